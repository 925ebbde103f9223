"""KV caches for a batch of rows that grow at different speeds.

A batched call feeds every row the same number of new positions, but after verification each row
keeps its own number of them: row b keeps its pending token and its a_b accepted drafts, and drops
the rest. Four ways to store that: copy every row into place after each step (a cache's worth of
memory traffic per step), keep one cache per row (B calls instead of one), keep a length per row
and let the next call write each row at its own offset, over what it rejected (what paged servers
do with their block tables, and BASS for batched speculation: it needs a forward that writes and
attends per row), or leave the dropped positions where they are and hide them.

The engine does the third where it runs the package's decoder (`specbook.decoder`), whose cache it
owns: `SlotRows`, a `specbook.cache.SlotCache` with a row per sequence, where row b's tokens fill its
slots 0 .. length_b - 1, each at its own position, and a call's other columns (a shorter prompt's
padding, a row's filler) go after them, to be overwritten (`SlotRowsCache` keeps its lengths). Every other model keeps Hugging Face's forward and
the fourth way, `RaggedCache`, which such a model runs as it is: one `transformers.DynamicCache` for the
whole batch, left padding, rejected drafts and the shorter rows' filler hidden columns in it, and
trailing columns that no row keeps cropped off (`specbook.cache.rollback`). Each call then needs
what the model's own mask cannot say: every new row sees the visible columns before it and itself,
and sits at its row's own position -- the number of visible columns before it -- so its rotary or
learned position is what it would be alone (`specbook.masks`, sliding windows included). A hidden
row still sees itself, so that no attention row is empty (an empty one would fill the cache with
NaN, which a zero weight does not cancel). The price is the hidden columns: the keys a call reads
but masks, counted by `RaggedCache.hidden`.

Both keep, on the host, the map `visible` (B, L): which of the columns fed so far hold a token each
row kept. `rows_cache` picks the one a model gets.
"""

import torch

from .cache import SlotCache, new_cache, rollback
from .decoder import decoder_for
from .masks import attention_inputs


def check_batch(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Validate a batch of prompts, left-padded as Hugging Face tokenizers pad them for generation
    (``padding_side="left"``), and return its mask (B, T) as bools (all True when none is given)."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2:
        shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(f"input_ids must be a (B, T) tensor of token ids (got {shape})")
    if attention_mask is None:
        return torch.ones_like(input_ids, dtype=torch.bool)
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
        shape = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask).__name__
        raise ValueError(f"attention_mask must have the shape of input_ids, {tuple(input_ids.shape)} (got {shape})")
    if attention_mask.is_floating_point() or ((attention_mask != 0) & (attention_mask != 1)).any():
        raise ValueError("attention_mask must hold 0 (padding) and 1 (token) as integers or bools")
    mask = attention_mask.bool()
    if not mask[:, -1].all():
        row = int((~mask[:, -1]).nonzero()[0])
        raise ValueError(f"attention_mask: row {row} is padded on the right; prompts must be padded on the left "
                         "(tokenizer.padding_side = 'left'), so that every row's last column is its last token")
    if (mask[:, 1:] < mask[:, :-1]).any():
        row = int((mask[:, 1:] < mask[:, :-1]).any(1).nonzero()[0])
        raise ValueError(f"attention_mask: row {row} has padding between its tokens; padding must all be on the left")
    return mask


def layout(visible: torch.Tensor | None, rows: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where a call's n columns go in each row, from ``visible`` (rows, n), True where a column holds a token of its
    row (None: all do): ``order`` (rows, n), each column's offset from the row's length -- the row's tokens first, in
    their order, then its other columns -- and ``tokens`` (rows,), how many each row adds. On the host."""
    if visible is None or bool(visible.all()):
        return torch.arange(n).expand(rows, n), torch.full((rows,), n)
    visible = visible.cpu()
    tokens = visible.sum(1)  # (rows,)
    return torch.where(visible, visible.cumsum(1), tokens[:, None] + (~visible).cumsum(1)) - 1, tokens


class SlotRows(SlotCache):
    """A `SlotCache` for a batch of ``rows`` sequences that grow at different speeds: row r's tokens fill its own
    slots 0 .. lengths[r] - 1, each at the position of its slot, so that a row's rotary positions and sliding
    windows are what they would be alone, and what a row rejected is overwritten by its next call. This is a
    write offset per row (chapter 7's third way; paged servers keep a length per sequence beside its blocks):
    no copy after a step and no holes in the cache, at the price of a mask per call, since rows end at different
    slots. ``kv`` is (layers, rows, 2 KV, max_length, d).

    A call feeds n columns to every row; `arrange` says which of them hold the row's tokens (the others: a
    shorter prompt's left padding, the filler of a row that drafted less). Row r's tokens go to its next slots,
    in order, and its other columns after them, beyond its length, where no query of the row looks before its next
    call overwrites them. ``lengths`` is kept on the host, per row: the engine knows what each row kept
    (`SlotRowsCache`), so a call never reads the device to place its tokens."""

    def __init__(self, rows, layers, kv_heads, head_dim, max_length, windows, dtype, device):
        if not isinstance(rows, int) or rows < 1:
            raise ValueError(f"rows must be an integer >= 1 (got {rows!r})")
        if not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"max_length must be an integer >= 1 (got {max_length!r})")
        self._hold(torch.zeros(layers, rows, 2 * kv_heads, max_length, head_dim, dtype=dtype, device=device))
        self.steps = torch.arange(max_length, device=device)  # (max_length,): slot indices
        self.windows, self.static, self.known = windows, False, None
        self.lengths, self.layout = [0] * rows, None

    @classmethod
    def for_decoder(cls, decoder, rows: int, max_length: int):
        """An empty cache of ``rows`` rows of ``max_length`` slots for ``decoder`` (a `specbook.decoder.Decoder`)."""
        return cls(rows, len(decoder.layers), decoder.kv_heads, decoder.head_dim, max_length, decoder.windows,
                   decoder.dtype, decoder.device)

    def _hold(self, kv: torch.Tensor) -> None:
        self.kv = kv  # (layers, rows, 2 KV, max_length, d)
        self.keys, self.values = kv.chunk(2, 2)  # (layers, rows, KV, max_length, d) each: views
        self.rows = kv.shape[1]
        self.row_index = torch.arange(self.rows, device=kv.device)[:, None]  # (rows, 1)

    @property
    def max_length(self) -> int:
        return self.kv.shape[3]

    def arrange(self, visible: torch.Tensor) -> None:
        """The next call's columns: ``visible`` (rows, n), True where a column holds a token of its row."""
        self.layout = visible

    def claim(self, n: int) -> torch.Tensor:
        """Every row's slots for the call's n columns, (rows, n) in ``slots``; returns their positions (rows * n,),
        which are the slots. Row r's lengths move past its tokens only."""
        visible, self.layout = self.layout, None
        if visible is not None and tuple(visible.shape) != (self.rows, n):
            raise ValueError(f"visible must be ({self.rows}, {n}), a flag per row and column (got "
                             f"{tuple(visible.shape)})")
        lengths = torch.tensor(self.lengths)  # (rows,)
        order, tokens = layout(visible, self.rows, n)
        self.span = int(lengths.max()) + n
        if self.span > self.max_length:
            self._grow(self.span)
        self.slots = (lengths[:, None] + order).to(self.steps.device)  # (rows, n)
        self.lengths = (lengths + tokens).tolist()
        return self.slots.view(-1)

    def _grow(self, needed: int) -> None:
        old = self.kv
        self._hold(old.new_zeros(old.shape[:3] + (max(needed, 2 * old.shape[3]),) + old.shape[4:]))
        self.kv[:, :, :, : old.shape[3]] = old
        self.steps = torch.arange(self.max_length, device=self.steps.device)

    def causal_masks(self, slots: torch.Tensor) -> dict:
        """Per sliding window, the additive masks (rows, n, span) of the call's queries: a row's query at slot s
        sees the row's keys at slots <= s, within its window."""
        keys, slots = self.steps[: self.span], self.slots[:, :, None]  # (span,), (rows, n, 1)
        masks = {}
        for window in set(self.windows):
            visible = keys <= slots  # (rows, n, span)
            if window is not None:
                visible &= keys > slots - window
            masks[window] = self._additive(visible)
        return masks

    def write(self, index: int, kv: torch.Tensor) -> None:
        """Layer ``index``'s keys and values of the claimed slots, ``kv`` (rows * n, 2 KV, d), in one copy."""
        self.kv[index][self.row_index, :, self.slots] = kv.view(self.rows, -1, *kv.shape[1:])  # (rows, n, 2 KV, d)

    def attended(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``index``'s keys and values over the call's span, (rows, KV, span, d) each: views."""
        return self.keys[index, :self.rows, :, :self.span], self.values[index, :self.rows, :, :self.span]

    def get_seq_length(self) -> int:
        """The longest row's length."""
        return max(self.lengths)

    def select(self, rows: list[int]) -> None:
        """Keep only ``rows`` of the batch, in that order (finished rows leave it): one copy of theirs."""
        self._hold(self.kv[:, torch.tensor(rows, dtype=torch.long, device=self.kv.device)])
        self.lengths = [self.lengths[row] for row in rows]

    def reset(self) -> None:
        self.lengths = [0] * self.rows

    def rollback(self, num_tokens) -> None:
        """Forget the last ``num_tokens[r]`` tokens of each row r (a list)."""
        if len(num_tokens) != len(self.lengths) or min(num_tokens) < 0 or any(
                n > length for n, length in zip(num_tokens, self.lengths)):
            raise ValueError(f"num_tokens must hold, per row, a count in [0, its length {self.lengths}] "
                             f"(got {list(num_tokens)})")
        self.lengths = [length - n for length, n in zip(self.lengths, num_tokens)]

    def keep(self, *args, **kwargs):
        raise ValueError("a batch's cache keeps chains, not a token tree's path: trees decode one sequence at a time")

    keep_tail = tree_masks = given_masks = keep


class StaticRows(SlotRows):
    """`SlotRows` of a fixed size, for calls replayed as graphs (`specbook.row_graphs`): room for ``capacity`` rows
    of ``max_length`` slots, and each row's length on the device too, ``length`` (capacity,), which a call reads
    and advances without the host. A call on R <= capacity rows is given its layout on the device first (`place`:
    `layout`'s order and counts), and its queries attend over every slot (a fixed span), the mask hiding what lies
    past each query in its row. The host's ``lengths`` (one per row in use) come from the engine (`set_lengths`).
    Rows past those in use (a graph's padding up to its batch size) keep length 0 and add nothing."""

    def __init__(self, capacity, layers, kv_heads, head_dim, max_length, windows, dtype, device):
        super().__init__(capacity, layers, kv_heads, head_dim, max_length, windows, dtype, device)
        self.static, self.capacity, self.span = True, capacity, max_length
        self.length = torch.zeros(capacity, dtype=torch.long, device=device)  # (capacity,)
        self.all_rows, self.order, self.added = self.row_index, None, None

    def place(self, order: torch.Tensor, added: torch.Tensor) -> None:
        """The next call's layout on the device: ``order`` (R, n), each column's offset from its row's length, and
        ``added`` (R,), the tokens each row adds (`layout`)."""
        if order.shape[0] > self.capacity:
            raise ValueError(f"this static cache holds {self.capacity} rows (got a call on {order.shape[0]}): "
                             "make it for the batch's size (specbook.row_graphs.static_rows)")
        self.order, self.added, self.rows = order, added, order.shape[0]
        self.row_index = self.all_rows[: self.rows]

    def claim(self, n: int) -> torch.Tensor:
        """The slots (rows, n) of the placed call, from the lengths on the device, which move past each row's tokens."""
        if self.order is None or self.order.shape[1] != n:
            raise ValueError(f"place a call's layout on {n} columns before it (StaticRows.place)")
        self.slots = self.length[: self.rows, None] + self.order  # (rows, n)
        self.length[: self.rows] += self.added
        return self.slots.view(-1)

    def set_lengths(self, lengths: list[int]) -> None:
        """Each row's length, on the host and the device (one copy): after a step, what each row kept."""
        if len(lengths) > self.capacity or min(lengths, default=0) < 0 or max(lengths, default=0) > self.max_length:
            raise ValueError(f"lengths must be at most {self.capacity} counts in [0, {self.max_length}] (got {lengths})")
        self.lengths = list(lengths)
        self.length[: len(lengths)].copy_(torch.tensor(lengths), non_blocking=True)

    def rollback(self, num_tokens) -> None:
        super().rollback(num_tokens)
        self.set_lengths(self.lengths)

    def select(self, rows: list[int]) -> None:
        """Keep only ``rows`` of those in use, moved to the first slots of the buffer, in place (a graph's buffers keep
        their addresses); the rows after them are emptied."""
        index = torch.tensor(rows, dtype=torch.long, device=self.kv.device)
        self.kv[:, : len(rows)] = self.kv[:, index]
        self.length[: len(rows)] = self.length[index]
        self.length[len(rows):] = 0
        self.lengths = [self.lengths[row] for row in rows]

    def reset(self, rows: int | None = None) -> None:
        """Empty the cache for a batch of ``rows`` (by default its capacity)."""
        self.length.zero_()
        self.lengths = [0] * (self.capacity if rows is None else rows)

    def _grow(self, needed: int) -> None:
        raise ValueError(f"a call would write past this static cache's {self.max_length} slots (needs {needed})")


class RowsCache:
    """A batch's KV cache as the batched engine uses it (module docstring), whatever the forward: ``cache(tokens,
    new_visible, logits_to_keep=...)`` calls the model on m new columns of every row, ``new_visible`` (B, m)
    saying which hold the row's tokens; ``forget`` then drops what a row did not keep, ``select`` finished rows.
    ``visible`` (B, L), on the host: which of the L columns fed so far hold each row's kept tokens."""

    def __init__(self, rows: int):
        self.visible = torch.zeros(rows, 0, dtype=torch.bool)

    def forget(self, columns: int, keep) -> None:
        """Of the last ``columns`` columns fed, row b keeps only the first ``keep[b]``; crop the columns no row keeps."""
        if columns:
            self.visible[:, -columns:] &= torch.arange(columns)[None] < torch.as_tensor(keep).view(-1, 1)
        kept = self.visible.any(0).nonzero()  # (n, 1)
        length = int(kept[-1]) + 1 if len(kept) else 0
        self._crop(self.visible.shape[1] - length)
        self.visible = self.visible[:, :length]

    def select(self, rows: list[int]) -> None:
        """Keep only ``rows`` of the batch (finished rows leave it), then crop the columns no row keeps."""
        self._select(rows)
        self.visible = self.visible[rows]
        self.forget(0, None)


class SlotRowsCache(RowsCache):
    """A batch's cache for a model the package's decoder runs: a write offset per row (module docstring)."""

    def __init__(self, decoder, rows: int, max_length: int):
        super().__init__(rows)
        self.decoder, self.cache = decoder, SlotRows.for_decoder(decoder, rows, max_length)

    def __call__(self, tokens: torch.Tensor, new_visible: torch.Tensor, **options):
        self.visible = torch.cat([self.visible, new_visible.cpu()], 1)  # (B, L + m)
        self.cache.arrange(new_visible)
        return self.decoder(tokens, past_key_values=self.cache, **options)

    def _crop(self, columns: int) -> None:  # no columns to crop: each row's length is the tokens it kept
        self.cache.lengths = self.visible.sum(1).tolist()

    def _select(self, rows: list[int]) -> None:
        self.cache.select(rows)


class RaggedCache(RowsCache):
    """``model``'s KV cache for a batch whose rows keep different numbers of positions, hidden columns in one
    `transformers.DynamicCache` (module docstring), for Hugging Face's forward.

    ``visible`` (B, L): which cache columns hold each row's tokens. A call goes ``model(tokens,
    **cache.inputs(new_visible))`` (or ``cache(tokens, new_visible)``), then ``cache.forget(...)`` hides what the
    call fed but a row did not keep.
    """

    def __init__(self, model, rows: int):
        super().__init__(rows)  # (B, L), on the host: masks are built there
        self.model, self.cache = model, new_cache(model)  # refuses layers that cannot be rolled back
        self.config, self.dtype, self.device = model.config, model.dtype, model.device

    def __call__(self, tokens: torch.Tensor, new_visible: torch.Tensor, **options):
        return self.model(tokens, **self.inputs(new_visible), **options)

    def inputs(self, new_visible: torch.Tensor) -> dict:
        """The keyword arguments of a call that feeds m new columns, ``new_visible`` (B, m) saying which of
        them hold tokens (the rest: padding, filler); the map grows by them."""
        past = self.visible.shape[1]
        visible = torch.cat([self.visible, new_visible.cpu()], 1)  # (B, L + m)
        key_positions = visible.long().cumsum(1) - 1  # (B, L + m): a column's position in its own row
        rows = torch.arange(new_visible.shape[1])
        causal = torch.arange(visible.shape[1])[None] <= past + rows[:, None]  # (m, L + m)
        sees = visible[:, None] & causal  # (B, m, L + m)
        sees[:, rows, past + rows] = True  # every new row sees itself: no empty attention row
        self.visible = visible
        return dict(past_key_values=self.cache, use_cache=True,
                    **attention_inputs(sees, key_positions[:, past:].clamp(min=0), key_positions, self.dtype,
                                       self.device, self.config))

    def _crop(self, columns: int) -> None:
        rollback(self.cache, columns)

    def _select(self, rows: list[int]) -> None:
        self.cache.batch_select_indices(torch.tensor(rows, dtype=torch.long, device=self.device))

    @property
    def hidden(self) -> float:
        """The share of the cache's columns that hold no token of their row: what a call reads and masks."""
        return 1 - self.visible.float().mean().item() if self.visible.numel() else 0.0


def rows_cache(model, rows: int, max_length: int) -> RowsCache:
    """A new cache for a batch of ``rows`` sequences of ``model`` with room for ``max_length`` tokens each (it
    grows): a write offset per row over the package's decoder where it serves the model, else Hugging Face's
    forward over hidden columns (`specbook.decoder.forward_name` says which, and why)."""
    decoder = decoder_for(model)
    return RaggedCache(model, rows) if decoder is None else SlotRowsCache(decoder, rows, max_length)

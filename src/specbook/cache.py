"""KV caches that can be rolled back.

Speculative decoding writes the keys and values of every drafted token into the cache, and must
forget the ones the target rejected. Rolling back never recomputes the prefix. Two kinds:

- a dynamic cache (`transformers.DynamicCache`, the default) grows as tokens are fed; rolling
  back crops its sequence dimension;
- a static cache (`transformers.StaticCache`, for GPUs) is allocated once for the whole
  generation; every layer keeps a length pointer on the device, and rolling back moves the
  pointer back: nothing is copied, and the next tokens overwrite the forgotten ones. Keys beyond
  a query's position get zero weight from the causal mask (attention still reads the whole buffer:
  the engine sizes it to the generation, in blocks, `decoding.STATIC_BLOCK`).
  Fixed shapes and a pointer on the device are what lets a decode step be replayed as a CUDA graph
  (`specbook.graphs`).

Tree verification (`specbook.trees`) feeds every branch of a token tree at once; afterwards the
cache keeps the prefix and the accepted path only (`keep_positions`).

A third kind is the package's own: `SlotCache`, the cache of `specbook.decoder.Decoder` (the forward
written for decoding). One buffer of keys and values for all layers and one length on the device: a
call writes its tokens at the next slots, rolling back moves the length back, and a tree's accepted
path is moved into place by index. On the engine's eager path it grows when a call would overflow it;
under a replayed graph (``static=True``) its size is fixed.

Sliding windows. Some families attend, in some or all layers, only to the last W positions
(Mistral, Phi-3, Qwen2 with ``use_sliding_window``, Gemma 2 and 3, whose layers alternate between a
window and the full context). Hugging Face gives such a layer a cache that keeps only the last W
keys and values, a ring buffer. Speculative decoding cannot use one: writing K drafts pushes the
oldest K positions out, and when the target rejects the drafts those positions are gone, while
the next tokens still need them. So every attention layer here keeps its full history (a
`DynamicLayer`, or a full-length `StaticLayer`) and the window is applied by the attention mask
alone -- the model's own mask for a chain, and `specbook.trees.tree_model_inputs` for a tree. The
arithmetic is the model's; the cost is memory: a sliding layer holds the whole sequence, not W
positions. Layers whose state is not one key and value per position (linear attention, state
space layers, chunked attention, KV sharing) cannot be rolled back this way, and `attention_windows`
refuses them.
"""

import torch
from transformers import DynamicCache, EncoderDecoderCache, StaticCache
from transformers.cache_utils import DynamicLayer, StaticLayer

CACHES = ("dynamic", "static")


def check_cache_options(cache: str, compile: bool = False) -> None:
    """The engine's ``cache`` and ``compile`` options: a known kind, and compiled steps only over a static cache."""
    if cache not in CACHES:
        raise ValueError(f"cache must be one of {CACHES} (got {cache!r})")
    if compile and cache != "static":
        raise ValueError("compile=True needs cache='static': a compiled step replays fixed shapes")


def attention_windows(config) -> list[int | None]:
    """Per decoder layer of a model with ``config``: its sliding window W, or None for full attention.

    Reads ``layer_types`` ("full_attention", "sliding_attention") where the config has them, else
    ``sliding_window`` for every layer (Mistral, Phi-3). Raises for any other kind of layer, whose
    cache cannot be rolled back by cropping (see the module docstring).
    """
    config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    window = getattr(config, "sliding_window", None)
    kinds = getattr(config, "layer_types", None)
    if kinds is None:
        kinds = ["sliding_attention" if window else "full_attention"] * config.num_hidden_layers
        if getattr(config, "attention_chunk_size", None):
            kinds = ["chunked_attention"]
        if "local" in (getattr(config, "attention_layers", None) or []):  # GPT-Neo's local attention
            kinds = ["local_attention"]
    unsupported = sorted(set(kinds) - {"full_attention", "sliding_attention"})
    if unsupported:
        raise ValueError(f"this model has {', '.join(unsupported)} layers ({type(config).__name__}): specbook "
                         "decodes models whose attention layers keep one key and value per position (full "
                         "attention or a sliding window), the only state it can roll back after rejected drafts")
    return [window if kind == "sliding_attention" else None for kind in kinds]


def new_cache(model, max_length: int | None = None):
    """An empty cache for ``model``: dynamic, or static with room for ``max_length`` tokens when given.

    Every layer keeps its full history, sliding-window layers included (see the module docstring).
    An encoder-decoder model gets a dynamic ``EncoderDecoderCache``: its decoder's self-attention,
    cropped by `rollback`, and its cross-attention, filled once and kept (`specbook.seq2seq`).
    """
    attention_windows(model.config)
    if getattr(model.config, "is_encoder_decoder", False):
        if max_length is not None:
            raise ValueError("encoder-decoder models decode with cache='dynamic': the static path is for "
                             "decoder-only models")
        return EncoderDecoderCache(DynamicCache(), DynamicCache())
    if max_length is None:
        return DynamicCache()
    if not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be an integer >= 1 (got {max_length!r})")
    cache = StaticCache(config=model.config, max_cache_len=max_length)
    cache.layers = [StaticLayer(max_length) for _ in cache.layers]  # no ring buffers: the mask applies the window
    return cache


class SlotCache:
    """Keys and values of ``layers`` layers, (layers, kv_heads, max_length, head_dim) each, and one ``length`` on
    the device: how many slots hold committed tokens. ``windows``: each layer's sliding window or None.
    ``keys`` and ``values`` are the two halves of one buffer, ``kv`` (layers, 2 * kv_heads, max_length,
    head_dim): a call writes a layer's keys and values with one copy, and moving a token moves both at once.

    ``static``: the size is fixed (a replayed graph recorded its buffers); otherwise a call that would
    overflow it first grows it (reading the length on the host). Rows of a token tree occupy slots whose
    positions differ from their indices (`specbook.decoder.Decoder` is then given the positions and mask).
    """

    rows = 1  # sequences: one (`specbook.ragged.SlotRows` holds a batch)

    def __init__(self, layers, kv_heads, head_dim, max_length, windows, dtype, device, static=False):
        if not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"max_length must be an integer >= 1 (got {max_length!r})")
        self._hold(torch.zeros(layers, 2 * kv_heads, max_length, head_dim, dtype=dtype, device=device))
        self.length = torch.zeros((), dtype=torch.long, device=device)
        self.steps = torch.arange(max_length, device=device)  # (max_length,): slot indices, made once
        self.windows, self.static = windows, static
        self.known = 0  # the length as the host knows it: None once a count it has not read moved it

    def _hold(self, kv: torch.Tensor) -> None:
        self.kv = kv  # (layers, 2 * KV, max_length, d): keys, then values
        self.keys, self.values = kv.chunk(2, 1)  # (layers, KV, max_length, d) each: views

    @property
    def max_length(self) -> int:
        return self.kv.shape[2]

    def get_seq_length(self) -> int:
        """The length: the host's own count where it has one (``known``), else read from the device."""
        if self.known is None:
            self.known = int(self.length)
        return self.known

    def reset(self) -> None:
        self.length.zero_()
        self.known = 0

    def claim(self, n: int) -> torch.Tensor:
        """The slots (n,) of a call's n new tokens, on the device; the length moves past them. Sets ``span``, the
        slots the call's queries attend over: all of them under a graph, else those in use."""
        self.span = self.max_length
        if not self.static:
            self.span = self.get_seq_length() + n
            if self.span > self.max_length:
                self._grow(self.span)
        slots = self.slots = self.length + self.steps[:n]
        self.length.add_(n)
        if not torch.compiler.is_compiling() and self.known is not None:  # a compiled call's caller counts
            self.known += n
        return slots

    def write(self, index: int, kv: torch.Tensor) -> None:
        """Layer ``index``'s keys and values of the claimed slots, ``kv`` (n, 2 KV, d), in one copy."""
        self.kv[index].index_copy_(1, self.slots, kv.transpose(0, 1))

    def attended(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``index``'s keys and values over the call's span, (1, KV, span, d) each: views."""
        return self.keys[index, None, :, :self.span], self.values[index, None, :, :self.span]

    def _grow(self, needed: int) -> None:
        size = max(needed, 2 * self.max_length)
        old = self.kv
        self._hold(old.new_zeros(old.shape[:2] + (size,) + old.shape[3:]))
        self.kv[:, :, : old.shape[2]] = old
        self.steps = torch.arange(size, device=self.steps.device)

    def causal_masks(self, slots: torch.Tensor) -> dict:
        """Per sliding window (None: full attention), the additive masks (n, span) of queries at positions
        ``slots`` (n,): a key is visible at a position <= the query's, and within its window. None where every
        key is: one query at the last slot of a growing cache, within its window."""
        keys = self.steps[: self.span]  # (span,)
        masks = {}
        for window in set(self.windows):
            if len(slots) == 1 and not self.static and (window is None or self.span <= window):
                masks[window] = None  # the span ends at the query's slot: nothing to hide
                continue
            visible = keys <= slots[:, None]  # (n, span)
            if window is not None:
                visible &= keys > slots[:, None] - window
            masks[window] = self._additive(visible)
        return masks

    def _additive(self, visible: torch.Tensor) -> torch.Tensor:
        """An additive mask in the cache's dtype from a boolean one: 0 where a key is visible, else its lowest."""
        hidden = max(torch.finfo(self.keys.dtype).min, torch.finfo(torch.float32).min)  # where's scalars: float32
        return torch.where(visible, 0.0, hidden).to(self.keys.dtype)

    def tree_masks(self, slots: torch.Tensor, visible: torch.Tensor, depths: torch.Tensor) -> tuple:
        """A token tree's positions (n,) and masks per window (n, span) for a call on its last n rows at ``slots``
        (n,), from ``visible`` (n, size), which of the tree's rows each sees (`specbook.trees.tree_attention_mask`'s
        last n rows), and ``depths`` (size,), each row's depth. The tree's first row (the root) sits at slot
        ``slots[0] - (size - n)``; the slots before it are the committed tokens, each at its own position. All
        on the device: the host need not know where the tree starts."""
        n, size = visible.shape
        start = slots[:1] - (size - n)  # (1,): the root's slot and position
        keys = self.steps[: self.span]  # (span,)
        row = keys - start  # (span,): each key's row in the tree
        in_tree = (row >= 0) & (row < size)
        column = row.clamp(0, size - 1)
        seen = torch.where(in_tree, visible[:, column], row < 0)  # (n, span): the prefix, and the tree's mask
        key_positions = torch.where(in_tree, start + depths[column], keys)  # (span,)
        positions = start + depths[size - n:]  # (n,)
        masks = {}
        for window in set(self.windows):
            shown = seen if window is None else seen & (key_positions > positions[:, None] - window)  # (n, span)
            masks[window] = self._additive(shown)
        return positions, masks

    def given_masks(self, attention_mask, n: int) -> dict:
        """A tree's masks in Hugging Face's form -- (1, 1, n, keys), or one per kind of layer
        (`specbook.masks.attention_inputs`) -- per window, as (n, span) over the slots."""
        by_kind = attention_mask if isinstance(attention_mask, dict) else None
        masks = {}
        for window in set(self.windows):
            mask = attention_mask if by_kind is None else by_kind[
                "full_attention" if window is None else "sliding_attention"]
            mask = mask[0, 0].to(self.keys.dtype)  # (n, keys)
            masks[window] = torch.nn.functional.pad(mask, (0, self.span - mask.shape[1]),
                                                    value=torch.finfo(self.keys.dtype).min)
        return masks

    def rollback(self, num_tokens) -> None:
        self.length.sub_(num_tokens)
        self.known = None if isinstance(num_tokens, torch.Tensor) or self.known is None else self.known - num_tokens

    def keep(self, positions: torch.Tensor, start: int = 0) -> None:
        """Keep the slots ``positions`` (m,), increasing, moved to slots start .. start + m - 1, after the first
        ``start`` slots, which stay (a tree's prefix: only the accepted path moves). One gather and one copy for
        the keys and values of every layer."""
        m = len(positions)
        self.kv[:, :, start:start + m] = self.kv.index_select(2, positions)  # (layers, 2 KV, m, d)
        self.length.fill_(start + m)
        self.known = start + m

    def keep_tail(self, rows: torch.Tensor, fed: int, count: int) -> None:
        """Of the last ``fed`` slots (a tree's rows), keep the first ``count`` of ``rows`` (m,), indices among
        them on the device, increasing: they move to the front of those slots, the rest are forgotten. All m
        move (up to ``fed`` of them, those outside the fed slots clamped into them), whatever ``count`` is: the same
        shapes every step, and no index made on the host."""
        base = self.length - fed  # (): the first of the fed slots
        rows = rows[:fed].clamp(0, max(fed - 1, 0))  # only the first count matter
        source, target = base + rows, base + self.steps[: len(rows)]  # (m,), (m,)
        self.kv.index_copy_(2, target, self.kv.index_select(2, source))  # (layers, 2 KV, max_length, d)
        self.rollback(fed - count)


def is_static(cache) -> bool:
    """Whether ``cache`` has a fixed size (a transformers `StaticCache`, or a `SlotCache` under graphs)."""
    return isinstance(cache, StaticCache) or isinstance(cache, SlotCache) and cache.static


def length_pointers(cache) -> list[torch.Tensor]:
    """The device counters that say how full a fixed-size ``cache`` is: every allocated layer's of a
    `StaticCache`, or a `SlotCache`'s one length."""
    if isinstance(cache, SlotCache):
        return [cache.length]
    return [layer.cumulative_length for layer in cache.layers if layer.is_initialized]


def rollback(cache, num_tokens: int | torch.Tensor) -> None:
    """Forget the last ``num_tokens`` positions of ``cache`` (in place): crop it, or move its pointers back.

    A static cache also takes ``num_tokens`` as a 0-d tensor on its device, a count the host has not read
    (the engine's drafting ahead, `specbook.drafters.ModelDrafter.draft_ahead`): it must be >= 0.
    """
    on_device = isinstance(num_tokens, torch.Tensor)
    if on_device and not isinstance(cache, (StaticCache, SlotCache)):
        raise ValueError("a number of tokens held on the device rolls back a static cache only (a dynamic cache "
                         "crops on the host)")
    if not on_device and num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0 (got {num_tokens})")
    if not on_device and not num_tokens:
        return
    if isinstance(cache, SlotCache):
        cache.rollback(num_tokens)
    elif isinstance(cache, StaticCache):
        for layer in cache.layers:
            if type(layer) is not StaticLayer:
                raise ValueError(f"rollback needs full-length StaticLayer cache layers (got {type(layer).__name__}): "
                                 "make the cache with specbook.cache.new_cache")
        pointers = length_pointers(cache)  # device scalars
        if pointers and on_device:  # every layer's pointer in one kernel: no copy, no sync
            torch._foreach_add_(pointers, num_tokens, alpha=-1)  # (its "sub" would read the tensor on the host)
        elif pointers:
            torch._foreach_sub_(pointers, num_tokens)
    else:
        cache.crop(-num_tokens)


def keep_tail(cache, rows: torch.Tensor, fed: int, count: int) -> None:
    """Keep, of the last ``fed`` positions of ``cache`` (a tree's rows), the first ``count`` of ``rows`` (m,), indices
    among them, increasing, on the cache's device; forget the others (`SlotCache.keep_tail`). After a tree
    pass: the root's row and the accepted path's, the path's order as verification left it on the device."""
    if not 0 <= count <= min(len(rows), fed):
        raise ValueError(f"count must be in [0, {min(len(rows), fed)}] (got {count})")
    if isinstance(cache, SlotCache):
        cache.keep_tail(rows, fed, count)
        return
    context = cache.get_seq_length() - fed
    keep_positions(cache, torch.cat([torch.arange(context, device=rows.device), context + rows[:count]]))


def keep_positions(cache, positions) -> None:
    """Keep only ``positions`` (increasing indices along the sequence) of ``cache``, in place.

    After a tree pass over [prefix, root, nodes...], the positions of the prefix, the root and the
    accepted nodes. Works on `DynamicCache` layers (keys and values (batch, heads, seq, head_dim)) and on
    a `SlotCache`.
    """
    positions = torch.as_tensor(positions, dtype=torch.long)  # (m,)
    length = cache.get_seq_length()
    if positions.ndim != 1 or (positions.numel() and (positions[0] < 0 or positions[-1] >= length
                                                      or (positions.diff() <= 0).any())):
        raise ValueError(f"positions must be increasing indices in [0, {length}) (got {positions.tolist()})")
    if isinstance(cache, SlotCache):
        in_place = positions == torch.arange(len(positions), device=positions.device)
        unmoved = int(in_place.cumprod(0).sum())  # the leading slots already where they are kept: the prefix
        cache.keep(positions[unmoved:].to(cache.length.device), unmoved)
        return
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise ValueError(f"keep_positions needs DynamicLayer cache layers (got {type(layer).__name__})")
        if layer.is_initialized:
            layer.keys = layer.keys.index_select(-2, positions.to(layer.keys.device))
            layer.values = layer.values.index_select(-2, positions.to(layer.values.device))

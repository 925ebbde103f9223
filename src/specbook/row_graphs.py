"""A batch's calls replayed as graphs: the batched engine on a GPU.

At batch one a decode call replays one CUDA graph per number of new tokens (`specbook.graphs`). A batch
needs the same where its size repeats, and a server's batch sizes do not: rows finish and leave. Serving
engines capture one graph per *batch bucket* (vLLM's ``cudagraph_capture_sizes``, SGLang's
``cuda_graph_bs``) and pad a batch up to the next bucket with rows that do nothing. `StaticRowsModel` does
that for a model the package's decoder serves, over `specbook.ragged.StaticRows`:

- one key and value buffer for ``capacity`` rows of ``max_length`` slots, kept with the model between
  generations (`static_rows`), so that the addresses a graph recorded stay valid; each row's length
  lives on the device, and a call reads and advances it there;
- a call on R rows of n columns replays the graph of (the smallest power of two >= R, n): its tokens
  and its layout (where each column goes in its row: `specbook.ragged.layout`) are copied into the
  graph's buffers, the padding rows' tokens go nowhere (they add no length), and the logits of the R
  real rows are copied out;
- a call on more than 16 columns (the prompts) is padded to the next of `specbook.graphs.PROMPT_BUCKETS`
  with columns that hold no token, which the layout puts after each row's tokens, to be overwritten;
- after verification the engine sets each row's length to what it kept (one small copy), and a row that
  finishes leaves: the others move to the first rows of the buffer, one copy, as the dynamic cache does.

On a CPU there are no graphs: the calls run eagerly over the same fixed buffers (``CAPTURE_ON_CPU``
records and re-runs them, as for a batch of one, in tests). The engine takes this path by default on a
GPU where the decoder serves the target (`batch_cache`).
"""

import weakref

import torch

from . import graphs
from .cache import check_cache_options
from .decoder import Output, decoder_for, forward_name
from .graphs import PROMPT_BUCKETS, capture
from .ragged import RowsCache, StaticRows, layout, rows_cache

EXACT_COLUMNS = 16  # calls on up to this many columns (decode steps) get a graph of their own width


def batch_bucket(rows: int) -> int:
    """The batch size a call on ``rows`` rows is replayed at: the next power of two."""
    return 1 << (rows - 1).bit_length()


class StaticRowsModel:
    """``model`` (one the package's decoder serves) decoding batches of up to ``capacity`` rows over a `StaticRows`
    cache of ``max_length`` slots a row, each call one replayed graph on a GPU (module docstring). ``start(rows)``
    empties the cache for a batch; then call this object as `RowsCache` calls a forward."""

    def __init__(self, model, max_length: int, capacity: int):
        self.model, self.decoder = model, _served(model)
        self.decoder._tables(max_length)  # the rotary table a graph reads, made before any capture
        self.cache = StaticRows.for_decoder(self.decoder, capacity, max_length)
        self.graphs = {}  # (bucket, width, keep) -> (graph, its buffers); graph.output: logits (bucket, keep, vocab)
        self.pool = torch.cuda.graph_pool_handle() if model.device.type == "cuda" else None

    @property
    def replays(self) -> bool:
        return self.model.device.type == "cuda" or graphs.CAPTURE_ON_CPU

    def start(self, rows: int) -> StaticRows:
        self.cache.reset(rows)
        return self.cache

    def __call__(self, tokens: torch.Tensor, visible: torch.Tensor, logits_to_keep: int = 1):
        """Logits (R, keep, vocab) of the last ``logits_to_keep`` columns of ``tokens`` (R, n), ``visible`` (R, n)
        saying which columns hold their row's tokens; each row's length moves past its tokens."""
        rows, n = tokens.shape
        keep, room = logits_to_keep or n, self.cache.max_length - max(self.cache.lengths)
        if n > room:
            raise ValueError(f"a call on {n} columns overflows the static cache: {room} slots are left in its "
                             f"longest row (max_length {self.cache.max_length})")
        width = n if n <= EXACT_COLUMNS else next((size for size in PROMPT_BUCKETS if n <= size <= room), None)
        if not self.replays or width is None:  # eager, on the call's own columns
            order, added = layout(visible, rows, n)
            self.cache.place(order.to(self.cache.length.device), added.to(self.cache.length.device))
            logits = self.decoder(tokens, past_key_values=self.cache, logits_to_keep=keep).logits
        else:
            shown = torch.zeros(rows, width, dtype=torch.bool)  # (R, width): padding columns hold no token
            shown[:, :n] = True if visible is None else visible.cpu()
            order, added = layout(shown, rows, width)
            logits = self._replay(tokens, order, added, n, width, keep)
        self.cache.lengths = [length + int(count) for length, count in zip(self.cache.lengths, added)]
        return Output(logits=logits)

    def _replay(self, tokens, order, added, n, width, keep):
        rows = tokens.shape[0]
        key = (batch_bucket(rows), width, keep)
        if key not in self.graphs:
            device = self.cache.length.device
            buffers = (torch.zeros(key[:2], dtype=torch.long, device=device),  # tokens
                       torch.arange(width, device=device).repeat(key[0], 1),  # order
                       torch.zeros(key[0], dtype=torch.long, device=device),  # tokens added
                       torch.arange(width - keep, width, device=device))  # the columns whose logits are kept

            def call():
                self.cache.place(*buffers[1:3])
                return self.decoder(buffers[0], past_key_values=self.cache, logits_to_keep=buffers[3]).logits
            self.graphs[key] = capture(call, [self.cache.length], self.pool, self.model.device), buffers
        graph, (token_buffer, order_buffer, added_buffer, kept) = self.graphs[key]
        token_buffer.zero_()
        token_buffer[:rows, :n].copy_(tokens)
        order_buffer[:rows].copy_(order)
        added_buffer.zero_()
        added_buffer[:rows].copy_(added)
        torch.arange(n - keep, n, out=kept)
        graph.replay()
        return graph.output[:rows].clone()


_RUNNERS = weakref.WeakKeyDictionary()  # model -> {(max_length, capacity, role): StaticRowsModel}


def static_rows(model, max_length: int, rows: int, role: str = "target") -> StaticRowsModel:
    """The `StaticRowsModel` of ``model`` for batches of up to ``rows`` rows (its capacity the next power of two) of
    ``max_length`` slots, in ``role`` ("target" or "draft"), made on first use and kept with the model so that a
    later generation replays the graphs an earlier one captured."""
    per_model = _RUNNERS.setdefault(model, {})
    key = (max_length, batch_bucket(rows), role)
    if key not in per_model:
        per_model[key] = StaticRowsModel(model, max_length, key[1])
    return per_model[key]


class StaticRowsCache(RowsCache):
    """A batch's cache over a `StaticRowsModel` for one generation (`specbook.ragged.RowsCache`'s interface)."""

    def __init__(self, runner: StaticRowsModel, rows: int):
        super().__init__(rows)
        self.runner, self.cache = runner, runner.start(rows)

    def __call__(self, tokens: torch.Tensor, new_visible: torch.Tensor, logits_to_keep: int = 1):
        self.visible = torch.cat([self.visible, new_visible.cpu()], 1)  # (B, L + m)
        return self.runner(tokens, new_visible, logits_to_keep)

    def _crop(self, columns: int) -> None:  # each row's length is the tokens it kept
        self.cache.set_lengths(self.visible.sum(1).tolist())

    def _select(self, rows: list[int]) -> None:
        self.cache.select(rows)


def batch_cache(model, rows: int, max_length: int, cache: str = "dynamic", role: str = "target") -> RowsCache:
    """A new cache for a batch of ``rows`` sequences of ``model``, each with room for ``max_length`` tokens: with
    ``cache="static"``, the model's `StaticRowsModel`'s (its calls replayed as graphs on a GPU); else a dynamic
    one, a write offset per row over the package's decoder where it serves the model, hidden columns over Hugging
    Face's forward elsewhere (`specbook.ragged.rows_cache`)."""
    if cache == "static":
        return StaticRowsCache(static_rows(model, max_length, rows, role), rows)
    return rows_cache(model, rows, max_length)


def batch_cache_option(model, cache: str | None, compile: bool | None) -> str:
    """The cache a batch of ``model``'s prompts decodes over: ``cache`` as given, None meaning the static one (its
    graphs) on a GPU where the package's decoder serves the model, else the dynamic one. Compiled steps are for a
    batch of one."""
    if compile:
        raise ValueError("a batch decodes with compile=False: compiled steps are for a batch of one")
    if cache is None:
        return "static" if model.device.type == "cuda" and decoder_for(model) is not None else "dynamic"
    check_cache_options(cache)
    if cache == "static":
        _served(model)
    return cache


def _served(model):
    """``model``'s `specbook.decoder.Decoder`, or a clear refusal: a batch's static cache is the decoder's."""
    decoder = decoder_for(model)
    if decoder is None:
        raise ValueError(f"a batch decodes over the static cache on the package's decoder only; "
                         f"{type(model).__name__} runs {forward_name(model)}: use cache='dynamic'")
    return decoder

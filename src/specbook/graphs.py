"""Decode steps without host overhead: a static KV cache kept between generations, and one CUDA graph
per input length, replayed with one launch.

At batch one a small model's decode step does a few microseconds of GPU work per layer, while the host
spends tens of microseconds per layer launching its kernels: Python through the model's modules, and
hundreds of kernel launches. ``torch.compile(mode="reduce-overhead")`` records the kernels as a CUDA
graph, but every call still evaluates the compiled function's guards on the module and its cache
object and does the graph runtime's bookkeeping, about 0.3 ms a call whatever the model's size (the
project measured 0.28 ms for its one-layer draft on an H100, c = 0.60). Serving engines capture the
forward themselves instead (SGLang's ``CudaGraphRunner``, vLLM's ``CUDAGraphWrapper``): a plain
``torch.cuda.CUDAGraph`` per number of new tokens, over input buffers at fixed addresses, replayed
without any Python of the model running. `StaticModel` does that for a Hugging Face causal LM:

- its static cache (`specbook.cache.new_cache`) lives as long as the `StaticModel`, one per model,
  length and role (`static_model`), and is reset between generations by zeroing its length pointers
  in place, so the addresses a graph recorded stay valid from one generation to the next;
- a call on n new tokens copies them into the buffer of n, replays n's graph and returns a copy of its
  logits (n, vocab); the first call on n warms the forward up on a side stream (restoring the cache's
  pointers after) and captures it. The model's position, cache position and mask all derive from the
  cache's length pointer on the device (transformers' ``StaticLayer.cumulative_length``), which the
  replay advances in place and `specbook.cache.rollback` moves back: nothing the host knows is baked in;
- a draft model's K steps are one graph (`StaticModel.chain`): K forwards and the sampling between
  them, one launch where a loop of calls would cost the host K launches and K samplers' kernels;
- a chain's verification is one graph (`StaticModel.verify`): the target's call on the pending token
  and the drafts, its probabilities and the accept decision, the random numbers of a sampled step
  drawn into buffers before the replay; a token tree's call is one graph per padded size
  (`StaticModel.tree`), its mask made on the device from the tree's shape;
- a generation's first call, on the prompt (and the first drafts), is one graph too, though prompts
  differ in length: the tokens are padded at their end to the next of a few sizes (`PROMPT_BUCKETS`,
  SGLang's and vLLM's way with batch sizes), one graph per size, and the pointers move back over the
  padding afterwards. Causal attention keeps the padding out of every real position, and the next
  tokens overwrite its keys and values. An eager call of a small model's prompt would cost the host
  as much as a dozen replayed decode calls (on an H100, 12 ms for the built-in target against 1 ms);
- with ``compile=True`` the captured kernels are Inductor's (``torch.compile`` without its own
  graphs, as SGLang compiles inside its runner): fewer, fused kernels, for a compilation per input
  length on first use; without it, the model's own kernels are captured, ready in a second.

On a CPU there are no graphs: a call runs the model (compiled to C++ kernels with ``compile=True``).
The engine's calls are the same on both, so the CPU tests cover the buffers and the cache's lifetime;
``CAPTURE_ON_CPU`` makes a "capture" on the CPU record the call and a "replay" re-run it on the same
buffers, the semantics of a graph, for those tests.
"""

import weakref
from contextlib import contextmanager

import torch

from .cache import SlotCache, length_pointers, rollback
from .decoder import cache_and_forward, decoder_for, forward_over
from .models import read_features, vocab_size
from .rejection import chain_decision
from .sampling import exponential_race, one_hot

OPTIONS = dict(fullgraph=True, dynamic=False)  # torch.compile: one graph per input shape, no fallback to Python
# Every model and every input length is one more compilation of the same forward; a benchmark over
# K = 1..8 with a target, a draft and autoregressive decoding needs a few dozen, past torch's default of 8.
RECOMPILE_LIMIT = 64
CAPTURE_ON_CPU = False  # tests: record and re-run calls on the CPU as a graph would replay them
WARMUP_CALLS = 2  # eager calls before a capture (lazy initialisation, cuBLAS workspaces, compilation)
PROMPT_BUCKETS = (16, 32, 64, 128, 256, 512)  # a first call's padded lengths; a longer one runs eagerly
TREE_BUCKETS = (8, 16, 32, 64)  # a token tree's padded rows (root, nodes); a larger tree runs eagerly


_COMPILED = weakref.WeakKeyDictionary()  # model -> its compiled forward


def compiled(model):
    """``model`` compiled by Inductor (memoised per model): C++ kernels on a CPU; on a GPU Triton kernels
    without CUDA graphs of torch's own, which `StaticModel` captures itself."""
    if model not in _COMPILED:
        config = torch._dynamo.config
        limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"  # its older name
        setattr(config, limit, max(getattr(config, limit), RECOMPILE_LIMIT))
        _COMPILED[model] = torch.compile(model, **OPTIONS)  # Inductor's default mode: no graphs, no autotuning
    return _COMPILED[model]


class _Recorded:
    """A CPU stand-in for a captured graph: replaying re-runs the recorded call on the same buffers and
    leaves its outputs in ``output``, where a graph's outputs are."""

    def __init__(self, function):
        self.function, self.output = function, None

    def replay(self):
        self.output = self.function()


def capture(function, pointers: list[torch.Tensor], pool, device: torch.device):
    """``function`` -- work on a cache that reads its inputs from buffers -- captured as a CUDA graph whose
    ``output`` is the function's, in the memory ``pool``; on a CPU, a `_Recorded` call. The function is first
    run eagerly on a side stream (allocations, workspaces, compilation), the cache's length ``pointers`` put
    back after each run; the recording does not run it, so they do not move."""
    if device.type != "cuda":
        return _Recorded(function)
    saved = [pointer.clone() for pointer in pointers]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        for _ in range(WARMUP_CALLS):
            function()
            for pointer, value in zip(pointers, saved):
                pointer.copy_(value)
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph, pool=pool):
        graph.output = function()
    return graph


def pads_safely(config) -> bool:
    """Whether padding a call's tokens leaves the real positions' outputs alone: not where the rotary
    embedding reads the call's largest position (``longrope`` switches its frequencies past the
    pretraining length, ``dynamic`` rescales them), which the padding would move."""
    parameters = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    per_layer_type = [value for value in parameters.values() if isinstance(value, dict)]
    kinds = {entry.get("rope_type", entry.get("type", "default")) for entry in per_layer_type or [parameters]}
    return not any(kind == "longrope" or "dynamic" in kind for kind in kinds)


class StaticModel:
    """``model`` decoding batch-one sequences over a static KV cache of ``max_length`` that it keeps between
    generations, each call on n new tokens one replayed CUDA graph on a GPU.

    ``start()`` empties the cache (in place) for a new generation and returns it; then call this object on
    the prompt and on the tokens that follow. ``features``: also return the hidden states a drafter reads,
    `Drafter.feature_layers` (`specbook.models.read_features`).
    """

    def __init__(self, model, max_length: int, compile: bool = False):
        self.model, self.max_length, self.compile = model, max_length, compile
        # its `specbook.decoder.Decoder` and a fixed-size `SlotCache` where it has one, else the model itself
        self.cache, self.eager = cache_and_forward(model, max_length, static=True)
        self.forward = compiled(self.eager) if compile else self.eager
        self.graphs = {}  # (n, features) -> (graph, its input buffer (1, n)); graph.output: (logits, features);
        # also ("prompt", bucket, keep, features) and ("chain", m, k, sampler, vocab), with their buffers
        self.pool = torch.cuda.graph_pool_handle() if model.device.type == "cuda" else None
        self.pads = pads_safely(model.config)
        self.fresh = True  # no call since `start`: the next one reads the prompt

    def start(self):
        """The cache, emptied for a new generation: every layer's length pointer back to zero, in place."""
        pointers = length_pointers(self.cache)
        if pointers:
            torch._foreach_zero_(pointers)  # one kernel for every layer
        if isinstance(self.cache, SlotCache):
            self.cache.known = 0
        self.fresh = True
        return self.cache

    def _call(self, input_ids, features, keep=None, forward=None, **tree):
        """``forward`` (by default this object's: the model, or its compiled forward) on ``input_ids`` (1, n)
        over the cache: logits (keep, vocab) at the positions ``keep`` (by default all n; an int: the last
        ones; a tensor: those indices), and the hidden states ``features`` names (n, .) or None. ``tree``: a
        token tree's mask and depths, for the decoder (`specbook.decoder.Decoder`)."""
        with self._moves(input_ids.shape[1]):  # a compiled call leaves the host's count alone
            outputs = (forward or self.forward)(input_ids, past_key_values=self.cache, use_cache=True,
                                                logits_to_keep=input_ids.shape[1] if keep is None else keep,
                                                output_hidden_states=features is not None, **tree)
        return outputs.logits[0], read_features(outputs, features)

    @contextmanager
    def _moves(self, advance: int):
        """The cache's length moves by ``advance`` inside the block, and the host's count of it (a `SlotCache`'s
        ``known``) with it, whatever Python ran there: a replay on a GPU runs none, a compiled call skips it,
        a warm-up or a capture runs it for a move that never happens (``advance`` 0)."""
        known = getattr(self.cache, "known", None)
        yield
        if isinstance(self.cache, SlotCache):
            self.cache.known = None if known is None else known + advance

    @property
    def replays(self) -> bool:
        """Whether calls replay graphs: on a GPU (or ``CAPTURE_ON_CPU``), once every layer of the cache holds
        its buffers (a layer allocates them on its first write: the first generation's prompt, read eagerly)."""
        capture = self.model.device.type == "cuda" or CAPTURE_ON_CPU
        return capture and (isinstance(self.cache, SlotCache) or all(layer.is_initialized
                                                                      for layer in self.cache.layers))

    def _graph(self, function):
        """``function`` -- work on this model's cache that reads its inputs from buffers -- captured (`capture`)."""
        with self._moves(0):  # warm-ups put the pointers back; a recording does not move them
            return capture(function, length_pointers(self.cache), self.pool, self.model.device)

    def _replay(self, graph, advance: int):
        """Replay ``graph``, which moves the cache's length by ``advance``."""
        with self._moves(advance):
            graph.replay()

    def __call__(self, input_ids: torch.Tensor, features: tuple | None = None, keep: int | None = None):
        """Logits (keep, vocab) of the last ``keep`` of ``input_ids`` (1, n) after the cache (by default all n),
        and the hidden states ``features`` names (n, .) or None.

        Advances the cache's pointers by n. A replayed graph's outputs are copied, safe to keep past the
        next call. Until the cache holds something (the first generation's prompt), calls run without a
        graph; the first call of a generation on several tokens is `_prompt`'s.
        """
        keep = input_ids.shape[1] if keep is None else keep
        if self.fresh and input_ids.shape[1] > 1:
            return self._prompt(input_ids, features, keep)
        self.fresh = False
        if not self.replays:
            logits, hidden = self._call(input_ids, features)
            return logits[-keep:], hidden
        key = (input_ids.shape[1], features)
        if key not in self.graphs:
            buffer = torch.zeros((1, key[0]), dtype=torch.long, device=self.model.device)
            self.graphs[key] = self._graph(lambda: self._call(buffer, features)), buffer
        graph, buffer = self.graphs[key]
        buffer.copy_(input_ids)
        self._replay(graph, key[0])
        logits, hidden = graph.output
        return logits[-keep:].clone(), (hidden.clone() if hidden is not None else None)

    def verify(self, pending: torch.Tensor, drafted: torch.Tensor, draft_probs, sampler, features=None,
               generator=None):
        """A chain's verification in one replay: the model on [pending (m,), drafted (k,)], the target's
        distributions and the accept decision (`specbook.rejection.chain_decision`), the random numbers of a
        sampled decision drawn from ``generator`` before the replay, as the chain's noise is. ``draft_probs``
        (k, width <= vocab) or None (one-hot drafts). Returns copies of the decision (2 + k,): [number
        accepted, next token, the drafts], of the target's distributions (k + 1, vocab) and of the hidden
        states ``features`` names (m + k, .) or None. Advances the length by m + k. Use it where `replays`,
        after a generation's first call."""
        m, k = len(pending), len(drafted)
        draft_probs = None if sampler.greedy else draft_probs  # greedily the decision needs no p
        key = ("verify", m, k, features, sampler, draft_probs is None)
        if key not in self.graphs:
            vocab = vocab_size(self.model)
            tokens = torch.zeros((1, m + k), dtype=torch.long, device=self.model.device)
            probs = None if draft_probs is None else torch.zeros((k, vocab), device=self.model.device,
                                                                  dtype=draft_probs.dtype)
            noise = None if sampler.greedy else (torch.zeros(k, device=self.model.device),
                                                 torch.ones((k + 1, vocab), device=self.model.device))

            def decide():
                logits, hidden = self._call(tokens, features)  # as the plain call's graph: one compilation
                drafts = tokens[0, m:]  # (k,)
                p = probs if probs is not None or sampler.greedy else one_hot(drafts, vocab)
                outcome, target_probs = chain_decision(logits[-k - 1:], drafts, p, sampler, noise=noise)
                return torch.cat([outcome, drafts]), target_probs, hidden
            self.graphs[key] = self._graph(decide), (tokens, probs, noise)
        graph, (tokens, probs, noise) = self.graphs[key]
        tokens[0, :m].copy_(pending)
        tokens[0, m:].copy_(drafted)
        if probs is not None:
            probs[:, : draft_probs.shape[1]].copy_(draft_probs)  # a narrower draft's rows stay zero
        if noise is not None:  # the order `chain_outcome` draws them in
            noise[0].uniform_(generator=generator)
            noise[1].exponential_(generator=generator)
        self._replay(graph, m + k)
        decision, target_probs, hidden = graph.output
        return decision.clone(), target_probs.clone(), (hidden.clone() if hidden is not None else None)

    def tree(self, input_ids: torch.Tensor, visible: torch.Tensor, depths: torch.Tensor, features=None):
        """A token tree's call: logits (n, vocab) of its rows ``input_ids`` (1, n) (root first) under the tree's
        mask ``visible`` (n, n) and ``depths`` (n,) (`specbook.trees.tree_shape`), and the hidden states
        ``features`` names (n, .) or None. Padded to the smallest of `TREE_BUCKETS` that holds the rows and
        replayed as that size's graph: a padding row sees itself only and no real row sees it, and the length
        moves back over the padding after. Eager where no bucket fits the tree or the room left in the cache.
        Advances the length by n."""
        self.fresh = False
        n = input_ids.shape[1]
        bucket = next((size for size in TREE_BUCKETS if size >= n), None)
        if (bucket is None or not self.replays or not isinstance(self.cache, SlotCache)
                or bucket > self.max_length - self.cache.get_seq_length()):
            return self._call(input_ids, features, forward=self.eager, tree=(visible, depths))
        key = ("tree", bucket, features)
        if key not in self.graphs:
            buffers = (torch.zeros((1, bucket), dtype=torch.long, device=self.model.device),
                       torch.zeros((bucket, bucket), dtype=torch.bool, device=self.model.device),
                       torch.zeros(bucket, dtype=torch.long, device=self.model.device))
            self.graphs[key] = self._graph(lambda: self._call(buffers[0], features, forward=self.eager,
                                                              tree=buffers[1:])), buffers
        graph, (tokens, mask, rows_depths) = self.graphs[key]
        tokens[:, :n].copy_(input_ids)
        tokens[:, n:].zero_()
        mask.zero_()
        mask.diagonal().fill_(True)
        mask[:n, :n].copy_(visible)
        rows_depths.fill_(1)
        rows_depths[:n].copy_(depths)
        self._replay(graph, bucket)
        rollback(self.cache, bucket - n)
        logits, hidden = graph.output
        return logits[:n].clone(), (hidden[:n].clone() if hidden is not None else None)

    def _prompt(self, input_ids, features, keep):
        """A generation's first call, on n tokens: padded at the end to the smallest of `PROMPT_BUCKETS` that
        holds them and replayed as that size's graph (the model's own kernels: a compilation per size would
        cost more than it saves), the pointers then moved back by the padding. Eager where no bucket fits
        the prompt or the cache, before the cache holds anything, or where padding would change the real
        positions (`pads_safely`)."""
        self.fresh = False
        n = input_ids.shape[1]
        bucket = next((size for size in PROMPT_BUCKETS if size >= n), None)
        if bucket is None or bucket > self.max_length or not self.pads or not self.replays:
            return self._call(input_ids, features, keep, forward=self.eager)
        key = ("prompt", bucket, keep, features)
        if key not in self.graphs:
            buffer = torch.zeros((1, bucket), dtype=torch.long, device=self.model.device)
            rows = torch.arange(keep, device=self.model.device)  # (keep,): which positions' logits
            self.graphs[key] = self._graph(lambda: self._call(buffer, features, rows, self.eager)), buffer, rows
        graph, buffer, rows = self.graphs[key]
        buffer[:, :n].copy_(input_ids)
        buffer[:, n:].zero_()  # any token: no real position attends to it
        torch.arange(n - keep, n, device=rows.device, out=rows)  # on the device: no copy from the host
        self._replay(graph, bucket)
        rollback(self.cache, bucket - n)
        logits, hidden = graph.output
        return logits.clone(), (hidden[:n].clone() if hidden is not None else None)

    def chain(self, pending: torch.Tensor, k: int, sampler, vocab: int, generator=None):
        """Draft k tokens after ``pending`` (m,) in one replay, as a drafting loop would call the model k times:
        on the pending tokens, then on each drafted token. Token i is drawn from ``sampler.probs`` of the
        last position's logits (narrowed to ``vocab``): its argmax greedily, else the exponential race
        (`specbook.sampling.exponential_race`) on noise (k, vocab) drawn from ``generator`` before the
        replay, the one kernel outside the graph. SGLang captures EAGLE's draft loop the same way.

        Returns copies of the tokens (k,) and their distributions (k, vocab); advances the pointers by
        m + k - 1 (the k-th token is drawn, not fed). Use it where `replays`.
        """
        self.fresh = False
        key = ("chain", len(pending), k, sampler, vocab)
        if key not in self.graphs:
            buffer = torch.zeros((1, len(pending)), dtype=torch.long, device=self.model.device)
            noise = None if sampler.greedy else torch.ones((k, vocab), device=self.model.device)

            def drafts():
                inputs, tokens, probs = buffer, [], []
                for i in range(k):
                    step_probs = sampler.probs(self._call(inputs, None)[0][-1, :vocab])  # (vocab,)
                    token = step_probs.argmax(-1) if noise is None else exponential_race(step_probs, noise[i])
                    tokens.append(token)
                    probs.append(step_probs)
                    inputs = token.view(1, 1)
                return torch.stack(tokens), torch.stack(probs)  # (k,), (k, vocab)
            self.graphs[key] = self._graph(drafts), buffer, noise
        graph, buffer, noise = self.graphs[key]
        buffer.copy_(pending[None])
        if noise is not None:
            noise.exponential_(generator=generator)
        self._replay(graph, len(pending) + k - 1)
        tokens, probs = graph.output
        return tokens.clone(), probs.clone()


def prefill(model, cache, input_ids, features=None, runner=None):
    """Feed all prompt tokens but the last into the empty ``cache``; return the last as pending (1,).

    With ``features`` (`Drafter.feature_layers`), also return the hidden states it names at those T - 1
    positions (None for a one-token prompt). ``runner``: the
    model's `StaticModel` where ``cache`` is its (the call is then its first: a prompt's graph).
    """
    context, hidden = input_ids[:, :-1], None
    if context.shape[1] and isinstance(runner, StaticModel):
        hidden = runner(context, features, keep=1)[1]
    elif context.shape[1]:
        outputs = forward_over(model, cache)(context, past_key_values=cache, use_cache=True, logits_to_keep=1,
                                             output_hidden_states=features is not None)
        hidden = read_features(outputs, features)  # (T - 1, .) or None
    return input_ids[0, -1:], hidden


_MODELS = weakref.WeakKeyDictionary()  # model -> {(max_length, role, compile, decoder): StaticModel}


def static_model(model, max_length: int, role: str = "target", compile: bool = False) -> StaticModel:
    """The `StaticModel` of ``model`` for caches of ``max_length`` in ``role`` ("target" or "draft": a model
    that drafts for itself needs two caches at once), made on first use and kept with the model, so that a
    later generation replays the graphs an earlier one captured."""
    per_model = _MODELS.setdefault(model, {})
    key = (max_length, role, compile, decoder_for(model) is not None)  # `hugging_face_forward` gets its own
    if key not in per_model:
        per_model[key] = StaticModel(model, max_length, compile)
    return per_model[key]

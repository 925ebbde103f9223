"""Decode steps compiled with ``torch.compile``: fused kernels, replayed as CUDA graphs on a GPU.

On a GPU a batch-of-one decode step moves little data and does little arithmetic, so its time
goes to the host: the Python of the model's forward and hundreds of kernel launches, a few
milliseconds for a small model -- more than the GPU's work itself. Compiling the forward with
Inductor fuses the kernels, and ``mode="reduce-overhead"`` records each step as a CUDA graph
that the host replays with a single launch. A graph replays fixed shapes at fixed addresses: it
needs a static KV cache whose length pointer lives on the device (`specbook.cache`), so that
neither a decode step nor a rollback changes any shape. Each input length (1 or 2 tokens for a
draft step, K + 1 for a verification) is compiled once, on first use; the prompt's prefill
runs uncompiled.

On a CPU the same call compiles the forward to C++ kernels (no graphs), which tests that the
code paths trace without a graph break.
"""

import torch

OPTIONS = dict(fullgraph=True, dynamic=False)  # one graph per input shape, no silent fallback to Python
# Every model and every input length is one more compilation of the same forward; a benchmark over
# K = 1..8 with a target, a draft and autoregressive decoding needs a few dozen, past torch's default of 8.
RECOMPILE_LIMIT = 64
_COMPILED = {}  # model -> its compiled forward


def compiled(model):
    """``model`` compiled for decoding (memoised per model): call it like the model.

    Outputs of a CUDA graph are overwritten by its next replay: use the logits of a step before
    the next step runs (the engine turns them into probabilities at once).
    """
    if model not in _COMPILED:
        config = torch._dynamo.config
        limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"  # its older name
        setattr(config, limit, max(getattr(config, limit), RECOMPILE_LIMIT))
        mode = "reduce-overhead" if model.device.type == "cuda" else None
        _COMPILED[model] = torch.compile(model, mode=mode, **OPTIONS)
    step = _COMPILED[model]

    def forward(*args, **kwargs):
        torch.compiler.cudagraph_mark_step_begin()  # the previous step's outputs are no longer read
        return step(*args, **kwargs)
    return forward

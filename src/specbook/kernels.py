"""Counting the kernels a call launches, without a GPU.

At batch one a small model's decode call on a GPU costs about its number of kernels times the cost of one
(about 1.8 microseconds each in a replayed CUDA graph on an H100): the count, not the arithmetic, sets the
time. `count_kernels` counts the operators a call dispatches on whatever device it runs, under inference
mode as the engine runs them, which are the kernels a CUDA graph of the call holds, up to fusion: views and
allocations launch nothing and are not counted, and an RMSNorm written as one call (``F.rms_norm``, one fused
kernel on a GPU, several operators on a CPU) counts once. Hugging Face's Llama writes its RMSNorm out in
eight operators, which count as eight, as they launch on a GPU.

`call_kernels` counts one decode call over the cache and forward the engine uses, and `gpu_prediction` turns
counts into a GPU's milliseconds: a prediction, to be read as one, until a run on the GPU replaces it.
"""

from collections import Counter
from contextlib import ExitStack, contextmanager
from unittest import mock

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack, _pop_mode_temporarily
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

NO_KERNEL = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default,  # allocations
             torch.ops.aten.empty_like.default, torch.ops.aten.lift_fresh.default,
             torch.ops.aten._unsafe_view.default}  # a view that autograd does not track
FUSED = {F.rms_norm, torch.rms_norm}  # one kernel on a GPU


class _Operators(TorchDispatchMode):
    """The count (module docstring), in all (``count``), per operator (``names``) and per part (``parts``: what
    ran while ``part`` held that name; "outside" unless the caller names another)."""

    def __init__(self):
        super().__init__()
        self.count, self.names, self.parts, self.part, self.muted = 0, Counter(), Counter(), "outside", False

    def add(self, name: str) -> None:
        self.count += 1
        self.names[name] += 1
        self.parts[self.part] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.muted and not func.is_view and func not in NO_KERNEL:
            self.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


class _Fused(TorchFunctionMode):
    def __init__(self, operators):
        super().__init__()
        self.operators = operators

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func not in FUSED or self.operators.muted:
            return func(*args, **(kwargs or {}))
        self.operators.add("rms_norm")
        self.operators.muted = True
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.operators.muted = False


@contextmanager
def counting():
    """The kernels dispatched while it is open, counted as `count_kernels` counts them: yields the counter, whose
    ``part`` the caller may set to attribute what follows to a part (`specbook.profile.host_profile` splits a
    generation's kernels between the target's calls, the draft's and the engine's)."""
    operators = _Operators()
    with _Fused(operators), operators:
        yield operators


@contextmanager
def paused():
    """Nothing counted while it lasts: the counting modes off torch's stacks (compiled code refuses to run under
    them)."""
    with ExitStack() as stack:
        stack.enter_context(_disable_current_modes())
        if any(isinstance(mode, _Fused) for mode in _get_current_function_mode_stack()):
            stack.enter_context(_pop_mode_temporarily())
        yield


def count_kernels(function, *args, by_name: bool = False, excluding=(), **kwargs):
    """The kernels ``function(*args, **kwargs)`` launches (see the module docstring); with ``by_name``, also a
    dict of counts per operator. ``excluding``: (owner, attribute name) pairs, functions whose kernels are not
    counted while they run (the model calls, to count an engine's own work). The function runs once."""
    with ExitStack() as stack:
        stack.enter_context(torch.inference_mode())
        operators = stack.enter_context(counting())
        for owner, name in excluding:
            stack.enter_context(mock.patch.object(owner, name, _uncounted(operators, getattr(owner, name))))
        function(*args, **kwargs)
    return (operators.count, dict(operators.names)) if by_name else operators.count


def _uncounted(operators, function):
    def run(*args, **kwargs):
        outer, operators.muted = operators.muted, True
        try:
            return function(*args, **kwargs)
        finally:
            operators.muted = outer
    return run


@torch.inference_mode()
def call_kernels(model, input_ids, positions: int = 1, static: bool = True, by_name: bool = False):
    """The kernels one decode call of ``model`` launches on the last ``positions`` tokens of ``input_ids`` (1, T),
    the ones before them in its cache, over the cache and forward the engine uses (``static``: the GPU path's);
    with ``by_name``, also a dict of counts per operator (`count_kernels`)."""
    from .decoder import cache_and_forward

    if not 1 <= positions < input_ids.shape[1]:
        raise ValueError(f"positions must be in [1, {input_ids.shape[1] - 1}] for a prompt of {input_ids.shape[1]} "
                         f"tokens (got {positions})")
    cache, forward = cache_and_forward(model, input_ids.shape[1], static)
    forward(input_ids[:, :-positions], past_key_values=cache, use_cache=True, logits_to_keep=1)
    return count_kernels(forward, input_ids[:, -positions:], past_key_values=cache, use_cache=True,
                         logits_to_keep=positions, by_name=by_name)


def gpu_prediction(target, draft, input_ids, us_per_kernel: float, tokens_per_call: dict, new_tokens: int = 64,
                   engine_kernels: float = 5, idle_ms: float = 0.0) -> dict:
    """A GPU's time a token predicted from kernel counts (chapter 4, §4.12). At batch one, with every call a
    replayed graph, a small model's call costs about its kernels times the cost of one, ``us_per_kernel`` (measured
    on that GPU), its weights' reading a small addition left out. Autoregressive decoding: one target call a token,
    and the prompt's call (a graph as well) spread over ``new_tokens``. Speculative decoding at each K of
    ``tokens_per_call`` {K: E}: the target's call on K + 1 positions, K draft calls, the engine's own
    ``engine_kernels`` a step and ``idle_ms`` a step with the device waiting for the host, over the E tokens a step
    writes. Kernels are counted here, on the engine's static-cache path (`call_kernels`). Returns the counts and,
    per K, ms a token and the speedup over the predicted autoregressive decoding."""
    ms = us_per_kernel / 1000
    target_call, draft_call = call_kernels(target, input_ids), call_kernels(draft, input_ids)
    ar_ms = target_call * ms * (1 + 1 / new_tokens)
    rows = {}
    for k, tokens in tokens_per_call.items():
        verification = call_kernels(target, input_ids, k + 1)
        step = (verification + k * draft_call + engine_kernels) * ms + idle_ms
        per_token = step / tokens + target_call * ms / new_tokens
        rows[k] = {"tokens_per_call": tokens, "verification_kernels": verification, "step_ms": step,
                   "ms_per_token": per_token, "speedup": ar_ms / per_token}
    return {"target_kernels": target_call, "draft_kernels": draft_call, "ar_ms": ar_ms, "speculative": rows}

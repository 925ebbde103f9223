"""Counting the kernels a call launches, without a GPU.

At batch one a small model's decode call on a GPU costs about its number of kernels times the cost of one
(about 1.8 microseconds each in a replayed CUDA graph on an H100): the count, not the arithmetic, sets the
time. `count_kernels` counts the operators a call dispatches on whatever device it runs, under inference
mode as the engine runs them, which are the kernels a CUDA graph of the call holds, up to fusion: views and
allocations launch nothing and are not counted, and an RMSNorm written as one call (``F.rms_norm``, one fused
kernel on a GPU, several operators on a CPU) counts once. Hugging Face's Llama writes its RMSNorm out in
eight operators, which count as eight, as they launch on a GPU.
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

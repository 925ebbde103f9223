"""Counting the kernels a call launches, without a GPU.

At batch one a small model's decode call on a GPU costs about its number of kernels times the cost of one
(about 1.8 microseconds each in a replayed CUDA graph on an H100): the count, not the arithmetic, sets the
time. `count_kernels` counts the operators a call dispatches on whatever device it runs, under inference
mode as the engine runs them, which are the kernels a CUDA graph of the call holds, up to fusion: views and
allocations launch nothing and are not counted, and an RMSNorm written as one call (``F.rms_norm``, one fused
kernel on a GPU, several operators on a CPU) counts once. Hugging Face's Llama writes its RMSNorm out in
eight operators, which count as eight, as they launch on a GPU.
"""

from contextlib import ExitStack
from unittest import mock

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

NO_KERNEL = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default,  # allocations
             torch.ops.aten.empty_like.default, torch.ops.aten.lift_fresh.default,
             torch.ops.aten._unsafe_view.default}  # a view that autograd does not track
FUSED = {F.rms_norm, torch.rms_norm}  # one kernel on a GPU


class _Operators(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count, self.names, self.muted = 0, {}, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.muted and not func.is_view and func not in NO_KERNEL:
            self.count += 1
            name = func.overloadpacket.__name__
            self.names[name] = self.names.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


class _Fused(TorchFunctionMode):
    def __init__(self, operators):
        super().__init__()
        self.operators = operators

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func not in FUSED or self.operators.muted:
            return func(*args, **(kwargs or {}))
        self.operators.count += 1
        self.operators.names["rms_norm"] = self.operators.names.get("rms_norm", 0) + 1
        self.operators.muted = True
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.operators.muted = False


def count_kernels(function, *args, by_name: bool = False, excluding=(), **kwargs):
    """The kernels ``function(*args, **kwargs)`` launches (see the module docstring); with ``by_name``, also a
    dict of counts per operator. ``excluding``: (owner, attribute name) pairs, functions whose kernels are not
    counted while they run (the model calls, to count an engine's own work). The function runs once."""
    operators = _Operators()
    with ExitStack() as stack:
        for owner, name in excluding:
            stack.enter_context(mock.patch.object(owner, name, _uncounted(operators, getattr(owner, name))))
        stack.enter_context(torch.inference_mode())
        stack.enter_context(_Fused(operators))
        stack.enter_context(operators)
        function(*args, **kwargs)
    return (operators.count, operators.names) if by_name else operators.count


def _uncounted(operators, function):
    def run(*args, **kwargs):
        outer, operators.muted = operators.muted, True
        try:
            return function(*args, **kwargs)
        finally:
            operators.muted = outer
    return run

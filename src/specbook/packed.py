"""Linear layers with their weights packed once, for a faster verification call on the CPU.

Chapter 3's roofline says that at batch one a decoding step reads every weight once, so verifying
K + 1 positions should cost little more than decoding one: the extra rows are arithmetic on
weights already read. On a CPU that depends on the matrix library. PyTorch sends ``nn.Linear`` to
a BLAS (MKL on x86), whose kernels for a few rows re-arrange ("pack") the weight matrix into the layout
its inner loop wants on every call. oneDNN, the library behind PyTorch's CPU convolutions and
``torch.compile``'s frozen CPU graphs, can pack a weight matrix once, ahead of time, and then
multiply by it without repacking. For one row the BLAS does not pack at all -- it multiplies a
vector by the matrix as it lies -- and its call costs less than oneDNN's. On two cores of an AMD EPYC,
per layer of the built-in target (medians of 2000 calls, microseconds):

    layer (in -> out)   one row: BLAS / packed   six rows: BLAS / packed
    256 -> 256                   9 / 33                   22 / 38
    256 -> 768                  25 / 42                   69 / 53
    768 -> 256                  21 / 40                   52 / 51
    256 -> 2048 (head)          60 / 60                  144 / 88

On two cores of an Intel Xeon (AVX-512, no AMX), the same layers (one row, then six; microseconds):

    layer (in -> out)   one row: BLAS / packed   six rows: BLAS / packed
    256 -> 768                  12 / 29                   24 / 40
    256 -> 256                   6 / 23                    8 / 26
    256 -> 1536                 23 / 31                   44 / 41
    768 -> 256                  11 / 37                   21 / 32
    256 -> 2048 (head)          23 / 36                   49 / 45

There packing slows four of the five shapes: whether it pays is a property of the CPU. So `load_pair`
packs only a target that `specbook.decoder` does not serve (a model that keeps Hugging Face's forward);
the decoder's gain, a few operators a layer instead of dozens, does not depend on the matrix library.

So a `PackedLinear` sends one row to the BLAS and several to its packed weights: autoregressive
decoding's calls keep the BLAS's speed, and verification gets oneDNN's, which pays on the larger
layers and costs a little on the smallest (a finer rule would time both per shape). Packing every
call instead slowed the built-in target's autoregressive decoding by a fifth on that machine (17.9
against 14.7 ms per token), a slower baseline that would flatter every speedup measured against it.
`pack_linears` swaps every ``nn.Linear`` of a model for a `PackedLinear`.

It changes the arithmetic's order, not the model: logits agree with the unpacked model to float32
rounding (1e-5 on logits of order 10), and speculative decoding on a packed target still equals
autoregressive decoding on the same packed target token for token (both are tested). It pays
where a layer's weights come from memory rather than the cache: the built-in target gains, while
its one-layer draft, whose weights stay in the cache between its calls, is faster as it is, so
`load_pair` packs the target only (where it packs at all) -- for every method alike, autoregressive
decoding and Hugging Face's assisted generation included.
"""

import torch
import torch.nn.functional as F


def can_pack(model: torch.nn.Module) -> bool:
    """Whether `pack_linears` applies: PyTorch has oneDNN, and ``model`` is on the CPU in float32 or bfloat16."""
    parameter = next(model.parameters())
    return (torch.backends.mkldnn.is_available() and parameter.device.type == "cpu"
            and parameter.dtype in (torch.float32, torch.bfloat16))


class PackedLinear(torch.nn.Module):
    """``nn.Linear`` whose weight oneDNN packed once, for inputs of several rows; one row goes to the BLAS's
    matrix-vector product on the weight as it is. ``weight`` stays, for that and for code that reads it
    (tied LM heads)."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias  # (out, in), (out,) or None
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)  # opaque layout

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        if x.dtype != self.weight.dtype or not x.is_cpu:
            raise ValueError(f"this layer was packed for {self.weight.dtype} on the CPU and got {x.dtype} on "
                             f"{x.device}: pack the model after moving it, not before")
        if x.numel() == self.in_features:  # one row: a decoding step's call
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def pack_linears(model: torch.nn.Module) -> torch.nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (in place) by a `PackedLinear`; return ``model``.

    Linear subclasses (quantized or adapter layers) and other layers (GPT-2's ``Conv1D``) stay as
    they are. Memory grows by the packed copies. Pack after moving the model: a packed layer refuses
    inputs of another device or dtype.
    """
    if not can_pack(model):
        parameter = next(model.parameters())
        raise ValueError(f"pack_linears needs a model on the CPU in float32 or bfloat16 and a PyTorch built with "
                         f"oneDNN (got {parameter.dtype} on {parameter.device}; oneDNN "
                         f"{'available' if torch.backends.mkldnn.is_available() else 'missing'})")
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(module, name, PackedLinear(child))
    return model


def is_packed(model: torch.nn.Module) -> bool:
    """Whether any linear layer of ``model`` is a `PackedLinear` (`specbook.models.load_pair` packs a CPU target)."""
    return any(isinstance(module, PackedLinear) for module in model.modules())

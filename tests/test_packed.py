"""Packed linear layers (specbook.packed): the same model to float32 rounding, exact decoding on every family."""

import copy

import pytest
import torch

from specbook import Sampler, autoregressive_generate, speculative_generate
from specbook.drafters import TopKTreeDrafter
from specbook.models import weight_bytes
from specbook.packed import PackedLinear, can_pack, pack_linears

from families import FAMILIES, VOCAB, hf_greedy, tiny_family_model
from support import BATCH, chi_square_p_value, tiny_model

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="PyTorch built without oneDNN")
PROMPT = torch.randint(3, VOCAB, (1, 12), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_packed_model_is_the_same_model_and_decodes_exactly(family):
    model = tiny_family_model(family)
    packed = pack_linears(copy.deepcopy(model))
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    assert sum(isinstance(m, PackedLinear) for m in packed.modules()) == len(linears)  # GPT-2's Conv1D: none
    assert packed.state_dict().keys() == model.state_dict().keys()
    assert weight_bytes(packed) == weight_bytes(model)
    with torch.no_grad():
        torch.testing.assert_close(packed(PROMPT).logits, model(PROMPT).logits, atol=1e-4, rtol=1e-4)
        reference = hf_greedy(packed, PROMPT, 16)
    draft = tiny_family_model(family, seed=1, layers=1)
    greedy = Sampler(0)
    assert autoregressive_generate(packed, PROMPT, 16, greedy).token_ids == reference
    assert speculative_generate(packed, draft, PROMPT, 16, k=3, sampler=greedy).token_ids == reference
    assert speculative_generate(packed, TopKTreeDrafter(draft, (2, 2)), PROMPT, 16, k=3,
                                sampler=greedy).token_ids == reference


def test_sampling_with_a_packed_target_follows_the_target(tiny_pair):
    target, draft = tiny_pair
    assert chi_square_p_value(pack_linears(copy.deepcopy(target)), draft, Sampler(1.0), batch=BATCH) > 1e-3


def test_packing_refuses_what_it_cannot_pack():
    model = tiny_model()
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        pack_linears(copy.deepcopy(model).half())
    packed = pack_linears(copy.deepcopy(model))
    assert can_pack(model) and not can_pack(copy.deepcopy(model).half())
    layer = next(m for m in packed.modules() if isinstance(m, PackedLinear))
    with pytest.raises(ValueError, match="pack the model after moving it"):
        layer(torch.ones(1, layer.in_features, dtype=torch.float64))


def test_one_row_goes_to_the_blas_and_several_to_the_packed_weights():
    layer = torch.nn.Linear(24, 40)
    packed = PackedLinear(layer)
    one, several = torch.randn(1, 1, 24), torch.randn(1, 6, 24)
    with torch.no_grad():
        assert torch.equal(packed(one), torch.nn.functional.linear(one, layer.weight, layer.bias))
        assert torch.equal(packed(several), torch.ops.mkldnn._linear_pointwise(several, packed.packed, layer.bias,
                                                                                "none", [], ""))
        torch.testing.assert_close(packed(several), layer(several))

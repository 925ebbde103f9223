"""Tests for specbook.train: the pieces that decide what the shipped pair is."""

import pytest
import torch

from specbook.train import grow

from support import tiny_model


def test_grow_keeps_the_function_and_the_old_layers():
    """Net2DeeperNet: the inserted layers start as identities, so the deeper model predicts exactly the same."""
    shallow = tiny_model(num_layers=2, seed=0).eval()
    deeper = grow(shallow, tiny_model(num_layers=4, seed=1)).eval()  # old layers at 0 and 2
    prompt = torch.tensor([[1, 5, 2, 7, 3, 3, 9]])
    with torch.no_grad():
        torch.testing.assert_close(deeper(prompt).logits, shallow(prompt).logits, rtol=0, atol=1e-6)
    torch.testing.assert_close(deeper.model.layers[2].mlp.up_proj.weight, shallow.model.layers[1].mlp.up_proj.weight)
    assert not deeper.model.layers[1].mlp.down_proj.weight.any()  # the new one, still an identity
    assert deeper.model.layers[1].mlp.up_proj.weight.any()  # but trainable: its gradient is not zero


def test_grow_refuses_a_shallower_model():
    with pytest.raises(ValueError, match="fewer than"):
        grow(tiny_model(num_layers=3), tiny_model(num_layers=2))

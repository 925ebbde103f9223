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


def test_copy_losses_tell_a_copying_model_from_one_that_does_not():
    """A model that reads the previous copy (a lookup table shifted by the passage length) wins on the second copy."""
    from specbook.train import copy_losses

    class Copier(torch.nn.Module):  # from position length - 1 on, predicts token t + 1 as token t + 1 - length
        def __init__(self, vocab, length):
            super().__init__()
            self.vocab, self.length = vocab, length

        def forward(self, input_ids):
            logits = torch.zeros(*input_ids.shape, self.vocab)
            earlier = input_ids[:, : input_ids.shape[1] - self.length + 1]  # what followed the earlier twin
            logits[:, self.length - 1 :].scatter_(-1, earlier[..., None], 20.0)
            return type("Output", (), {"logits": logits})

    tokens = torch.randint(0, 50, (1000,), generator=torch.Generator().manual_seed(0))
    first, second = copy_losses(Copier(50, 20), tokens, passages=4, length=20)
    assert second < 0.01 < first
    first, second = copy_losses(tiny_model(vocab_size=50), tokens, passages=4, length=20)
    assert second == pytest.approx(first, abs=0.2)

"""Tests for specbook.train: the pieces that decide what the shipped pair is."""

import json
import shutil

import pytest
import torch

from specbook.train.loop import TrainConfig, batches, lr_at
from specbook.train.models import blend, grow

from support import tiny_model, training_folders


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
    from specbook.train.loop import copy_losses

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


def test_batches_repeat_random_sequences_and_copy_passages():
    """repeat_rate: whole windows of one random sequence written again and again; copy_rate: a passage of
    at least 16 tokens written again later in the window, also when the window is short."""
    tokens = torch.arange(20_000) % 997  # text in which no token repeats within a window
    config = TrainConfig(steps=1, batch_size=64, block_size=128, copy_rate=1.0, repeat_rate=0.5)
    inputs, targets = next(batches(tokens, config, torch.Generator().manual_seed(0)))
    assert inputs.shape == targets.shape == (64, 128)
    torch.testing.assert_close(inputs[:, 1:], targets[:, :-1])
    windows = torch.cat([inputs, targets[:, -1:]], 1)
    periodic = [any(torch.equal(row[period:], row[:-period]) for period in range(8, 33)) for row in windows]
    assert 16 <= sum(periodic) <= 48  # about half
    for row, repeats in zip(windows, periodic):
        if not repeats:
            assert len(row) - len(row.unique()) >= 16  # the copied passage


def test_learning_rate_warms_up_then_decays_to_final_lr():
    decaying = TrainConfig(steps=100, lr=1.0, warmup=10)
    constant = TrainConfig(steps=100, lr=1.0, warmup=10, final_lr=1.0)
    assert lr_at(0, decaying) == pytest.approx(0.1) and lr_at(9, decaying) == pytest.approx(1.0)
    assert lr_at(99, decaying) == pytest.approx(0.1, abs=1e-3)
    assert all(lr_at(step, constant) == pytest.approx(1.0) for step in range(9, 100))


def test_copy_stage_trains_the_target_on_and_records_its_phases(tmp_path):
    from specbook.train.card import _phases
    from specbook.train.cli import main
    from specbook.train.models import load_trained

    out, work = training_folders(tmp_path)
    tiny_model(vocab_size=2048, seed=2).save_pretrained(out / "target")
    earlier = {"step": 3, "seconds": 60.0, "grown_from": {"layers": 1, "step": 1, "seconds": 30.0}}
    (out / "target" / "training.json").write_text(json.dumps(earlier))
    before = load_trained(out / "target", "cpu").model.layers[0].mlp.up_proj.weight.clone()
    main(["--work", str(work), "--out", str(out), "--stages", "copy", "--copy-steps", "2", "--anneal-steps", "2",
          "--device", "cpu", "--target-lr-scale", "0.5", "--ckpt-every", "1"])
    meta = json.loads((out / "target" / "training.json").read_text())
    assert meta["copy"]["induction"]["config"]["lr"] == 3e-4 and meta["copy"]["anneal"]["config"]["lr"] == 1.5e-4
    assert meta["copy"]["induction"]["config"]["ckpt_every"] == 1
    assert meta["copy"]["induction"]["step"] == meta["copy"]["anneal"]["step"] == 2
    assert meta["copy"]["induction"]["config"]["repeat_rate"] == 0.5 and len(meta["copy"]["copy_losses"]) == 2
    assert meta["step"] == 3 and meta["grown_from"] == earlier["grown_from"]  # the earlier phases' record stays
    assert "then the `copy` stage: 2 steps" in _phases(meta)
    assert meta["copy"]["mix"] == 0.8 and "blended" in _phases(meta)
    after = load_trained(out / "target", "cpu").model.layers[0].mlp.up_proj.weight
    assert not torch.equal(before.half().float(), after)

    # --copy-mix 0 blends all the way back: the stage's training leaves no trace in the weights
    shutil.rmtree(work / "ckpt-target-induction")
    shutil.rmtree(work / "ckpt-target-anneal")
    tiny_model(vocab_size=2048, seed=2).save_pretrained(out / "target")
    (out / "target" / "training.json").write_text(json.dumps(earlier))
    main(["--work", str(work), "--out", str(out), "--stages", "copy", "--copy-steps", "2", "--anneal-steps", "2",
          "--copy-mix", "0", "--device", "cpu"])
    torch.testing.assert_close(load_trained(out / "target", "cpu").model.layers[0].mlp.up_proj.weight,
                               before.half().float(), rtol=0, atol=0)


def test_blend_interpolates_weights_and_checks_mix():
    before, after = {"w": torch.zeros(3)}, {"w": torch.tensor([1.0, 2.0, 4.0])}
    torch.testing.assert_close(blend(before, after, 0.25)["w"], torch.tensor([0.25, 0.5, 1.0]))
    torch.testing.assert_close(blend(before, after, 1.0)["w"], after["w"])
    for mix in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"mix must be in \[0, 1\]"):
            blend(before, after, mix)


@pytest.mark.parametrize("option, value, message", [
    ("--copy-mix", "1.5", "--copy-mix must be in [0, 1], got 1.5"),
    ("--target-lr-scale", "0", "--target-lr-scale must be > 0, got 0.0"),
    ("--ckpt-every", "0", "--ckpt-every must be >= 1, got 0"),
    ("--pard-corpus", "-1", "--pard-corpus must be >= 0 and needs --pard-greedy > 0, got -1"),
])
def test_options_out_of_range_are_usage_errors(capsys, option, value, message):
    from specbook.train.cli import main

    with pytest.raises(SystemExit):
        main(["--stages", "card", option, value])
    assert message in capsys.readouterr().err


def test_corpus_windows_need_greedy_ones(capsys):
    """--pard-corpus mixes corpus windows into the target's greedy ones; without those it is a usage error."""
    from specbook.train.cli import main

    with pytest.raises(SystemExit):
        main(["--stages", "card", "--pard-corpus", "8", "--pard-greedy", "0"])
    assert "--pard-corpus must be >= 0 and needs --pard-greedy > 0, got 8 with --pard-greedy 0" in capsys.readouterr().err

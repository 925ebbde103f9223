"""Tests for specbook.train.greedy: the target's greedy text, and the built-in draft's distillation on it."""

import json

import pytest
import torch

from specbook import Sampler, autoregressive_generate
from specbook.train.greedy import corpus_windows, distill_on_greedy, greedy_agreement, greedy_windows
from specbook.train.loop import TrainConfig

from support import tiny_model, training_folders


def test_greedy_windows_are_the_targets_continuations():
    target = tiny_model(seed=0)
    windows = greedy_windows(target, torch.randint(0, 64, (100,), generator=torch.Generator().manual_seed(0)), 3, 12,
                             prefix=4, batch=2)
    assert windows.shape == (3, 12)
    for row in windows:
        assert autoregressive_generate(target, row[None, :4], 8, Sampler(0)).token_ids == row[4:].tolist()


def test_corpus_windows_are_stretches_of_the_corpus():
    tokens = torch.arange(100)
    windows = corpus_windows(tokens, 5, 12, seed=3)
    assert windows.shape == (5, 12)
    for row in windows:  # consecutive ids: one stretch of the corpus each
        assert row.tolist() == list(range(int(row[0]), int(row[0]) + 12))
    assert torch.equal(windows, corpus_windows(tokens, 5, 12, seed=3))  # reproducible from its seed


def test_greedy_agreement_scores_the_continuation_only():
    target = tiny_model(seed=0)
    windows = greedy_windows(target, torch.randint(0, 64, (200,), generator=torch.Generator().manual_seed(1)), 4, 16,
                             prefix=6)
    assert greedy_agreement(target, target, windows, 6) == {"agreement": 1.0, "kl_to_target": 0.0}
    other = tiny_model(seed=5)
    scored = greedy_agreement(other, target, windows, 6)
    logits = other(windows).logits[:, 5:-1]  # the positions whose next token is the target's greedy one
    assert scored["agreement"] == round((logits.argmax(-1) == windows[:, 6:]).float().mean().item(), 4)
    assert scored["kl_to_target"] > 0


def test_distill_on_greedy_refuses_a_prefix_outside_the_window(tmp_path):
    with pytest.raises(ValueError, match=r"prefix must be in \[1, block_size - 1\] = \[1, 15\], got 16"):
        distill_on_greedy(tiny_model(), tiny_model(), torch.arange(64), torch.arange(64),
                          TrainConfig(steps=1, block_size=16), tmp_path, "cpu", 2, 1, prefix=16)


def test_greedy_stage_distils_draft_corpus_into_the_pairs_draft(tmp_path):
    from specbook.train.cli import main
    from specbook.train.models import load_trained

    out, work = training_folders(tmp_path)
    tiny_model(vocab_size=2048, seed=2).save_pretrained(out / "target")
    tiny_model(vocab_size=2048, hidden_size=16, num_layers=1, seed=3).save_pretrained(out / "draft-corpus")
    main(["--work", str(work), "--out", str(out), "--stages", "greedy", "--greedy-steps", "2", "--greedy-windows", "3",
          "--greedy-corpus", "2", "--batch-size", "2", "--device", "cpu"])
    meta = json.loads((out / "draft" / "training.json").read_text())
    assert meta["step"] == 2 and meta["init"] == "draft-corpus" and meta["distilled"]
    assert (meta["greedy_windows"], meta["corpus_windows"], meta["config"]["seed"]) == (3, 2, 12)
    assert set(meta["start"]) == set(meta["log"][-1]) - {"step", "train_loss"} == {"agreement", "kl_to_target"}
    before, after = (load_trained(out / name, "cpu").lm_head.weight for name in ("draft-corpus", "draft"))
    assert not torch.equal(before, after)  # trained, and saved beside the draft it started from


@pytest.mark.parametrize("options, message", [
    (["--greedy-windows", "0"], "--greedy-windows must be >= 1 and --greedy-corpus >= 0, got 0 and 1024"),
    (["--greedy-corpus", "-1"], "--greedy-windows must be >= 1 and --greedy-corpus >= 0, got 4096 and -1"),
])
def test_greedy_options_out_of_range_are_usage_errors(capsys, options, message):
    from specbook.train.cli import main

    with pytest.raises(SystemExit):
        main(["--stages", "card", *options])
    assert message in capsys.readouterr().err

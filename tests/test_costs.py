"""The cost probe (specbook.costs): the real pairs' shapes, the probe at a reduced size, its file and its errors.

Timings on a shared CPU say nothing about speed; these tests check the wiring, the shapes and the formulas.
"""

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from specbook import costs, theory
from specbook.cli import main
from specbook.gpu import write_results

SMALL = dict(scale=32, k_max=2, repeats=2, context=8, progress=False)  # seconds on one CPU thread


@pytest.fixture(scope="module")
def probe():
    return costs.cost_probe(["llama-3.1-8b"], **SMALL)


@pytest.mark.parametrize("name, parameters", [
    ("Llama-3.1-8B", 8.03e9), ("Llama-3.2-1B", 1.24e9), ("Qwen2.5-7B", 7.62e9), ("Qwen2.5-0.5B", 0.494e9)])
def test_the_configs_have_the_published_sizes(name, parameters):
    with torch.device("meta"):  # shapes only
        model = AutoModelForCausalLM.from_config(costs.scaled_config(name))
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(parameters, rel=0.01)


def test_a_scale_divides_the_widths_and_keeps_layers_and_heads():
    full, small = costs.scaled_config("Qwen2.5-7B"), costs.scaled_config("Qwen2.5-7B", 8)
    for width in costs.WIDTHS:
        assert getattr(small, width) * 8 == getattr(full, width)
    for kept in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "model_type"):
        assert getattr(small, kept) == getattr(full, kept)
    assert costs.allowed_scales("llama-3.1-8b") == costs.allowed_scales("qwen2.5-7b") == [1, 2, 4, 8, 16, 32]


def test_random_weights_fill_every_parameter():
    model = costs.build_model(costs.scaled_config("Qwen2.5-0.5B", 32))
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, as published
    for name, param in model.named_parameters():
        assert torch.isfinite(param).all(), name
        if param.ndim > 1:
            assert 0.01 < param.std() < 0.03, name
    assert model.model.layers[0].self_attn.q_proj.bias.eq(0).all()  # Qwen2's attention biases
    logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, model.config.vocab_size) and torch.isfinite(logits).all()


def test_the_probe_returns_costs_for_every_call(probe, tmp_path):
    settings = probe["settings"]
    assert settings["scale"] == 32 and settings["k_max"] == 2 and settings["cache"] == "static"
    assert {"device", "torch", "transformers", "python"} <= set(probe) and probe["copy_bandwidth_gb_s"] > 0
    (pair,) = probe["pairs"]
    assert pair["pair"] == "llama-3.1-8b"
    assert pair["target"]["name"] == "Llama-3.1-8B" and pair["draft"]["name"] == "Llama-3.2-1B"
    assert pair["target"]["layers"] == 32 and pair["target"]["hidden_size"] == 4096 // 32
    for summary in (pair["target_ms"], pair["draft_ms"]):
        lows, mids, highs = (torch.tensor(summary[key]).reshape(-1) for key in ("min", "median", "max"))
        assert (0 < lows).all() and (lows <= mids).all() and (mids <= highs).all()
    assert len(pair["target_ms"]["median"]) == len(pair["verify_ratio"]) == 3  # n = 1 .. K + 1
    assert pair["verify_ratio"][0] == 1 and all(0 < v < 20 for v in pair["verify_ratio"])
    assert 0 < pair["cost_ratio"] < 5  # the draft's step against the target's (noisy on a shared CPU)
    assert pair["bandwidth_gb_s"] > 0
    assert pair["bandwidth_fraction"] == pytest.approx(pair["bandwidth_gb_s"] / pair["copy_bandwidth_gb_s"])
    assert len(pair["predictions"]) == len(costs.ALPHAS) * 2 and len(pair["best_k"]) == len(costs.ALPHAS)
    write_results(probe, tmp_path / "costs.json")
    assert json.loads((tmp_path / "costs.json").read_text()) == json.loads(json.dumps(probe))


def test_the_predictions_are_the_theory_modules(probe):
    (pair,) = probe["pairs"]
    c, v = pair["cost_ratio"], pair["verify_ratio"]
    for row in pair["predictions"]:
        alpha, k = row["alpha"], row["k"]
        assert row["speedup"] == theory.batch_speedup(alpha, k, c, v[k])
        assert row["speedup_free_verification"] == theory.speedup(alpha, k, c)
        assert row["tokens_per_call"] == theory.expected_tokens_per_step(alpha, k)
    for best in pair["best_k"]:
        mine = [row for row in pair["predictions"] if row["alpha"] == best["alpha"]]
        assert best["speedup"] == max(row["speedup"] for row in mine)


def test_with_free_verification_the_best_k_is_theorys_optimal_k():
    rows, best = costs.predictions(0.1, [1.0] * 9)  # K up to 8
    assert all(row["speedup"] == row["speedup_free_verification"] for row in rows)
    assert [b["k"] for b in best] == [theory.optimal_k(alpha, 0.1, 8) for alpha in costs.ALPHAS]


def test_the_report_shows_costs_and_a_row_per_k(probe):
    text = costs.report(probe)
    assert "c = " in text and "copy bandwidth" in text and "best K: alpha 0.5" in text
    assert "widths / 32" in text and "alpha=0.9" in text and "v(K+1)" in text


@pytest.mark.parametrize("options, message", [
    (dict(scale=0), "scale must be an integer >= 1"),
    (dict(scale=3), "scale must be one of 1, 2, 4, 8, 16, 32"),
    (dict(scale=64), "scale must be one of"),
    (dict(pairs=["gpt-5"]), "pairs must be names from"),
    (dict(pairs=[]), "pairs must name at least one"),
    (dict(k_max=0), "k_max must be an integer >= 1"),
    (dict(repeats=0), "repeats must be an integer >= 1"),
    (dict(context=32768), "context + k_max + 1 must be at most 32768"),
])
def test_bad_options_get_a_clear_error(options, message):
    with pytest.raises(ValueError, match=message.replace("+", r"\+")):
        costs.cost_probe(**{**SMALL, "pairs": ["qwen2.5-7b"], **options})


def test_a_pair_too_big_for_the_memory_is_refused_before_it_is_built(monkeypatch):
    monkeypatch.setattr(costs, "_free_bytes", lambda device: 10**9)
    with pytest.raises(ValueError, match=r"needs 18\.\d GB of weights in bfloat16 .* pass a larger scale"):
        costs.probe_pair("llama-3.1-8b", scale=1, dtype=torch.bfloat16, copy_gb_s=1.0)


def test_the_command_line_prints_the_table_and_writes_the_file(tmp_path, capsys):
    out = tmp_path / "costs.json"
    main(["bench", "--suite", "costs", "--pairs", "qwen2.5-7b", "--scale", "32", "--ks", "1,2", "--repeats", "1",
          "--json", str(out)])
    printed = capsys.readouterr().out
    assert "qwen2.5-7b: target Qwen2.5-7B" in printed and "best K:" in printed
    results = json.loads(out.read_text())
    assert [pair["pair"] for pair in results["pairs"]] == ["qwen2.5-7b"]
    assert results["settings"]["k_max"] == 2 and results["settings"]["scale"] == 32
    assert math.isfinite(results["pairs"][0]["cost_ratio"])


@pytest.mark.parametrize("argv, message", [
    (["--scale", "3"], "scale must be one of"),
    (["--scale", "0"], "must be an integer >= 1"),
    (["--pairs", "gpt-5"], "unknown ['gpt-5']"),
    (["--pair", "shakespeare"], "drop --pair, --target and --draft"),
])
def test_the_command_line_refuses_bad_options(capsys, argv, message):
    with pytest.raises(SystemExit):
        main(["bench", "--suite", "costs", "--pairs", "llama-3.1-8b", *argv])
    assert message in capsys.readouterr().err

import pytest
import torch

from specbook import autoregressive_generate, decoding
from specbook.bench import autoregressive, decode_latency, measure_alpha, run_benchmark, speculative
from specbook.drafters import ModelDrafter, TopKTreeDrafter
from specbook.models import weight_bytes
from specbook.profile import PARTS, autoregressive_ms, copy_bandwidth, step_profile
from specbook.sampling import Sampler
from specbook.spread import compared, fastest, speedup_range, spread_text

from support import tiny_model

PROMPTS = [torch.tensor([[3, 14, 15, 9, 2, 6, 5]]), torch.tensor([[1, 2, 3]])]


@pytest.mark.parametrize("tree", [False, True])
def test_a_step_splits_into_its_parts_and_the_engine(target, draft, tree):
    drafter = TopKTreeDrafter(draft) if tree else ModelDrafter(draft)
    profile = step_profile(target, drafter, PROMPTS, k=3, max_new_tokens=12)
    parts = profile["ms_per_step"]
    assert set(parts) == set(PARTS) - {"prefill"} | {"engine"}
    assert profile["steps"] > 0 and 1 <= profile["tokens_per_step"] <= 4
    for part in ("draft", "target call", "probabilities", "verification", "rollback"):
        assert parts[part] > 0, part
    assert parts["engine"] >= 0  # what the parts leave of the wall time


def test_autoregressive_ms_times_every_token_of_every_prompt(target, monkeypatch):
    """The baseline the profile's bound divides by: the wall time of the prompts' generations over their tokens."""
    generated = []
    real = autoregressive_generate

    def counted(*args, **kwargs):
        generated.append(real(*args, **kwargs))
        return generated[-1]

    monkeypatch.setattr("specbook.profile.autoregressive_generate", counted)
    ms = autoregressive_ms(target, PROMPTS, max_new_tokens=5)
    assert len(generated) == 1 + len(PROMPTS) and ms > 0  # one untimed run, then each prompt


def test_the_profile_leaves_the_engine_as_it_found_it(target, draft):
    forward, drafter = decoding._target_forward, ModelDrafter(draft)
    greedy = Sampler(0)
    before = decoding.speculative_generate(target, ModelDrafter(draft), PROMPTS[0], 12, k=3, sampler=greedy).token_ids
    step_profile(target, drafter, PROMPTS, k=3, max_new_tokens=12)
    assert decoding._target_forward is forward and "propose" not in vars(drafter)
    assert decoding.speculative_generate(target, drafter, PROMPTS[0], 12, k=3, sampler=greedy).token_ids == before


def test_weight_bytes_count_a_tied_matrix_once():
    model = tiny_model(seed=3)
    untied = weight_bytes(model)
    assert untied == 4 * sum(param.numel() for param in model.parameters())  # float32
    embedding = model.get_input_embeddings().weight
    model.get_output_embeddings().weight = embedding  # tied by hand: one matrix read by both ends
    assert weight_bytes(model) == untied - 4 * embedding.numel()
    assert weight_bytes(model.half()) == (untied - 4 * embedding.numel()) // 2


def test_benchmark_rows_report_the_bandwidth_their_speed_implies(target, draft):
    rows = run_benchmark([autoregressive(target, Sampler(0), 12), speculative(target, draft, 3, Sampler(0), 12)],
                         PROMPTS, repeats=1, progress=False)
    for row in rows:
        assert row["bandwidth_gb_s"] == pytest.approx(weight_bytes(target) * row["tokens"] / row["seconds"] / 1e9)
    assert copy_bandwidth(megabytes=8, repeats=2) > 0


def test_benchmark_rows_carry_the_spread_of_their_rounds(target, draft):
    rows = run_benchmark([autoregressive(target, Sampler(0), 8), speculative(target, draft, 3, Sampler(0), 8)],
                         PROMPTS, repeats=3, progress=False)
    for row in rows:
        assert row["seconds_min"] <= row["seconds"] <= row["seconds_max"]
        assert row["speedup_min"] <= row["speedup"] <= row["speedup_max"]
        assert len(row["round_seconds"]) == 3
        assert row["seconds_min"] <= min(row["round_seconds"]) and max(row["round_seconds"]) <= row["seconds_max"]
    assert rows[0]["speedup_min"] == rows[0]["speedup_max"] == 1  # the baseline against itself, round by round


def test_a_speedup_range_is_paired_by_round_and_holds_the_median():
    assert speedup_range([2.0, 4.0, 3.0], [1.0, 2.0, 1.0], 3 / 1) == (2.0, 3.0)  # round 2 ran slow for both
    assert speedup_range([1.0, 2.0], [1.0, 1.0], 1.8) == (1.0, 2.0)
    assert speedup_range([1.0, 1.0], [1.0, 1.0], 1.2) == (1.0, 1.2)  # a ratio of medians outside the rounds
    with pytest.raises(ValueError, match="the same, non-zero number of rounds"):
        speedup_range([1.0], [1.0, 2.0], 1.0)


def test_the_fastest_row_is_named_with_the_rows_its_spread_cannot_tell_it_from():
    rows = [{"method": "a", "speedup": 1.8, "speedup_min": 1.7, "speedup_max": 1.9},
            {"method": "b", "speedup": 1.6, "speedup_min": 1.5, "speedup_max": 1.75},
            {"method": "c", "speedup": 1.2, "speedup_min": 1.1, "speedup_max": 1.3}]
    best, tied, distinguishable = fastest(rows, repeats=3)
    assert best["method"] == "a" and [row["method"] for row in tied] == ["b"] and not distinguishable
    best, tied, distinguishable = fastest([rows[0], rows[2]], repeats=3)
    assert best["method"] == "a" and tied == [] and distinguishable
    assert fastest([rows[0], rows[2]], repeats=1)[2] is False  # one round measures no spread
    assert fastest([{"speedup": 1.1}, {"speedup": 1.3}])[0] == {"speedup": 1.3}  # rows written before the ranges
    assert spread_text(1.824, 1.75, 1.9) == "1.82x (1.75-1.90)" and spread_text(1.824) == "1.82x"
    assert compared(rows[0], rows[2]) == "faster than" and compared(rows[2], rows[0]) == "slower than"
    assert compared(rows[0], rows[1]) == compared(rows[1], rows[0]) == "within the spread of"  # 1.75 reaches 1.7
    assert compared({"speedup": 1.3}, {"speedup": 1.1}) == "faster than"  # no ranges: the medians


def test_decode_latency_leaves_the_prefill_out(target):
    """A difference of two timings (a run of n tokens less a run of one): positive once the n - 1 steps outweigh
    the noise of a single run, which five steps of a tiny model on a busy machine need not."""
    assert decode_latency(target, PROMPTS[0], new_tokens=48, repeats=3) > 0
    with pytest.raises(ValueError, match="new_tokens must be >= 2"):
        decode_latency(target, PROMPTS[0], new_tokens=1)


def test_one_round_when_the_environment_asks(target, draft, monkeypatch):
    """`make nbval` runs the chapters' timing cells once each, unwarmed, on their first prompt: nbval ignores
    what they print. A cell whose rows a later cell counts from (``counts_from_rows``) runs every prompt."""
    monkeypatch.setenv("SPECBOOK_QUICK_TIMING", "1")
    method = autoregressive(target, Sampler(0), 4)
    runs = []
    method.run = lambda input_ids, seed, run=method.run: runs.append(input_ids) or run(input_ids, seed)
    rows = run_benchmark([method], PROMPTS, repeats=3, progress=False)
    assert len(runs) == 1 and runs[0] is PROMPTS[0] and len(rows[0]["round_seconds"]) == 1 and rows[0]["tokens"] == 4
    runs.clear()
    rows = run_benchmark([method], PROMPTS, repeats=3, progress=False, counts_from_rows=True)
    assert len(runs) == len(PROMPTS) and len(rows[0]["round_seconds"]) == 1 and rows[0]["tokens"] == 4 * len(PROMPTS)


def test_measure_alpha_takes_the_greedy_continuations_a_caller_has(target, draft):
    """ᾱ over continuations passed in equals ᾱ over the ones it generates; one continuation per prompt."""
    greedy = [autoregressive_generate(target, ids, 12, Sampler(0)).token_ids for ids in PROMPTS]
    assert measure_alpha(target, draft, PROMPTS, 12, greedy=greedy) == measure_alpha(target, draft, PROMPTS, 12)
    with pytest.raises(ValueError, match="greedy: one continuation per prompt, got 1 for 2 prompts"):
        measure_alpha(target, draft, PROMPTS, 12, greedy=greedy[:1])

"""The cost model: its arithmetic on terms given by hand, its refusals, and a measurement on tiny models."""

import math

import pytest
import torch

from specbook.bench import autoregressive, run_benchmark, speculative
from specbook.cost_model import CostModel, DrafterCost, benchmark, for_methods, measure, predicted
from specbook.drafters import PromptLookupDrafter
from specbook.sampling import Sampler

from support import tiny_model

PROMPTS = [torch.tensor([[1, 2, 3, 4, 5, 1, 2, 3]]), torch.tensor([[7, 8, 9, 7, 8]])]


@pytest.fixture
def costs():
    return CostModel(target_ms={1: 2.0, 2: 2.2, 5: 3.0}, ar_ms=2.5,
                     drafters={"draft": DrafterCost(call_ms=0.3, step_ms=1.2, engine_ms=0.4, calls_per_step=4, k=4),
                               "lookup": DrafterCost(call_ms=None, step_ms=0.1, engine_ms=0.5, calls_per_step=0, k=4)})


def test_a_step_is_the_target_call_the_draft_calls_and_the_engine(costs):
    guess = costs.predict(tokens_per_call=3, positions_per_call=5, draft_calls_per_step=4, drafter="draft")
    assert guess["ms_per_token"] == pytest.approx((3.0 + 4 * 0.3 + 0.4) / 3)
    assert guess["bound_ms_per_token"] == pytest.approx(3.0 / 3)
    assert guess["speedup"] == pytest.approx(2.5 * 3 / 4.6)
    assert guess["bound_speedup"] == pytest.approx(2.5)
    lookup = costs.predict(2, 5, 0, "lookup")  # no model call: its host work a step
    assert lookup["ms_per_token"] == pytest.approx((3.0 + 0.1 + 0.5) / 2)


def test_v_and_c_are_chapter_3s_ratios(costs):
    assert costs.v(1) == 1 and costs.v(5) == pytest.approx(1.5)
    assert costs.call_ms(3.5) == pytest.approx(2.2 + 0.5 * 0.8)  # between the timed 2 and 5
    assert costs.c("draft") == pytest.approx(0.15)


def test_every_prompts_prefill_is_shared_by_the_tokens_after_it(costs):
    """A row's time holds one prefill of each prompt (the target's call on its length), so its prediction does."""
    row = {"method": "speculative", "tokens_per_call": 3, "positions_per_call": 5, "draft_calls_per_token": 4 / 3,
           "tokens": 20, "target_calls": 20 / 3}
    plain, = predicted([row], costs, {"speculative": "draft"})
    prompts = [torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 5, dtype=torch.long)]
    with_prefill, = predicted([row], costs, {"speculative": "draft"}, prompts)
    assert with_prefill["predicted_ms_per_token"] == pytest.approx(plain["predicted_ms_per_token"] + (2.2 + 3.0) / 20)
    assert with_prefill["bound_ms_per_token"] == pytest.approx(plain["bound_ms_per_token"] + (2.2 + 3.0) / 20)
    assert with_prefill["predicted_speedup"] == pytest.approx(2.5 / with_prefill["predicted_ms_per_token"])


def test_the_tokens_a_call_are_pooled_over_the_prompts_as_the_time_is(costs):
    """Two prompts, one at 4 tokens a call and one at 1 (8 tokens each): the row's mean of ratios says 2.5, but its
    time is 2 + 8 calls for 16 tokens, 1.6 a call, and the prediction counts those."""
    row = {"method": "speculative", "tokens_per_call": 2.5, "positions_per_call": 5, "draft_calls_per_token": 0.5,
           "tokens": 16, "target_calls": 10}
    guess, = predicted([row], costs, {"speculative": "draft"})
    assert guess["predicted_ms_per_token"] == pytest.approx(costs.predict(1.6, 5, 0.8, "draft")["ms_per_token"])


@pytest.mark.parametrize("call, message", [
    (lambda costs: costs.call_ms(6), r"positions must be in \[1, 5\]"),
    (lambda costs: costs.predict(0.5, 2, 1, "draft"), "tokens_per_call must be >= 1"),
    (lambda costs: costs.predict(2, 2, -1, "draft"), "draft_calls_per_step must be >= 0"),
    (lambda costs: costs.predict(2, 2, 1, "medusa"), "drafter must be one this model measured"),
    (lambda costs: costs.c("lookup"), "makes no model call"),
])
def test_bad_input_is_refused_by_name(costs, call, message):
    with pytest.raises(ValueError, match=message):
        call(costs)


@pytest.fixture(scope="module")
def measured():
    target, draft = tiny_model(num_layers=2, seed=0), tiny_model(num_layers=1, seed=1)
    return target, draft, measure(target, PROMPTS, {"draft": (draft, 3), "lookup": (PromptLookupDrafter(), 3)},
                                  positions=(1, 2, 4), rounds=2, max_new_tokens=12)


def test_measure_times_every_term(measured):
    _, _, costs = measured
    assert sorted(costs.target_ms) == [1, 2, 4] and all(ms > 0 for ms in costs.target_ms.values())
    assert costs.ar_ms > 0 and costs.rounds == 2 and costs.spread >= 0 and costs.cpu
    draft, lookup = costs.drafters["draft"], costs.drafters["lookup"]
    assert 1 <= draft.calls_per_step <= 3 and draft.call_ms > 0 and draft.engine_ms > 0 and draft.k == 3
    assert lookup.call_ms is None and lookup.calls_per_step == 0
    assert set(costs.as_dict()["drafters"]) == {"draft", "lookup"}


@pytest.mark.parametrize("options, message", [
    ({"rounds": 0}, "rounds must be an integer >= 1"),
    ({"positions": (2, 4)}, "positions must include 1"),
    ({"positions": (1, 0)}, "positions must be an integer >= 1"),
])
def test_measure_refuses_bad_options(measured, options, message):
    target, _, _ = measured
    with pytest.raises(ValueError, match=message):
        measure(target, PROMPTS, **options)
    with pytest.raises(ValueError, match="prompts must hold"):
        measure(target, [])


def test_a_benchmarks_rows_get_the_prediction_beside_the_measurement(measured):
    target, draft, _ = measured
    greedy = Sampler(0)
    methods = [autoregressive(target, greedy, 12), speculative(target, draft, 2, greedy, 12),
               speculative(target, draft, 3, greedy, 12, name="draft, k=3")]
    meter, drafters = for_methods(methods, PROMPTS, max_new_tokens=12, sampler=greedy)
    assert drafters == {"speculative k=2": "speculative k=2", "draft, k=3": "speculative k=2"}  # one drafter, timed once
    assert list(meter.drafters) == ["speculative k=2"]
    rows = benchmark(methods, PROMPTS, repeats=2, max_new_tokens=12, sampler=greedy, progress=False)
    assert math.isnan(rows[0]["predicted_ms_per_token"])  # autoregressive: measured, not predicted
    for row in rows[1:]:
        assert 0 < row["bound_ms_per_token"] < row["predicted_ms_per_token"]
        assert row["bound_speedup"] > row["predicted_speedup"] > 0


def test_a_meter_times_its_rounds_between_the_benchmarks(measured, monkeypatch):
    """`benchmark` runs one untimed round of the cost model's terms, then one before each of the benchmark's rounds,
    and the model takes the timed ones; a meter with no timed round is refused."""
    import specbook.cost_model

    target, draft, _ = measured
    greedy = Sampler(0)
    meters = []
    original = specbook.cost_model.Meter.model

    def model(self):
        meters.append(self)
        return original(self)
    monkeypatch.setattr(specbook.cost_model.Meter, "model", model)
    benchmark([autoregressive(target, greedy, 8), speculative(target, draft, 2, greedy, 8)], PROMPTS, repeats=3,
              max_new_tokens=8, sampler=greedy, progress=False)
    assert len(meters[0].ar) == 4 and meters[0].model().rounds == 3
    untimed, _ = for_methods([speculative(target, draft, 2, greedy, 8)], PROMPTS, max_new_tokens=8)
    untimed()
    with pytest.raises(ValueError, match="needs a timed round after the untimed first"):
        untimed.model()


def test_only_rows_on_the_default_path_of_one_target_are_predicted(measured):
    target, draft, _ = measured
    greedy = Sampler(0)
    on_static = [autoregressive(target, greedy, 12), speculative(target, draft, 2, greedy, 12, cache="static")]
    assert for_methods(on_static, PROMPTS) == (None, {})  # the static cache's calls are not what it times
    rows = predicted(run_benchmark(on_static, PROMPTS, repeats=1, progress=False), None, {})
    assert all(math.isnan(row["predicted_ms_per_token"]) for row in rows)
    other = tiny_model(num_layers=1, seed=2)
    with pytest.raises(ValueError, match="methods must share one target"):
        for_methods([speculative(target, draft, 2, greedy, 12), speculative(other, draft, 2, greedy, 12)], PROMPTS)


def test_a_calls_anatomy_keeps_the_operators_and_grows_the_weights(measured):
    from specbook.cost_model import call_anatomy

    target, _, _ = measured
    rows = call_anatomy(target, PROMPTS[0], factors=(0.5, 1, 2), rounds=1)
    assert [row["factor"] for row in rows] == [0.5, 1, 2]
    assert len({row["operators"] for row in rows}) == 1  # the same operators at every width
    assert rows[0]["weight_mb"] < rows[1]["weight_mb"] < rows[2]["weight_mb"]
    assert rows[1]["hidden_size"] == target.config.hidden_size and all(row["ms"] > 0 for row in rows)
    with pytest.raises(ValueError, match="factors must be"):
        call_anatomy(target, PROMPTS[0], factors=(0, 1))


def test_the_books_measurement_is_made_once_and_read_back(costs, monkeypatch, tmp_path):
    """`book_costs` measures on its first call on a machine and engine and stores the terms; a later call, in another
    chapter's process, reads the same numbers back; ``refresh`` (chapter 4's §4.9) measures again."""
    import specbook.cost_model as cost_model
    from specbook import load_pair

    made = []
    monkeypatch.setattr(cost_model, "STORE", tmp_path)
    monkeypatch.setattr(cost_model, "measure", lambda target, prompts, drafters: made.append(sorted(drafters)) or costs)
    pair = load_pair("shakespeare")
    first = cost_model.book_costs(pair)
    assert made == [["PARD", "draft model"]] and len(list(tmp_path.iterdir())) == 1
    again = cost_model.book_costs(pair)
    assert len(made) == 1 and again == first == costs
    cost_model.book_costs(pair, refresh=True)
    assert len(made) == 2
    with pytest.raises(ValueError, match="built-in pair beside its PARD draft"):
        cost_model.book_costs(load_pair("shakespeare-seq2seq"))


def test_a_stored_model_reads_back_as_it_was(costs):
    costs.when = "2026-12-02 21:00 UTC"
    assert CostModel.from_dict(costs.as_dict()) == costs

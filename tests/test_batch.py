"""Batched decoding (`specbook.batch`): every row exact, as if it were decoded alone, or a clear refusal.

Greedy rows equal their prompt's batch-of-one output (and the target's own ``generate``) for batches
up to 32 with left-padded prompts of different lengths and rows that stop early, on every family of
the architecture matrix; sampled rows follow the target in the chi-square test, row by row, and a
row's tokens do not depend on the other rows. A broken variant -- one acceptance count shared by
all rows -- fails both.
"""

import dataclasses

import pytest
import torch
from scipy.stats import chisquare

from specbook import (BatchSizeK, EntropyGuidedK, HeuristicK, MedusaDrafter, MedusaHeads, NGramDrafter,
                      PromptLookupDrafter, Sampler, TopKTreeDrafter, autoregressive_generate, speculative_generate)
from specbook import batch as batch_module
from specbook.decoder import serves
from specbook.ragged import RaggedCache, SlotRows, SlotRowsCache, check_batch, rows_cache

from families import FAMILIES, VOCAB, hf_greedy, tiny_family_model
from support import NEW_TOKENS, SAMPLERS, sequence_distribution, tiny_model

GREEDY = Sampler(0)


@pytest.fixture(scope="module")
def pair():
    return agreeing_pair()


def agreeing_pair():
    """A tiny target with clear-cut greedy choices and a draft that agrees with it about 60% of the time: its LM
    head is the target's plus noise. (Two random models would never agree, and acceptance would not be ragged.)"""
    target = tiny_model(seed=0)
    draft = tiny_model(seed=0)
    with torch.no_grad():
        target.lm_head.weight.mul_(8)
        noise = torch.randn(target.lm_head.weight.shape, generator=torch.Generator().manual_seed(1))
        draft.lm_head.weight.copy_(target.lm_head.weight + 0.3 * target.lm_head.weight.std() * noise)
    return target, draft


def left_pad(prompts, pad=0):
    """A list of 1-D prompts as a left-padded (B, T) batch and its attention mask."""
    width = max(len(prompt) for prompt in prompts)
    ids = torch.tensor([[pad] * (width - len(prompt)) + list(prompt) for prompt in prompts])
    mask = torch.tensor([[0] * (width - len(prompt)) + [1] * len(prompt) for prompt in prompts])
    return ids, mask


def random_prompts(count, vocab=64, longest=12, seed=0):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, longest + 1, (count,), generator=generator).tolist()
    return [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in lengths]


def alone(target, drafter, prompt, new_tokens, **options):
    """The batch-of-one output for ``prompt``: autoregressive when ``drafter`` is None."""
    ids = torch.tensor([prompt])
    if drafter is None:
        return autoregressive_generate(target, ids, new_tokens, **options)
    return speculative_generate(target, drafter, ids, new_tokens, **options)


def test_a_batch_runs_on_the_package_decoder_where_it_serves_the_model(pair, family_pair):
    """The built-in Llama-family pair batches over the decoder's cache, a write offset per row; a model the decoder
    does not serve over Hugging Face's forward and hidden columns."""
    assert isinstance(rows_cache(pair[0], 2, 8), SlotRowsCache)
    served = serves(family_pair[0]) is None
    assert isinstance(rows_cache(family_pair[0], 2, 8), SlotRowsCache if served else RaggedCache)


@pytest.mark.parametrize("batch", [1, 3, 4, 8, 16])
def test_greedy_rows_with_their_own_ends_equal_their_batch_of_one_output(pair, batch):
    """B = 1 .. 16: prompts of different lengths, rows that stop at an end-of-sequence token at different steps (or
    never): each row is its batch-of-one output, autoregressively and speculatively."""
    target, draft = pair
    prompts = random_prompts(batch, longest=12, seed=10 + batch)
    eos = alone(target, None, prompts[0], 24, sampler=GREEDY).token_ids[6]  # a token row 0 emits at its 7th
    ids, mask = left_pad(prompts)
    references = [alone(target, None, prompt, 24, sampler=GREEDY, eos_token_id=eos).token_ids for prompt in prompts]
    assert len(references[0]) == 7
    assert autoregressive_generate(target, ids, 24, GREEDY, eos_token_id=eos, attention_mask=mask).token_ids \
        == references
    assert speculative_generate(target, draft, ids, 24, k=3, sampler=GREEDY, eos_token_id=eos,
                                attention_mask=mask).token_ids == references


def test_greedy_equality_catches_rows_placed_without_their_padding(pair, monkeypatch):
    """The broken variant: the decoder's batch cache takes every column for a token of its row (padding and filler
    included), which shifts a shorter prompt's positions and lets it see its padding."""
    target, draft = pair
    prompts = random_prompts(8, seed=2)
    ids, mask = left_pad(prompts)
    references = [alone(target, None, prompt, 20, sampler=GREEDY).token_ids for prompt in prompts]
    monkeypatch.setattr(SlotRows, "arrange", lambda self, visible: None)
    assert autoregressive_generate(target, ids, 20, GREEDY, attention_mask=mask).token_ids != references


@pytest.mark.parametrize("batch", [2, 32])
def test_greedy_rows_equal_their_batch_of_one_output(pair, batch):
    target, draft = pair
    prompts = random_prompts(batch, longest=12, seed=batch)
    ids, mask = left_pad(prompts)
    references = [alone(target, None, prompt, 20, sampler=GREEDY).token_ids for prompt in prompts]
    assert autoregressive_generate(target, ids, 20, GREEDY, attention_mask=mask).token_ids == references
    result = speculative_generate(target, draft, ids, 20, k=3, sampler=GREEDY, attention_mask=mask)
    assert result.token_ids == references
    assert sum(row.stats.acceptance_rate > 0 for row in result) > batch // 2  # the drafts were really verified


def test_rows_that_stop_early(pair):
    """Rows stop at their own end-of-sequence token, inside an accepted run or not, and leave the batch."""
    target, draft = pair
    prompts = random_prompts(32, seed=3)
    outputs = [alone(target, None, prompt, 24, sampler=GREEDY).token_ids for prompt in prompts]
    eos = outputs[0][5]  # a token some rows emit early, others late or never
    ids, mask = left_pad(prompts)
    references = [alone(target, draft, prompt, 24, k=4, sampler=GREEDY, eos_token_id=eos).token_ids
                  for prompt in prompts]
    result = speculative_generate(target, draft, ids, 24, k=4, sampler=GREEDY, eos_token_id=eos, attention_mask=mask)
    assert result.token_ids == references
    lengths = [len(row) for row in references]
    assert sum(n < 24 for n in lengths) >= 4 and len(set(lengths)) > 4  # ragged: rows stopped at different steps
    assert result.stats.rows_per_call < 32  # and stopped costing target work


@pytest.mark.parametrize("drafter", ["prompt_lookup", "nasd"])
def test_model_free_drafters_batch(pair, drafter):
    target, _ = pair
    make = {"prompt_lookup": lambda: PromptLookupDrafter(max_ngram=2, min_ngram=1),
            "nasd": lambda: NGramDrafter(filler_top_k=2)}[drafter]
    prompts = [prompt * 3 for prompt in random_prompts(5, longest=4, seed=4)]  # repeats to look up
    ids, mask = left_pad(prompts)
    references = [alone(target, make(), prompt, 20, k=3, sampler=GREEDY) for prompt in prompts]
    result = speculative_generate(target, make(), ids, 20, k=3, sampler=GREEDY, attention_mask=mask)
    assert result.token_ids == [reference.token_ids for reference in references]
    assert [row.steps for row in result] == [reference.steps for reference in references]  # same drafts, step by step
    assert result.stats.draft_calls == 0


@pytest.mark.parametrize("policy", [lambda: HeuristicK(2, 1, 6), lambda: EntropyGuidedK(1, 5)])
def test_each_row_keeps_its_own_policy(pair, policy):
    target, draft = pair
    prompts = random_prompts(4, seed=5)
    ids, mask = left_pad(prompts)
    references = [alone(target, draft, prompt, 20, k=policy(), sampler=GREEDY) for prompt in prompts]
    result = speculative_generate(target, draft, ids, 20, k=policy(), sampler=GREEDY, attention_mask=mask)
    assert [row.steps for row in result] == [reference.steps for reference in references]


def test_a_rows_sample_does_not_depend_on_the_batch(pair):
    """Row b draws from seed + b (or its own seed): the same prompt and seed give the same tokens in any batch."""
    target, draft = pair
    prompts = random_prompts(4, seed=6)
    alone_tokens = alone(target, draft, prompts[2], 16, k=3, sampler=SAMPLERS[1], seed=7).token_ids
    ids, mask = left_pad(prompts)
    assert speculative_generate(target, draft, ids, 16, k=3, sampler=SAMPLERS[1], seed=5,
                                attention_mask=mask)[2].token_ids == alone_tokens
    ids, mask = left_pad([prompts[2], prompts[0]])
    assert speculative_generate(target, draft, ids, 16, k=3, sampler=SAMPLERS[1], seed=[7, 1],
                                attention_mask=mask)[0].token_ids == alone_tokens


def _shared_acceptance(monkeypatch):
    """The broken variant: every row keeps as many drafts as the first row accepted."""
    verify = batch_module.verify_rows

    def shared(drafts, lengths, *args):
        accepted, next_tokens = verify(drafts, lengths, *args)
        return [min(accepted[0], n) for n in lengths], next_tokens

    monkeypatch.setattr(batch_module, "verify_rows", shared)


def test_greedy_equality_catches_a_shared_acceptance_count(pair, monkeypatch):
    target, draft = pair
    prompts = random_prompts(8, seed=2)
    ids, mask = left_pad(prompts)
    references = [alone(target, None, prompt, 20, sampler=GREEDY).token_ids for prompt in prompts]
    _shared_acceptance(monkeypatch)
    assert speculative_generate(target, draft, ids, 20, k=3, sampler=GREEDY, attention_mask=mask).token_ids \
        != references


PROMPTS, COPIES, ROUNDS = ([0, 1, 2], [1], [2, 2, 0, 1]), 100, 15  # 1,500 samples per prompt


def _row_p_values(target, drafter, sampler):
    """Per prompt, the chi-square p-value of its NEW_TOKENS-token samples, drawn COPIES at a time in batches
    that mix the three prompts (different lengths, so different padding)."""
    ids, mask = left_pad([prompt for prompt in PROMPTS for _ in range(COPIES)])
    counts = [{} for _ in PROMPTS]
    for round_ in range(ROUNDS):
        result = speculative_generate(target, drafter, ids, NEW_TOKENS, k=2, sampler=sampler,
                                      seed=round_ * len(ids), attention_mask=mask)
        for row, generation in enumerate(result):
            tally = counts[row // COPIES]
            tally[tuple(generation.token_ids)] = tally.get(tuple(generation.token_ids), 0) + 1
    p_values = []
    for prompt, tally in zip(PROMPTS, counts):
        with torch.no_grad():
            exact = sequence_distribution(target, torch.tensor([prompt]), sampler)
        assert all(exact[sequence] > 0 for sequence in tally)  # nothing outside the support
        samples = COPIES * ROUNDS
        big = [sequence for sequence in exact if exact[sequence] * samples >= 5]
        observed = [tally.get(s, 0) for s in big] + [samples - sum(tally.get(s, 0) for s in big)]
        predicted = [exact[s] * samples for s in big] + [samples - sum(exact[s] * samples for s in big)]
        if predicted[-1] < 1e-9:
            observed, predicted = observed[:-1], predicted[:-1]
        scale = sum(observed) / sum(predicted)
        p_values.append(chisquare(observed, [value * scale for value in predicted]).pvalue)
    return p_values


def test_every_row_follows_the_target(tiny_pair):
    assert isinstance(rows_cache(tiny_pair[0], 2, 8), SlotRowsCache)  # the decoder's batch cache, per-row slots
    assert min(_row_p_values(*tiny_pair, SAMPLERS[0])) > 1e-3


def test_chi_square_catches_a_shared_acceptance_count(tiny_pair, monkeypatch):
    _shared_acceptance(monkeypatch)
    assert min(_row_p_values(*tiny_pair, SAMPLERS[0])) < 1e-6


@pytest.fixture(scope="module", params=FAMILIES)
def family_pair(request):
    return tiny_family_model(request.param), tiny_family_model(request.param, seed=1, layers=1, vocab=VOCAB + 32)


def test_every_family_batches(family_pair):
    """Left padding, holes and sliding windows (8 positions) on every family: each row equals HF's generate."""
    target, draft = family_pair
    prompts = random_prompts(4, vocab=VOCAB, longest=14, seed=9) + [random_prompts(1, vocab=VOCAB, seed=1)[0] * 4]
    ids, mask = left_pad(prompts)
    with torch.no_grad():
        references = [hf_greedy(target, torch.tensor([prompt]), 20) for prompt in prompts]
    assert autoregressive_generate(target, ids, 20, GREEDY, attention_mask=mask).token_ids == references
    assert speculative_generate(target, draft, ids, 20, k=3, sampler=GREEDY, attention_mask=mask).token_ids \
        == references
    assert speculative_generate(target, PromptLookupDrafter(), ids, 20, k=3, sampler=GREEDY,
                                attention_mask=mask).token_ids == references


def test_batch_size_policy(pair):
    target, draft = pair
    policy = BatchSizeK({1: 4, 3: 2, 6: 0})
    ks = []
    for rows in (1, 2, 3, 5, 6, 40):
        policy.observe_batch(rows)
        ks.append(policy.next_k())
    assert ks == [4, 4, 2, 2, 0, 0]
    prompts = random_prompts(6, seed=8)
    ids, mask = left_pad(prompts)
    references = [alone(target, None, prompt, 12, sampler=GREEDY).token_ids for prompt in prompts]
    plain = speculative_generate(target, draft, ids, 12, k=BatchSizeK({1: 3, 6: 0}), sampler=GREEDY,
                                 attention_mask=mask)
    assert plain.token_ids == references and plain.stats.draft_calls == 0  # K = 0 at 6 rows: plain decoding
    mixed = speculative_generate(target, draft, ids, 12, k=BatchSizeK({1: 3, 6: 0}), sampler=GREEDY,
                                 eos_token_id=references[0][2], attention_mask=mask)
    assert mixed.stats.draft_calls > 0  # rows that stopped early leave a batch small enough to draft for


def test_batch_size_policy_from_costs():
    """Where verifying K + 1 positions costs K + 1 times one position, no K pays: K = 0."""
    policy = BatchSizeK.from_costs(0.8, {1: 0.1, 32: 0.1}, {1: [1, 1.05, 1.1, 1.15, 1.2], 32: [1, 2, 3, 4, 5]})
    assert policy.k_by_batch == {1: 4, 32: 0}
    margins = {8: [1, 1.4, 1.6]}  # K = 1 is predicted at 1.8 / 1.5 = 1.2x, K = 2 at 2.44 / 1.8 = 1.36x
    assert BatchSizeK.from_costs(0.8, {1: 0.1, 8: 0.1}, {1: [1, 1, 1], **margins}).k_for(8) == 2
    assert BatchSizeK.from_costs(0.8, {1: 0.1, 8: 0.1}, {1: [1, 1, 1], **margins}, min_speedup=1.5).k_for(8) == 0
    with pytest.raises(ValueError, match="min_speedup must be a number >= 1"):
        BatchSizeK.from_costs(0.8, {1: 0.1}, {1: [1, 1]}, min_speedup=0.5)


def test_batch_size_policy_from_speedups():
    """Each batch size's fastest K among those that beat autoregressive decoding in every round, else K = 0."""
    policy = BatchSizeK.from_speedups({2: {1: (1.3, 1.1), 2: (1.5, 1.2), 4: (1.6, 0.9)}, 8: {1: (1.1, 0.95)}})
    assert policy.k_by_batch == {1: 2, 2: 2, 8: 0}  # K = 4's fastest median had a losing round
    assert BatchSizeK.from_speedups({1: {2: (1.3, 1.1)}}, min_speedup=1.2).k_by_batch == {1: 0}
    for speedups, match in (({}, "speedups must be a non-empty dict"), ({0: {1: (1, 1)}}, "batch sizes must be")):
        with pytest.raises(ValueError, match=match):
            BatchSizeK.from_speedups(speedups)


def test_a_policy_from_costs_measured_from_a_larger_batch_covers_one_row():
    """Measured at 4 and 32 rows only (``--batch-sizes 4,32``): below 4 rows the policy drafts 4 rows' K."""
    policy = BatchSizeK.from_costs(0.8, {4: 0.1, 32: 0.1}, {4: [1, 1.05, 1.1, 1.15, 1.2], 32: [1, 2, 3, 4, 5]})
    assert policy.k_by_batch == {1: 4, 4: 4, 32: 0} and [policy.k_for(rows) for rows in (1, 3, 4, 31, 32)] == [
        4, 4, 4, 4, 0]
    assert BatchSizeK.from_costs(0.8, {8: 0.1}, {8: [1, 5, 9]}).k_by_batch == {1: 0, 8: 0}
    for costs, ratios, match in (({}, {}, "verify_ratio must be a non-empty dict"),
                                 ({1: 0.1}, {1: [1, 1], 4: [1, 1]}, "cost_ratio must hold every batch size"),
                                 ({0: 0.1}, {0: [1, 1]}, "verify_ratio's batch sizes must be an integer >= 1")):
        with pytest.raises(ValueError, match=match):
            BatchSizeK.from_costs(0.8, costs, ratios)


def test_at_batch_size_one_the_policy_runs_the_loop_of_its_fixed_k(pair):
    """The batch suite's rows at one row: the policy and the fixed K it picks take the same loop (the batch-of-one
    loop, on the unpadded prompt) with the same K, step for step; a batch seen before does not leak in."""
    target, draft = pair
    policy = BatchSizeK({1: 3, 2: 1})
    policy.observe_batch(5)  # a stale batch size: each generation starts from one row
    ids, mask = torch.tensor([[0, 0, 7, 3, 9]]), torch.tensor([[0, 0, 1, 1, 1]])  # a padded batch of one
    runs = [speculative_generate(target, draft, ids, 16, k=k, sampler=GREEDY, attention_mask=mask)
            for k in (policy, 3)]
    assert [type(run).__name__ for run in runs] == ["BatchGeneration"] * 2
    assert runs[0][0].steps == runs[1][0].steps and max(len(step.drafted) for step in runs[0][0].steps) == 3
    untimed = [dataclasses.replace(run.stats, seconds=0.0) for run in runs]
    assert untimed[0] == untimed[1] and untimed[0].rows_per_call == 1  # the batch-of-one loop's record


@pytest.mark.parametrize("kwargs, match", [
    (dict(attention_mask=torch.ones(2, 3)), "attention_mask must have the shape"),
    (dict(attention_mask=torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])), "row 1 is padded on the right"),
    (dict(attention_mask=torch.tensor([[1, 1, 1, 1], [1, 0, 1, 1]])), "padding between its tokens"),
    (dict(attention_mask=torch.tensor([[1, 1, 1, 1], [0, 2, 1, 1]])), "0 \\(padding\\) and 1"),
    (dict(seed=[1, 2, 3]), "a list of 2 ints"),
    (dict(compile=True), "compile=False"),
])
def test_bad_batches_are_refused(pair, kwargs, match):
    target, draft = pair
    ids = torch.tensor([[5, 6, 7, 8], [1, 2, 3, 4]])
    with pytest.raises(ValueError, match=match):
        speculative_generate(target, draft, ids, 5, **kwargs)


@pytest.mark.parametrize("make", [lambda t, d: TopKTreeDrafter(d, (2, 2)),
                                  lambda t, d: MedusaDrafter(t, MedusaHeads(t.config.hidden_size, 2))])
def test_drafters_that_cannot_batch_are_refused(pair, make):
    target, draft = pair
    with pytest.raises(ValueError, match="drafts for one sequence at a time"):
        speculative_generate(target, make(target, draft), torch.tensor([[5, 6], [1, 2]]), 5)


def test_bad_policy_tables_are_refused():
    for table, match in (({2: 4}, "starts at batch size 1"), ({1: -1}, "K must be an integer >= 0"),
                         ({1: 2, 0: 1}, "batch sizes must be an integer >= 1")):
        with pytest.raises(ValueError, match=match):
            BatchSizeK(table)


def test_check_batch_without_a_mask():
    assert check_batch(torch.zeros(3, 4, dtype=torch.long), None).all()


def test_seq2seq_batches_are_refused():
    from specbook import load_pair
    pair = load_pair("shakespeare-seq2seq")
    ids = torch.tensor([[5, 6, 7], [5, 6, 8]])
    with pytest.raises(ValueError, match="a \\(1, S\\) tensor"):
        speculative_generate(pair.target, pair.draft, ids, 5)


def test_a_batch_of_one_keeps_its_api(pair):
    target, draft = pair
    prompt = torch.tensor([[1, 2, 3]])
    assert type(speculative_generate(target, draft, prompt, 5)).__name__ == "Generation"
    batched = speculative_generate(target, draft, prompt, 5, sampler=GREEDY, attention_mask=torch.ones_like(prompt))
    assert type(batched).__name__ == "BatchGeneration" and len(batched) == 1
    assert batched[0].token_ids == speculative_generate(target, draft, prompt, 5, sampler=GREEDY).token_ids
    padded = speculative_generate(target, draft, torch.tensor([[0, 0, 1, 2, 3]]), 5, sampler=GREEDY,
                                  attention_mask=torch.tensor([[0, 0, 1, 1, 1]]))  # the batch-of-one loop, unpadded
    assert padded.token_ids == batched.token_ids and padded.stats.rows_per_call == 1


def test_call_costs_and_the_crossover(pair):
    from specbook.batch_bench import batch_prompts, call_costs, crossover, predicted_crossover
    target, _ = pair
    costs = call_costs(target, [1, 3], [1, 3], context=8, repeats=1)
    assert set(costs) == {1, 3} and all(len(times) == 2 and min(times) > 0 for times in costs.values())
    rows = [{"method": "speculative k=4", "batch_size": b, "speedup_vs_ar": s, "predicted_speedup": p}
            for b, s, p in ((1, 1.5, 1.6), (8, 0.9, 1.1), (16, 0.8, 0.95))]
    assert crossover(rows, 4) == {"measured": 8, "measured_every_round": 8, "predicted": 16}  # no spread: medians
    for row, high in zip(rows, (1.7, 1.05, 0.9)):  # at 8 rows one round still paid
        row["speedup_vs_ar_max"] = high
    assert crossover(rows, 4) == {"measured": 8, "measured_every_round": 16, "predicted": 16}
    costs = {1: {"cost_ratio": 0.1, "verify_ratio": [1, 1.1, 1.2]}, 8: {"cost_ratio": 0.1, "verify_ratio": [1, 2, 3]}}
    assert predicted_crossover(0.8, costs, 2) == 8 and predicted_crossover(0.8, costs, 4) is None  # 3 positions only
    assert len(set(batch_prompts(32))) == 32
    with pytest.raises(ValueError, match="count must be at most"):
        batch_prompts(1000)

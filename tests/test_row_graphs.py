"""A batch over static caches, its calls replayed per batch bucket (`specbook.row_graphs`): the GPU's default.

On the CPU ``CAPTURE_ON_CPU`` records each call and re-runs it on the same buffers, a graph's semantics: the
buffers, the padding rows and columns, the lengths on the device and the cache's life between generations are
what these tests check; on a GPU the same calls are CUDA graphs. Every row equals its batch-of-one output
greedily and its dynamic-cache output sampled; a cache whose lengths are not rolled back fails.
"""

import pytest
import torch

import specbook.graphs
from specbook import Sampler, autoregressive_generate, speculative_generate
from specbook.decoder import serves
from specbook.ragged import StaticRows
from specbook.row_graphs import StaticRowsCache, StaticRowsModel, batch_bucket, batch_cache, static_rows

from families import FAMILIES, VOCAB, hf_greedy, tiny_family_model
from test_batch import agreeing_pair, alone, left_pad, random_prompts

GREEDY = Sampler(0)


@pytest.fixture
def replayed(monkeypatch):
    monkeypatch.setattr(specbook.graphs, "CAPTURE_ON_CPU", True)


@pytest.fixture(scope="module")
def pair():
    return agreeing_pair()


def test_batch_buckets():
    assert [batch_bucket(rows) for rows in (1, 2, 3, 4, 5, 16, 17)] == [1, 2, 4, 4, 8, 16, 32]


@pytest.mark.parametrize("batch", [1, 3, 8, 16])
def test_greedy_rows_equal_their_batch_of_one_output(pair, replayed, batch):
    """Prompts of 1 to 20 tokens (a padded prompt graph past 16), rows that end at different steps and leave, a
    draft model batched over static caches too: every row is its batch-of-one output."""
    target, draft = pair
    prompts = random_prompts(batch, longest=20, seed=30 + batch)
    eos = alone(target, None, prompts[0], 24, sampler=GREEDY).token_ids[6]
    ids, mask = left_pad(prompts)
    references = [alone(target, None, prompt, 24, sampler=GREEDY, eos_token_id=eos).token_ids for prompt in prompts]
    options = dict(eos_token_id=eos, attention_mask=mask, cache="static")
    assert autoregressive_generate(target, ids, 24, GREEDY, **options).token_ids == references
    assert speculative_generate(target, draft, ids, 24, k=3, sampler=GREEDY, **options).token_ids == references


def test_graphs_are_captured_per_bucket_and_kept(pair, replayed):
    """A generation replays one graph per (batch bucket, columns, logits kept); the next generation reuses them."""
    target, draft = pair
    prompts = random_prompts(5, longest=12, seed=4) + [list(range(20))]
    ids, mask = left_pad(prompts)
    first = speculative_generate(target, draft, ids, 16, k=2, sampler=GREEDY, attention_mask=mask, cache="static")
    runner = static_rows(target, 256, 6)
    assert isinstance(runner, StaticRowsModel) and runner.cache.capacity == 8
    keys = set(runner.graphs)
    assert (8, 3, 3) in keys  # a step of six rows: the pending token and two drafts, at the bucket of 8
    assert (8, 32, 3) in keys  # the prompts and two drafts, 22 columns padded to 32
    again = speculative_generate(target, draft, ids, 16, k=2, sampler=GREEDY, attention_mask=mask, cache="static")
    assert again.token_ids == first.token_ids and set(runner.graphs) == keys


def test_greedy_equality_catches_lengths_not_rolled_back(pair, replayed, monkeypatch):
    """The broken variant: a row's length on the device keeps the drafts it rejected."""
    target, draft = pair
    prompts = random_prompts(4, seed=6)
    ids, mask = left_pad(prompts)
    references = [alone(target, None, prompt, 20, sampler=GREEDY).token_ids for prompt in prompts]
    monkeypatch.setattr(StaticRowsCache, "_crop", lambda self, columns: None)
    result = speculative_generate(target, draft, ids, 20, k=3, sampler=GREEDY, attention_mask=mask, cache="static")
    assert result.token_ids != references


@pytest.mark.parametrize("sampler", [Sampler(1.0), Sampler(0.8, top_k=20)])
def test_sampled_rows_equal_the_dynamic_caches(pair, replayed, sampler):
    """Each row draws from its own stream, in the same order, over either cache: the same tokens."""
    target, draft = pair
    ids, mask = left_pad(random_prompts(6, seed=7))
    runs = [speculative_generate(target, draft, ids, 24, k=3, sampler=sampler, seed=5, attention_mask=mask,
                                 cache=cache).token_ids for cache in ("dynamic", "static")]
    assert runs[0] == runs[1]


@pytest.fixture(scope="module", params=[family for family in FAMILIES if family in ("llama", "qwen2", "qwen3",
                                                                                      "mistral")])
def served_pair(request):
    return tiny_family_model(request.param), tiny_family_model(request.param, seed=1, layers=1, vocab=VOCAB + 32)


def test_served_families_batch_over_static_caches(served_pair, replayed):
    """Left padding and sliding windows (8 positions) over a fixed span: each row equals HF's generate."""
    target, draft = served_pair
    assert serves(target) is None
    prompts = random_prompts(4, vocab=VOCAB, longest=14, seed=9) + [random_prompts(1, vocab=VOCAB, seed=1)[0] * 4]
    ids, mask = left_pad(prompts)
    with torch.no_grad():
        references = [hf_greedy(target, torch.tensor([prompt]), 20) for prompt in prompts]
    options = dict(sampler=GREEDY, attention_mask=mask, cache="static")
    assert autoregressive_generate(target, ids, 20, **options).token_ids == references
    assert speculative_generate(target, draft, ids, 20, k=3, **options).token_ids == references


def test_the_default_cache_of_a_batch():
    """On the CPU a batch decodes over dynamic caches by default; a model the decoder does not serve has no static
    batch cache; compiled steps are for a batch of one."""
    from specbook.row_graphs import batch_cache_option
    llama, gpt2 = tiny_family_model("llama"), tiny_family_model("gpt2")
    assert batch_cache_option(llama, None, None) == "dynamic" and batch_cache_option(gpt2, None, None) == "dynamic"
    assert batch_cache_option(llama, "static", False) == "static"
    with pytest.raises(ValueError, match="static cache on the package's decoder only.*cache='dynamic'"):
        autoregressive_generate(gpt2, torch.tensor([[1, 2], [3, 4]]), 4, GREEDY, cache="static")
    with pytest.raises(ValueError, match="compile=False"):
        autoregressive_generate(llama, torch.tensor([[1, 2], [3, 4]]), 4, GREEDY, cache="static", compile=True)
    with pytest.raises(ValueError, match="cache must be one of"):
        autoregressive_generate(llama, torch.tensor([[1, 2], [3, 4]]), 4, GREEDY, cache="paged")


def test_bad_calls_on_a_static_cache(pair):
    target, _ = pair
    cache = batch_cache(target, 2, 16, "static")
    with pytest.raises(ValueError, match="overflows the static cache: 16 slots are left"):
        cache(torch.zeros(2, 17, dtype=torch.long), torch.ones(2, 17, dtype=torch.bool))
    rows = StaticRows(2, 1, 1, 4, 8, [None], torch.float32, "cpu")
    with pytest.raises(ValueError, match="holds 2 rows \\(got a call on 3\\)"):
        rows.place(torch.zeros(3, 1, dtype=torch.long), torch.ones(3, dtype=torch.long))
    with pytest.raises(ValueError, match="place a call's layout on 2 columns"):
        rows.claim(2)
    with pytest.raises(ValueError, match="lengths must be at most 2 counts in \\[0, 8\\]"):
        rows.set_lengths([1, 9])
    wide = StaticRows(4, 1, 1, 4, 8, [None], torch.float32, "cpu")
    wide.reset(2)  # two rows in use of four: a rollback counts the rows in use
    wide.set_lengths([3, 2])
    wide.rollback([1, 2])
    assert wide.lengths == [2, 0] and wide.length.tolist() == [2, 0, 0, 0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graphs_replay_a_batch():
    """On a GPU, by default: every row of a batch replayed per bucket equals its batch-of-one output."""
    target, draft = (model.cuda() for model in agreeing_pair())
    prompts = random_prompts(6, longest=20, seed=12)
    ids, mask = left_pad(prompts)
    references = [autoregressive_generate(target, torch.tensor([prompt], device="cuda"), 24, GREEDY).token_ids
                  for prompt in prompts]
    options = dict(sampler=GREEDY, attention_mask=mask.cuda())
    assert autoregressive_generate(target, ids.cuda(), 24, **options).token_ids == references
    assert speculative_generate(target, draft, ids.cuda(), 24, k=3, **options).token_ids == references
    assert static_rows(target, 256, 6).graphs  # the default path replayed graphs

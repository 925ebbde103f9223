"""A tree's verification on the device: the same decision as the host's walk, its path's rows kept on the
device, the call replayed as a graph per padded size, and one host read per step."""

import random

import pytest
import torch

import specbook.graphs
import specbook.tree_verification
from specbook import DynamicTree, Sampler, autoregressive_generate, speculative_generate
from specbook.cache import SlotCache, keep_positions, keep_tail, new_cache
from specbook.decoder import decoder_for
from specbook.drafters import Draft, EagleDrafter, MedusaDrafter, SampledTreeDrafter, TopKTreeDrafter
from specbook.graphs import TREE_BUCKETS, static_model
from specbook.heads import EagleHead, MedusaHeads
from specbook.tree_verification import tree_outcome, tree_outcome_greedy, verify_tree, verify_tree_greedy
from specbook.trees import tree_attention_mask, tree_positions, tree_shape

from support import SAMPLERS, cached_layers, chi_square_p_value, reads_per_step, tiny_model

PROMPT = torch.tensor([[3, 14, 15, 9, 2, 6, 5]])


def _random_tree(rng, n):
    return [rng.randrange(-1, node) for node in range(n)]


def _probs(generator, rows, vocab, sharpness):
    return (sharpness * torch.randn(rows, vocab, generator=generator)).softmax(-1)


@pytest.mark.parametrize("deterministic", [False, True], ids=["sampled siblings", "one-hot siblings"])
def test_the_device_decides_what_the_walk_decides(deterministic):
    """Random trees, drafts and targets: the same path and next token as `verify_tree` from the same generator."""
    rng, data = random.Random(0), torch.Generator().manual_seed(0)
    for case in range(300):
        n, vocab = rng.randrange(1, 14), rng.choice([2, 3, 5])
        parents = _random_tree(rng, n)
        target = _probs(data, n + 1, vocab, rng.choice([1.0, 4.0]))
        draft = _probs(data, n, vocab, 3.0)
        tokens = torch.multinomial(draft, 1, generator=data)[:, 0]
        if deterministic:
            draft = torch.nn.functional.one_hot(tokens, vocab).float()
        walk = verify_tree(tokens, parents, draft, target, torch.Generator().manual_seed(case))
        outcome = tree_outcome(tree_shape(parents, "cpu"), tokens, draft, target,
                               torch.Generator().manual_seed(case)).tolist()
        assert (outcome[0], outcome[2:2 + outcome[0]], outcome[1]) == (len(walk.path), walk.path, walk.next_token)


def _one_hot_siblings_tree(rng, n, vocab):
    """A random tree of a deterministic drafter, its parents a tensor as a drafter shapes them on the device
    (`grow_dynamic_tree`, `CaPE.expand_on_device`): siblings hold distinct tokens (a top-k), or now and then
    an earlier sibling's token again (CaPE's slots left out)."""
    parents, tokens = _random_tree(rng, n), []
    for node, parent in enumerate(parents):
        taken = {tokens[other] for other in range(node) if parents[other] == parent}
        fresh = [token for token in range(vocab) if token not in taken]
        tokens.append(rng.choice(sorted(taken)) if taken and (rng.random() < 0.3 or not fresh) else rng.choice(fresh))
    return torch.tensor(parents), torch.tensor(tokens)


def test_a_shape_made_on_the_device_is_the_hosts():
    """From a list or from a tensor on the device: the tree's mask, depths, parents' rows and earlier siblings as
    the host writes them out; the ranks (nodes of each child rank, their parents' rows) for a list only."""
    rng = random.Random(2)
    for _ in range(100):
        parents = _random_tree(rng, rng.randrange(0, 20))
        earlier = torch.zeros(len(parents), len(parents), dtype=torch.bool)
        for node, parent in enumerate(parents):
            earlier[node, [other for other in range(node) if parents[other] == parent]] = True
        expected = {"visible": tree_attention_mask(parents), "depths": tree_positions(parents),
                    "parent_rows": torch.tensor([parent + 1 for parent in parents], dtype=torch.long),
                    "earlier": earlier}
        listed, shaped_there = tree_shape(parents, "cpu"), tree_shape(torch.tensor(parents, dtype=torch.long), "cpu")
        for shape in (listed, shaped_there):
            for field, value in expected.items():
                assert torch.equal(getattr(shape, field), value), field
        ranks = [[(node, parents[node] + 1) for node in range(len(parents)) if earlier[node].sum() == rank]
                 for rank in range(len(listed.ranks))]  # (node, its parent's row) per child rank
        assert [sorted(zip(nodes.tolist(), rows.tolist())) for nodes, rows in listed.ranks] == ranks
        assert shaped_there.ranks is None


def test_a_tree_shaped_on_the_device_is_decided_as_the_walk_decides():
    """Without ranks (a tree shaped on the device), one-hot siblings: removing each rejected token from q at
    once (a repeated token has nothing left) gives the walk's path and token from the same generator."""
    rng, data = random.Random(3), torch.Generator().manual_seed(3)
    for case in range(300):
        n, vocab = rng.randrange(1, 10), 6
        parents, tokens = _one_hot_siblings_tree(rng, n, vocab)
        target = _probs(data, n + 1, vocab, rng.choice([1.0, 4.0]))
        one_hot = torch.nn.functional.one_hot(tokens, vocab).float()
        walk = verify_tree(tokens, parents.tolist(), one_hot, target, torch.Generator().manual_seed(case))
        outcome = tree_outcome(tree_shape(parents, "cpu"), tokens, one_hot, target,
                               torch.Generator().manual_seed(case)).tolist()
        assert (outcome[0], outcome[2:2 + outcome[0]], outcome[1]) == (len(walk.path), walk.path, walk.next_token)


def test_a_tree_shaped_on_the_device_must_be_deterministic():
    with pytest.raises(ValueError, match="must be deterministic"):
        Draft(torch.tensor([1, 2]), torch.full((2, 4), 0.25), torch.tensor([-1, 0]))


def test_the_greedy_decision_is_the_greedy_walks():
    rng, data = random.Random(1), torch.Generator().manual_seed(1)
    for _ in range(300):
        n = rng.randrange(0, 14)
        parents = _random_tree(rng, n)
        tokens, target = torch.randint(0, 3, (n,), generator=data), torch.randint(0, 3, (n + 1,), generator=data)
        walk = verify_tree_greedy(tokens, parents, target)
        outcome = tree_outcome_greedy(tree_shape(parents, "cpu"), tokens, target).tolist()
        assert (outcome[0], outcome[2:2 + outcome[0]], outcome[1]) == (len(walk.path), walk.path, walk.next_token)
        assert sorted(outcome[2:]) == list(range(n))  # every node once: the path's, then the others


def test_keep_tail_keeps_what_keep_positions_keeps():
    """Of a tree's rows after the context, the root's and the path's: the same keys and values on the decoder's
    cache (moved on the device) as on Hugging Face's (cropped on the host)."""
    model = tiny_model(seed=2)
    decoder = decoder_for(model)
    ids = torch.randint(0, 64, (1, 15), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        reference, cache = new_cache(model), decoder.new_cache(32)
        model(ids, past_key_values=reference, use_cache=True)
        decoder(ids, past_key_values=cache)
    keep_positions(reference, list(range(9)) + [9, 11, 12])
    keep_tail(cache, torch.tensor([0, 2, 3, 1, 4, 5]), 6, 3)  # rows 9..14 are the tree's; keep 9, 11, 12
    assert cache.get_seq_length() == int(cache.length) == 12
    for (keys, values), (expected_keys, expected_values) in zip(cached_layers(cache), cached_layers(reference)):
        torch.testing.assert_close(keys, expected_keys)
        torch.testing.assert_close(values, expected_values)
    with pytest.raises(ValueError, match=r"count must be in \[0, 6\] \(got 7\)"):
        keep_tail(cache, torch.arange(6), 6, 7)


def test_the_hosts_count_of_a_slot_cache_follows_the_device():
    """The length the host counts (``SlotCache.known``) is the device's after every kind of move; a count on the
    device makes it unknown, and the next question reads it."""
    cache = SlotCache(1, 1, 4, 8, [None], torch.float32, "cpu")
    cache.claim(5)
    cache.rollback(2)
    assert cache.known == int(cache.length) == 3
    cache.claim(7)  # grows
    keep_tail(cache, torch.tensor([1, 3, 0]), 7, 2)
    assert cache.known == int(cache.length) == 5
    cache.rollback(torch.tensor(1))
    assert cache.known is None and cache.get_seq_length() == 4 and cache.known == 4
    cache.reset()
    assert cache.known == int(cache.length) == 0


@pytest.fixture
def replayed(monkeypatch):
    monkeypatch.setattr(specbook.graphs, "CAPTURE_ON_CPU", True)


@pytest.fixture(scope="module")
def models():
    return tiny_model(seed=0), tiny_model(hidden_size=16, num_layers=1, seed=1)


@pytest.mark.parametrize("tree", [(2, 2, 1), (3, 3, 3, 3)], ids=["11 rows", "121 rows: eager"])
def test_a_trees_call_replays_its_padded_graph(models, tree, replayed):
    """A tree of up to the largest bucket's rows replays that bucket's graph, a larger one runs eagerly; both give
    autoregressive decoding's tokens, and the host's count of each cache stays the device's."""
    target, draft = models
    reference = autoregressive_generate(target, PROMPT, 30, Sampler(0)).token_ids
    for _ in range(2):  # the first generation reads its prompt eagerly; the second replays
        drafter = TopKTreeDrafter(draft, tree)
        result = speculative_generate(target, drafter, PROMPT, 30, k=4, sampler=Sampler(0), cache="static")
        assert result.token_ids == reference and all(step.tree_nodes for step in result.steps[:-1])
    runner, rows = static_model(target, 256, "target"), 1 + len(drafter.tree)
    buckets = {key[1] for key in runner.graphs if key[0] == "tree"}  # the last steps' smaller trees too
    assert buckets and buckets <= set(TREE_BUCKETS)
    if rows <= TREE_BUCKETS[-1]:
        assert next(size for size in TREE_BUCKETS if size >= rows) in buckets
    for cache in (runner.cache, drafter.cache):
        assert cache.known == int(cache.length)


def _seeded(kind, *args):
    torch.manual_seed(0)
    return kind(*args).eval()  # a module in training mode keeps Hugging Face's forward


def _reads_per_step(target, drafter, sampler):
    return reads_per_step(lambda new_tokens: speculative_generate(target, drafter(), PROMPT, new_tokens, k=3,
                                                                  sampler=sampler, seed=0, cache="static"), warm=True)


@pytest.mark.parametrize("make", [
    lambda target, draft: TopKTreeDrafter(draft, (2, 2, 1)),
    lambda target, draft: SampledTreeDrafter(draft, (3, 2)),
    lambda target, draft: TopKTreeDrafter(draft, DynamicTree(3, 3, 8)),
    lambda target, draft: MedusaDrafter(target, _seeded(MedusaHeads, target.config.hidden_size, 3)),
    lambda target, draft: EagleDrafter(target, _seeded(EagleHead, target.config), tree=(2, 2)),
    lambda target, draft: EagleDrafter(target, _seeded(EagleHead, target.config), tree=DynamicTree(3, 2, 6)),
], ids=["top-k", "sampled", "dynamic", "medusa", "eagle", "eagle-2"])
@pytest.mark.parametrize("sampler", [Sampler(0), Sampler(1.0)], ids=["greedy", "sampled"])
def test_one_host_read_per_tree_step(models, make, sampler, replayed):
    """The decision, the drafts (and a tree shaped on the device) and the path's order come back in one read;
    the caches keep the path on the device."""
    target, draft = models
    assert _reads_per_step(target, lambda: make(target, draft), sampler) <= 1


def test_a_read_more_per_tree_step_is_caught(models, replayed, monkeypatch):
    target, draft = models
    original = specbook.decoding._tree_step

    def chatty(target, cache, pending, draft, *args):
        draft.tokens.tolist()
        return original(target, cache, pending, draft, *args)

    monkeypatch.setattr(specbook.decoding, "_tree_step", chatty)
    assert _reads_per_step(target, lambda: TopKTreeDrafter(draft, (2, 2, 1)), Sampler(0)) > 1


@pytest.mark.parametrize("make", [lambda draft: TopKTreeDrafter(draft, (2, 2)),
                                  lambda draft: SampledTreeDrafter(draft, (3, 2)),
                                  lambda draft: TopKTreeDrafter(draft, DynamicTree(2, 2, 3))],
                         ids=["top-k", "sampled", "dynamic"])
def test_sampled_trees_on_the_graphs_follow_the_target(tiny_pair, make, replayed):
    target, draft = tiny_pair
    assert chi_square_p_value(target, make(draft), SAMPLERS[1], cache="static") > 1e-3


def test_chi_square_on_the_graphs_catches_siblings_checked_against_the_original_target(tiny_pair, replayed,
                                                                                      monkeypatch):
    monkeypatch.setattr(specbook.tree_verification, "residual_distribution", lambda target_probs, draft_probs, **_:
                        target_probs)
    target, draft = tiny_pair
    assert chi_square_p_value(target, TopKTreeDrafter(draft, (2, 2)), SAMPLERS[0], samples=400, cache="static") < 1e-6


@pytest.mark.parametrize("capture", [False, True], ids=["static", "graphs stand-in"])
def test_a_path_kept_out_of_order_is_caught(models, capture, monkeypatch):
    """Keeping a tree's first rows in node order rather than the path's (a rejected sibling's keys in place of
    the accepted node's) changes the greedy tokens: the equality tests see where the path's keys go."""
    monkeypatch.setattr(specbook.graphs, "CAPTURE_ON_CPU", capture)
    original = SlotCache.keep_tail
    monkeypatch.setattr(SlotCache, "keep_tail", lambda self, rows, fed, count: original(
        self, torch.arange(len(rows)), fed, count))
    target, draft = models
    reference = autoregressive_generate(target, PROMPT, 30, Sampler(0)).token_ids
    result = speculative_generate(target, TopKTreeDrafter(draft, (2, 2, 1)), PROMPT, 30, k=3, sampler=Sampler(0),
                                  cache="static")
    assert result.token_ids != reference

"""Lookahead decoding: the window's mask, one Jacobi step, the pool, exactness greedy and sampled, bad input."""

import pytest
import torch

import specbook.tree_verification
from specbook import Sampler, autoregressive_generate, speculative_generate
from specbook.drafters import LookaheadDrafter
from specbook.drafters.lookahead import lookahead_parents, merge_candidates
from specbook.trees import tree_attention_mask, tree_positions

from families import hf_greedy, tiny_family_model
from support import SAMPLERS, chi_square_p_value, tiny_model


def test_the_window_is_a_tree_of_diagonal_trajectories():
    """Token (j, i) sits at depth i + j + 1 and sees level 0 up to column i and its own column below it."""
    window, levels = 4, 3
    parents = lookahead_parents(window, levels)
    visible, depths = tree_attention_mask(parents), tree_positions(parents)
    for j in range(levels):
        for i in range(window):
            row = 1 + j * window + i
            seen = {(0, c) for c in range(i + 1)} | {(level, i) for level in range(1, j + 1)}
            expected = [True] + [(node // window, node % window) in seen for node in range(window * levels)]
            assert visible[row].tolist() == expected, (j, i)
            assert depths[row] == i + j + 1


def test_candidates_merge_into_a_trie_of_distinct_siblings():
    tokens, parents = merge_candidates([(5, 6, 7), (5, 6, 8), (9,), (5, 2)])
    assert tokens == [5, 6, 7, 8, 9, 2]
    assert parents == [-1, 0, 1, 1, -1, 0]
    assert merge_candidates([]) == ([], [])


def test_the_pool_keeps_the_newest_distinct_ngrams():
    drafter = LookaheadDrafter(window=2, ngram=3, candidates=2)
    drafter.start(torch.tensor([[1, 2, 3]]))
    for rest in [(4, 5), (6, 7), (4, 5), (8, 9)]:
        drafter._remember(1, rest)
    assert list(drafter.pool[1]) == [(4, 5), (8, 9)]  # (6, 7) was the oldest when the third arrived
    draft = drafter.propose(1, Sampler(0), None)  # k = 1 verifies the first token of each, newest first
    assert draft.tokens.tolist() == [] and draft.parents == []  # the pending token is 3: nothing starts with it
    drafter.update(0, 1)
    draft = drafter.propose(2, Sampler(0), None)
    assert draft.tokens.tolist() == [8, 9, 4, 5] and draft.parents == [-1, 0, -1, 2]
    assert draft.side_parents == lookahead_parents(2, 1) and len(draft.side_tokens) == 2


class _Recording(LookaheadDrafter):
    """Keeps what each call's window held and the logits the target gave its rows."""

    def propose(self, k, sampler, generator, keep_drafting=None):
        self.window_held = [list(level) for level in self.levels]
        return super().propose(k, sampler, generator, keep_drafting)

    def observe_side(self, logits):
        self.seen = getattr(self, "seen", []) + [(self.window_held, logits.clone())]
        super().observe_side(logits)


def test_one_jacobi_step_is_what_the_target_says_after_each_trajectory(target):
    """The row of token (j, i) holds the target's logits after the plain sequence context, level 0 up to column i,
    then column i's levels 1..j: the engine feeds the window with the right mask and positions, and hands back
    the window's rows in order."""
    prompt = torch.randint(3, 64, (1, 9), generator=torch.Generator().manual_seed(1))
    drafter = _Recording(window=3, ngram=4, candidates=3)
    result = speculative_generate(target, drafter, prompt, 12, k=3, sampler=Sampler(0))
    committed = prompt[0].tolist() + result.token_ids
    position = prompt.shape[1] - 1  # the pending token's index in committed
    for step, (levels, logits) in zip(result.steps, drafter.seen):
        context = committed[: position + 1]
        for j, level in enumerate(levels):
            for i in range(3):
                sequence = context + levels[0][: i + 1] + [levels[level][i] for level in range(1, j + 1)]
                with torch.no_grad():
                    expected = target(torch.tensor([sequence])).logits[0, -1]
                torch.testing.assert_close(logits[j * 3 + i], expected, atol=1e-4, rtol=0)
        position += step.accepted + 1
    assert len(drafter.seen) == len(result.steps)


@pytest.mark.parametrize("window, ngram, candidates", [(1, 2, 1), (3, 3, 2), (5, 4, 5), (4, 6, 3)])
def test_greedy_lookahead_equals_autoregressive(target, window, ngram, candidates):
    for seed in range(3):
        prompt = torch.randint(3, 64, (1, 6 + seed), generator=torch.Generator().manual_seed(seed))
        expected = autoregressive_generate(target, prompt, 30, Sampler(0)).token_ids
        result = speculative_generate(target, LookaheadDrafter(window, ngram, candidates), prompt, 30, k=ngram - 1,
                                      sampler=Sampler(0))
        assert result.token_ids == expected
        assert all(step.accepted <= ngram - 1 for step in result.steps)


def test_lookahead_accepts_what_the_window_found():
    """On a model that falls into a loop, the window's n-grams are accepted: the test above can fail."""
    model = tiny_family_model("llama")
    prompt = torch.tensor([[5, 9, 14, 5, 9]])
    result = speculative_generate(model, LookaheadDrafter(4, 3, 4), prompt, 40, k=2, sampler=Sampler(0))
    assert result.token_ids == hf_greedy(model, prompt, 40)
    assert sum(step.accepted for step in result.steps) > 5
    assert {step.side_nodes for step in result.steps} == {4, 8}  # one level, then the whole window
    scored = [1 + step.tree_nodes + step.side_nodes for step in result.steps]  # pending, trie, window
    assert result.stats.positions_per_call == pytest.approx(sum(scored) / len(scored))


def test_positions_per_call_of_a_chain(target, draft):
    """The pending token and K drafts: the last step drafts fewer, to stop at max_new_tokens."""
    result = speculative_generate(target, draft, torch.tensor([[1, 2, 3]]), 20, k=3, sampler=Sampler(0))
    assert result.stats.positions_per_call == pytest.approx(
        sum(1 + len(step.drafted) for step in result.steps) / len(result.steps))
    assert autoregressive_generate(target, torch.tensor([[1, 2, 3]]), 5).stats.positions_per_call == 1


def test_the_window_is_left_out_where_it_would_pass_the_context():
    """GPT-2 has learned positions: a window row past its last position would fail deep inside torch."""
    model = tiny_family_model("gpt2")  # 256 positions
    prompt = torch.randint(3, 96, (1, 230), generator=torch.Generator().manual_seed(0))
    result = speculative_generate(model, LookaheadDrafter(5, 4, 5), prompt, 26, k=3, sampler=Sampler(0))
    assert result.token_ids == hf_greedy(model, prompt, 26)
    assert result.steps[-1].side_nodes == 0 and result.steps[0].side_nodes > 0


@pytest.mark.parametrize("sampler", SAMPLERS, ids=["plain", "warped"])
def test_sampled_lookahead_follows_the_target(tiny_pair, sampler):
    target, _ = tiny_pair
    assert chi_square_p_value(target, LookaheadDrafter(3, 2, 3), sampler, k=1) > 1e-3


def test_chi_square_catches_candidates_checked_against_the_original_target(tiny_pair, monkeypatch):
    """Trying the next candidate against the original q, instead of q without the rejected one, biases the output."""
    monkeypatch.setattr(specbook.tree_verification, "residual_distribution",
                        lambda target_probs, draft_probs, **_: target_probs)
    target, _ = tiny_pair
    assert chi_square_p_value(target, LookaheadDrafter(3, 2, 3), SAMPLERS[0], samples=400, k=1) < 1e-6


@pytest.mark.parametrize("options, match", [
    (dict(window=0), "window must be an integer >= 1"),
    (dict(ngram=1), "ngram must be an integer >= 2"),
    (dict(ngram=2.5), "ngram must be an integer >= 2"),
    (dict(candidates=0), "candidates must be an integer >= 1"),
])
def test_bad_sizes_are_refused(options, match):
    with pytest.raises(ValueError, match=match):
        LookaheadDrafter(**options)


def test_the_static_cache_gives_the_same_tokens():
    """Lookahead's trees verified on the decoder's static cache: autoregressive decoding's tokens."""
    model, prompt = tiny_model(), torch.tensor([[1, 2, 3]])
    assert speculative_generate(model, LookaheadDrafter(), prompt, 8, k=3, sampler=Sampler(0), cache="static").token_ids \
        == autoregressive_generate(model, prompt, 8, Sampler(0)).token_ids


def test_lookahead_on_the_built_in_pair():
    """The book's target, an open prompt: exact, and more than one token per call (chapter 6b)."""
    from specbook import load_pair
    from specbook.bench import OPEN_ENDED

    pair = load_pair("shakespeare")
    prompt = pair.encode(OPEN_ENDED[1])
    expected = autoregressive_generate(pair.target, prompt, 48, Sampler(0)).token_ids
    result = speculative_generate(pair.target, LookaheadDrafter(), prompt, 48, k=3, sampler=Sampler(0))
    assert result.token_ids == expected and result.stats.tokens_per_step > 1.5

"""Ouroboros: a draft model's chain extended by phrases from earlier committed text, verified as a token tree."""

import pytest
import torch

from specbook import Sampler, autoregressive_generate, load_pair, speculative_generate
from specbook.bench import REPETITIVE
from specbook.drafters import OuroborosDrafter
from specbook.drafters.ouroboros import PhrasePool

from support import SAMPLERS, chi_square_p_value, tiny_model


def test_the_pool_keeps_the_newest_phrases_after_each_token():
    pool = PhrasePool(phrase_length=2, per_key=2)
    pool.add([5, 1, 2, 5, 3, 4])
    assert pool.after(5, 3) == [(3, 4), (1, 2)] and pool.after(1, 3) == [(2, 5)] and pool.after(4, 3) == []
    pool.add([5, 1, 2, 5, 3, 4, 5, 1, 2], start=6)  # only the phrases ending at the new tokens
    assert pool.after(5, 3) == [(1, 2), (3, 4)]


@pytest.mark.parametrize("k", [2, 4, 6])
def test_greedy_equals_autoregressive(k):
    target, draft = tiny_model(seed=0), tiny_model(hidden_size=16, num_layers=1, seed=1)
    prompt = torch.tensor([[3, 14, 15, 9, 2, 6, 5, 3, 14, 15, 9, 2, 6]])
    reference = autoregressive_generate(target, prompt, 40, Sampler(0)).token_ids
    drafter = OuroborosDrafter(draft, phrase_length=2)
    for _ in range(2):  # a cold pool, then the warm one
        assert speculative_generate(target, drafter, prompt, 40, k=k, sampler=Sampler(0)).token_ids == reference


def test_phrases_make_steps_longer_than_the_chain_on_the_built_in_pair():
    """On repetitive text the pool offers what the target then writes: steps keep more than the chain drafted,
    and every token is still the target's own."""
    pair = load_pair("shakespeare")
    prompt = pair.encode(REPETITIVE[0])
    reference = autoregressive_generate(pair.target, prompt, 48, Sampler(0)).token_ids
    drafter = OuroborosDrafter(pair.draft, phrase_length=3, chain=2)
    result = speculative_generate(pair.target, drafter, prompt, 48, k=5, sampler=Sampler(0))
    assert result.token_ids == reference
    assert any(step.accepted > 2 for step in result.steps)  # a phrase passed after the whole chain
    assert result.stats.draft_calls <= 2 * len(result.steps)  # the phrases cost no draft calls


@pytest.mark.parametrize("sampler", SAMPLERS, ids=["plain", "warped"])
def test_sampled_output_follows_the_target(tiny_pair, sampler):
    target, draft = tiny_pair
    assert chi_square_p_value(target, OuroborosDrafter(draft, phrase_length=2), sampler, k=3) > 1e-3


class _ClaimsSampledPhrases(OuroborosDrafter):
    """Broken on purpose: reports its pooled phrases as if drawn from a uniform p, which they were not."""

    def propose(self, k, sampler, generator, keep_drafting=None):
        draft = super().propose(k, sampler, generator, keep_drafting)
        if draft.parents is not None:
            draft.probs[self.chain_length:] = 1 / draft.probs.shape[1]
        return draft


def test_the_chi_square_catches_phrases_reported_with_a_wrong_p(tiny_pair):
    target, draft = tiny_pair
    assert chi_square_p_value(target, _ClaimsSampledPhrases(draft, phrase_length=2), SAMPLERS[0], samples=1000,
                              k=3) < 1e-6


@pytest.mark.parametrize("options, match", [
    (dict(phrase_length=1), "phrase_length must be an integer >= 2"),
    (dict(max_phrases=0), "max_phrases must be an integer >= 1"),
    (dict(chain=0), "chain must be an integer >= 1"),
])
def test_bad_options(options, match):
    with pytest.raises(ValueError, match=match):
        OuroborosDrafter(tiny_model(), **options)

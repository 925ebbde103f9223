"""Tests for the model-free drafters: prompt lookup and the n-gram storages of NASD.

They are lossless like every drafter (greedy equal to autoregressive, sampled output following the
target by a chi-square test that a broken verifier fails), and their drafts are actually used: the
tiny random target falls into loops, which is exactly the repetition these drafters exploit.
"""

import pytest
import torch

import specbook.rejection
from specbook.decoding import autoregressive_generate, speculative_generate
from specbook.drafters import NGramDrafter, NGramStorage, PromptLookupDrafter
from specbook.sampling import Sampler

from support import BATCH, SAMPLERS, chi_square_p_value

PROMPT = torch.tensor([[3, 14, 15, 9, 2, 6, 5]])
REPEATING = PROMPT.repeat(1, 3)  # a prompt that repeats itself

DRAFTERS = {
    "prompt-lookup": PromptLookupDrafter,
    "prompt-lookup-2-to-4": lambda: PromptLookupDrafter(max_ngram=4, min_ngram=2),
    "multilevel": NGramDrafter,
    "onelevel": lambda: NGramDrafter(storage="onelevel"),
    "4-gram": lambda: NGramDrafter(n=4),
    "filler": lambda: NGramDrafter(filler_top_k=3),
    "unigram-fallback": lambda: NGramDrafter(stop_if_unknown=False),
    "kept": lambda: NGramDrafter(reset=False),
}


def _new_drafter(drafter_class, prompt):
    drafter = drafter_class()
    drafter.start(torch.tensor([prompt]))
    return drafter


# --- lossless, and not vacuously so

@pytest.mark.parametrize("prompt", [PROMPT, REPEATING], ids=["prompt", "repeating"])
@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("name", DRAFTERS)
def test_greedy_speculative_equals_autoregressive(target, name, k, prompt):
    reference = autoregressive_generate(target, prompt, 40, Sampler(0)).token_ids
    result = speculative_generate(target, DRAFTERS[name](), prompt, 40, k=k, sampler=Sampler(0))
    assert result.token_ids == reference
    assert sum(step.accepted for step in result.steps) >= 5  # the drafts were used: the test is not vacuous
    assert result.stats.draft_calls == 0


@pytest.mark.parametrize("drafter", [
    PromptLookupDrafter(),
    NGramDrafter(stop_if_unknown=False),  # drafts from the first step on, two tokens at a time
    NGramDrafter(filler_top_k=2, reset=False),  # learns across the 1,500 generations: still lossless
], ids=["prompt-lookup", "unigram-fallback", "filler-kept"])
def test_sampled_output_follows_the_target(tiny_pair, drafter):
    target, _ = tiny_pair
    learns = getattr(drafter, "reset", True) is False  # its storage must live through every generation: one at a time
    assert chi_square_p_value(target, drafter, SAMPLERS[0], batch=None if learns else BATCH) > 1e-3


def test_chi_square_catches_a_fresh_sample_after_a_mismatch(tiny_pair, monkeypatch):
    """NASD's own loop draws the correction from q itself after a mismatch: biased toward the draft, and caught."""
    monkeypatch.setattr(specbook.rejection, "residual_distribution",
                        lambda target_probs, draft_probs, **_: target_probs)
    assert chi_square_p_value(tiny_pair[0], PromptLookupDrafter(), SAMPLERS[0], samples=1000, batch=BATCH) < 1e-6


def test_the_engine_feeds_the_filler(target):
    """Greedily q is one-hot, so the filler counts each emitted token once more, at its own context."""
    drafter = NGramDrafter(n=2, filler_top_k=3)
    generated = speculative_generate(target, drafter, PROMPT, 20, k=4, sampler=Sampler(0)).token_ids
    text = PROMPT[0].tolist() + generated
    bigrams = sum(sum(counts.values()) for counts in drafter.storage.counts.values())
    assert bigrams == (len(text) - 1) + len(generated)


# --- the storages

def test_multilevel_backs_off_down_to_a_single_token_context():
    storage = NGramStorage(n=3, kind="multilevel")
    storage.add([5, 1], [7])
    storage.add([6, 1], [8, 8])
    assert storage.context_lengths == (2, 1)
    assert storage.lookup([5, 1]) == 7  # the longest context wins over the more frequent bigram
    assert storage.lookup([9, 1]) == 8  # unknown (9, 1): back off to the bigram context (1,)
    assert storage.lookup([1]) == 8
    assert storage.lookup([9, 2]) is None  # nothing known: no guess


def test_onelevel_knows_only_full_contexts():
    storage = NGramStorage(n=3, kind="onelevel")
    storage.add([5, 1], [7])
    assert storage.context_lengths == (2,)
    assert storage.lookup([4, 5, 1]) == 7
    assert storage.lookup([9, 1]) is None
    assert storage.lookup([1]) is None


@pytest.mark.parametrize("n, kind, unigram, lengths", [
    (4, "multilevel", False, (3, 2, 1)), (4, "onelevel", False, (3,)), (4, "multilevel", True, (3, 2, 1, 0)),
    (4, "onelevel", True, (3, 0)), (1, "multilevel", False, (0,)), (1, "onelevel", True, (0,)),
])
def test_context_lengths(n, kind, unigram, lengths):
    assert NGramStorage(n, kind, unigram).context_lengths == lengths


def test_the_most_frequent_continuation_wins_and_ties_go_to_the_latest():
    storage = NGramStorage(n=2)
    storage.add([1], [4, 5])
    assert storage.lookup([1]) == 5
    storage.add([1], [4])
    assert storage.lookup([1]) == 4
    storage.add([1], [5])
    assert storage.lookup([1]) == 5
    assert storage.counts[(1,)] == {4: 2, 5: 2}


def test_ngram_drafter_chains_the_most_frequent_continuation():
    drafter = _new_drafter(NGramDrafter, [1, 2, 3, 1])
    draft = drafter.propose(5, Sampler(), None)
    assert draft.probs is None and draft.tokens.dtype == torch.long
    assert draft.tokens.tolist() == [2, 3, 1, 2, 3]


def test_ngram_drafter_stops_at_an_unknown_context_or_backs_off_to_the_unigram():
    assert _new_drafter(NGramDrafter, [1, 2, 3]).propose(4, Sampler(), None).tokens.tolist() == []
    fallback = _new_drafter(lambda: NGramDrafter(stop_if_unknown=False), [1, 2, 2, 3])
    assert fallback.propose(3, Sampler(), None).tokens.tolist() == [2, 3, 2]  # unigram 2, (2,) -> 3, unigram 2


def test_ngram_drafter_learns_committed_tokens():
    drafter = _new_drafter(lambda: NGramDrafter(n=2), [1, 2, 1])
    assert drafter.propose(3, Sampler(), None).tokens.tolist() == [2, 1, 2]
    drafter.update(1, 7)  # kept the draft 2, then the target said 7
    assert drafter.tokens == [1, 2, 1, 2, 7]
    assert drafter.storage.counts[(2,)] == {1: 1, 7: 1}
    assert drafter.propose(2, Sampler(), None).tokens.tolist() == []  # 7 was never followed


def test_filler_counts_the_target_top_k_at_each_committed_position():
    drafter = _new_drafter(lambda: NGramDrafter(n=2, filler_top_k=2), [1, 2, 1])
    drafter.propose(1, Sampler(), None)
    drafter.update(1, 5)  # text 1 2 1 | 2 5: the step committed positions 3 and 4
    target_probs = torch.zeros(2, 10)  # (accepted + 1, vocab)
    target_probs[0, [2, 6, 8]] = torch.tensor([0.5, 0.3, 0.2])  # after (1,): the top 2 are 2 and 6
    target_probs[1, 9] = 1.0  # after (2,): one-hot, so the second of the top 2 has q = 0 and is skipped
    drafter.observe_target(target_probs)
    assert drafter.storage.counts[(1,)] == {2: 3, 6: 1}  # 2 twice in the text, once from the filler
    assert drafter.storage.counts[(2,)] == {1: 1, 5: 1, 9: 1}


def test_filler_off_ignores_the_target():
    drafter = _new_drafter(NGramDrafter, [1, 2])
    drafter.observe_target(torch.full((1, 4), 0.25))
    assert drafter.storage.counts == {(1,): {2: 1}}


@pytest.mark.parametrize("reset", [True, False])
def test_reset_clears_the_storage_at_start_or_keeps_it(reset):
    drafter = _new_drafter(lambda: NGramDrafter(n=2, reset=reset), [1, 2, 3])
    drafter.start(torch.tensor([[7, 8]]))
    assert drafter.tokens == [7, 8]
    assert drafter.storage.lookup([1]) == (None if reset else 2)
    assert drafter.storage.lookup([7]) == 8


# --- prompt lookup

def test_prompt_lookup_copies_after_the_most_recent_occurrence():
    drafter = _new_drafter(PromptLookupDrafter, [1, 2, 9, 1, 2, 8, 5, 1, 2])
    draft = drafter.propose(3, Sampler(), None)
    assert draft.probs is None
    assert draft.tokens.tolist() == [8, 5, 1]


def test_prompt_lookup_prefers_the_longest_match():
    drafter = _new_drafter(lambda: PromptLookupDrafter(max_ngram=2), [7, 2, 5, 9, 2, 6, 7, 2])
    assert drafter.propose(1, Sampler(), None).tokens.tolist() == [5]  # (7, 2) beats the more recent (2,)


def test_prompt_lookup_keeps_copying_past_the_present():
    drafter = _new_drafter(PromptLookupDrafter, [4, 1, 2, 3, 1, 2])
    assert drafter.propose(7, Sampler(), None).tokens.tolist() == [3, 1, 2, 3, 1, 2, 3]


def test_prompt_lookup_min_ngram_and_no_match():
    assert _new_drafter(lambda: PromptLookupDrafter(min_ngram=2), [1, 2, 3, 4, 1]).propose(
        3, Sampler(), None).tokens.tolist() == []
    assert _new_drafter(PromptLookupDrafter, [1, 2, 3, 4, 1]).propose(3, Sampler(), None).tokens.tolist() == [2, 3, 4]
    assert _new_drafter(PromptLookupDrafter, [1, 2, 3]).propose(3, Sampler(), None).tokens.tolist() == []


def test_prompt_lookup_indexes_committed_tokens():
    drafter = _new_drafter(PromptLookupDrafter, [5, 6, 5])
    assert drafter.propose(2, Sampler(), None).tokens.tolist() == [6, 5]
    drafter.update(0, 7)  # text 5 6 5 7
    drafter.update(0, 5)  # text 5 6 5 7 5: (7, 5) is new, (5,) was last followed by 7
    assert drafter.propose(2, Sampler(), None).tokens.tolist() == [7, 5]


# --- bad input gets a clear error naming the argument

@pytest.mark.parametrize("make, match", [
    (lambda: NGramDrafter(n=0), "n must be an integer >= 1"),
    (lambda: NGramDrafter(n=2.5), "n must be an integer >= 1"),
    (lambda: NGramDrafter(storage="twolevel"), r"storage must be one of \('multilevel', 'onelevel'\)"),
    (lambda: NGramDrafter(filler_top_k=-1), "filler_top_k must be an integer >= 0"),
    (lambda: NGramStorage(n=0), "n must"),
    (lambda: PromptLookupDrafter(max_ngram=0), "max_ngram must be an integer >= 1"),
    (lambda: PromptLookupDrafter(min_ngram=0), "min_ngram must be an integer >= 1"),
    (lambda: PromptLookupDrafter(max_ngram=2, min_ngram=3), "min_ngram must be <= max_ngram"),
])
def test_bad_input(make, match):
    with pytest.raises(ValueError, match=match):
        make()

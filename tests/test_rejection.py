"""Tests for specbook.rejection: the accept/reject math, and that the verifier is lossless.

The statistical tests use fixed seeds and a tight threshold (p > 1e-3), and each is paired with a
deliberately broken verifier (correction drawn from q instead of the residual) that must fail it
(p < 1e-6): a lossless test that cannot fail would prove nothing.
"""

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st
from scipy import stats

from specbook import rejection
from specbook.rejection import (
    Verification,
    acceptance_rate,
    check_distribution,
    output_distribution,
    residual_distribution,
    verify_chain,
    verify_chain_greedy,
)

PROPERTY = settings(max_examples=50, deadline=None)


def _random_distribution(rng: np.random.Generator, vocab: int, with_zeros: bool) -> torch.Tensor:
    """A Dirichlet(0.5) vector, with some entries zeroed (at least one kept) if asked."""
    probs = rng.dirichlet(np.full(vocab, 0.5))
    if with_zeros:
        zeroed = rng.random(vocab) < 0.4
        zeroed[rng.integers(vocab)] = False
        probs[zeroed] = 0.0
    return torch.tensor(probs / probs.sum())


@st.composite
def distribution_pairs(draw):
    """(target_probs, draft_probs) over a vocabulary of 2..12, with zeros and p == q sometimes."""
    vocab = draw(st.integers(2, 12))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    target_probs = _random_distribution(rng, vocab, with_zeros=draw(st.booleans()))
    if draw(st.integers(0, 4)) == 0:
        return target_probs, target_probs.clone()
    return target_probs, _random_distribution(rng, vocab, with_zeros=draw(st.booleans()))


# acceptance rate


@PROPERTY
@given(distribution_pairs())
def test_acceptance_rate_is_overlap_and_one_minus_total_variation(pair):
    target_probs, draft_probs = pair
    alpha = acceptance_rate(target_probs, draft_probs)
    overlap = sum(min(p, q) for p, q in zip(draft_probs.tolist(), target_probs.tolist()))
    total_variation = 0.5 * (target_probs - draft_probs).abs().sum()
    assert alpha.shape == ()
    assert alpha.item() == pytest.approx(overlap, abs=1e-12)
    assert alpha.item() == pytest.approx(1 - total_variation.item(), abs=1e-12)
    assert acceptance_rate(draft_probs, target_probs).item() == pytest.approx(alpha.item())
    assert (abs(alpha.item() - 1) < 1e-12) == torch.equal(target_probs, draft_probs)


def test_acceptance_rate_is_batched():
    rng = np.random.default_rng(0)
    target_probs = torch.stack([_random_distribution(rng, 5, False) for _ in range(6)])
    draft_probs = torch.stack([_random_distribution(rng, 5, True) for _ in range(6)])
    batched = acceptance_rate(target_probs.view(2, 3, 5), draft_probs.view(2, 3, 5))
    rows = torch.stack([acceptance_rate(q, p) for q, p in zip(target_probs, draft_probs)])
    assert batched.shape == (2, 3)
    torch.testing.assert_close(batched.flatten(), rows)


# residual


@PROPERTY
@given(distribution_pairs())
def test_residual_is_normalised_positive_part(pair):
    target_probs, draft_probs = pair
    residual = residual_distribution(target_probs, draft_probs)
    assert not residual.isnan().any()
    assert residual.sum().item() == pytest.approx(1, abs=1e-12)
    if torch.equal(target_probs, draft_probs):
        torch.testing.assert_close(residual, target_probs)  # defined even with no residual mass
    else:
        assert (residual >= 0).all()
        assert (residual[draft_probs >= target_probs] == 0).all()
        excess = (target_probs - draft_probs).clamp(min=0)
        torch.testing.assert_close(residual, excess / excess.sum())


def test_residual_is_batched_with_equal_rows():
    target_probs = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    draft_probs = torch.tensor([[0.9, 0.1, 0.0], [0.2, 0.3, 0.5]])
    expected = torch.tensor([[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]])
    torch.testing.assert_close(residual_distribution(target_probs, draft_probs), expected)


# output distribution


@PROPERTY
@given(distribution_pairs())
def test_residual_correction_outputs_the_target_exactly(pair):
    target_probs, draft_probs = pair
    output = output_distribution(target_probs, draft_probs, correction="residual")
    torch.testing.assert_close(output, target_probs, rtol=0, atol=1e-12)


def test_output_handles_zero_draft_probability():
    target_probs = torch.tensor([0.2, 0.3, 0.5])
    draft_probs = torch.tensor([1.0, 0.0, 0.0])
    output = output_distribution(target_probs, draft_probs)
    assert not output.isnan().any()
    torch.testing.assert_close(output, target_probs)


def test_target_correction_is_biased():
    # alpha = 0.6. Accepted mass min(p, q) = [0.5, 0.1]; the rejected 0.4 must all go to token 1,
    # which the residual does ([0, 1]) and a fresh draw from q does not ([0.5, 0.5]).
    target_probs = torch.tensor([0.5, 0.5])
    draft_probs = torch.tensor([0.9, 0.1])
    biased = output_distribution(target_probs, draft_probs, correction="target")
    torch.testing.assert_close(biased, torch.tensor([0.7, 0.3]))
    torch.testing.assert_close(output_distribution(target_probs, draft_probs), target_probs)


def test_unknown_correction_is_rejected():
    probs = torch.tensor([0.5, 0.5])
    with pytest.raises(ValueError, match="correction must be one of .*residual.*target"):
        output_distribution(probs, probs, correction="draft")


# input validation of the vector functions


@pytest.mark.parametrize("bad, message", [
    (torch.tensor([0.5, 0.43]),
     r"target_probs must sum to 1 along the last dimension \(got 0.93\)"),
    (torch.tensor([1.1, -0.1]), "target_probs must be non-negative"),
    (torch.tensor([float("nan"), 1.0]), "target_probs must not contain NaN"),
    (torch.tensor([0, 1]), "target_probs must be a floating-point tensor"),
    ([0.5, 0.5], "target_probs must be a torch.Tensor"),
    (torch.zeros(2, 0), "target_probs must have a non-empty last"),
])
def test_bad_target_probs_are_named(bad, message):
    with pytest.raises(ValueError, match=message):
        acceptance_rate(bad, torch.tensor([0.5, 0.5]))


def test_bad_draft_probs_are_named():
    with pytest.raises(ValueError, match="draft_probs must sum to 1"):
        residual_distribution(torch.tensor([0.5, 0.5]), torch.tensor([[0.5, 0.5], [0.5, 0.6]]))


def test_mismatched_shapes_name_both_arguments():
    with pytest.raises(ValueError, match=r"target_probs and draft_probs .*\(3,\) and \(4,\)"):
        acceptance_rate(torch.full((3,), 1 / 3), torch.full((4,), 0.25))


def test_check_distribution_accepts_rows_within_tolerance():
    check_distribution(torch.tensor([[0.5, 0.50005], [1.0, 0.0]]), "probs")
    with pytest.raises(ValueError, match="probs must sum to 1"):
        check_distribution(torch.tensor([[0.5, 0.50005], [1.0, 0.0]]), "probs", atol=1e-6)


# verify_chain: statistics over many chains with i.i.d. positions

IID_TARGET = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
IID_DRAFT = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
IID_K = 3
IID_ALPHA = 0.5  # sum of min(p, q) = 0.1 + 0.2 + 0.15 + 0.05
NUM_CHAINS = 8_000  # the broken verifier's bias gives p ~ 1e-180 at this size


def _run_iid_chains(seed: int = 0) -> list[tuple[list[int], Verification]]:
    """Draft and verify NUM_CHAINS chains with p and q the same at every position."""
    generator = torch.Generator().manual_seed(seed)
    draft_probs = IID_DRAFT.expand(IID_K, -1)  # (K, vocab)
    target_probs = IID_TARGET.expand(IID_K + 1, -1)  # (K + 1, vocab)
    drafts = torch.multinomial(draft_probs, NUM_CHAINS, replacement=True, generator=generator)
    return [(chain.tolist(), verify_chain(chain, draft_probs, target_probs, generator,
                                          validate=False)) for chain in drafts.T]


@functools.cache
def _iid_chains() -> list[tuple[list[int], Verification]]:
    return _run_iid_chains()


def _first_token_p_value(chains) -> float:
    first = [drafts[0] if outcome.num_accepted else outcome.next_token
             for drafts, outcome in chains]
    counts = np.bincount(first, minlength=len(IID_TARGET))
    return stats.chisquare(counts, len(chains) * IID_TARGET.numpy()).pvalue


def test_first_emitted_token_follows_target():
    assert _first_token_p_value(_iid_chains()) > 1e-3


def test_first_token_test_catches_a_broken_verifier(monkeypatch):
    monkeypatch.setattr(rejection, "residual_distribution",
                        lambda target_probs, draft_probs, **_: target_probs)
    assert _first_token_p_value(_run_iid_chains()) < 1e-6


def test_first_draft_is_accepted_with_probability_alpha():
    assert acceptance_rate(IID_TARGET, IID_DRAFT).item() == pytest.approx(IID_ALPHA)
    accepted = sum(outcome.num_accepted >= 1 for _, outcome in _iid_chains())
    assert stats.binomtest(accepted, NUM_CHAINS, IID_ALPHA).pvalue > 1e-3


def test_number_accepted_is_truncated_geometric():
    # P(n) = alpha^n (1 - alpha) for n < K, and alpha^K for n = K (Leviathan et al. Section 3.3).
    counts = np.bincount([outcome.num_accepted for _, outcome in _iid_chains()],
                         minlength=IID_K + 1)
    expected = [IID_ALPHA**n * (1 - IID_ALPHA) for n in range(IID_K)] + [IID_ALPHA**IID_K]
    assert stats.chisquare(counts, NUM_CHAINS * np.array(expected)).pvalue > 1e-3


def test_bonus_exactly_when_all_drafts_accepted():
    outcomes = [outcome for _, outcome in _iid_chains()]
    assert all(outcome.bonus == (outcome.num_accepted == IID_K) for outcome in outcomes)
    assert any(outcome.bonus for outcome in outcomes) and not all(o.bonus for o in outcomes)


# verify_chain: the whole emitted sequence of a tiny Markov target

TARGET_TABLE = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.3, 0.5, 0.2]],
                            dtype=torch.float64)  # row = q(. | previous token)
DRAFT_TABLE = torch.tensor([[0.2, 0.3, 0.5], [0.5, 0.4, 0.1], [0.3, 0.1, 0.6]],
                           dtype=torch.float64)  # row = p(. | previous token)
SEQUENCE_K = 2
SEQUENCE_LENGTH = 3  # enough to cover a whole step: K accepted drafts and the bonus
NUM_SEQUENCES = 4_000  # 27 cells, each expecting >= 16; the broken verifier gives p ~ 1e-270


def _speculative_sequence(generator: torch.Generator) -> tuple[int, ...]:
    """The first SEQUENCE_LENGTH tokens of speculative decoding from token 0."""
    tokens = [0]
    while len(tokens) <= SEQUENCE_LENGTH:
        contexts = [tokens[-1]]  # the context of each target row: last token, then each draft
        for _ in range(SEQUENCE_K):
            contexts.append(int(torch.multinomial(DRAFT_TABLE[contexts[-1]], 1,
                                                  generator=generator)))
        drafts = contexts[1:]
        outcome = verify_chain(torch.tensor(drafts), DRAFT_TABLE[contexts[:-1]],
                               TARGET_TABLE[contexts], generator, validate=False)
        tokens += drafts[:outcome.num_accepted] + [outcome.next_token]
    return tuple(tokens[1:SEQUENCE_LENGTH + 1])


def _sequence_p_value(num_sequences: int = NUM_SEQUENCES, seed: int = 0) -> float:
    generator = torch.Generator().manual_seed(seed)
    vocab = TARGET_TABLE.shape[0]
    counts = np.zeros((vocab,) * SEQUENCE_LENGTH)
    for _ in range(num_sequences):
        counts[_speculative_sequence(generator)] += 1
    exact = np.ones((vocab,) * SEQUENCE_LENGTH)
    for index in np.ndindex(*exact.shape):
        previous = 0
        for token in index:
            exact[index] *= TARGET_TABLE[previous, token].item()
            previous = token
    return stats.chisquare(counts.ravel(), num_sequences * exact.ravel()).pvalue


def test_emitted_sequence_follows_target():
    assert _sequence_p_value() > 1e-3


def test_sequence_test_catches_a_broken_verifier(monkeypatch):
    monkeypatch.setattr(rejection, "residual_distribution",
                        lambda target_probs, draft_probs, **_: target_probs)
    assert _sequence_p_value() < 1e-6


# verify_chain: deterministic cases


def test_greedy_one_hot_is_deterministic():
    vocab = 5
    target_argmax = torch.tensor([2, 0, 3, 1])  # K = 3 positions plus the bonus position
    target_probs = F.one_hot(target_argmax, vocab).double()  # (K + 1, vocab)
    cases = [  # draft tokens -> (num_accepted, next_token, bonus)
        ([2, 0, 3], Verification(3, 1, True)),
        ([2, 0, 4], Verification(2, 3, False)),
        ([4, 0, 3], Verification(0, 2, False)),
    ]
    for drafts, expected in cases:
        draft_probs = F.one_hot(torch.tensor(drafts), vocab).double()  # (K, vocab)
        for seed in range(5):
            generator = torch.Generator().manual_seed(seed)
            assert verify_chain(torch.tensor(drafts), draft_probs, target_probs,
                                generator) == expected


def test_equal_draft_and_target_accept_everything():
    rng = np.random.default_rng(1)
    target_probs = torch.stack([_random_distribution(rng, 6, True) for _ in range(5)])
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        drafts = torch.multinomial(target_probs[:4], 1, generator=generator).squeeze(1)
        outcome = verify_chain(drafts, target_probs[:4], target_probs, generator)
        assert outcome.num_accepted == 4 and outcome.bonus
        assert target_probs[4, outcome.next_token] > 0


def test_same_seed_same_outcome():
    drafts = torch.tensor([0, 3, 1])
    draft_probs, target_probs = IID_DRAFT.expand(3, -1), IID_TARGET.expand(4, -1)
    runs = [[verify_chain(drafts, draft_probs, target_probs, generator)
             for _ in range(10)] for generator in
            (torch.Generator().manual_seed(7), torch.Generator().manual_seed(7))]
    assert runs[0] == runs[1]


# verify_chain: input validation

VOCAB = 4
GOOD_DRAFTS = torch.tensor([0, 1])
GOOD_DRAFT_PROBS = torch.full((2, VOCAB), 1 / VOCAB)
GOOD_TARGET_PROBS = torch.full((3, VOCAB), 1 / VOCAB)


@pytest.mark.parametrize("draft_tokens, draft_probs, target_probs, message", [
    (GOOD_DRAFTS[None], GOOD_DRAFT_PROBS, GOOD_TARGET_PROBS, "draft_tokens must be a 1-D"),
    (GOOD_DRAFTS[:0], GOOD_DRAFT_PROBS[:0], GOOD_TARGET_PROBS[:1], "draft_tokens .*K >= 1"),
    (GOOD_DRAFTS.float(), GOOD_DRAFT_PROBS, GOOD_TARGET_PROBS, "draft_tokens must be an integer"),
    (torch.tensor([0, 4]), GOOD_DRAFT_PROBS, GOOD_TARGET_PROBS, r"draft_tokens .*\[0, 4\)"),
    (torch.tensor([-1, 0]), GOOD_DRAFT_PROBS, GOOD_TARGET_PROBS, r"draft_tokens .*\[0, 4\)"),
    (GOOD_DRAFTS, GOOD_TARGET_PROBS, GOOD_TARGET_PROBS,
     r"draft_probs must have shape \(K, vocab\)"),
    (GOOD_DRAFTS, GOOD_DRAFT_PROBS, GOOD_DRAFT_PROBS, r"target_probs must have shape \(K \+ 1"),
    (GOOD_DRAFTS, GOOD_DRAFT_PROBS, torch.full((3, 5), 0.2), r"target_probs .*\(3, 4\)"),
    (GOOD_DRAFTS, F.one_hot(torch.tensor([0, 2]), VOCAB).float(), GOOD_TARGET_PROBS,
     "draft_probs must give each of draft_tokens a positive probability"),
    (GOOD_DRAFTS, GOOD_DRAFT_PROBS, GOOD_TARGET_PROBS * 0.93, "target_probs must sum to 1"),
    (GOOD_DRAFTS, GOOD_DRAFT_PROBS * 1.1, GOOD_TARGET_PROBS, "draft_probs must sum to 1"),
])
def test_verify_chain_names_bad_arguments(draft_tokens, draft_probs, target_probs, message):
    with pytest.raises(ValueError, match=message):
        verify_chain(draft_tokens, draft_probs, target_probs)


def test_validate_false_skips_the_checks():
    outcome = verify_chain(GOOD_DRAFTS, GOOD_DRAFT_PROBS, GOOD_TARGET_PROBS * 0.93,
                           torch.Generator().manual_seed(0), validate=False)
    assert 0 <= outcome.num_accepted <= 2


def test_greedy_verification_is_the_rule_for_one_hot_targets():
    """verify_chain_greedy gives verify_chain's verdict whenever q is one-hot, whatever p is."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        k, vocab = int(torch.randint(1, 6, (1,), generator=generator)), 5
        target_tokens = torch.randint(vocab, (k + 1,), generator=generator)
        draft_probs = torch.rand(k, vocab, generator=generator).softmax(-1)
        draft_tokens = torch.multinomial(draft_probs, 1, generator=generator)[:, 0]
        agree = int(torch.randint(k + 1, (1,), generator=generator))  # a leading run that matches, of any length
        draft_tokens[:agree] = target_tokens[:agree]
        one_hot = torch.nn.functional.one_hot(target_tokens, vocab).float()
        expected = verify_chain(draft_tokens, draft_probs, one_hot, generator)
        assert verify_chain_greedy(draft_tokens, target_tokens) == expected
    with pytest.raises(ValueError, match="target_tokens must have shape"):
        verify_chain_greedy(torch.tensor([1, 2]), torch.tensor([1, 2]))

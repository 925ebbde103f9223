"""Tests for specbook.theory: the closed forms of Leviathan et al. Section 3 and their twins."""

import numpy as np
import pytest

from specbook.theory import (
    arithmetic_overhead,
    expected_tokens_per_step,
    optimal_k,
    simulate_speedup,
    simulate_tokens_per_step,
    speedup,
)

ALPHAS = [0.0, 0.3, 0.6, 0.8, 0.95, 1.0]
KS = [1, 2, 4, 7]


def _leviathan_tokens(alpha: float, k: int) -> float:
    """Eq. (1) as printed, for alpha < 1."""
    return (1 - alpha ** (k + 1)) / (1 - alpha)


# closed forms


def test_known_values():
    assert expected_tokens_per_step(0.8, 4) == pytest.approx(3.3616, abs=1e-12)
    assert speedup(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2, abs=1e-12)
    assert arithmetic_overhead(0.8, 4, 0.05) == pytest.approx(5.2 / 3.3616, abs=1e-12)
    assert isinstance(expected_tokens_per_step(0.8, 4), float)


@pytest.mark.parametrize("alpha", [a for a in ALPHAS if a < 1])
@pytest.mark.parametrize("k", KS)
def test_closed_forms_match_the_paper(alpha, k):
    tokens = _leviathan_tokens(alpha, k)
    assert expected_tokens_per_step(alpha, k) == pytest.approx(tokens, rel=1e-12)
    assert speedup(alpha, k, 0.1) == pytest.approx(tokens / (0.1 * k + 1), rel=1e-12)  # Thm 3.8
    overhead = (1 - alpha) * (0.3 * k + k + 1) / (1 - alpha ** (k + 1))  # Theorem 3.11
    assert arithmetic_overhead(alpha, k, 0.3) == pytest.approx(overhead, rel=1e-12)


@pytest.mark.parametrize("k", KS)
def test_limits_at_zero_and_one(k):
    assert expected_tokens_per_step(0.0, k) == 1.0
    assert expected_tokens_per_step(1.0, k) == k + 1
    assert expected_tokens_per_step(1 - 1e-12, k) == pytest.approx(k + 1, rel=1e-10)
    assert expected_tokens_per_step(1 - 1e-6, k) == pytest.approx(
        k + 1 - 1e-6 * k * (k + 1) / 2, rel=1e-10)  # first-order Taylor term
    assert arithmetic_overhead(1.0, k, 0.0) == 1.0  # every target position is used
    assert arithmetic_overhead(0.0, k, 0.0) == k + 1  # one token for K + 1 target positions


def test_arrays_broadcast():
    alphas = np.array(ALPHAS)[:, None]  # (6, 1)
    ks = np.array(KS)  # (4,)
    tokens = expected_tokens_per_step(alphas, ks)
    assert isinstance(tokens, np.ndarray) and tokens.shape == (6, 4)
    expected = [[expected_tokens_per_step(a, k) for k in KS] for a in ALPHAS]
    np.testing.assert_allclose(tokens, expected, rtol=1e-14)
    np.testing.assert_allclose(speedup(alphas, ks, 0.2), tokens / (0.2 * ks + 1), rtol=1e-14)


def test_speedup_decreases_with_cost_ratio():
    cost_ratios = np.linspace(0, 2, 50)
    for alpha in ALPHAS:
        assert (np.diff(speedup(alpha, 4, cost_ratios)) < 0).all()


# optimal K


def test_optimal_k_is_brute_force_argmax():
    for alpha in [0.1, 0.5, 0.7, 0.8, 0.9, 0.97]:
        for cost_ratio in [0.01, 0.05, 0.2, 0.5]:
            by_hand = [_leviathan_tokens(alpha, k) / (cost_ratio * k + 1) for k in range(1, 33)]
            assert optimal_k(alpha, cost_ratio, k_max=32) == 1 + by_hand.index(max(by_hand))
        # c = 0: speedup grows with K until it saturates in floating point; any K there is best.
        best = optimal_k(alpha, 0.0, k_max=32)
        assert speedup(alpha, best, 0.0) == pytest.approx(speedup(alpha, 32, 0.0), rel=1e-14)


def test_optimal_k_grows_with_alpha():
    ks = [optimal_k(alpha, 0.05) for alpha in np.linspace(0.1, 0.99, 30)]
    assert ks == sorted(ks) and ks[-1] > ks[0]


def test_optimal_k_when_speculation_cannot_help():
    # alpha <= c: no K beats plain decoding (speedup <= 1); the argmax is still returned: K = 1.
    for alpha, cost_ratio in [(0.2, 0.2), (0.2, 0.5), (0.0, 0.0), (0.0, 1.0)]:
        assert optimal_k(alpha, cost_ratio) == 1
        assert speedup(alpha, np.arange(1, 65), cost_ratio).max() <= 1
    assert optimal_k(1.0, 0.0, k_max=10) == 10


# Monte Carlo twins


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("k", [1, 4])
def test_simulation_matches_closed_form(alpha, k):
    # Tokens per step lie in [1, K + 1], so their standard deviation is at most K / 2
    # (Popoviciu); allow five standard errors of the mean.
    num_steps = 50_000
    tolerance = 5 * (k / 2) / np.sqrt(num_steps)
    simulated = simulate_tokens_per_step(alpha, k, num_steps=num_steps, seed=1)
    assert simulated == pytest.approx(expected_tokens_per_step(alpha, k), abs=tolerance)
    simulated_speedup = simulate_speedup(alpha, k, 0.1, num_steps=num_steps, seed=1)
    assert simulated_speedup == pytest.approx(simulated / (0.1 * k + 1), rel=1e-12)
    assert simulated_speedup == pytest.approx(speedup(alpha, k, 0.1), abs=tolerance)


def test_simulation_is_seeded():
    assert simulate_tokens_per_step(0.7, 3, 1000, seed=5) == simulate_tokens_per_step(0.7, 3, 1000,
                                                                                     seed=5)
    assert simulate_tokens_per_step(0.7, 3, 1000, seed=5) != simulate_tokens_per_step(0.7, 3, 1000,
                                                                                     seed=6)


# input validation


@pytest.mark.parametrize("call, message", [
    (lambda: expected_tokens_per_step(1.2, 4), r"alpha must be in \[0, 1\] \(got 1.2\)"),
    (lambda: expected_tokens_per_step(-0.1, 4), r"alpha must be in \[0, 1\] \(got -0.1\)"),
    (lambda: expected_tokens_per_step(float("nan"), 4), r"alpha must be in \[0, 1\]"),
    (lambda: expected_tokens_per_step(np.array([0.5, 1.5]), 4), r"alpha .*\(got 1.5\)"),
    (lambda: expected_tokens_per_step(0.5, 0), "k must be an integer >= 1"),
    (lambda: expected_tokens_per_step(0.5, 2.5), "k must be an integer >= 1"),
    (lambda: expected_tokens_per_step(0.5, True), "k must be an integer >= 1"),
    (lambda: speedup(0.5, 4, -0.1), "cost_ratio must be a finite number >= 0"),
    (lambda: speedup(0.5, 4, float("inf")), "cost_ratio must be a finite number >= 0"),
    (lambda: arithmetic_overhead(0.5, 4, -1), "op_ratio must be a finite number >= 0"),
    (lambda: optimal_k(0.5, 0.1, k_max=0), "k_max must be an integer >= 1"),
    (lambda: optimal_k(np.array([0.5, 0.6]), 0.1), "alpha must be a single number"),
    (lambda: optimal_k(0.5, -0.1), "cost_ratio"),
    (lambda: simulate_tokens_per_step(0.5, 4, num_steps=0), "num_steps must be an integer >= 1"),
    (lambda: simulate_tokens_per_step(2.0, 4), "alpha must be in"),
    (lambda: simulate_speedup(0.5, 0, 0.1), "k must be an integer >= 1"),
    (lambda: simulate_speedup(0.5, 4, -1.0), "cost_ratio must be"),
])
def test_bad_input_names_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()

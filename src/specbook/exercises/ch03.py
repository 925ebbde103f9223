"""Checkers for the exercises of chapter 3, how fast can it go: tokens per target call, the
speedup, the best draft length, alpha estimated from a log, and acceptance by draft index.

The references are `specbook.theory`'s formulas.
"""

from __future__ import annotations

import math

import numpy as np

from ..theory import expected_tokens_per_step, optimal_k, speedup
from .core import Case, Check, _as_float, _as_int, _fmt, _same_number

def _tokens_per_step_cases() -> list[Case]:
    settings = [(0.8, 4), (0.5, 1), (0.9, 8), (0.6, 3), (0.95, 20), (0.3, 2), (0.0, 3), (1.0, 5)]
    return [Case(f"alpha = {alpha}, k = {k}", (alpha, k), expected_tokens_per_step(alpha, k))
            for alpha, k in settings]


def _compare_tokens_per_step(got, case: Case) -> str | None:
    alpha, k = case.args
    got = _as_float(got, "a number")
    if _same_number(got, case.expected):
        return None
    expected = f"expected {case.expected:.6g} tokens per target call, got {got:.6g}"
    if math.isnan(got) or math.isinf(got):
        return (f"{expected}. At α = 1 the closed form is 0/0; every draft is accepted, so a step "
                "emits all K drafts plus the bonus. Sum the series instead, or treat α = 1 apart.")
    if alpha < 1 and math.isclose(got, (1 - alpha ** k) / (1 - alpha), rel_tol=1e-9):
        return (f"{expected}: that is (1 − α^K)/(1 − α), one token short of the most a step can "
                "emit. A step emits its accepted drafts plus one more (correction or bonus).")
    if _same_number(got, case.expected - 1):
        return (f"{expected}: that counts the accepted drafts only. Every step also emits one "
                "more token, the correction or the bonus.")
    return f"{expected}."


def _tokens_per_step_error(error: Exception, case: Case) -> str | None:
    if case.args[0] == 1:
        return ("At α = 1 the closed form is 0/0; every draft is accepted, so what does a step "
                "emit? Sum the series instead, or treat α = 1 apart.")
    return None


check_tokens_per_step = Check("tokens_per_step", _tokens_per_step_cases, _compare_tokens_per_step,
                              error_hint=_tokens_per_step_error)


def _speedup_cases() -> list[Case]:
    settings = [(0.8, 4, 0.05), (0.6, 1, 0.2), (0.9, 8, 0.0), (0.3, 3, 0.5), (0.7, 6, 0.1),
                (0.95, 12, 0.02), (0.5, 2, 1.0)]
    return [Case(f"alpha = {alpha}, k = {k}, cost_ratio = {c}", (alpha, k, c),
                 speedup(alpha, k, c)) for alpha, k, c in settings]


def _compare_speedup(got, case: Case) -> str | None:
    alpha, k, cost_ratio = case.args
    got = _as_float(got, "a number")
    if _same_number(got, case.expected):
        return None
    expected = f"expected a speedup of {case.expected:.6g}, got {got:.6g}"
    tokens = expected_tokens_per_step(alpha, k)
    if math.isclose(got, tokens / (cost_ratio * (k + 1) + 1), rel_tol=1e-9):
        return (f"{expected}: that charges K + 1 draft calls. A step runs the draft K times (c "
                "each) and the target once: it costs c K + 1 target calls.")
    if cost_ratio > 0 and math.isclose(got, tokens / (cost_ratio * k), rel_tol=1e-9):
        return f"{expected}: that leaves out the target's own call; a step costs c K + 1."
    if math.isclose(got, tokens, rel_tol=1e-9):
        return f"{expected}: that is tokens per target call; divide by the step's cost, c K + 1."
    return f"{expected}. Speedup = tokens per step / (c K + 1)."


check_speedup = Check("speedup_by_hand", _speedup_cases, _compare_speedup, "check_speedup")


def _optimal_k_cases() -> list[Case]:
    settings = [(0.8, 0.05, None), (0.6, 0.2, None), (0.95, 0.01, None), (0.7, 0.1, None),
                (0.3, 0.5, None), (0.5, 0.5, None), (0.9, 0.0, 10), (0.9, 0.001, 16), (0.99, 0.02, 8)]
    cases = []
    for alpha, cost_ratio, k_max in settings:
        kwargs = {} if k_max is None else {"k_max": k_max}
        label = f"alpha = {alpha}, cost_ratio = {cost_ratio}" + (f", k_max = {k_max}" if k_max else "")
        cases.append(Case(label, (alpha, cost_ratio), optimal_k(alpha, cost_ratio, k_max or 64),
                          kwargs=kwargs, extra={"k_max": k_max or 64}))
    return cases


def _compare_optimal_k(got, case: Case) -> str | None:
    alpha, cost_ratio = case.args
    got = _as_int(got, "a draft length K")
    if got == case.expected:
        return None
    expected = f"expected K = {case.expected}, got {got}"
    if got == 0:
        return (f"{expected}: K = 0 is no speculation at all. Search K = 1 … k_max; when α ≤ c "
                "nothing beats plain decoding and the answer is K = 1 (the caller decides whether "
                "to speculate).")
    if not 1 <= got <= case.extra["k_max"]:
        return f"{expected}, outside 1 … k_max = {case.extra['k_max']}."
    if got == case.expected - 1:
        return (f"{expected}: one short. Did you search range(1, k_max), which stops before k_max, "
                "or return an index (from 0) instead of a K (from 1)?")
    return (f"{expected}: K = {got} gives a speedup of {speedup(alpha, got, cost_ratio):.4f}, "
            f"K = {case.expected} gives {speedup(alpha, case.expected, cost_ratio):.4f}.")


check_optimal_k = Check("optimal_k_by_hand", _optimal_k_cases, _compare_optimal_k, "check_optimal_k")


def _accepted_counts(alpha: float, k: int, num_steps: int, seed: int) -> np.ndarray:
    """A log of num_accepted per step, from the i.i.d. model (as specbook.theory simulates it)."""
    verdicts = np.random.default_rng(seed).random((num_steps, k)) < alpha  # (num_steps, K)
    return verdicts.cumprod(axis=1).sum(axis=1)  # (num_steps,) leading run of acceptances


def _estimate_alpha_reference(num_accepted: np.ndarray, k: int) -> float:
    """The maximum-likelihood alpha: accepted drafts / tested drafts (a step tests min(N + 1, K))."""
    return float(num_accepted.sum() / np.minimum(num_accepted + 1, k).sum())


def _estimate_alpha_cases() -> list[Case]:
    logs = [("a log of 4 steps, K = 4", np.array([1, 4, 0, 2]), 4),
            ("every step rejects its first draft, K = 3", np.array([0, 0, 0]), 3),
            ("every step accepts all drafts, K = 3", np.array([3, 3]), 3),
            ("a log of 4 steps, K = 4", np.array([4, 4, 4, 0]), 4),
            ("K = 1", np.array([1, 0, 1, 1, 0]), 1)]
    for alpha, k in ((0.8, 4), (0.6, 8), (0.9, 2)):
        logs.append((f"20,000 simulated steps, K = {k}", _accepted_counts(alpha, k, 20_000, seed=k), k))
    return [Case(f"{label}: num_accepted {_fmt(log) if len(log) < 10 else 'of ' + str(len(log)) + ' steps'}",
                 (log, k), _estimate_alpha_reference(log, k)) for label, log, k in logs]


def _compare_estimate_alpha(got, case: Case) -> str | None:
    num_accepted, k = case.args
    got = _as_float(got, "a number")
    if _same_number(got, case.expected):
        return None
    expected = f"expected α̂ = {case.expected:.6g}, got {got:.6g}"
    if _same_number(got, num_accepted.mean() / k):
        return (f"{expected}: that is accepted / (K × steps), as if every step tested all K "
                "drafts. A step stops at its first rejection: drafts after it were never tested.")
    if _same_number(got, num_accepted.sum() / (num_accepted + 1).sum()):
        return (f"{expected}: that counts N + 1 tested drafts in every step, but a step that "
                "accepts all K drafts tested only K (its extra token is the bonus, not a test).")
    return f"{expected}. α̂ = drafts accepted / drafts tested."


check_estimate_alpha = Check("estimate_alpha", _estimate_alpha_cases, _compare_estimate_alpha)


def _tokens_by_index_reference(alphas) -> float:
    """1 + alpha_1 + alpha_1 alpha_2 + ... : the chance that the first i drafts all pass, summed."""
    return float(1 + np.cumprod(np.asarray(alphas, dtype=float)).sum())


def _tokens_by_index_cases() -> list[Case]:
    settings = [[0.8, 0.8, 0.8, 0.8], [0.4, 0.55, 0.74, 0.86], [0.9], [1.0, 1.0, 1.0],
                [0.0, 0.9], [0.9, 0.0, 0.9], [0.3, 0.6, 0.9, 0.95, 0.95, 0.95]]
    return [Case(f"alphas = {values}", (np.array(values),), _tokens_by_index_reference(values))
            for values in settings]


def _compare_tokens_by_index(got, case: Case) -> str | None:
    (alphas,) = case.args
    got = _as_float(got, "a number")
    if _same_number(got, case.expected):
        return None
    expected = f"expected {case.expected:.6g} tokens per target call, got {got:.6g}"
    if _same_number(got, case.expected - 1):
        return f"{expected}: add the token every step emits after its accepted drafts."
    if math.isclose(got, 1 + alphas.sum(), rel_tol=1e-9):
        return (f"{expected}: that is 1 + Σ α_i. Draft i is accepted only if drafts 1 … i − 1 were "
                "too: the chance is the product α_1 ⋯ α_i.")
    mean = float(alphas.mean())
    if math.isclose(got, expected_tokens_per_step(mean, len(alphas)), rel_tol=1e-9):
        return f"{expected}: that is the i.i.d. formula at the mean α, the very thing to avoid here."
    return f"{expected}. Sum, over i = 0 … K, the chance that the first i drafts all pass."


check_tokens_per_step_by_index = Check("tokens_per_step_by_index", _tokens_by_index_cases,
                                       _compare_tokens_by_index)


"""Closed-form speedup formulas for speculative decoding, and their Monte Carlo twins.

All assume what Leviathan et al. assume: each draft is accepted independently with the same
probability alpha (the i.i.d. assumption that chapter 3 tests against real models).

- Expected tokens per target call, Leviathan et al. 2023 Section 3.3, Eq. (1):
  (1 - alpha^(K+1)) / (1 - alpha).
- Expected wall-time improvement, Section 3.4, Theorem 3.8:
  (1 - alpha^(K+1)) / ((1 - alpha)(c K + 1)), with c the draft's cost per token relative to
  the target's; Corollary 3.9: if alpha > c, K = 1 already gives an improvement.
- Expected factor increase in arithmetic operations, Section 3.5, Theorem 3.11:
  (1 - alpha)(K c_hat + K + 1) / (1 - alpha^(K+1)), with c_hat the draft's arithmetic cost per
  token relative to the target's.

Leviathan et al. write gamma for the draft length; this book writes K (`k` in code).
Functions take Python numbers or numpy arrays (broadcast), and return a float for scalar input.
"""

import numpy as np


def _check_alpha(alpha) -> np.ndarray:
    """alpha as a float array, or ValueError unless every entry is in [0, 1]."""
    values = np.asarray(alpha, dtype=float)
    bad = ~((values >= 0) & (values <= 1))  # also catches NaN
    if bad.any():
        raise ValueError(f"alpha must be in [0, 1] (got {values[bad].flat[0]:g})")
    return values


def _check_positive_int(value, name: str) -> np.ndarray:
    """value as an integer array, or ValueError naming it unless every entry is an int >= 1."""
    values = np.asarray(value)
    if values.dtype.kind not in "iu" or (values < 1).any():
        raise ValueError(f"{name} must be an integer >= 1 (got {value!r})")
    return values


def _check_nonnegative(value, name: str) -> np.ndarray:
    """value as a float array, or ValueError naming it unless every entry is finite and >= 0."""
    values = np.asarray(value, dtype=float)
    bad = ~(np.isfinite(values) & (values >= 0))
    if bad.any():
        raise ValueError(f"{name} must be a finite number >= 0 (got {values[bad].flat[0]:g})")
    return values


def _check_scalar(values: np.ndarray, name: str) -> None:
    """ValueError naming the argument unless it is a single number."""
    if values.ndim != 0:
        raise ValueError(f"{name} must be a single number (got shape {values.shape})")


def _as_output(result: np.ndarray):
    """A float for a scalar result, the array otherwise."""
    return float(result) if result.ndim == 0 else result


def _tokens_per_step(alpha: np.ndarray, k: np.ndarray) -> np.ndarray:
    """sum_{i=0}^{K} alpha^i on validated arrays.

    Term i is the chance that the first i drafts are all accepted, so the sum is the expected
    number of tokens per step. It equals (1 - alpha^(K+1)) / (1 - alpha) but has no 0/0 at
    alpha = 1 (where it gives K + 1) and no cancellation near it.
    """
    exponents = np.arange(k.max() + 1)  # (K_max + 1,)
    terms = np.where(exponents <= k[..., None], alpha[..., None] ** exponents, 0.0)
    return terms.sum(-1)  # broadcast shape of alpha and k


def expected_tokens_per_step(alpha, k):
    """Expected tokens emitted per target call: (1 - alpha^(K+1)) / (1 - alpha), Leviathan Eq. (1).

    Equals K + 1 at alpha = 1 and 1 at alpha = 0.
    """
    return _as_output(_tokens_per_step(_check_alpha(alpha), _check_positive_int(k, "k")))


def speedup(alpha, k, cost_ratio):
    """Expected wall-time speedup over plain decoding, Leviathan Theorem 3.8.

    (1 - alpha^(K+1)) / ((1 - alpha)(c K + 1)): tokens per step over the cost of a step (K draft
    calls at c each plus one target call), in units of one target call.
    """
    alpha, k = _check_alpha(alpha), _check_positive_int(k, "k")
    cost_ratio = _check_nonnegative(cost_ratio, "cost_ratio")
    return _as_output(_tokens_per_step(alpha, k) / (cost_ratio * k + 1))


def optimal_k(alpha, cost_ratio, k_max: int = 64) -> int:
    """The draft length K in [1, k_max] that maximises speedup(alpha, K, cost_ratio).

    Scalar inputs. Ties go to the smaller K (with c = 0 the speedup grows with K until it
    saturates in floating point, so the answer is where it saturates, or k_max).

    Some K beats plain decoding exactly when alpha > c (Leviathan Corollary 3.9 gives K = 1 for
    "if"; "only if" because alpha^i <= alpha). When alpha <= c no K gives a speedup above 1, and
    this still returns the argmax, which is K = 1: the caller decides whether to speculate.
    """
    alpha, cost_ratio = _check_alpha(alpha), _check_nonnegative(cost_ratio, "cost_ratio")
    k_max = _check_positive_int(k_max, "k_max")
    for values, name in ((alpha, "alpha"), (cost_ratio, "cost_ratio"), (k_max, "k_max")):
        _check_scalar(values, name)
    candidates = np.arange(1, int(k_max) + 1)  # (k_max,)
    return int(candidates[np.argmax(speedup(alpha, candidates, cost_ratio))])


def batch_speedup(alpha, k, cost_ratio, verify_ratio):
    """Theorem 3.8 where widening a target call is not free: (1 - alpha^(K+1)) / ((1 - alpha)(c K + v(K + 1))).

    ``verify_ratio`` v(K + 1) (v_B(K + 1) at batch size B, chapter 7) is the cost of a target call that
    scores K + 1 positions per row relative to one that scores one, at the same batch size: 1 where a call
    is memory-bound (a small batch on a GPU), more as the batch grows and the call turns compute-bound
    (chapter 7 measures it), so the speedup falls below 1 where v(K + 1) outgrows the tokens a step emits.
    With v(K + 1) = 1 this is `speedup`.
    """
    alpha, k = _check_alpha(alpha), _check_positive_int(k, "k")
    cost_ratio = _check_nonnegative(cost_ratio, "cost_ratio")
    verify_ratio = np.asarray(verify_ratio, dtype=float)
    if not (np.isfinite(verify_ratio) & (verify_ratio > 0)).all():
        raise ValueError(f"verify_ratio must be a finite number > 0 (got {verify_ratio!r})")
    return _as_output(_tokens_per_step(alpha, k) / (cost_ratio * k + verify_ratio))


def arithmetic_overhead(alpha, k, op_ratio):
    """Expected factor increase in arithmetic operations, Leviathan Theorem 3.11.

    (1 - alpha)(K c_hat + K + 1) / (1 - alpha^(K+1)), with c_hat = op_ratio the draft's
    arithmetic cost per token relative to the target's: each step runs K draft calls and K + 1
    target positions, and emits expected_tokens_per_step tokens.
    """
    alpha, k = _check_alpha(alpha), _check_positive_int(k, "k")
    op_ratio = _check_nonnegative(op_ratio, "op_ratio")
    return _as_output((k * op_ratio + k + 1) / _tokens_per_step(alpha, k))


def simulate_tokens_per_step(alpha, k, num_steps: int = 100_000, seed: int = 0) -> float:
    """Monte Carlo twin of expected_tokens_per_step, for scalar alpha and k.

    Each step accepts each of its K drafts independently with probability alpha, stops at the
    first rejection and emits the accepted drafts plus one token (correction or bonus).
    """
    alpha, k = _check_alpha(alpha), _check_positive_int(k, "k")
    num_steps = _check_positive_int(num_steps, "num_steps")
    for values, name in ((alpha, "alpha"), (k, "k"), (num_steps, "num_steps")):
        _check_scalar(values, name)
    rng = np.random.default_rng(seed)
    accepted = rng.random((int(num_steps), int(k))) < alpha  # (num_steps, K)
    num_accepted = accepted.cumprod(axis=1, dtype=np.int8).sum(axis=1)  # (num_steps,) leading run
    return float(np.mean(num_accepted + 1))


def simulate_speedup(alpha, k, cost_ratio, num_steps: int = 100_000, seed: int = 0) -> float:
    """Monte Carlo twin of speedup: simulated tokens per step over the step cost c K + 1."""
    cost_ratio = _check_nonnegative(cost_ratio, "cost_ratio")
    _check_scalar(cost_ratio, "cost_ratio")
    tokens = simulate_tokens_per_step(alpha, k, num_steps, seed)
    return tokens / float(cost_ratio * k + 1)

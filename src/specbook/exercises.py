"""Checkers for the book's exercises: run a learner's function on hidden cases, say what went wrong.

Each exercise notebook (exercises/chNN_*.ipynb) gives a function stub with a TODO and, right after
it, a cell such as ``check_residual(residual)``. The checker calls the learner's function on cases
the learner cannot see, compares every answer with specbook's own reference (the package's
functions in `specbook.rejection` and `specbook.theory`, or a one-line formula written here where
the package has none), and prints one line:

- ``✓ residual: all 9 cases pass.``, or
- ``✗ residual, case 7 of 9 (q == p): got NaN. ...``: the first case that failed, what was
  expected and what came back, often with the likely mistake named.

A checker never raises and never shows a stack trace: an exception from the learner's code
(NotImplementedError from an untouched stub included) becomes one line too. The cases are fixed
(seeded), so a notebook prints the same thing every run and nbval can compare outputs.

Tests and tools can ask for the verdict instead of the printout: ``check_residual.outcome(fn)``
returns an :class:`Outcome` (passed, message). `CHECKS` lists every checker by name.

Notation as everywhere in the book: q is the target's distribution (`target_probs`), p the
draft's (`draft_probs`), K the draft length (`k`), alpha the acceptance rate and c the cost ratio
(`cost_ratio`).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

from .rejection import (acceptance_rate, output_distribution, residual_distribution,
                        verify_chain)
from .theory import expected_tokens_per_step, optimal_k, speedup

PASS, FAIL = "✓", "✗"
ATOL = 1e-6  # tolerance on probabilities and rates; answers are computed in float64
MAX_ERROR_CHARS = 160  # an exception message from the learner's code is cut to this length


class Outcome(NamedTuple):
    """A checker's verdict: passed, and the one line it prints."""

    passed: bool
    message: str


@dataclass
class Case:
    """One hidden case: the arguments, a short description for messages, and what to expect."""

    label: str
    args: tuple
    expected: Any
    kwargs: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)  # anything the comparison needs to name a mistake


class Check:
    """A checker for one exercise. Call it on the learner's function to print the verdict.

    `cases` builds the hidden cases; `compare(got, case)` returns None when the answer is right
    and otherwise a short description of what is wrong (it may raise _Wrong from helpers).
    """

    def __init__(self, name: str, cases: Callable[[], list[Case]],
                 compare: Callable[[Any, Case], str | None], checker_name: str | None = None,
                 error_hint: Callable[[Exception, Case], str | None] | None = None):
        self.name = name  # the name of the learner's function
        self._cases = cases
        self._compare = compare
        self._error_hint = error_hint  # a word on what an exception on this case usually means
        self.__name__ = checker_name or f"check_{name}"
        self.__doc__ = f"Check your `{name}` on hidden cases and print one line: pass, or what failed."

    def __repr__(self) -> str:
        return f"<specbook exercise check for {self.name}>"

    def __call__(self, function) -> None:
        print(self.outcome(function).message)

    def cases(self) -> list[Case]:
        """The hidden cases (fresh tensors on every call)."""
        return self._cases()

    def outcome(self, function) -> Outcome:
        """Run `function` on every case; stop at the first failure."""
        name = getattr(function, "__name__", self.name)
        if not callable(function):
            return Outcome(False, f"{FAIL} {self.name}: expected a function, got "
                                  f"{type(function).__name__}. Pass the function itself, without ().")
        cases = self.cases()
        for number, case in enumerate(cases, 1):
            where = f"case {number} of {len(cases)} ({case.label})"
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # 0/0 warnings: the answer says what went wrong
                    got = function(*_copy(case.args), **_copy(case.kwargs))
            except NotImplementedError:
                return Outcome(False, f"{FAIL} {name} is not written yet (it raised "
                                      "NotImplementedError): fill in the TODO, then run this cell again.")
            except Exception as error:  # the learner's bug, reported in one line
                hint = self._error_hint(error, case) if self._error_hint else None
                return Outcome(False, f"{FAIL} {name} raised {_describe_error(error)} on {where}."
                                      + (f" {hint}" if hint else ""))
            if got is None:
                return Outcome(False, f"{FAIL} {name} returned None on {where}. "
                                      "Did you forget `return`?")
            try:
                problem = self._compare(got, case)
            except _Wrong as wrong:
                problem = str(wrong)
            except Exception:  # an answer of a type the comparison cannot read
                problem = f"could not read the answer, {_type_name(got)}: {_describe_value(got)}."
            if problem:
                return Outcome(False, f"{FAIL} {name}, {where}: {problem}")
        return Outcome(True, f"{PASS} {name}: all {len(cases)} cases pass.")


class _Wrong(Exception):
    """Raised by the converters below when an answer has the wrong type or shape."""


def _copy(value):
    """A deep-enough copy of the arguments, so a learner's in-place edit cannot change a case."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, tuple):
        return tuple(_copy(v) for v in value)
    if isinstance(value, list):
        return [_copy(v) for v in value]
    if isinstance(value, dict):
        return {key: _copy(v) for key, v in value.items()}
    return value


def _describe_error(error: Exception) -> str:
    text = " ".join(str(error).split())
    if len(text) > MAX_ERROR_CHARS:
        text = text[:MAX_ERROR_CHARS - 1] + "…"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _describe_value(value) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS - 1] + "…"


def _fmt(value) -> str:
    """A number or a vector, short: 0.75, [0, 0.6, 0.2]."""
    array = np.asarray(value, dtype=float)
    if array.ndim == 0:
        return f"{float(array):.4g}"
    return "[" + ", ".join(f"{x:.3g}" for x in array.ravel()) + "]"


def _type_name(value) -> str:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return f"{type(value).__name__} of shape {tuple(value.shape)}"
    return type(value).__name__


def _as_float(got, what: str = "a number") -> float:
    """A Python float from a number, a numpy scalar or a one-element tensor or array."""
    if isinstance(got, (bool, np.bool_)):
        raise _Wrong(f"expected {what}, got {got!r} (a bool).")
    if isinstance(got, (int, float, np.integer, np.floating)):
        return float(got)
    if isinstance(got, torch.Tensor) and got.numel() == 1 and got.dtype != torch.bool:
        return float(got.item())
    if isinstance(got, np.ndarray) and got.size == 1 and got.dtype != bool:
        return float(got.item())
    raise _Wrong(f"expected {what}, got {_type_name(got)}.")


def _as_int(got, what: str) -> int:
    """A Python int from an int, a numpy integer or a one-element integer tensor."""
    if isinstance(got, (bool, np.bool_)):
        raise _Wrong(f"expected {what} (an int), got {got!r}.")
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    if isinstance(got, np.ndarray) and got.size == 1:
        got = got.item()
    if isinstance(got, (int, np.integer)):
        return int(got)
    if isinstance(got, (float, np.floating)) and float(got).is_integer():
        return int(got)
    raise _Wrong(f"expected {what} (an int), got {got!r}.")


def _as_vector(got, shape: tuple, what: str) -> np.ndarray:
    """A float64 numpy array of the given shape from a tensor, an array or a list."""
    if isinstance(got, torch.Tensor):
        array = got.detach().cpu().double().numpy()
    else:
        try:
            array = np.asarray(got, dtype=float)
        except (TypeError, ValueError):
            raise _Wrong(f"expected {what}, got {_type_name(got)}.") from None
    if array.shape != shape:
        raise _Wrong(f"expected {what} of shape {shape}, got {_type_name(got)}.")
    return array


def _close(a, b, atol: float = ATOL) -> bool:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=0, atol=atol))


def _probs(values) -> torch.Tensor:
    """A float64 probability vector from numbers (normalised)."""
    probs = torch.tensor(values, dtype=torch.float64)
    return probs / probs.sum(-1, keepdim=True)


def _random_pair(rng: np.random.Generator, vocab: int, sparse: bool = False):
    """(target_probs, draft_probs): two Dirichlet(0.5) vectors, some entries zeroed if sparse."""
    pair = []
    for _ in range(2):
        probs = rng.dirichlet(np.full(vocab, 0.5))
        if sparse:
            zeroed = rng.random(vocab) < 0.4
            zeroed[rng.integers(vocab)] = False
            probs[zeroed] = 0.0
        pair.append(torch.tensor(probs / probs.sum()))
    return tuple(pair)


# The toy pair of chapter 2 (§2.1): "The cat sat on the" -> mat, floor, sofa, roof, moon.
TOY_TOKENS = ("mat", "floor", "sofa", "roof", "moon")


def _toy_pair():
    target_probs = torch.tensor([0.45, 0.25, 0.15, 0.10, 0.05], dtype=torch.float64)  # q
    draft_probs = torch.tensor([0.60, 0.10, 0.10, 0.05, 0.15], dtype=torch.float64)  # p
    return target_probs, draft_probs


def _pair_cases(seed: int) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """Distribution pairs for the one-position exercises: (label, target_probs, draft_probs)."""
    rng = np.random.default_rng(seed)
    toy_q, toy_p = _toy_pair()
    pairs = [("the toy pair of §2.1", toy_q, toy_p)]
    for vocab in (3, 6, 10):
        pairs.append((f"random, vocab {vocab}", *_random_pair(rng, vocab)))
    pairs.append(("random with zeros, vocab 8", *_random_pair(rng, 8, sparse=True)))
    pairs.append(("q has zeros where p does not", _probs([0.5, 0.5, 0.0, 0.0]),
                  _probs([0.25, 0.25, 0.25, 0.25])))
    pairs.append(("p has zeros where q does not", _probs([0.25, 0.25, 0.25, 0.25]),
                  _probs([0.7, 0.3, 0.0, 0.0])))
    # The draft is alpha q plus mass where q is zero: the residual is q itself.
    pairs.append(("p = 0.6 q + mass where q = 0", _probs([0.5, 0.3, 0.2, 0.0]),
                  _probs([0.3, 0.18, 0.12, 0.4])))
    pairs.append(("p and q do not overlap", _probs([0.6, 0.4, 0.0]), _probs([0.0, 0.0, 1.0])))
    return pairs


# --- Chapter 2 -----------------------------------------------------------------------------------


def _accept_draft_cases() -> list[Case]:
    cases = []
    target_probs, draft_probs = _toy_pair()
    for token, uniform in ((0, 0.5), (0, 0.8), (4, 0.3), (4, 0.4), (1, 0.99), (2, 0.0)):
        cases.append((f"the toy pair of §2.1, draft {TOY_TOKENS[token]!r}", token, target_probs,
                      draft_probs, uniform))
    rng = np.random.default_rng(2)
    while len(cases) < 30:
        target_probs, draft_probs = _random_pair(rng, 6, sparse=len(cases) % 2 == 0)
        token = int(rng.choice(6, p=draft_probs.numpy()))
        uniform = float(rng.random())
        accept_prob = min(1.0, float(target_probs[token] / draft_probs[token]))
        if abs(uniform - accept_prob) > 1e-9:
            cases.append(("random, vocab 6", token, target_probs, draft_probs, uniform))
    result = []
    for label, token, target_probs, draft_probs, uniform in cases:
        q, p = float(target_probs[token]), float(draft_probs[token])
        accept_prob = min(1.0, q / p)
        result.append(Case(f"{label}: q(x) = {q:.3g}, p(x) = {p:.3g}, uniform = {uniform:.3g}",
                           (token, target_probs, draft_probs, uniform), uniform < accept_prob,
                           extra={"accept_prob": accept_prob}))
    return result


def _compare_accept_draft(got, case: Case) -> str | None:
    if isinstance(got, torch.Tensor) and got.numel() == 1 and got.dtype == torch.bool:
        got = bool(got)
    if isinstance(got, (np.ndarray, np.bool_)) and np.asarray(got).size == 1 \
            and np.asarray(got).dtype == bool:
        got = bool(got)
    if not isinstance(got, bool):
        return (f"expected True or False, got {got!r} ({_type_name(got)}). "
                "Return the verdict: is the uniform below min(1, q(x)/p(x))?")
    if got == case.expected:
        return None
    verdict = "True (accept)" if case.expected else "False (reject)"
    relation = "<" if case.expected else ">="
    return (f"expected {verdict}, since uniform {relation} min(1, q(x)/p(x)) = "
            f"{case.extra['accept_prob']:.4g}; got {got}.")


check_accept_draft = Check("accept_draft", _accept_draft_cases, _compare_accept_draft)


def _residual_cases() -> list[Case]:
    cases = [Case(label, (q, p), residual_distribution(q, p)) for label, q, p in _pair_cases(3)]
    same = _probs([0.5, 0.3, 0.2])
    cases.append(Case("q == p", (same, same.clone()), None))
    return cases


def _compare_residual(got, case: Case) -> str | None:
    target_probs, draft_probs = case.args
    vocab = target_probs.shape[0]
    got = _as_vector(got, (vocab,), "a probability vector")
    if not np.isfinite(got).all():
        if case.expected is None:
            return ("got NaN: when q == p, (q − p)+ is all zeros and its normaliser is 0. No draft "
                    "is ever rejected then, so any distribution is a safe answer: return q.")
        return f"got {_fmt(got)}, which is not finite."
    if case.expected is None:  # q == p: any distribution will do
        if (got < -ATOL).any() or abs(got.sum() - 1) > ATOL:
            return (f"when q == p any probability vector will do (no draft is ever rejected), but "
                    f"got {_fmt(got)}, which is not one.")
        return None
    if _close(got, case.expected):
        return None
    expected = f"expected {_fmt(case.expected)}, got {_fmt(got)}"
    excess = (target_probs - draft_probs).clamp(min=0)
    swapped = residual_distribution(draft_probs, target_probs)
    if _close(got, excess):
        return (f"{expected}: that is (q − p)+ without normalising (it sums to "
                f"{float(excess.sum()):.4g}); divide by its sum.")
    if _close(got, swapped):
        return (f"{expected}: that is norm((p − q)+), the letters swapped. Here q is the target, "
                "p the draft (Leviathan et al. write them the other way round).")
    if _close(got, target_probs):
        return f"{expected}: that is q itself. The residual is zero wherever p ≥ q."
    return f"{expected}."


check_residual = Check("residual", _residual_cases, _compare_residual)


def _verify_chain_cases() -> list[Case]:
    """Seeded chains; the expected verdicts come from specbook.rejection.verify_chain itself.

    verify_chain draws its K uniforms first, with torch.rand(K, generator=...), so the learner's
    function gets exactly those uniforms and must make the same decisions.
    """
    rng = np.random.default_rng(4)
    chains = []
    for seed in range(24):
        k = int(rng.integers(1, 6))
        vocab = 6
        draft_probs = torch.tensor(rng.dirichlet(np.full(vocab, 0.5), size=k))  # (K, vocab)
        target_probs = torch.tensor(rng.dirichlet(np.full(vocab, 0.5), size=k + 1))  # (K + 1, vocab)
        if seed % 6 == 5:  # a draft close to the target: long runs of acceptances and bonus tokens
            draft_probs = 0.9 * target_probs[:k] + 0.1 * draft_probs
        chains.append((f"random, K = {k}", seed, draft_probs, target_probs))
    same = torch.tensor(rng.dirichlet(np.full(6, 0.5), size=4))  # (K + 1, vocab), K = 3
    chains.append(("K = 3, p == q at every position", 100, same[:3].clone(), same))
    one_hot = torch.eye(6, dtype=torch.float64)
    chains.append(("K = 4, greedy (one-hot p and q)", 101, one_hot[[2, 3, 1, 5]],
                   one_hot[[2, 3, 4, 0, 1]]))
    cases = []
    for label, seed, draft_probs, target_probs in chains:
        k = draft_probs.shape[0]
        tokens = torch.multinomial(draft_probs, 1, generator=torch.Generator().manual_seed(seed))
        draft_tokens = tokens.squeeze(1)  # (K,)
        uniforms = torch.rand(k, generator=torch.Generator().manual_seed(seed))  # (K,)
        verdict = verify_chain(draft_tokens, draft_probs, target_probs,
                               generator=torch.Generator().manual_seed(seed))
        accepted = verdict.num_accepted
        if accepted < k:
            next_probs = residual_distribution(target_probs[accepted], draft_probs[accepted])
        else:
            next_probs = target_probs[k]
        positions = torch.arange(k)
        accept_probs = (target_probs[positions, draft_tokens]
                        / draft_probs[positions, draft_tokens]).clamp(max=1.0)  # (K,)
        cases.append(Case(f"{label}, uniforms {_fmt(uniforms)}, min(1, q/p) at the drafts "
                          f"{_fmt(accept_probs)}",
                          (draft_tokens, draft_probs, target_probs, uniforms.double()),
                          (accepted, next_probs),
                          extra={"accept_probs": accept_probs, "uniforms": uniforms.double()}))
    return cases


def _compare_verify_chain(got, case: Case) -> str | None:
    draft_tokens, draft_probs, target_probs, _ = case.args
    k, vocab = draft_probs.shape
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return (f"expected a pair (num_accepted, next_probs), got {_type_name(got)}"
                + (f" of length {len(got)}" if isinstance(got, (tuple, list)) else "") + ".")
    expected_accepted, expected_probs = case.expected
    num_accepted = _as_int(got[0], "num_accepted")
    if num_accepted != expected_accepted:
        passed = case.extra["uniforms"] < case.extra["accept_probs"]  # (K,)
        hint = ""
        if num_accepted == int(passed.sum()) != expected_accepted:
            hint = (" You counted every draft that passed its test; verification stops at the "
                    "first rejection, and the drafts after it are discarded.")
        return (f"expected {expected_accepted} accepted draft(s), got {num_accepted}. Draft t is "
                f"accepted when uniforms[t] < min(1, q_t(x_t)/p_t(x_t)).{hint}")
    next_probs = _as_vector(got[1], (vocab,), "next_probs, a probability vector over the vocabulary")
    if _close(next_probs, expected_probs):
        return None
    expected = f"{num_accepted} accepted is right, but next_probs should be {_fmt(expected_probs)}, " \
               f"got {_fmt(next_probs)}"
    if num_accepted < k:
        if _close(next_probs, target_probs[num_accepted]):
            return (f"{expected}: that is q at the rejected position. The correction comes from the "
                    "residual norm((q_t − p_t)+), or the output is biased (§2.5).")
        return f"{expected}: the residual norm((q_t − p_t)+) at the rejected position t = {num_accepted}."
    return (f"{expected}: all K = {k} drafts passed, so the bonus token comes from the last target "
            f"row, target_probs[K] = target_probs[{k}].")


check_verify_chain = Check("verify_chain_by_hand", _verify_chain_cases, _compare_verify_chain,
                           "check_verify_chain")


def _acceptance_rate_cases() -> list[Case]:
    cases = [Case(label, (q, p), float(acceptance_rate(q, p))) for label, q, p in _pair_cases(5)]
    same = _probs([0.2, 0.5, 0.3])
    cases.append(Case("q == p", (same, same.clone()), 1.0))
    rng = np.random.default_rng(6)
    batch = [_random_pair(rng, 6) for _ in range(4)]
    target_probs = torch.stack([q for q, _ in batch])  # (4, vocab)
    draft_probs = torch.stack([p for _, p in batch])  # (4, vocab)
    cases.append(Case("a batch of 4 pairs, shape (4, 6)", (target_probs, draft_probs),
                      acceptance_rate(target_probs, draft_probs).numpy()))
    return cases


def _compare_acceptance_rate(got, case: Case) -> str | None:
    target_probs, draft_probs = case.args
    if isinstance(case.expected, np.ndarray):
        batch = tuple(target_probs.shape[:-1])
        got = _as_vector(got, batch, "one acceptance rate per pair (sum over the last dimension)")
    else:
        got = _as_float(got, "a number")
    if _close(got, case.expected):
        return None
    expected = f"expected α = {_fmt(case.expected)}, got {_fmt(got)}"
    maximum = torch.maximum(target_probs, draft_probs).sum(-1).numpy()
    distance = (target_probs - draft_probs).abs().sum(-1).numpy()
    if _close(got, maximum):
        return f"{expected}: that is Σ max(p, q). A draft passes on the overlap, Σ min(p, q)."
    if _close(got, 1 - distance):
        return (f"{expected}: that is 1 − Σ|p − q|. The total-variation distance has a ½: "
                "TV(p, q) = ½ Σ|p − q|.")
    return f"{expected}."


check_acceptance_rate = Check("acceptance_rate_by_hand", _acceptance_rate_cases,
                              _compare_acceptance_rate, "check_acceptance_rate")


def _shortcut_cases() -> list[Case]:
    cases = []
    for label, q, p in _pair_cases(7):
        shortcut = output_distribution(q, p, correction="target")
        cases.append(Case(label, (q, p), shortcut, extra={"tv": 0.5 * float((shortcut - q).abs().sum())}))
    return cases


def _compare_shortcut_output(got, case: Case) -> str | None:
    target_probs, draft_probs = case.args
    got = _as_vector(got, tuple(target_probs.shape), "a probability vector")
    if _close(got, case.expected):
        return None
    expected = f"expected {_fmt(case.expected)}, got {_fmt(got)}"
    if _close(got, target_probs):
        return (f"{expected}: that is q, what the real algorithm emits. With corrections from q a "
                "token is emitted with probability min(p(x), q(x)) + (1 − α) q(x).")
    if _close(got, torch.minimum(target_probs, draft_probs)):
        return f"{expected}: that is only the accepted part, min(p, q); add the corrections."
    return f"{expected}. Emitted = accepted, min(p, q), plus rejected-then-corrected, (1 − α) q."


check_shortcut_output = Check("shortcut_output", _shortcut_cases, _compare_shortcut_output)


def _compare_shortcut_bias(got, case: Case) -> str | None:
    target_probs, draft_probs = case.args
    got = _as_float(got, "a number, the total-variation distance")
    expected_tv = case.extra["tv"]
    if abs(got - expected_tv) <= ATOL:
        return None
    expected = f"expected TV(shortcut, q) = {expected_tv:.4g}, got {got:.4g}"
    mistakes = []
    if abs(got - 2 * expected_tv) <= ATOL:
        mistakes.append("Σ|shortcut − q| without the ½")
    if abs(got - (1 - float(acceptance_rate(target_probs, draft_probs)))) <= ATOL:
        mistakes.append("TV(p, q) = 1 − α, the draft's distance from q rather than the output's")
    if mistakes:
        return f"{expected}: that is {', or '.join(mistakes)}. The bias is ½ Σ|shortcut − q|."
    return f"{expected}. The bias is ½ Σ|shortcut − q|."


check_shortcut_bias = Check("shortcut_bias", _shortcut_cases, _compare_shortcut_bias)


# --- Chapter 3 -----------------------------------------------------------------------------------


def _tokens_per_step_cases() -> list[Case]:
    settings = [(0.8, 4), (0.5, 1), (0.9, 8), (0.6, 3), (0.95, 20), (0.3, 2), (0.0, 3), (1.0, 5)]
    return [Case(f"alpha = {alpha}, k = {k}", (alpha, k), expected_tokens_per_step(alpha, k))
            for alpha, k in settings]


def _compare_tokens_per_step(got, case: Case) -> str | None:
    alpha, k = case.args
    got = _as_float(got, "a number")
    if math.isclose(got, case.expected, rel_tol=1e-9, abs_tol=1e-12):
        return None
    expected = f"expected {case.expected:.6g} tokens per target call, got {got:.6g}"
    if math.isnan(got) or math.isinf(got):
        return (f"{expected}. At α = 1 the closed form is 0/0; every draft is accepted, so a step "
                "emits all K drafts plus the bonus. Sum the series instead, or treat α = 1 apart.")
    if alpha < 1 and math.isclose(got, (1 - alpha ** k) / (1 - alpha), rel_tol=1e-9):
        return (f"{expected}: that is (1 − α^K)/(1 − α), one token short of the most a step can "
                "emit. A step emits its accepted drafts plus one more (correction or bonus).")
    if math.isclose(got, case.expected - 1, rel_tol=1e-9, abs_tol=1e-12):
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
    if math.isclose(got, case.expected, rel_tol=1e-9, abs_tol=1e-12):
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
    if math.isclose(got, case.expected, rel_tol=1e-9, abs_tol=1e-12):
        return None
    expected = f"expected α̂ = {case.expected:.6g}, got {got:.6g}"
    if math.isclose(got, num_accepted.mean() / k, rel_tol=1e-9, abs_tol=1e-12):
        return (f"{expected}: that is accepted / (K × steps), as if every step tested all K "
                "drafts. A step stops at its first rejection: drafts after it were never tested.")
    if math.isclose(got, num_accepted.sum() / (num_accepted + 1).sum(), rel_tol=1e-9, abs_tol=1e-12):
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
    if math.isclose(got, case.expected, rel_tol=1e-9, abs_tol=1e-12):
        return None
    expected = f"expected {case.expected:.6g} tokens per target call, got {got:.6g}"
    if math.isclose(got, case.expected - 1, rel_tol=1e-9, abs_tol=1e-12):
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


CHECKS: dict[str, Check] = {check.name: check for check in (
    check_accept_draft, check_residual, check_verify_chain, check_acceptance_rate,
    check_shortcut_output, check_shortcut_bias,
    check_tokens_per_step, check_speedup, check_optimal_k, check_estimate_alpha,
    check_tokens_per_step_by_index,
)}

__all__ = ["CHECKS", "Check", "Outcome"] + [check.__name__ for check in CHECKS.values()]

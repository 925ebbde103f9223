"""The machinery every checker shares: `Check`, `Case`, `Outcome`, and the helpers that read a
learner's answer (a number, an int, a list of ints, a vector) and describe it in a message.

A checker is a `Check`: a name (the learner's function), a function that builds the hidden cases,
and a comparison that returns None for a right answer or a short description of what is wrong.
`Check.outcome` runs the learner's function on every case and stops at the first failure; an
exception from the learner's code, a None, or an answer of the wrong type becomes one line.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

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


def _same_number(a: float, b: float) -> bool:
    """Two scalar answers agree: equal up to float rounding (relative 1e-9, or 1e-12 near zero)."""
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


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



def _as_token_list(got, what: str = "a list of token ids") -> list[int]:
    """A list of Python ints from a list or tuple of ints, or a 1-D (or (1, n)) integer tensor or array."""
    if isinstance(got, (torch.Tensor, np.ndarray)):
        if got.ndim == 2 and got.shape[0] == 1:
            got = got[0]
        if got.ndim != 1 or (got.dtype.is_floating_point if isinstance(got, torch.Tensor)
                             else not np.issubdtype(got.dtype, np.integer)):
            raise _Wrong(f"expected {what}, got {_type_name(got)} of {got.dtype}.")
        return [int(token) for token in got.tolist()]
    if not isinstance(got, (list, tuple)):
        raise _Wrong(f"expected {what}, got {_type_name(got)}.")
    return [_as_int(token, "a token id") for token in got]


def _as_ints(got, what: str, item: str) -> list[int]:
    """A list of Python ints from a list or tuple of ints, or a 1-D integer tensor or array."""
    if isinstance(got, (torch.Tensor, np.ndarray)):
        return _as_token_list(got, what)
    if not isinstance(got, (list, tuple)):
        raise _Wrong(f"expected {what}, got {_type_name(got)}.")
    return [_as_int(value, item) for value in got]

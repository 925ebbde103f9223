"""Checkers for the exercises of chapter 6b on EAGLE-3 (exercises 6b.6 and 6b.7): the training-time test's attention
mask, and the draft distribution of a head with a reduced vocabulary.

The references are the package's: `specbook.eagle3.ttt_mask`, and the softmax of `specbook.eagle3.Eagle3Head.logits`
(the head's scores on its vocabulary, -inf elsewhere), written here as a scatter of the softmax over the scores
(tests/test_exercises.py checks the two agree). Every case is small and seeded: no model is needed.
"""

from __future__ import annotations

import numpy as np
import torch

from ..eagle3 import ttt_mask
from .ch06 import _as_mask, _columns
from .core import Case, Check, _as_vector, _close, _fmt

# --- The training-time test's mask ---------------------------------------------------------------------


def _ttt_mask_cases() -> list[Case]:
    settings = [(1, 4, "one step: EAGLE's causal mask"), (2, 3, "two steps of 3 bases"), (3, 4, "three steps of 4"),
                (3, 1, "three steps of one base"), (4, 5, "four steps of 5"), (2, 1, "two steps of one base"),
                (5, 3, "five steps of 3"), (2, 6, "two steps of 6")]
    return [Case(f"{label}: steps = {steps}, n = {n}", (steps, n), ttt_mask(steps, n).numpy())
            for steps, n, label in settings]


def _compare_ttt_mask(got, case: Case) -> str | None:
    steps, n = case.args
    size = steps * n
    mask, expected = _as_mask(got, size), case.expected
    if np.array_equal(mask, expected):
        return None
    row = int(np.flatnonzero((mask != expected).any(1))[0])
    step, base = divmod(row, n)
    message = (f"row {row} (step {step}, base {base}) should see columns {_columns(expected[row])}, got "
               f"{_columns(mask[row])}")
    if np.array_equal(mask, np.tril(np.ones((size, size), dtype=bool))):
        return (f"{message}: that is a causal mask over the unrolled sequence. Step {step} at base {base} would see "
                "the chains of other bases, which at test time are never in its context.")
    if np.array_equal(mask, expected.T):
        return f"{message}: that is the mask transposed. Row i is the query, column j the key it attends to."
    if step and mask[row, :n].sum() == 0:
        return (f"{message}: the later steps must see step 0's keys up to their base: the true context, in the "
                "KV cache at test time.")
    if step and mask[row, :n].sum() > base + 1:
        return f"{message}: step 0's keys after the base are the future at test time."
    if step and not mask[row, row]:
        return f"{message}: the diagonal is missing. Every query sees its own key."
    return (f"{message}: a later step sees step 0 up to its base, then its own chain: the keys of steps 1 .. {step} "
            f"at base {base}, one column in each block.")


check_ttt_mask = Check("ttt_mask", _ttt_mask_cases, _compare_ttt_mask)

# --- A reduced vocabulary ------------------------------------------------------------------------------


def draft_distribution_reference(scores: torch.Tensor, vocab: list[int], target_vocab: int) -> torch.Tensor:
    """p over the target's vocabulary: the softmax of the head's ``scores`` (m,) at the token ids ``vocab`` (row i
    scores token vocab[i]), zero on every other token."""
    probs = torch.zeros(target_vocab, dtype=torch.float64)
    probs[torch.tensor(vocab)] = torch.as_tensor(scores, dtype=torch.float64).softmax(-1)
    return probs


def _draft_distribution_cases() -> list[Case]:
    generator = torch.Generator().manual_seed(68)
    settings = [("the 3 most frequent of 8 tokens", [0, 1, 2], 8), ("tokens not in order", [5, 1, 3], 6),
                ("the whole vocabulary: no reduction", list(range(5)), 5), ("one token: p is one-hot", [4], 7),
                ("every other token", [0, 2, 4, 6, 8], 10), ("a sparse map into 40 tokens", [39, 7, 22, 3], 40)]
    cases = []
    for label, vocab, target_vocab in settings:
        scores = 3 * torch.randn(len(vocab), generator=generator, dtype=torch.float64)
        cases.append(Case(f"{label}: vocab {vocab}, target_vocab = {target_vocab}, scores {_fmt(scores)}",
                          (scores, vocab, target_vocab), draft_distribution_reference(scores, vocab, target_vocab)))
    return cases


def _compare_draft_distribution(got, case: Case) -> str | None:
    scores, vocab, target_vocab = case.args
    probs = _as_vector(got, (target_vocab,), f"p over the target's {target_vocab} tokens")
    expected = case.expected.numpy()
    if _close(probs, expected):
        return None
    message = f"expected {_fmt(expected)}, got {_fmt(probs)}"
    outside = [token for token in range(target_vocab) if token not in vocab]
    full = torch.zeros(target_vocab, dtype=torch.float64)
    full[torch.tensor(vocab)] = scores
    if outside and _close(probs, full.softmax(-1).numpy()):
        return (f"{message}: that is the softmax with a score of 0 on the tokens the head cannot propose, which "
                "gives them mass. They need a score of -inf, or zeros put in after the softmax.")
    if _close(probs[: len(vocab)], scores.softmax(-1).numpy()) and vocab != list(range(len(vocab))):
        return (f"{message}: row i of the head's scores is token vocab[i], not token i. Place each probability at "
                "its token id.")
    if not np.isclose(probs.sum(), 1):
        return f"{message}: p sums to {probs.sum():.4g}, not 1. Take the softmax of the scores."
    if outside and probs[outside].any():
        return f"{message}: p must be zero on the tokens outside vocab, which the head cannot propose."
    return message + "."


check_draft_distribution = Check("draft_distribution", _draft_distribution_cases, _compare_draft_distribution)

"""Checker for exercise 6c.7 (chapter 6c's section on parallel drafting): the attention mask that trains a PARD
draft on every context at every depth of a window in one forward.

The reference is the package's, `specbook.train.pard.layout` over every position (no drop): rows depth after
depth, depth c holding the positions c .. n - 1 (tests/test_exercises.py checks it against a mask written by hand).
Every case is a small shape: no model is needed.
"""

from __future__ import annotations

import numpy as np

from ..train.pard import kept_positions, layout
from .ch06 import _as_mask, _columns
from .core import Case, Check


def pard_mask_reference(depths: int, n: int) -> np.ndarray:
    """The layout's mask: row (c, p) sees the text up to p - c, the masks of depths 1 .. c of its context, itself."""
    return layout(kept_positions(n, depths, ratio=1.0))[2].numpy()


def _rows(depths: int, n: int) -> list[tuple[int, int]]:
    """Each row's (depth, position), in the layout's order."""
    return [(depth, position) for depth in range(depths) for position in range(depth, n)]


def _pard_mask_cases() -> list[Case]:
    settings = [(1, 4, "one depth: the text's causal mask"), (2, 4, "the text and one mask depth"),
                (3, 5, "three depths of 5 positions"), (4, 6, "four depths of 6"), (3, 3, "three depths of 3"),
                (5, 7, "five depths of 7"), (2, 2, "two depths of 2"), (4, 4, "four depths of 4")]
    return [Case(f"{label}: depths = {depths}, n = {n}", (depths, n), pard_mask_reference(depths, n))
            for depths, n, label in settings]


def _compare_pard_mask(got, case: Case) -> str | None:
    depths, n = case.args
    rows, expected = _rows(depths, n), case.expected
    mask = _as_mask(got, len(rows))
    if np.array_equal(mask, expected):
        return None
    row = int(np.flatnonzero((mask != expected).any(1))[0])
    depth, position = rows[row]
    message = (f"row {row} (depth {depth} at position {position}) should see rows {_columns(expected[row])}, got "
               f"{_columns(mask[row])}")
    if np.array_equal(mask, np.tril(np.ones_like(expected))):
        return (f"{message}: that is a causal mask over the whole layout. A mask of depth {depth} would see other "
                "contexts' masks and text past its own context, which its drafting call never holds.")
    if np.array_equal(mask, expected.T):
        return f"{message}: that is the mask transposed. Row i is the query, column j the key it attends to."
    if not mask[row, row]:
        return f"{message}: the diagonal is missing. Every row sees its own key."
    text = [column for column in _columns(mask[row]) if rows[column][0] == 0]
    if depth and text and max(rows[column][1] for column in text) > position - depth:
        return (f"{message}: a mask of depth {depth} at position {position} drafts after a context ending at "
                f"position {position - depth}; the text after it is what the draft must guess.")
    return (f"{message}: the row sees the text up to position {position - depth} and the masks of depths 1 .. "
            f"{depth} of the same context, one at each position {position - depth + 1} .. {position}.")


check_pard_mask = Check("pard_mask", _pard_mask_cases, _compare_pard_mask)

"""Checkers for the exercises of chapter 7, speculative decoding in a server: left padding, each row's
positions in a cache with hidden columns, greedy verification of ragged rows, and the draft length
for a batch size.

The references are the package's: `specbook.models.ModelPair.encode_batch`'s padding (written out
here on token lists), `specbook.ragged.RaggedCache`'s positions (the visible columns before a
column), `specbook.batch.verify_rows` for greedy verification and
`specbook.policies.BatchSizeK.from_costs` for the draft length.
"""

from __future__ import annotations

import numpy as np
import torch

from ..batch import verify_rows
from ..policies import BatchSizeK
from ..sampling import Sampler
from ..theory import optimal_k
from .core import Case, Check, _as_int, _as_token_list, _type_name, _Wrong

# --- Left padding ------------------------------------------------------------------------------------


def _pad(rows, pad_id):
    width = max(map(len, rows))
    return ([[pad_id] * (width - len(row)) + row for row in rows],
            [[0] * (width - len(row)) + [1] * len(row) for row in rows])


def _left_pad_cases() -> list[Case]:
    settings = [([[5, 6, 7], [8]], 0), ([[1, 2], [3, 4]], 0), ([[9], [10, 11, 12, 13], [14, 15]], 2),
                ([[4, 4, 4, 4, 4]], 1), ([[3], [3], [3, 3]], 0)]
    return [Case(f"rows {rows}, pad_id {pad}", (rows, pad), _pad(rows, pad)) for rows, pad in settings]


def _as_table(got, what: str) -> list[list[int]]:
    if isinstance(got, (torch.Tensor, np.ndarray)):
        if got.ndim != 2:
            raise _Wrong(f"expected {what} as a (B, T) tensor, got {_type_name(got)}.")
        return [[int(x) for x in row] for row in got.tolist()]
    if not isinstance(got, (list, tuple)):
        raise _Wrong(f"expected {what} as a (B, T) tensor, got {_type_name(got)}.")
    return [_as_token_list(row, what) for row in got]


def _as_pair(got, names: str) -> tuple:
    """The learner's two answers, or _Wrong naming them (``names``: "first, second")."""
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise _Wrong(f"expected a pair ({names}), got {_type_name(got)}.")
    return tuple(got)


def _compare_left_pad(got, case: Case) -> str | None:
    ids, mask = _as_pair(got, "input_ids, attention_mask")
    ids, mask = _as_table(ids, "input_ids"), _as_table(mask, "attention_mask")
    expected_ids, expected_mask = case.expected
    if ids == expected_ids and mask == expected_mask:
        return None
    rows, pad = case.args
    width = max(map(len, rows))
    right = ([row + [pad] * (width - len(row)) for row in rows], [[1] * len(row) + [0] * (width - len(row))
                                                                   for row in rows])
    if (ids, mask) == right:
        return ("that pads on the right. A batch generates after every row's last column, so each row's "
                "last token must sit in the last column: put the padding on the left.")
    if ids == expected_ids and mask == [[1 - x for x in row] for row in expected_mask]:
        return "the mask is inverted: 1 marks a token the model reads, 0 the padding."
    return f"expected input_ids {expected_ids} and attention_mask {expected_mask}, got {ids} and {mask}."


check_left_pad = Check("left_pad", _left_pad_cases, _compare_left_pad)

# --- Each row's positions ----------------------------------------------------------------------------


def _positions(visible: torch.Tensor) -> torch.Tensor:
    return (visible.long().cumsum(1) - 1).clamp(min=0)


def _row_positions_cases() -> list[Case]:
    maps = [[[1, 1, 1, 1]], [[0, 0, 1, 1], [1, 1, 1, 1]], [[0, 1, 1, 0, 0, 1, 1], [1, 1, 1, 1, 1, 0, 1]],
            [[0, 0, 0, 1, 1, 1, 0, 1], [0, 1, 1, 1, 0, 0, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]]]
    cases = []
    for rows in maps:
        visible = torch.tensor(rows, dtype=torch.bool)
        cases.append(Case(f"visible {rows}", (visible,), _positions(visible)))
    return cases


def _compare_row_positions(got, case: Case) -> str | None:
    visible = case.args[0]
    if not isinstance(got, torch.Tensor) or got.shape != visible.shape:
        raise _Wrong(f"expected a {tuple(visible.shape)} tensor of positions, got {_type_name(got)}.")
    got = got.long()
    if torch.equal(got[visible], case.expected[visible]):  # hidden columns are never read: any value will do
        return None
    if torch.equal(got[visible], torch.arange(visible.shape[1]).expand_as(visible)[visible]):
        return ("those are the column numbers. A row's position counts its own tokens only: padding and hidden "
                "drafts are not tokens of the row, so count the visible columns before each column.")
    if torch.equal(got[visible], case.expected[visible] + 1):
        return "off by one: a row's first token sits at position 0."
    return f"expected positions {case.expected.tolist()} at the visible columns, got {got.tolist()}."


check_row_positions = Check("row_positions", _row_positions_cases, _compare_row_positions)

# --- Greedy verification of ragged rows --------------------------------------------------------------


def _accept_rows_cases() -> list[Case]:
    rng = np.random.default_rng(7)
    cases = []
    for batch, k in [(1, 3), (2, 2), (3, 4), (4, 3), (5, 4), (3, 1)]:
        target = torch.tensor(rng.integers(0, 6, (batch, k + 1)))
        drafts = target[:, :k].clone()
        for row in range(batch):  # row b agrees with the target on its first few drafts
            cut = int(rng.integers(0, k + 1))
            if cut < k:
                drafts[row, cut] = (drafts[row, cut] + 1) % 6
        lengths = [int(rng.integers(0, k + 1)) for _ in range(batch)]
        for row, n in enumerate(lengths):
            drafts[row, n:] = target[row, n:k]  # filler that happens to match the target: it must not count
        logits = torch.nn.functional.one_hot(target, 6).float()
        expected = verify_rows(drafts, lengths, None, logits, Sampler(0), [None] * batch)
        cases.append(Case(f"{batch} rows, K = {k}, lengths {lengths}", (drafts, lengths, target), expected))
    return cases


def _compare_accept_rows(got, case: Case) -> str | None:
    accepted, next_tokens = _as_pair(got, "accepted, next_tokens")
    accepted, next_tokens = _as_token_list(accepted, "accepted counts"), _as_token_list(next_tokens, "next tokens")
    expected_accepted, expected_next = case.expected
    if accepted == expected_accepted and next_tokens == expected_next:
        return None
    if len(set(accepted)) == 1 and len(set(expected_accepted)) > 1:
        return (f"every row accepted {accepted[0]}, but the rows accept {expected_accepted}: each row keeps its own "
                "run of matches, whatever the other rows do.")
    lengths = case.args[1]
    if any(a > n for a, n in zip(accepted, lengths)):
        return (f"a row accepted more drafts than it drafted ({accepted} with lengths {lengths}): the columns "
                "after a row's own drafts are filler, never accepted.")
    return f"expected accepted {expected_accepted} and next tokens {expected_next}, got {accepted} and {next_tokens}."


check_accept_rows = Check("accept_rows", _accept_rows_cases, _compare_accept_rows)

# --- The draft length for a batch size ---------------------------------------------------------------


def _batch_k_cases() -> list[Case]:
    settings = [(0.7, 0.1, [1, 1.2, 1.35, 1.5, 1.7]), (0.8, 0.05, [1, 1.02, 1.05, 1.07, 1.1]),
                (0.6, 0.1, [1, 1.7, 2.4, 3.1, 3.8]), (0.6, 0.1, [1, 1.4, 1.8, 2.2, 2.6]),
                (0.9, 0.02, [1, 1.01, 1.02, 1.03, 1.04, 1.05, 1.06]), (0.5, 0.3, [1, 1.1, 1.2]),
                (0.75, 0.1, [1, 1.6, 2.1, 2.7])]
    return [Case(f"alpha = {alpha}, cost_ratio = {c}, verify_ratio = {ratios}", (alpha, c, ratios),
                 BatchSizeK.from_costs(alpha, {1: c}, {1: ratios}, min_speedup=1).k_by_batch[1]) for alpha, c, ratios in settings]


def _compare_batch_k(got, case: Case) -> str | None:
    got = _as_int(got, "a draft length K")
    if got == case.expected:
        return None
    alpha, cost_ratio, ratios = case.args
    if case.expected == 0 and got > 0:
        return (f"expected K = 0: at these costs no K beats plain decoding (every speedup is below 1), so the "
                f"batch should not speculate; you returned K = {got}.")
    if got == optimal_k(alpha, cost_ratio, len(ratios) - 1):
        return (f"expected K = {case.expected}, got K = {got}: chapter 3's best K, which takes a call on K + 1 "
                "positions to cost one call. Divide by c K + r(K), the measured cost of that call.")
    return f"expected K = {case.expected}, got K = {got}."


check_batch_k = Check("batch_k", _batch_k_cases, _compare_batch_k)

"""Checkers for the exercises of chapter 6 that verify a token tree (exercises 6.4, 6.5 and 6.7): greedy
tree verification, what a node emits when its candidates are tested without the residual, and the
tokens per call a static tree expects. The exercises that build a tree are checked in `ch06`.

The reference of greedy verification is the package's, `specbook.tree_verification.verify_tree_greedy`.
Where the package has no function the reference is written here: the walk over one node's deterministic
candidates, computed exactly (with the residual update it returns q, as `specbook.verify_tree` does;
without it, the biased shortcut of §6.3), and the expected tokens per call of a static tree under an
i.i.d. acceptance model, the sum over its nodes of the product of the accuracies along each node's
path (the estimate the Medusa paper builds its sparse trees from).
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch

from ..drafters.medusa import DEFAULT_TREE
from ..tree_verification import verify_tree_greedy
from ..trees import TreeSpec, tree_positions
from .core import Case, Check, _as_float, _as_int, _as_ints, _as_vector, _close, _fmt, _probs, _random_pair, \
    _same_number, _type_name

# --- Greedy tree verification -----------------------------------------------------------------------------


def greedy_walk(tokens, parents, target_tokens, *, any_depth=False, own_row=False, first_child_only=False):
    """(path, next_token) of greedy tree verification, and with switches the usual mistakes."""
    depths = tree_positions(parents).tolist()  # (n + 1,) root first
    path, row = [], 0
    while True:
        if any_depth:  # any node one level deeper, whoever its parent
            candidates = [node for node in range(len(tokens)) if depths[node + 1] == depths[row] + 1]
        else:
            candidates = [node for node, parent in enumerate(parents) if parent == row - 1]
            if first_child_only:
                candidates = candidates[:1]
        matches = [node for node in candidates if tokens[node] == target_tokens[node + 1 if own_row else row]]
        if not matches:
            return path, target_tokens[row]
        path.append(matches[0])
        row = matches[0] + 1


GREEDY_TREE_SETTINGS = [  # (label, tokens, parents, target_tokens)
    ("the first child, then its second child, then a leaf: the bonus", [5, 7, 2, 3, 2, 9], [-1, -1, 0, 0, 1, 1],
     [5, 3, 9, 1, 4, 6, 0]),
    ("no child of the root matches", [1, 2, 3], [-1, -1, -1], [8, 0, 0, 0]),
    ("the root's third child", [1, 2, 3], [-1, -1, -1], [3, 4, 5, 6]),
    ("a cousin holds the target's token", [5, 7, 3, 4], [-1, -1, 0, 1], [7, 2, 3, 1, 0]),
    ("a chain accepted to its leaf", [4, 5, 6], [-1, 0, 1], [4, 5, 6, 2]),
    ("each node's own row holds its token", [5, 6], [-1, 0], [9, 5, 6]),
    ("a deep branch under the second child", [2, 8, 1, 8, 3, 0], [-1, -1, 1, 1, 3, 4], [8, 5, 8, 9, 3, 0, 7]),
]


def _random_greedy_trees(seed: int, count: int) -> list[tuple]:
    rng = random.Random(seed)
    settings = []
    for _ in range(count):
        parents = [rng.randrange(-1, node) for node in range(rng.randrange(3, 17))]
        children = [[node for node, parent in enumerate(parents) if parent == row - 1]
                    for row in range(len(parents) + 1)]
        tokens = [0] * len(parents)
        for siblings in children:  # distinct tokens among siblings, as top-k candidates are
            for node, token in zip(siblings, rng.sample(range(10), len(siblings))):
                tokens[node] = token
        target_tokens = [tokens[rng.choice(siblings)] if siblings and rng.random() < 0.8 else rng.randrange(10)
                         for siblings in children]
        settings.append(("a random tree", tokens, parents, target_tokens))
    return settings


def _greedy_tree_cases() -> list[Case]:
    cases = []
    for label, tokens, parents, target_tokens in GREEDY_TREE_SETTINGS + _random_greedy_trees(62, 10):
        outcome = verify_tree_greedy(torch.tensor(tokens), parents, torch.tensor(target_tokens))
        cases.append(Case(f"{label}: tokens {tokens}, parents {parents}, target_tokens {target_tokens}",
                          (tokens, parents, target_tokens), (outcome.path, outcome.next_token)))
    return cases


def _compare_greedy_tree(got, case: Case) -> str | None:
    tokens, parents, target_tokens = case.args
    expected_path, expected_next = case.expected
    if isinstance(got, (tuple, list)) and all(isinstance(value, (int, np.integer)) for value in got):
        return f"expected a pair (path, next_token), got {list(got)}: return both, `return path, next_token`."
    if not isinstance(got, (tuple, list)) or len(got) not in (2, 3):
        return (f"expected a pair (path, next_token), got {_type_name(got)}"
                + (f" of length {len(got)}." if isinstance(got, (tuple, list)) else "."))
    path = _as_ints(got[0], "the accepted path, a list of node indices", "a node index")
    next_token = _as_int(got[1], "the next token")
    if path == expected_path and next_token == expected_next:
        return None
    expected = f"expected the path {expected_path} and then token {expected_next}, got {path} and {next_token}"
    if path != expected_path:
        if path == [tokens[node] for node in expected_path]:
            return f"{expected}: those are the accepted tokens. Return the nodes' indices."
        mistakes = {"any_depth": "accepts a node one level deeper that is not a child of the last accepted node. "
                                 "Only the current node's children continue its path",
                    "own_row": "compares a child's token with the target's choice at the child's own row. A child is "
                               "right when it equals the target's choice at its parent (row parent + 1; the root's "
                               "is row 0)",
                    "first_child_only": "tries only the first child of every node, as in a chain. Try every child of "
                                        "the current node"}
        for switch, mistake in mistakes.items():
            if (path, next_token) == greedy_walk(tokens, parents, target_tokens, **{switch: True}):
                return f"{expected}: that walk {mistake}."
        return (f"{expected}. From the root, accept the child whose token is the target's choice at the current node, "
                "and go on from it.")
    if path and next_token == target_tokens[0]:
        return (f"{expected}: that is the target's choice after the root. The next token is its choice after the last "
                f"accepted node, target_tokens[{path[-1]} + 1].")
    row = path[-1] + 1 if path else 0
    return f"{expected}: after the path, the target's own choice at row {row} comes next."


check_verify_tree_greedily = Check("verify_tree_greedily", _greedy_tree_cases, _compare_greedy_tree)


# --- Candidates tested without the residual ------------------------------------------------------------


def siblings_output(target_probs: torch.Tensor, candidates, residual: bool = True) -> torch.Tensor:
    """The exact distribution of the token emitted at a node whose distinct, deterministic candidates
    (one-hot p) are tried in order, as `specbook.verify_tree` tries them.

    A candidate x is accepted with probability q(x), q the current distribution. With ``residual``
    a rejection removes x from q (the residual of a one-hot p): the output is q itself. Without it
    every candidate is tested against the original q and the fallback draws from q: the shortcut.
    """
    current, untried, emitted = target_probs.clone(), 1.0, torch.zeros_like(target_probs)
    for token in candidates:
        accept = float(current[token])  # min(1, q(x) / p(x)) with p(x) = 1
        emitted[token] += untried * accept
        untried *= 1 - accept
        if residual and accept < 1:
            current = current.clone()
            current[token] = 0
            current = current / current.sum()
    return emitted + untried * current  # (vocab,): every candidate rejected, draw from what is left


def _no_residual_cases() -> list[Case]:
    toy = torch.tensor([0.45, 0.25, 0.15, 0.10, 0.05], dtype=torch.float64)  # chapter 2's q
    settings = [
        ("chapter 2's toy q, the top 3 of §6.3's p: floor, sofa, roof", toy, [1, 2, 3]),
        ("the toy q, one candidate: chapter 5's fresh draw", toy, [0]),
        ("the toy q, candidates mat and floor", toy, [0, 1]),
        ("the toy q, every token a candidate", toy, [4, 3, 2, 1, 0]),
        ("a candidate the target never writes", _probs([0.5, 0.5, 0.0, 0.0]), [2, 0]),
        ("a one-hot q, as under greedy decoding", _probs([0.0, 1.0, 0.0, 0.0]), [0, 1, 2]),
    ]
    rng = np.random.default_rng(63)
    for vocab, count in ((6, 2), (8, 3), (10, 4), (7, 1)):
        target_probs = _random_pair(rng, vocab, sparse=vocab == 8)[0]
        settings.append((f"random, vocab {vocab}", target_probs,
                         [int(token) for token in rng.choice(vocab, count, replace=False)]))
    return [Case(f"{label}: q = {_fmt(q)}, candidates {candidates}", (q, candidates),
                 siblings_output(q, candidates, residual=False).numpy()) for label, q, candidates in settings]


def _compare_no_residual(got, case: Case) -> str | None:
    target_probs, candidates = case.args
    got = _as_vector(got, tuple(target_probs.shape), "a distribution over the vocabulary")
    if _close(got, case.expected):
        return None
    expected = f"expected {_fmt(case.expected)}, got {_fmt(got)}"
    q = target_probs.numpy()
    all_rejected = math.prod(1 - q[token] for token in candidates)  # the chance of the final draw
    if abs(got.sum() - 1) > 1e-6:
        if _close(got, case.expected - all_rejected * q):
            return (f"{expected}, which sums to {got.sum():.4g}: the final draw is missing. When every candidate is "
                    f"rejected (probability {all_rejected:.4g}) a token is drawn from q.")
        return (f"{expected}, which sums to {got.sum():.4g}, not 1. Candidate x_i is emitted when x_1 … x_(i-1) were "
                "rejected and x_i accepted; any token, when all were rejected and the final draw gives it.")
    if _close(got, q):
        return (f"{expected}: that is q, what the rule with the residual emits. Here a rejection removes nothing: "
                "every candidate is tested against the original q, and the final draw is from q too.")
    others = q.copy()
    others[candidates] = 0
    if others.sum() > 0 and _close(got, case.expected + all_rejected * (others / others.sum() - q)):
        return (f"{expected}: your final draw leaves the candidates out. In the shortcut nothing is removed: the "
                "final draw is from q itself, candidates included.")
    return (f"{expected}. Candidate x_i is emitted when x_1 … x_(i-1) were rejected and x_i accepted (probability "
            "q(x_i) each time), or when all were rejected and the final draw from q gives it.")

check_no_residual_output = Check("no_residual_output", _no_residual_cases, _compare_no_residual)


# --- Tokens per call of a static tree -------------------------------------------------------------------


def tree_tokens_per_call_reference(paths, accuracy) -> float:
    """1 + the sum over the nodes of the product of the accuracies along each node's path.

    accuracy[d][r] is the chance that the rank-r candidate at depth d + 1 is the target's token,
    the same at every node and independent across depths; siblings' chances exclude each other
    (at most one sibling is the target's token). A node is on the accepted path exactly when every
    node of its path is right, and a call emits the accepted path plus one token.
    """
    return 1 + sum(math.prod(accuracy[depth][rank] for depth, rank in enumerate(path)) for path in paths)


def _tokens_per_call_cases() -> list[Case]:
    medusa_like = [[0.6, 0.15, 0.08, 0.05], [0.45, 0.15, 0.08, 0.05], [0.35, 0.12, 0.06, 0.04],
                   [0.3, 0.1, 0.05, 0.03]]
    rng = random.Random(64)
    shuffled = list(DEFAULT_TREE.truncated(3).paths)
    rng.shuffle(shuffled)
    settings = [
        ("a chain of 4 top guesses, accuracy 0.8 at every depth", [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)],
         [[0.8]] * 4),
        ("one node", [(0,)], [[0.6]]),
        ("the first head's top 3", [(0,), (1,), (2,)], [[0.5, 0.2, 0.1]]),
        ("the full (2, 2) tree", TreeSpec.from_branching((2, 2)).paths, [[0.5, 0.2], [0.4, 0.15]]),
        ("a chain whose accuracy falls with depth", [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)],
         [[0.7], [0.5], [0.4], [0.3]]),
        ("Medusa's default tree", DEFAULT_TREE.paths, medusa_like),
        ("the default tree cut to depth 3, in no particular order", shuffled, medusa_like),
        ("a rank that is never right", [(0,), (1,), (1, 0), (0, 0)], [[0.6, 0.0], [0.5]]),
        ("a lopsided tree", [(1,), (1, 2), (1, 2, 0), (0,), (1, 0)], [[0.4, 0.3], [0.2, 0.1, 0.5], [0.9]]),
    ]
    return [Case(f"{label}: paths {list(paths)}, accuracy {accuracy}", (list(paths), accuracy),
                 tree_tokens_per_call_reference(paths, accuracy)) for label, paths, accuracy in settings]


def _compare_tokens_per_call(got, case: Case) -> str | None:
    paths, accuracy = case.args
    got = _as_float(got, "a number")
    if _same_number(got, case.expected):
        return None
    expected = f"expected {case.expected:.6g} tokens per target call, got {got:.6g}"
    if _same_number(got, case.expected - 1):
        return (f"{expected}: that counts the accepted nodes only. Every call also emits one more token, the "
                "target's own after the accepted path (a correction, or the bonus after a leaf).")
    if math.isclose(got, 1 + sum(accuracy[len(path) - 1][path[-1]] for path in paths), rel_tol=1e-9):
        return (f"{expected}: that adds each node's own accuracy. A node is accepted only if every node on its path "
                "was: multiply the accuracies along the path.")
    if math.isclose(got, 1 + sum(math.prod(accuracy[0][rank] for rank in path) for path in paths), rel_tol=1e-9):
        return (f"{expected}: that uses the first depth's accuracies all along the path. The i-th rank of a path "
                "(counting from 0) is a candidate at depth i + 1: use accuracy[i].")
    return (f"{expected}. A node is on the accepted path with probability the product of accuracy[i][r_i] over its "
            "path (r_0, r_1, …); the expected accepted length is the sum of that over the nodes.")


check_tree_tokens_per_call = Check("tree_tokens_per_call", _tokens_per_call_cases, _compare_tokens_per_call)

"""Checkers for the exercises of chapter 6, heads and trees: the tree attention mask, depth-based
position ids, Medusa's tree of the heads' top guesses, greedy tree verification, what a node emits
when its candidates are tested without the residual, and the tokens per call a static tree
expects.

The references are the package's: `specbook.trees.tree_attention_mask`, `tree_positions` and
`verify_tree_greedy`; `specbook.MedusaDrafter` run with tiny random Medusa heads on a tiny random
target (`specbook.exercises.tiny`), never the trained ones. Where the package has no function the
reference is written here: the walk over one node's deterministic candidates, computed exactly
(with the residual update it returns q, as `specbook.verify_tree` does; without it, the biased
shortcut of §6.3), and the expected tokens per call of a static tree under an i.i.d. acceptance
model, the sum over its nodes of the product of the accuracies along each node's path (the
estimate the Medusa paper builds its sparse trees from).

Long because it holds six checkers, each a reference, its cases and its comparison: the module
is one per chapter, like its siblings, so that an exercise notebook imports one place.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from functools import lru_cache

import numpy as np
import torch

from ..drafters import MedusaDrafter
from ..drafters.medusa import DEFAULT_TREE
from ..heads import MedusaHeads
from ..models import target_features
from ..sampling import Sampler
from ..trees import TreeSpec, tree_attention_mask, tree_positions, verify_tree_greedy
from .core import Case, Check, _as_float, _as_int, _as_token_list, _as_vector, _close, _fmt, _probs, _random_pair, \
    _same_number, _type_name, _Wrong
from .tiny import random_prompt, tiny_model

# The hidden trees of the mask and position exercises: (label, parents).
TREES = [
    ("one node", [-1]),
    ("a chain of 4: its mask is the causal mask", [-1, 0, 1, 2]),
    ("three siblings under the root", [-1, -1, -1]),
    ("the (2, 2, 1) tree of §6.2", [-1, -1, 0, 0, 1, 1, 2, 3, 4, 5]),
    ("a deep branch and a shallow one", [-1, 0, 1, 2, -1, 4]),
    ("parents listed far from their children", [-1, -1, 1, 0, 2, 3, 3, 5]),
    ("Medusa's default 16-node tree", DEFAULT_TREE.parents),
]


def _random_trees(seed: int, count: int, sizes: tuple[int, int] = (2, 13)) -> list[tuple[str, list[int]]]:
    rng = random.Random(seed)
    trees = []
    for _ in range(count):
        trees.append(("a random tree", [rng.randrange(-1, node) for node in range(rng.randrange(*sizes))]))
    return trees


def _as_ints(got, what: str, item: str) -> list[int]:
    """A list of Python ints from a list or tuple of ints, or a 1-D integer tensor or array."""
    if isinstance(got, (torch.Tensor, np.ndarray)):
        return _as_token_list(got, what)
    if not isinstance(got, (list, tuple)):
        raise _Wrong(f"expected {what}, got {_type_name(got)}.")
    return [_as_int(value, item) for value in got]


def _shape(got) -> tuple | None:
    try:
        return tuple(got.shape) if isinstance(got, (torch.Tensor, np.ndarray)) else np.asarray(got).shape
    except (TypeError, ValueError):
        return None


# --- The tree attention mask ------------------------------------------------------------------------


def _tree_mask_cases() -> list[Case]:
    return [Case(f"{label}: parents {parents}", (parents,), tree_attention_mask(parents).numpy())
            for label, parents in TREES + _random_trees(60, 8)]


def _as_mask(got, size: int) -> np.ndarray:
    """A (size, size) bool array from a bool or 0/1 tensor, array or list of lists."""
    if isinstance(got, torch.Tensor):
        array = got.detach().cpu().numpy()
    else:
        try:
            array = np.asarray(got)
        except (TypeError, ValueError):
            raise _Wrong(f"expected a ({size}, {size}) boolean mask, got {_type_name(got)}.") from None
    if array.shape != (size, size) or array.dtype == object:
        raise _Wrong(f"expected a ({size}, {size}) boolean mask, root first, got {_type_name(got)}"
                     + (f" of shape {array.shape}." if array.dtype != object else "."))
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise _Wrong("got a float mask with -inf in it, the additive form a model adds to its attention scores. "
                     "Return True where a row may attend and False elsewhere.")
    if not set(np.unique(array).tolist()) <= {0, 1}:
        raise _Wrong(f"expected True/False (or 1/0) entries, got values {_fmt(np.unique(array)[:6])}.")
    return array.astype(bool)


def _columns(row: np.ndarray) -> list[int]:
    return np.flatnonzero(row).tolist()


def _compare_tree_mask(got, case: Case) -> str | None:
    (parents,) = case.args
    size = len(parents) + 1
    if _shape(got) == (size - 1, size - 1):
        return (f"expected a ({size}, {size}) mask, got ({size - 1}, {size - 1}): the root (the pending token) is row "
                "and column 0, and every node sees it. Put it first.")
    mask, expected = _as_mask(got, size), case.expected
    if np.array_equal(mask, expected):
        return None
    row = int(np.flatnonzero((mask != expected).any(1))[0])
    who = "the root's row (row 0)" if row == 0 else f"row {row} (node {row - 1}, whose parent is {parents[row - 1]})"
    message = f"{who} should see columns {_columns(expected[row])}, got {_columns(mask[row])}"
    if np.array_equal(mask, expected.T):
        return (f"{message}: that is the mask transposed. Row i is the query and column j what it attends to; a "
                "node attends to its ancestors, which come before it.")
    if np.array_equal(mask, np.tril(np.ones((size, size), dtype=bool))):
        return (f"{message}: that is a chain's causal mask. In a tree a node would then see its cousins, tokens of "
                "other branches that are not in its text.")
    missing, extra = set(_columns(expected[row] & ~mask[row])), set(_columns(mask[row] & ~expected[row]))
    if extra:
        return f"{message}: it sees a row that is not one of its ancestors."
    if missing == {row}:
        return f"{message}: the diagonal is missing. Every row sees itself, as in a causal mask."
    if missing == {0}:
        return f"{message}: every node sees the root (column 0), the pending token all its paths start from."
    if mask[row, parents[row - 1] + 1]:
        return (f"{message}: it sees its parent but not every ancestor. A node must see every ancestor up to the "
                "root, the whole path it continues, as it would in a plain sequence.")
    return f"{message}: an ancestor is missing. Follow the parents up to the root."

check_tree_mask = Check("tree_mask", _tree_mask_cases, _compare_tree_mask)


# --- Position ids -----------------------------------------------------------------------------------------


def _tree_position_cases() -> list[Case]:
    offsets = [5, 0, 12, 3, 7, 1, 30, 9, 4, 2, 16, 6, 8, 11, 21]
    trees = TREES + _random_trees(61, len(offsets) - len(TREES))
    return [Case(f"{label}: parents {parents}, context_length = {offset}", (parents, offset),
                 tree_positions(parents, offset).tolist()) for (label, parents), offset in zip(trees, offsets)]


def _compare_tree_positions(got, case: Case) -> str | None:
    parents, context_length = case.args
    positions, expected = _as_ints(got, "a list of position ids", "a position id"), case.expected
    if positions == expected:
        return None
    if len(positions) == len(parents):
        return (f"expected {len(expected)} position ids, root first, got {len(positions)}: the root (the pending "
                f"token) is row 0 and sits at position context_length = {context_length}.")
    if len(positions) != len(expected):
        return f"expected {len(expected)} position ids (root first), got {len(positions)}."
    message = f"expected {expected}, got {positions}"
    if positions == list(range(context_length, context_length + len(expected))):
        return (f"{message}: that numbers the rows in order, as for a chain. Siblings are alternatives for the same "
                f"place in the text and share a position: a node of depth d sits at {context_length} + d.")
    if positions == [position - context_length for position in expected]:
        return f"{message}: the depths alone. The {context_length} cached tokens come first: add context_length."
    if positions == [position + 1 for position in expected]:
        return (f"{message}: one too far. Positions count from 0, so the cached tokens take 0 … "
                f"{context_length - 1} and the root sits at {context_length}.")
    if positions == [position - 1 for position in expected]:
        return f"{message}: one short. The root comes after the {context_length} cached tokens, at {context_length}."
    row = next(r for r, (a, b) in enumerate(zip(positions, expected)) if a != b)
    return (f"{message}: row {row} (node {row - 1}, depth {expected[row] - context_length}) should be at "
            f"{expected[row]}. A node's depth is its parent's depth + 1; the root's is 0.")


check_tree_position_ids = Check("tree_position_ids", _tree_position_cases, _compare_tree_positions)


# --- Medusa's tree ---------------------------------------------------------------------------------------

HIDDEN_SIZE = 32  # tiny_model's width


@lru_cache(maxsize=None)
def tiny_medusa_heads(seed: int, num_heads: int) -> MedusaHeads:
    """Random Medusa heads for `tiny_model(0)`, from ``seed`` (the global RNG is left alone).

    Fresh heads start at zero, where every head repeats the target's next-token guess; random
    blocks make each head guess differently, so that a mix-up of heads shows.
    """
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        heads = MedusaHeads(HIDDEN_SIZE, num_heads)
        with torch.no_grad():
            for block in heads.blocks:
                block.weight.normal_(0, 2 / HIDDEN_SIZE ** 0.5)
                block.bias.normal_(0, 1)
    return heads.eval()


def medusa_tree_reference(target, heads: MedusaHeads, feature: torch.Tensor, choices) -> tuple[list[int], list[int]]:
    """(tokens, parents) of the tree `MedusaDrafter` drafts for ``choices`` from the target's ``feature`` (hidden,)."""
    spec = TreeSpec(choices)
    drafter = MedusaDrafter(target, heads, tree=spec)
    drafter.start(None)
    drafter.observe_features(feature[None])  # (1, hidden): the feature before the pending token
    with torch.no_grad():
        draft = drafter.propose(spec.depth, Sampler(0), None)
    return draft.tokens.tolist(), list(draft.parents)


MEDUSA_SETTINGS = [  # (label, heads' seed, number of heads, prompt seed, choices)
    ("a chain of each head's top guess", 1, 3, 30, [(0,), (0, 0), (0, 0, 0)]),
    ("the full (2, 2) tree, listed depth first", 2, 2, 31, [(0,), (0, 0), (0, 1), (1,), (1, 0), (1, 1)]),
    ("the first head's top 5", 3, 2, 32, [(0,), (1,), (2,), (3,), (4,)]),
    ("4 heads, a tree of depth 2", 4, 4, 33, [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0)]),
    ("Medusa's default tree, in TreeSpec's order", 5, 4, 34, DEFAULT_TREE.paths),
    ("the default tree cut to depth 3, deepest nodes first", 6, 4, 35, DEFAULT_TREE.truncated(3).paths[::-1]),
    ("a lopsided tree: the second guess has the deep branch", 7, 4, 36, [(1,), (1, 2), (1, 2, 0), (0,), (1, 0)]),
]


def _medusa_cases() -> list[Case]:
    target = tiny_model(0)
    cases = []
    for label, seed, num_heads, prompt_seed, choices in MEDUSA_SETTINGS:
        heads = tiny_medusa_heads(seed, num_heads)
        with torch.no_grad():
            feature = target_features(target, random_prompt(prompt_seed, 6))[0, -1]  # (hidden,)
            head_logits = heads(feature, target.get_output_embeddings())  # (heads, vocab)
        choices = [tuple(path) for path in choices]
        cases.append(Case(f"{label}, {num_heads} heads: choices {choices}", (head_logits, choices),
                          medusa_tree_reference(target, heads, feature, choices),
                          extra={"order": head_logits.argsort(-1, descending=True).tolist()}))
    return cases


def _in_given_order(order: list[list[int]], choices) -> tuple[list[int], list[int]]:
    """The tree's tokens and parents with the nodes left in the order of ``choices``."""
    index = {path: node for node, path in enumerate(choices)}
    return ([order[len(path) - 1][path[-1]] for path in choices],
            [index[path[:-1]] if len(path) > 1 else -1 for path in choices])


def _token_paths(tokens: list[int], parents: list[int]) -> Counter:
    """Every node as the tuple of tokens from the root down to it: the tree, whatever the node order."""
    paths = []  # parents in topological order: a node's parent's path is already there
    for token, parent in zip(tokens, parents):
        paths.append((paths[parent] if parent >= 0 else ()) + (token,))
    return Counter(paths)


def _compare_medusa(got, case: Case) -> str | None:
    head_logits, choices = case.args
    expected_tokens, expected_parents = case.expected
    order = case.extra["order"]  # each head's tokens, best first
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return (f"expected a pair (tokens, parents), got {_type_name(got)}"
                + (f" of length {len(got)}." if isinstance(got, (tuple, list)) else "."))
    tokens = _as_ints(got[0], "the nodes' tokens, a list of token ids", "a token id")
    parents = _as_ints(got[1], "the parents, a list of node indices", "a node index")
    if tokens == expected_tokens and parents == expected_parents:
        return None
    n = len(expected_tokens)
    if len(tokens) != n or len(parents) != n:
        return f"expected {n} nodes, one per path in choices, got {len(tokens)} tokens and {len(parents)} parents."
    if (tokens, parents) == _in_given_order(order, choices):
        return ("the tree is right, but its nodes are in the order of `choices`. Sort the paths as TreeSpec does, by "
                "depth and then by path: each depth one block, every parent before its children.")
    if all(-1 <= parent < node for node, parent in enumerate(parents)) and \
            _token_paths(tokens, parents) == _token_paths(expected_tokens, expected_parents):
        return ("the tree is right, but its nodes are in another order. Sort the paths as TreeSpec does, by depth "
                "and then by path: each depth one block, every parent before its children.")
    spec = TreeSpec(choices)
    for node, (path, parent) in enumerate(zip(spec.paths, parents)):
        if parent != spec.parents[node]:
            return (f"node {node}, path {path}: its parent should be node {spec.parents[node]}"
                    + (f" (path {path[:-1]})" if len(path) > 1 else " (the root)") + f", got {parent}.")
    node = next(node for node, (a, b) in enumerate(zip(tokens, expected_tokens)) if a != b)
    path = spec.paths[node]
    message = (f"node {node}, path {path}: expected token {expected_tokens[node]}, head {len(path) - 1}'s guess of "
               f"rank {path[-1]}, got {tokens[node]}")
    mistakes = {  # (which head, which rank) -> what that mistake is
        (lambda path: len(path), lambda path: path[-1]):
            "head d's guess for depth d. A node of depth d comes from head d - 1: head 0 guesses the first token "
            "after the pending one.",
        (lambda path: len(path) - 1, lambda path: path[0]):
            "the guess of rank r_1, the path's first entry. A node's own rank is the last entry of its path.",
        (lambda path: 0, lambda path: path[-1]): "head 0's guess at every depth. Each depth has its own head.",
        (lambda path: len(path) - 1, lambda path: 0):
            "each head's best guess. Rank r is the head's r-th best token, counting from 0.",
    }
    for (head, rank), mistake in mistakes.items():
        if all(head(path) < len(order) and tokens[node] == order[head(path)][rank(path)]
               for node, path in enumerate(spec.paths)):
            return f"{message}: that is {mistake}"
    return f"{message}. Sort head {len(path) - 1}'s logits in descending order and take entry {path[-1]}."


def _medusa_error(error: Exception, case: Case) -> str | None:
    if isinstance(error, IndexError):
        return ("Node (r_1, …, r_d) is head d - 1's guess of rank r_d: heads count from 0, and so do ranks, "
                "0 for a head's best guess.")
    return None


check_medusa_tree = Check("medusa_tree", _medusa_cases, _compare_medusa, error_hint=_medusa_error)


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

"""Checkers for the exercises of chapter 6 that build a token tree (exercises 6.1 to 6.3): the tree
attention mask, depth-based position ids, and Medusa's tree of the heads' top guesses. The exercises
that verify a tree are checked in `ch06_verification`.

The references are the package's: `specbook.trees.tree_attention_mask` and `tree_positions`, and
`specbook.MedusaDrafter` run with tiny random Medusa heads on a tiny random target
(`specbook.exercises.tiny`), never the trained ones.
"""

from __future__ import annotations

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
from ..trees import TreeSpec, tree_attention_mask, tree_positions
from .core import Case, Check, _as_ints, _fmt, _type_name, _Wrong
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

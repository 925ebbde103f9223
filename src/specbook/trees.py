"""Token trees: many candidate continuations verified by one target call.

A chain draft bets everything on one continuation; a tree hedges. Its nodes are draft tokens in
topological order (every parent before its children), ``parents[i]`` the node that token i
continues, -1 for a child of the root -- the pending token, the last committed one. Flattened into
one sequence [root, node 0, ..., node n-1] with a *tree attention mask* (each node sees the cache,
itself and its ancestors, nothing else) and *depth-based position ids* (a node at depth d sits at
position L + d, as it would in its own path), one forward pass scores every path at once: the row
of node i is exactly what the target computes after the plain sequence root, ..., i (SpecInfer,
Miao et al. 2024, Section 4; Medusa, Cai et al. 2024, Section 2.1.2). The KV cache then keeps only
the accepted path (`specbook.cache.keep_positions`).

Verifying a tree (`specbook.tree_verification`) keeps the longest path the target accepts. A tree's
structure goes to the device once per shape (`tree_shape`): its call's mask is made there, whatever
the cache's length, and a copy from the host would make the device wait. A tree the drafter shapes on
the device (EAGLE-2's dynamic tree, `grow_dynamic_tree`) never leaves it until the step's one read.
"""

from typing import NamedTuple, Sequence

import torch

from .cache import SlotCache
from .masks import attention_inputs
from .policies import check_integer

SHAPES = 512  # tree shapes (and index lists) kept on each device: a static tree's few, a dynamic tree's many


def check_parents(parents: Sequence[int] | torch.Tensor, name: str = "parents") -> list[int]:
    """Validate a tree's parent indices and return them as a list of ints.

    Node i's parent must be -1 (the root) or an earlier node: 0 <= parents[i] < i.
    """
    if isinstance(parents, torch.Tensor):
        if parents.ndim != 1 or parents.is_floating_point() or parents.dtype == torch.bool:
            raise ValueError(f"{name} must be a 1-D integer tensor or a list of ints (got {parents.dtype}, "
                             f"shape {tuple(parents.shape)})")
        parents = parents.tolist()
    parents = list(parents)
    for node, parent in enumerate(parents):
        if not isinstance(parent, int) or isinstance(parent, bool):
            raise ValueError(f"{name} must hold integer node indices (got {parent!r} at node {node})")
        if parent < -1 or parent >= len(parents):
            raise ValueError(f"{name}: node {node} has parent {parent}, which does not exist "
                             f"(a parent is -1 for the root or a node index in [0, {len(parents)}))")
        if parent >= node:
            raise ValueError(f"{name} must be in topological order: node {node} has parent {parent}, "
                             "which does not come before it")
    return parents


def tree_attention_mask(parents) -> torch.Tensor:
    """(n + 1, n + 1) bool, root first: entry [i, j] is True when row i may attend to row j.

    Row 0 is the root (it sees itself), row i + 1 is node i: it sees itself and its ancestors.
    """
    parents = check_parents(parents)
    visible = torch.eye(len(parents) + 1, dtype=torch.bool)  # (n + 1, n + 1)
    for node, parent in enumerate(parents):
        visible[node + 1] |= visible[parent + 1]  # the parent's row is final: it comes first
    return visible


def tree_depths(parents) -> list[int]:
    """Each row's depth (n + 1,), root first (the root's is 0), as Python ints."""
    depths = [0]
    for parent in check_parents(parents):
        depths.append(depths[parent + 1] + 1)
    return depths


def tree_positions(parents, offset: int = 0) -> torch.Tensor:
    """(n + 1,) long position ids, root first: ``offset`` plus each row's depth (the root's is 0)."""
    return torch.tensor(tree_depths(parents)) + offset


def tree_model_inputs(parents, context_length: int, in_cache: int = 0, dtype=torch.float32, device=None,
                      config=None) -> dict:
    """What a Hugging Face causal LM needs to feed a tree on top of its KV cache.

    The cache holds ``context_length`` tokens before the root, then the first ``in_cache`` rows of
    the tree (root first, node order); the call feeds the remaining rows in_cache..n. Returns
    ``attention_mask`` (1, 1, rows, cache + rows), a float mask added to the attention scores (0 =
    visible, the dtype's minimum = hidden; one per kind of layer, sliding windows applied, for a
    model whose layers attend differently: `specbook.masks`), and ``position_ids`` (1, rows).
    """
    visible = tree_attention_mask(parents)[in_cache:]  # (rows, n + 1)
    visible = torch.cat([torch.ones(visible.shape[0], context_length, dtype=torch.bool), visible], 1)
    tree_positions_all = tree_positions(parents, context_length)  # (n + 1,)
    positions = tree_positions_all[in_cache:]  # (rows,)
    key_positions = torch.cat([torch.arange(context_length), tree_positions_all])  # (cache + n + 1,)
    return attention_inputs(visible[None], positions[None], key_positions[None], dtype, device, config)


def tree_inputs(parents, cache, in_cache: int = 0, dtype=torch.float32, device=None, config=None) -> dict:
    """What a model needs to feed rows in_cache..n of a tree (``parents``, or its `TreeShape`) on top of ``cache``,
    which ends with the tree's first ``in_cache`` rows. Over a `specbook.cache.SlotCache` (the model runs on
    `specbook.decoder.Decoder`) ``tree``: the tree's mask rows and depths on the device (`tree_shape`), which
    need no host to know the cache's length; else `tree_model_inputs`, for Hugging Face's forward."""
    shape = parents if isinstance(parents, TreeShape) else None
    if isinstance(cache, SlotCache):
        shape = shape or tree_shape(parents, device)
        return {"tree": (shape.visible[in_cache:], shape.depths)}
    parents = shape.parents if shape is not None else parents
    return tree_model_inputs(parents, cache.get_seq_length() - in_cache, in_cache, dtype, device, config)


def tree_forward(model, cache, input_ids: torch.Tensor, parents, in_cache: int = 0) -> torch.Tensor:
    """Feed rows in_cache..n of a tree (``input_ids`` (rows,)) to ``model`` on top of ``cache``.

    ``cache`` ends with the tree's first ``in_cache`` rows (0: the root is fed too). Returns the
    logits (rows, vocab): row r is what the model predicts after the path from the root to that row.
    """
    inputs = tree_inputs(parents, cache, in_cache, model.dtype, model.device, model.config)
    return model(input_ids[None], past_key_values=cache, use_cache=True, **inputs).logits[0]


class TreeSpec:
    """A static tree shape: Medusa's "choices" (Cai et al. 2024, Section 2.1.2).

    Each node is the path of child ranks leading to it from the root: (0,) is the root's first
    candidate, (1,) its second, (0, 1) the second candidate after the first, and so on. A drafter
    fills rank r with its r-th best token (or, sampling, its r-th draw). Nodes are sorted by depth,
    then path, so ``parents`` is in topological order and each depth is a contiguous block.
    """

    def __init__(self, paths):
        paths = [tuple(path) for path in paths]
        for path in paths:
            if not path or not all(isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0
                                    for rank in path):
                raise ValueError(f"tree spec: every path must be a non-empty tuple of child ranks >= 0 (got {path})")
        known = set(paths)
        if len(known) < len(paths):
            raise ValueError(f"tree spec: paths must be distinct (got {paths})")
        for path in paths:
            if len(path) > 1 and path[:-1] not in known:
                raise ValueError(f"tree spec: node {path} has no parent: {path[:-1]} is not in the spec")
        self.paths = sorted(paths, key=lambda path: (len(path), path))
        index = {path: node for node, path in enumerate(self.paths)}
        self.parents = [index[path[:-1]] if len(path) > 1 else -1 for path in self.paths]
        self.ranks = [path[-1] for path in self.paths]
        self.depths = [len(path) for path in self.paths]

    @classmethod
    def from_branching(cls, branching: Sequence[int]) -> "TreeSpec":
        """The full tree with ``branching[d]`` children under every node at depth d: (2, 2, 1) has 2 + 4 + 4 nodes."""
        if not branching or not all(isinstance(width, int) and width >= 1 for width in branching):
            raise ValueError(f"branching must be a non-empty sequence of integers >= 1 (got {branching!r})")
        level, paths = [()], []
        for width in branching:
            level = [path + (rank,) for path in level for rank in range(width)]
            paths += level
        return cls(paths)

    @property
    def depth(self) -> int:
        return max(self.depths)

    def truncated(self, depth: int) -> "TreeSpec":
        """The nodes at depth <= ``depth``."""
        return TreeSpec([path for path in self.paths if len(path) <= depth])

    def __len__(self) -> int:
        return len(self.paths)

    def __repr__(self):
        return f"TreeSpec({self.paths})"


class DynamicTree:
    """EAGLE-2's tree, shaped while it is drafted by the draft's own confidence (Li et al. 2024b, Section 4).

    Expansion: at each depth up to ``depth`` the drafter drafts the ``width`` most likely children
    of every node it expands, and expands next the ``width`` children of the level with the highest
    *path* probability under the draft (the product of p from the root down), the draft's estimate
    of how likely the target is to accept the whole path. Reranking: of every node drafted, the
    ``nodes`` with the highest path probability are kept and verified. A node's path probability is
    never above its parent's, so the kept nodes include their ancestors: they form a tree. A static
    tree spends its budget on the same ranks everywhere; this one spends it where the draft is sure.
    """

    def __init__(self, depth: int = 4, width: int = 4, nodes: int = 16):
        for name, value in (("depth", depth), ("width", width), ("nodes", nodes)):
            check_integer(name, value, 1)
        if nodes < depth:
            raise ValueError(f"nodes (the budget of nodes verified, {nodes}) must be at least the depth ({depth}): "
                             "a tree of fewer nodes can never reach its last levels")
        self.depth, self.width, self.nodes = depth, width, nodes

    def __repr__(self):
        return f"DynamicTree(depth={self.depth}, width={self.width}, nodes={self.nodes})"


def grow_dynamic_tree(root_log_probs: torch.Tensor, feed, tree: DynamicTree, depth: int):
    """Draft a `DynamicTree` of at most ``depth`` levels; return the kept nodes. All on the device: the
    tree is shaped there, by top-k and sorts, and nothing is read until the engine reads the step's outcome.

    ``root_log_probs`` (vocab,) is the draft's log p after the root (the pending token).
    ``feed(tokens, fed_parents)`` runs the draft on newly expanded nodes, ``tokens`` (m,), on top of
    those fed before; ``fed_parents`` (a long tensor) holds the parent of every node fed so far, these m
    last, in feeding order (-1 the root): a tree of its own, which `tree_inputs` turns into a mask. It
    returns their log p (m, vocab). Returns the kept nodes' ``tokens`` (n,) in topological order, their
    ``parents`` (n,) and, for each, its row among the fed nodes (n,) (-1 if it was never fed).

    Nodes are numbered level by level: the root's w children, then w children of each of the w nodes of a
    level expanded (w = ``tree.width``), in the order they were expanded, so every level but the first has
    w * w nodes and every shape is known before the tree is drafted.
    """
    device, width = root_log_probs.device, min(tree.width, root_log_probs.shape[-1])
    levels = min(depth, tree.depth)
    top = root_log_probs.float().topk(width)  # the first level: the root's w best children
    tokens, scores = [top.indices], [top.values]  # per level, every node drafted; scores: its path log p
    parents = [torch.full((width,), -1, device=device)]
    fed, fed_parents = [], root_log_probs.new_empty(0, dtype=torch.long)  # nodes expanded, and their parents' rows
    for level in range(1, levels):
        first = sum(len(level_tokens) for level_tokens in tokens[:-1])  # the level's first node
        frontier = scores[-1].topk(width).indices.sort().values  # (w,): the level's nodes to expand, in order
        # a node's parent was the (index // w)-th node expanded at the level above: its row among the fed
        above = -torch.ones_like(frontier) if level == 1 else len(fed_parents) - width + frontier // width
        fed.append(first + frontier)
        fed_parents = torch.cat([fed_parents, above])
        log_probs = feed(tokens[-1].gather(0, frontier), fed_parents).float()  # (w, vocab)
        top = log_probs.topk(width)  # (w, w)
        tokens.append(top.indices.flatten())
        scores.append((scores[-1].gather(0, frontier)[:, None] + top.values).flatten())
        parents.append(fed[-1].repeat_interleave(width))
    tokens, scores, parents = torch.cat(tokens), torch.cat(scores), torch.cat(parents)  # (total,)
    rows = torch.full_like(tokens, -1)
    if fed:
        fed = torch.cat(fed)
        rows[fed] = torch.arange(len(fed), device=device)
    # ties go to the earlier node (a stable sort), so a parent (never less likely than its child) comes first
    keep = scores.sort(descending=True, stable=True).indices[: tree.nodes].sort().values  # (n,)
    index = torch.full_like(tokens, -1)
    index[keep] = torch.arange(len(keep), device=device)
    kept_parents = parents[keep]
    return tokens[keep], torch.where(kept_parents >= 0, index[kept_parents.clamp(min=0)], -1), rows[keep]


def children_of(parents: list[int]) -> list[list[int]]:
    """children[i + 1] lists node i's children in order; children[0] the root's."""
    children = [[] for _ in range(len(parents) + 1)]
    for node, parent in enumerate(parents):
        children[parent + 1].append(node)
    return children


_ON_DEVICE = {}  # ("values", values, device) -> a long tensor; ("shape", parents, device) -> a TreeShape


def _memo(key, make):
    """``make()``, kept under ``key`` (the oldest entries go first beyond `SHAPES`)."""
    if key not in _ON_DEVICE:
        if len(_ON_DEVICE) >= SHAPES:
            del _ON_DEVICE[next(iter(_ON_DEVICE))]
        _ON_DEVICE[key] = make()
    return _ON_DEVICE[key]


def on_device(values, device) -> torch.Tensor:
    """``values`` (a sequence of ints) as a long tensor on ``device``, copied there once and kept."""
    values = tuple(values)
    return _memo(("values", values, str(device)), lambda: torch.tensor(values, dtype=torch.long, device=device))


class TreeShape(NamedTuple):
    """A tree's structure on the device (`tree_shape`): what its call's mask and its verification read."""

    parents: tuple[int, ...]
    visible: torch.Tensor  # (n + 1, n + 1) bool: `tree_attention_mask`, root first
    depths: torch.Tensor  # (n + 1,) long: each row's depth, the root's 0
    parent_rows: torch.Tensor  # (n,) long: each node's parent's row (0: the root)
    earlier: torch.Tensor  # (n, n) bool: [i, j] when node j is an earlier sibling of node i
    ranks: tuple | None  # per child rank r: (the nodes of rank r (m,), their parents' rows (m,)), distinct parents


def tree_shape(parents, device) -> TreeShape:
    """The `TreeShape` of ``parents`` on ``device``, made once per shape and device and kept. ``parents`` may also
    be a long tensor on the device (a tree the drafter shaped there: `grow_dynamic_tree`): its shape is then
    made there, every time, without reading it (and ``ranks`` is None)."""
    if isinstance(parents, torch.Tensor):
        return _shape_of(parents)
    parents = tuple(check_parents(parents))

    def make():  # the shape as a tensor's, with its ranks, which only a host that knows the tree can list
        ranks = []
        for siblings in children_of(list(parents)):
            for rank, node in enumerate(siblings):
                if rank == len(ranks):
                    ranks.append(([], []))
                ranks[rank][0].append(node)
                ranks[rank][1].append(parents[node] + 1)
        return _shape_of(torch.tensor(parents, dtype=torch.long, device=device))._replace(
            parents=parents, ranks=tuple((torch.tensor(nodes, dtype=torch.long, device=device),
                                          torch.tensor(rows, dtype=torch.long, device=device)) for nodes, rows in ranks))
    return _memo(("shape", parents, str(device)), make)


def _shape_of(parents: torch.Tensor) -> TreeShape:
    """The `TreeShape` of a tree whose ``parents`` (n,) are on the device, made there: each row sees itself and
    its parent, and squaring that relation log2(n) times reaches every ancestor."""
    n = len(parents)
    parent_rows = parents + 1  # (n,)
    sees = torch.eye(n + 1, device=parents.device)  # (n + 1, n + 1): itself, and below its parent
    sees[1:].scatter_(1, parent_rows[:, None], 1.0)
    for _ in range(max(n, 1).bit_length()):  # paths of 2, 4, 8, ... steps up
        sees = (sees @ sees).clamp(max=1.0)
    visible = sees > 0
    earlier = (parents[:, None] == parents[None, :]).tril(-1)  # (n, n): same parent, an earlier node
    return TreeShape(parents, visible, visible.sum(-1) - 1, parent_rows, earlier, None)

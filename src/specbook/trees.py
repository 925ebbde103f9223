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

Verification walks down from the root. At each node its children are tried in order, each against
the current target distribution q: child x, drafted from p, is accepted with probability
min(1, q(x) / p(x)); a rejection replaces q by the residual norm((q - p)+) before the next sibling
is tried (multi-step speculative sampling, SpecInfer Algorithm 2; multi-candidate speculative
decoding, Yang et al. 2024, Algorithm 1). An accepted child becomes the current node, with q its
own target row; when no child is accepted, the next token is drawn from the current, residual-
updated q. This is lossless -- the emitted tokens follow q exactly -- when the siblings were drafted

- independently, each from its own p given the path (i.i.d. samples from one p are the common case), or
- deterministically (top-k of a draft model or a head, n-grams): p is one-hot on x, so x is accepted
  with probability q(x) and the residual is q with x removed and renormalised -- sampling without
  replacement, the matching rule. Several deterministic siblings are never tried twice against the
  same mass, which is what makes distinct top-k candidates lossless.

What is *not* allowed: siblings drawn without replacement from p but verified with their p (the
i.i.d. rule would then over-accept). A drafter either samples with replacement and reports p, or
picks deterministically and reports none.

`verify_tree` walks the tree on the host, node by node, as the rule reads; the engine makes the same
decision on the device (`specbook.tree_decision`), from the tree's shape there (`tree_shape`, copied to
the device once per shape, as a copy from the host would make the device wait).
"""

from typing import NamedTuple, Sequence

import torch

from .cache import SlotCache
from .masks import attention_inputs
from .policies import check_integer
from .rejection import _accept_probs, check_distribution, residual_distribution
from .sampling import draw

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


def tree_positions(parents, offset: int = 0) -> torch.Tensor:
    """(n + 1,) long position ids, root first: ``offset`` plus each row's depth (the root's is 0)."""
    depths = [0]
    for parent in check_parents(parents):
        depths.append(depths[parent + 1] + 1)
    return torch.tensor(depths) + offset


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
    """What a model needs to feed rows in_cache..n of a tree on top of ``cache``, which ends with the tree's
    first ``in_cache`` rows. Over a `specbook.cache.SlotCache` (the model runs on `specbook.decoder.Decoder`)
    ``tree``: the tree's mask rows and depths on the device (`tree_shape`), which need no host to know the
    cache's length; else `tree_model_inputs`, for Hugging Face's forward."""
    if isinstance(cache, SlotCache):
        shape = tree_shape(parents, device)
        return {"tree": (shape.visible[in_cache:], shape.depths)}
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
    """Draft a `DynamicTree` of at most ``depth`` levels; return the kept nodes.

    ``root_log_probs`` (vocab,) is the draft's log p after the root (the pending token).
    ``feed(tokens, fed_parents)`` runs the draft on newly expanded nodes, ``tokens`` (m,), on top of
    those fed before; ``fed_parents`` lists the parent of every node fed so far, these m last, in
    feeding order (-1 the root): a tree of its own, which `tree_model_inputs` turns into a mask. It
    returns their log p (m, vocab). Returns the kept nodes' ``tokens`` (n,) in topological order,
    their ``parents`` and, for each, its row among the fed nodes (None if it was never fed).
    """
    tokens, parents, scores = [], [], []  # every node drafted; scores: its path log-probability
    fed, fed_parents = [], []  # drafted nodes fed to the draft, in order, and their parents' rows there
    frontier, frontier_log_probs, frontier_scores = [-1], root_log_probs[None].float(), [0.0]
    levels = min(depth, tree.depth)
    for level in range(1, levels + 1):
        top = frontier_log_probs.topk(min(tree.width, frontier_log_probs.shape[-1]))  # (f, w)
        level_scores = (torch.tensor(frontier_scores, device=top.values.device)[:, None] + top.values).flatten()
        first = len(tokens)
        tokens += top.indices.flatten().tolist()
        parents += [node for node in frontier for _ in range(top.indices.shape[1])]
        scores += level_scores.tolist()
        if level == levels:
            break
        frontier = sorted(first + i for i in level_scores.topk(min(tree.width, len(level_scores))).indices.tolist())
        rows = {node: row for row, node in enumerate(fed)}
        fed_parents += [rows.get(parents[node], -1) for node in frontier]
        fed += frontier
        frontier_log_probs = feed(torch.tensor([tokens[node] for node in frontier], device=top.indices.device),
                                  fed_parents).float()
        frontier_scores = [scores[node] for node in frontier]
    # ties go to the earlier node, so a parent (never less likely than its child) always comes first
    keep = sorted(sorted(range(len(tokens)), key=lambda node: (-scores[node], node))[: tree.nodes])
    index, rows = {node: i for i, node in enumerate(keep)}, {node: row for row, node in enumerate(fed)}
    kept_parents = [index[parents[node]] if parents[node] >= 0 else -1 for node in keep]
    return (torch.tensor([tokens[node] for node in keep], device=root_log_probs.device), kept_parents,
            [rows.get(node) for node in keep])


class TreeVerification(NamedTuple):
    """The outcome of verifying a tree: emit the tokens of the nodes in ``path``, then ``next_token``.

    ``path`` lists the accepted node indices from the root down; ``bonus`` is True when its last
    node is a leaf, so next_token came from that leaf's target row with nothing left to try.
    """

    path: list[int]
    next_token: int
    bonus: bool


def _children(parents: list[int]) -> list[list[int]]:
    """children[i + 1] lists node i's children in order; children[0] the root's."""
    children = [[] for _ in range(len(parents) + 1)]
    for node, parent in enumerate(parents):
        children[parent + 1].append(node)
    return children


def _check_tree(tokens, parents, target_rows: torch.Tensor, name: str = "target_probs") -> list[int]:
    """Validate tokens (n,) against parents (n,) and a (n + 1, vocab) target tensor; return parents as a list."""
    parents = check_parents(parents)
    if not isinstance(tokens, torch.Tensor) or tokens.ndim != 1 or tokens.is_floating_point() \
            or tokens.dtype == torch.bool:
        raise ValueError("tokens must be a 1-D integer tensor of token ids")
    if tokens.shape[0] != len(parents):
        raise ValueError(f"tokens and parents must have the same length (got {tokens.shape[0]} and {len(parents)})")
    if target_rows.ndim < 1 or target_rows.shape[0] != len(parents) + 1:
        raise ValueError(f"{name} must have n + 1 = {len(parents) + 1} rows, root first "
                         f"(got shape {tuple(target_rows.shape)})")
    return parents


def verify_tree_greedy(tokens: torch.Tensor, parents, target_tokens: torch.Tensor) -> TreeVerification:
    """Greedy tree verification: the longest path whose every token is the target's argmax at its parent.

    ``target_tokens`` (n + 1,) are the target's greedy tokens after the root and after each node.
    From the root, the first child equal to the target's token is accepted, and so on down; then
    the target's token after the last accepted node follows. The same answer `verify_tree` gives
    for one-hot target distributions, written out for reading.
    """
    parents = _check_tree(tokens, parents, target_tokens, "target_tokens")
    children, tokens, target_tokens = _children(parents), tokens.tolist(), target_tokens.tolist()
    path, row = [], 0  # row 0 is the root, row i + 1 node i
    while True:
        matches = [child for child in children[row] if tokens[child] == target_tokens[row]]
        if not matches:
            return TreeVerification(path, target_tokens[row], not children[row])
        path.append(matches[0])
        row = matches[0] + 1


def verify_tree(tokens: torch.Tensor, parents, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                generator: torch.Generator | None = None, *, validate: bool = True) -> TreeVerification:
    """Verify a token tree with one batch of target probabilities (SpecInfer's multi-step speculative sampling).

    tokens (n,) and parents (n,) are the tree (topological order, -1 for the root's children);
    draft_probs (n, vocab) the distribution each node was drafted from (one-hot rows for a
    deterministic drafter); target_probs (n + 1, vocab) the target's distributions after the
    root (row 0) and after each node (row i + 1). One rule serves both lossless cases of the
    module docstring: siblings drawn independently, each with its p (accept with min(1, q/p), else
    q <- norm((q - p)+)), and deterministic siblings with one-hot p, for which the same two lines
    are the matching rule (accept with q(x), else remove x from q). One uniform per node is drawn
    up front; node i uses the i-th.
    validate=False skips the input checks (for a decode loop whose inputs are known good).
    """
    parents = _check_tree(tokens, parents, target_probs) if validate else check_parents(parents)
    if validate:
        check_distribution(draft_probs, "draft_probs")
        check_distribution(target_probs, "target_probs")
        if draft_probs.ndim != 2 or draft_probs.shape != (len(parents), target_probs.shape[-1]):
            raise ValueError(f"draft_probs must have shape (n, vocab) = ({len(parents)}, {target_probs.shape[-1]}) "
                             f"(got {tuple(draft_probs.shape)})")
        if ((tokens < 0) | (tokens >= draft_probs.shape[1])).any():
            raise ValueError(f"tokens must be token ids in [0, {draft_probs.shape[1]}) (got {tokens.tolist()})")
        nodes = torch.arange(len(parents), device=draft_probs.device)
        if (draft_probs[nodes, tokens.to(draft_probs.device)] <= 0).any():
            raise ValueError("draft_probs must give each of tokens a positive probability")
    children, token_list = _children(parents), tokens.tolist()
    # float32 uniforms even for half-precision probs: u < a must hold with probability a.
    uniforms = torch.rand(len(token_list), generator=generator, device=target_probs.device).tolist()  # (n,)
    path, row, target = [], 0, target_probs[0]  # the current node's row and its (residual-updated) q
    while True:
        for child in children[row]:
            token = token_list[child]
            if uniforms[child] < _accept_probs(target[token], draft_probs[child, token]):
                path.append(child)
                row, target = child + 1, target_probs[child + 1]
                break
            target = residual_distribution(target, draft_probs[child], validate=False)  # (vocab,)
        else:  # no child accepted (or a leaf): the next token comes from the current q
            next_token = int(draw(target, generator))
            return TreeVerification(path, next_token, not children[row])


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
    ranks: tuple  # per child rank r: (the nodes of rank r (m,), their parents' rows (m,)), distinct parents


def tree_shape(parents, device) -> TreeShape:
    """The `TreeShape` of ``parents`` on ``device``, made once per shape and device and kept."""
    parents = tuple(check_parents(parents))

    def make():
        children = _children(list(parents))
        earlier = torch.zeros(len(parents), len(parents), dtype=torch.bool)
        ranks = []
        for siblings in children:
            for rank, node in enumerate(siblings):
                earlier[node, siblings[:rank]] = True
                if rank == len(ranks):
                    ranks.append(([], []))
                ranks[rank][0].append(node)
                ranks[rank][1].append(parents[node] + 1)
        return TreeShape(parents, tree_attention_mask(parents).to(device), tree_positions(parents).to(device),
                         torch.tensor([parent + 1 for parent in parents], dtype=torch.long, device=device), earlier.to(device),
                         tuple((torch.tensor(nodes, dtype=torch.long, device=device), torch.tensor(rows, device=device))
                               for nodes, rows in ranks))
    return _memo(("shape", parents, str(device)), make)

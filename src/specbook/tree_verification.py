"""Verifying a token tree (`specbook.trees`): the longest path the target accepts, then one more token.

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

`verify_tree` walks the tree on the host, node by node, as the rule reads: on a GPU every step of the
walk would wait for the device. The engine makes the same decision for every node at once, on the
device, as it does a chain's (`specbook.rejection.chain_outcome`): `tree_outcome` tests every node
against its parent's q after its earlier siblings' residual updates (one child rank at a time, for all
parents together); a node is *chosen* when its test passes and no earlier sibling's did, and it is on
the path when it and all its ancestors are chosen (one row of the tree's mask each,
`specbook.trees.tree_shape`). From the same generator both give the same path and token; the engine
reads the outcome once, with the drafts, and keeps the path's rows in the order it left on the device.
"""

from typing import NamedTuple

import torch

from .rejection import _accept_probs, check_distribution, residual_distribution
from .sampling import draw
from .trees import TreeShape, check_parents, children_of, on_device


class TreeVerification(NamedTuple):
    """The outcome of verifying a tree: emit the tokens of the nodes in ``path``, then ``next_token``.

    ``path`` lists the accepted node indices from the root down; ``bonus`` is True when its last
    node is a leaf, so next_token came from that leaf's target row with nothing left to try.
    """

    path: list[int]
    next_token: int
    bonus: bool


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
    children, tokens, target_tokens = children_of(parents), tokens.tolist(), target_tokens.tolist()
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
    children, token_list = children_of(parents), tokens.tolist()
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


def _walk(shape: TreeShape, accepted: torch.Tensor, next_tokens) -> torch.Tensor:
    """The outcome (n + 2,) of a tree whose node i passed its test where ``accepted`` (n,) is True:
    [number accepted, next token, the path's nodes in order then the other nodes]. ``next_tokens(row)``
    gives the next token after the path's last row (a (1,) tensor of that row's index)."""
    n = len(shape.parent_rows)
    chosen = accepted & ~(shape.earlier & accepted).any(-1)  # (n,): accepted, and no earlier sibling was
    on_path = ~(shape.visible[1:, 1:] & ~chosen).any(-1)  # (n,): it and all its ancestors chosen
    rows = torch.arange(1, n + 1, device=on_path.device)  # (n,)
    last = torch.cat([rows.new_zeros(1), on_path * rows]).amax().view(1)  # (1,): the path's last row, 0 the root
    order = torch.argsort((~on_path).to(torch.uint8), stable=True)  # (n,): the path first, by depth
    return torch.cat([on_path.sum().view(1), next_tokens(last).view(1), order])


def tree_outcome_greedy(shape: TreeShape, tokens: torch.Tensor, target_tokens: torch.Tensor) -> torch.Tensor:
    """`verify_tree_greedy`'s decision left on the device: (n + 2,) long, [number accepted, next token, the
    path's nodes then the others]. ``target_tokens`` (n + 1,) are the target's greedy tokens, root first."""
    accepted = tokens.to(target_tokens.device) == target_tokens[shape.parent_rows]  # (n,)
    return _walk(shape, accepted, lambda last: target_tokens.gather(0, last))


def tree_outcome(shape: TreeShape, tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """`verify_tree`'s decision left on the device, from the same random draws: (n + 2,) long, [number accepted,
    next token, the path's nodes then the others]. tokens (n,), draft_probs (n, vocab), target_probs
    (n + 1, vocab) as for `verify_tree`.

    Every node is tested against its parent's q after its earlier siblings' residual updates (one child rank
    at a time, all parents together); the next token is drawn from the last accepted row's q after all its
    children's updates -- the q `verify_tree` holds when its walk stops there. A tree shaped on the device
    (``shape.ranks`` None) must be deterministic, its siblings with one-hot p (`_one_hot_outcome`)."""
    uniforms = torch.rand(len(shape.parent_rows), generator=generator, device=target_probs.device)  # (n,)
    tokens = tokens.to(target_probs.device)
    if shape.ranks is None:
        return _one_hot_outcome(shape, tokens, target_probs, uniforms, generator)
    target = target_probs.clone()  # (n + 1, vocab): each row's q
    accept_probs = torch.empty_like(uniforms)  # (n,)
    for nodes, rows in shape.ranks:
        drafted, parent_q = tokens[nodes], target[rows]  # (m,), (m, vocab)
        accept_probs[nodes] = _accept_probs(parent_q.gather(1, drafted[:, None])[:, 0],
                                            draft_probs[nodes, drafted]).to(accept_probs.dtype)
        target[rows] = residual_distribution(parent_q, draft_probs[nodes], validate=False)
    return _walk(shape, uniforms < accept_probs, lambda last: draw(target[last], generator))


def _one_hot_outcome(shape, tokens, target_probs, uniforms, generator) -> torch.Tensor:
    """`tree_outcome` for deterministic siblings (one-hot p) without a loop over ranks: removing the earlier
    siblings' tokens x_j from q leaves q(x) / (1 - sum_j q(x_j)) for the next one (a token an earlier sibling
    holds has nothing left: 0), and the next token is drawn from the last row's q without any of its
    children's tokens."""
    q_drafted = target_probs[shape.parent_rows, tokens]  # (n,): q(x) under each node's parent's q
    repeated = (shape.earlier & (tokens[:, None] == tokens[None, :])).any(-1)  # (n,): an earlier sibling's token
    removed = (shape.earlier & ~repeated).to(q_drafted.dtype) @ q_drafted  # (n,): the earlier siblings' mass
    accept_probs = torch.where(q_drafted > 0, q_drafted / (1 - removed).clamp(min=torch.finfo(q_drafted.dtype).tiny),
                               0.0).clamp(max=1.0).masked_fill(repeated, 0.0)
    left = target_probs.index_put((shape.parent_rows, tokens), target_probs.new_zeros(()))  # (n + 1, vocab)
    mass = left.sum(-1, keepdim=True)
    left = torch.where(mass > 0, left / mass.clamp(min=torch.finfo(mass.dtype).tiny), target_probs)
    return _walk(shape, uniforms < accept_probs.float(), lambda last: draw(left[last], generator))


class Path(list):
    """A verified tree's accepted nodes from the root down, with ``order`` (n,) on the device: the same nodes
    first, then the others (`tree_outcome`), for a drafter to keep their rows in its cache without a copy from
    the host (`specbook.cache.keep_tail`)."""

    def __init__(self, nodes, order: torch.Tensor | None = None):
        super().__init__(nodes)
        self.order = order


def path_order(path, device) -> torch.Tensor:
    """The nodes of ``path`` first, as a long tensor on ``device``: a `Path`'s ``order`` as verification left it
    there (the other nodes after them), or a plain list of nodes, copied there once (`specbook.trees.on_device`)."""
    order = getattr(path, "order", None)
    return on_device(path, device) if order is None else order

"""A token tree's verification decided on the device, as a chain's is (`specbook.rejection.chain_outcome`).

`specbook.trees.verify_tree` walks the tree on the host, node by node, as the rule reads: on a GPU every
step of the walk would wait for the device. Here the same decision is made for every node at once: a
node is *chosen* when its test passes and no earlier sibling's did, and it is on the path when it and all
its ancestors are chosen (one row of the tree's ancestor matrix each, `specbook.trees.tree_shape`). The
residual updates of sampled verification go one child rank at a time, for every parent together: a
node is tested against its parent's q after its earlier siblings' updates, which is the q the walk would
hold when it reaches that node. With the same generator both give the same path and token; the engine
reads the outcome once, with the drafts, and keeps the path's rows in the order it left on the device.
"""

import torch

from .rejection import _accept_probs, residual_distribution
from .sampling import draw
from .trees import TreeShape


def _walk(shape: TreeShape, accepted: torch.Tensor, next_tokens) -> torch.Tensor:
    """The outcome (n + 2,) of a tree whose node i passed its test where ``accepted`` (n,) is True:
    [number accepted, next token, the path's nodes in order then the other nodes]. ``next_tokens(row)``
    gives the next token after the path's last row (a (1,) tensor of that row's index)."""
    n = len(shape.parents)
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
    children's updates -- the q `verify_tree` holds when its walk stops there."""
    uniforms = torch.rand(len(shape.parents), generator=generator, device=target_probs.device)  # (n,)
    target, tokens = target_probs.clone(), tokens.to(target_probs.device)  # (n + 1, vocab): each row's q
    accept_probs = torch.empty_like(uniforms)  # (n,)
    for nodes, rows in shape.ranks:
        drafted, parent_q = tokens[nodes], target[rows]  # (m,), (m, vocab)
        accept_probs[nodes] = _accept_probs(parent_q.gather(1, drafted[:, None])[:, 0],
                                            draft_probs[nodes, drafted]).to(accept_probs.dtype)
        target[rows] = residual_distribution(parent_q, draft_probs[nodes], validate=False)
    return _walk(shape, uniforms < accept_probs, lambda last: draw(target[last], generator))


class Path(list):
    """A verified tree's accepted nodes from the root down, with ``order`` (n,) on the device: the same nodes
    first, then the others (`tree_outcome`), for a drafter to keep their rows in its cache without a copy from
    the host (`specbook.cache.keep_tail`)."""

    def __init__(self, nodes, order: torch.Tensor | None = None):
        super().__init__(nodes)
        self.order = order

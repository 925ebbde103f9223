"""Token trees from a draft model: its top candidates, or several samples, at every node.

The draft model expands a `specbook.trees.TreeSpec` one depth at a time: the pending context is
fed as a plain sequence, which gives the root's distribution; the root's children are picked from
it; then all nodes of depth 1 are fed at once with the tree attention mask, which gives their
distributions; and so on. The deepest nodes are picked but never fed, like a chain drafter's last
token. After verification the draft cache keeps only the accepted path (`specbook.cache.keep_tail`,
with the path's order verification left on the device), and what it has not seen yet is queued for the
next step.

Two ways to pick a node's children, one for each lossless case of tree verification:

- `TopKTreeDrafter`: child rank r is the draft's r-th most likely token (by logit). Deterministic,
  so it reports no p (one-hot), and verification samples the candidates without replacement --
  the SpecInfer / Medusa top-k tree.
- `SampledTreeDrafter`: every child is an independent draw from the draft's warped distribution p
  (duplicates allowed) and reports p -- the i.i.d. multi-candidate setting of SpecInfer and of
  Yang et al. 2024 (MCSD).

How deep a tree grows is decided while it is drafted, as for a chain (Lu et al. 2024 make the
same two moves for multi-candidate drafting: a draft length that changes during generation, and
early stopping):

- ``propose(k)`` drafts the depths <= k, so a draft-length policy (`specbook.policies.HeuristicK`)
  sets the depth step by step. Because the spec's nodes are sorted by depth, the tree of depth k is
  a prefix of the nodes and its attention mask the top-left corner of the full tree's: Lu et al.'s
  "sliced" mask, with nothing to precompute.
- ``keep_drafting`` (the policy's early stop, e.g. `specbook.policies.ConfidenceStop`,
  `EntropyGuidedK`) is asked once per depth, after that depth's candidates are picked, with the
  draft's own next-token distribution (its softmax, before the sampler's warp) at the parent of the
  level's *best* candidate -- the one whose path the draft finds most likely. When it says stop, the
  level just picked is kept and nothing deeper is drafted or fed. A one-wide tree thus stops exactly
  where a chain drafter would.

Both are lossless: they choose the tree's shape from the draft's own information, before the
children they add or leave out are drawn, and verification does not care what shape it is given.
"""

import torch

from ..cache import keep_tail
from ..tree_verification import path_order
from ..trees import DynamicTree, TreeSpec, grow_dynamic_tree, on_device, tree_forward
from .base import Draft
from .model import ModelDrafter


class TopKTreeDrafter(ModelDrafter):
    """Draft a tree of shape ``tree`` with a draft model: a `TreeSpec`, a branching tuple such as (2, 2, 1),
    or a `specbook.trees.DynamicTree` (EAGLE-2's tree, shaped by the draft's confidence as it grows).

    ``propose(k, ...)`` drafts the nodes of depth <= k, so a step still emits at most k + 1 tokens,
    and a static tree stops at a shallower depth where ``keep_drafting`` says so (see the module
    docstring); a dynamic tree spends its node budget by its own rule and is not asked.
    """

    drafts_trees = True

    def __init__(self, model: torch.nn.Module, tree=(2, 2, 1)):
        super().__init__(model)
        self.tree = tree if isinstance(tree, (TreeSpec, DynamicTree)) else TreeSpec.from_branching(tree)

    def start(self, input_ids):
        super().start(input_ids)
        self.fed = 0  # tree nodes the draft cache holds after the context
        self.rows = None  # a dynamic tree's nodes' rows among those fed (n,) on the device, -1 if never fed; None
        # for a static tree, whose first ``fed`` nodes were fed in order

    def _children(self, logits, ranks, sampler, generator):
        """Tokens (m,) for m children from their parents' logits (m, vocab), and their p (None: one-hot)."""
        order = logits.topk(max(ranks) + 1).indices  # (m, max rank + 1)
        return order.gather(1, on_device(ranks, order.device)[:, None])[:, 0], None

    def propose(self, k, sampler, generator, keep_drafting=None):
        logits = self.call(self.pending[None], past_key_values=self.cache,
                            use_cache=True, logits_to_keep=1).logits[0, :, : self.vocab_size]  # (1, vocab): the root
        if isinstance(self.tree, DynamicTree):
            return self._dynamic(logits[0], k)
        tree = self.tree.truncated(k)
        path_logp = logits.new_zeros(1)  # (1 + nodes so far,): each row's path log-probability under the draft
        tokens, probs, self.calls, drafted = [], [], self.calls + 1, 0
        for depth in range(1, tree.depth + 1):
            level = [node for node, node_depth in enumerate(tree.depths) if node_depth == depth]  # contiguous
            rows = on_device([tree.parents[node] + 1 for node in level], logits.device)  # their parents' rows
            level_tokens, level_probs = self._children(logits.index_select(0, rows),
                                                       [tree.ranks[node] for node in level], sampler, generator)
            tokens.append(level_tokens)
            probs.append(level_probs)
            drafted = level[-1] + 1
            if keep_drafting is not None:  # ask once per depth, about the level's most likely candidate
                own = logits.index_select(0, rows).float().log_softmax(-1)  # (len(level), vocab): unwarped log p
                level_logp = path_logp[rows] + own.gather(1, level_tokens[:, None])[:, 0]  # (len(level),)
                path_logp = torch.cat([path_logp, level_logp])
                if not keep_drafting(own[int(level_logp.argmax())].exp()):
                    break
            if depth < tree.depth:  # feed this level: its distributions pick the next level
                new = tree_forward(self.call, self.cache, level_tokens, tree.parents[:drafted],
                                   in_cache=level[0] + 1)[:, : self.vocab_size]  # (len(level), vocab)
                logits = torch.cat([logits, new])  # (1 + nodes so far, vocab), row i + 1 is node i
                self.calls += 1
                self.fed = drafted
        self.pending = self.pending[:0]
        self.proposed, self.rows = torch.cat(tokens), None
        return Draft(torch.cat(tokens), torch.cat(probs) if probs[0] is not None else None, tree.parents[:drafted])

    def _dynamic(self, root_logits, k):
        """Grow a `DynamicTree` from the root's logits (vocab,): each expanded level fed with the tree mask."""
        def feed(tokens, fed_parents):  # (m,) new nodes on top of those fed before (parents (fed,)) -> log p (m, vocab)
            self.calls, self.fed = self.calls + 1, len(fed_parents)
            in_cache = len(fed_parents) - len(tokens) + 1  # the root and the nodes fed before
            logits = tree_forward(self.call, self.cache, tokens, fed_parents, in_cache)
            return logits[:, : self.vocab_size].float().log_softmax(-1)

        tokens, parents, self.rows = grow_dynamic_tree(root_logits.float().log_softmax(-1), feed, self.tree, k)
        self.pending, self.proposed = self.pending[:0], tokens
        return Draft(tokens, None, parents)  # deterministic picks: no p

    def update(self, num_accepted, next_token, path=None):
        self._check_readable(next_token)
        path = path or []  # no path: nothing was proposed this step
        order = path_order(path, self.proposed.device)  # (n,): the path's nodes first
        if self.rows is None:  # a static tree: its fed nodes are its first, each at its own row
            fed, rows = sum(node < self.fed for node in path), order
        else:  # a dynamic tree: the path's nodes but its last had children, so were fed; the last is fed again
            fed, rows = max(len(path) - 1, 0), self.rows.index_select(0, order)
        keep_tail(self.cache, rows, self.fed, fed)  # the path's first ``fed`` nodes stay, in order
        next_token = torch.full((1,), next_token, dtype=self.proposed.dtype, device=self.proposed.device)
        self.pending = torch.cat([self.pending, self.proposed.index_select(0, order[fed:len(path)]), next_token])
        self.proposed, self.fed, self.rows = self.proposed[:0], 0, None


class SampledTreeDrafter(TopKTreeDrafter):
    """Like `TopKTreeDrafter`, but every child is an independent sample from the draft's p (reported with it)."""

    def __init__(self, model: torch.nn.Module, tree=(2, 2, 1)):
        if isinstance(tree, DynamicTree):
            raise ValueError("a DynamicTree picks the draft's most likely tokens: use TopKTreeDrafter for it "
                             "(samples reported with their p cannot be reranked without breaking the accept rule)")
        super().__init__(model, tree)

    def _children(self, logits, ranks, sampler, generator):
        probs = sampler.probs(logits)  # (m, vocab)
        return sampler.sample(probs, generator), probs

"""EAGLE: draft autoregressively at the feature level (Li et al. 2024).

`specbook.heads.EagleHead` reads pairs (f_t, x_{t+1}) -- the target's feature at position t and
the token that followed it -- and predicts the next feature f̂_{t+1}; the target's LM head turns
that into the draft distribution p over x_{t+2}. The head keeps its own KV cache of pairs.

The bookkeeping: after the prompt's prefill the engine hands over the features f_0 ... f_{T-2}
(``observe_features``), which pair with the prompt's tokens x_1 ... x_{T-1} -- x_{T-1} is the
pending token. Feeding those pairs yields f̂_{T-1}, hence p over x_T: the first draft, d_1.
Drafting goes on with predicted features: the pair (f̂_{T-1}, d_1) gives f̂_T and d_2, and so on.
After verification the pairs built on predicted features are rolled back, and the committed
positions come back with the target's *true* features: the pending token's and the accepted
drafts', paired with the accepted drafts and the target's next token -- as EAGLE does.

Two ways to draft, one for each lossless rule:

- a chain (``tree=None``): each token sampled from p with the engine's sampler and reported with
  its p, so verification is ordinary speculative sampling;
- a tree (a `specbook.trees.TreeSpec`): expanded one depth at a time like
  `specbook.drafters.tree.TopKTreeDrafter` -- all nodes of a depth fed at once with the tree
  attention mask, each paired with its parent's predicted feature -- child rank r the r-th most
  likely token; deterministic, so it reports no p (EAGLE's tree, Section 4.1);
- or a `specbook.trees.DynamicTree` (EAGLE-2, Li et al. 2024b): the same feeding, but only the
  most likely nodes of each depth are expanded and the most likely nodes overall are verified.
"""

import torch

from ..cache import rollback
from ..heads import EagleHead, check_hidden_size
from ..tree_verification import path_order
from ..trees import DynamicTree, TreeSpec, grow_dynamic_tree, on_device, tree_inputs
from .base import Draft, Drafter


class EagleDrafter(Drafter):
    """Draft with an EAGLE head on ``target``: a sampled chain (``tree=None``, the default) or a top-k tree.

    ``tree`` is a `TreeSpec` or a branching tuple such as (3, 2, 1); ``propose(k, ...)`` drafts the
    depths <= k. A chain honours ``keep_drafting`` after every token; a tree ignores it. ``calls``
    counts the head's forward passes. Until the target has computed a feature (a one-token prompt)
    it drafts nothing.
    """

    uses_features = True

    @property
    def drafts_trees(self) -> bool:
        return self.tree is not None

    def __init__(self, target: torch.nn.Module, head: EagleHead, tree=None):
        check_hidden_size(head, target)
        self.target, self.head = target, head
        self.tree = tree if tree is None or isinstance(tree, (TreeSpec, DynamicTree)) else TreeSpec.from_branching(tree)
        self.embed, self.lm_head = target.get_input_embeddings(), target.get_output_embeddings()
        self.calls = 0

    @classmethod
    def from_pretrained(cls, name_or_path, target: torch.nn.Module, tree=None) -> "EagleDrafter":
        """An EAGLE head for ``target``: ``"shakespeare"`` (trained on the built-in target) or a saved directory.

        The target is not loaded here: pass the very model you verify with, e.g.
        ``load_pair("shakespeare").target``.
        """
        return cls(target, EagleHead.from_pretrained(name_or_path, target), tree)

    def start(self, input_ids):
        self.cache = self.head.new_cache()
        self.tokens = input_ids[0, 1:]  # (m,): committed tokens x_{t+1} whose pair (f_t, x_{t+1}) is not fed yet
        self.features = []  # their features f_t: the (n, hidden) blocks the engine handed over
        self.proposed = input_ids[0, :0]  # (n,): this step's drafts
        self.fed = 0  # pairs of this step's drafts in the cache, all built on predicted features
        self.calls = 0

    def observe_features(self, features):
        self.features.append(features)

    def logits(self, predicted):
        """The draft's logits (..., vocab) from predicted features (..., hidden): the target's LM head on them."""
        return self.lm_head(predicted)

    def _feed(self, features, tokens, **inputs):
        """Feed pairs (features (n, hidden), tokens (n,)) on top of the cache; their predicted features (n, hidden)."""
        self.calls += 1
        return self.head(features[None], self.embed(tokens)[None], self.cache, **inputs)[0]

    def propose(self, k, sampler, generator, keep_drafting=None):
        if not self.features:
            return Draft(self.tokens.new_empty(0))
        predicted = self._feed(torch.cat(self.features), self.tokens)[-1:]  # (1, hidden): f̂ at the pending token
        self.tokens, self.features = self.tokens[:0], []
        if self.tree is None:
            draft = self._chain(k, predicted, sampler, generator, keep_drafting)
        elif isinstance(self.tree, DynamicTree):
            draft = self._dynamic(k, predicted)
        else:
            draft = self._tree(self.tree.truncated(k), predicted)
        self.proposed = draft.tokens
        return draft

    def _chain(self, k, predicted, sampler, generator, keep_drafting):
        tokens, probs = [], []
        for _ in range(k):
            if tokens:  # the pair (f̂, last draft) predicts the next feature; the last draft is never fed
                predicted = self._feed(predicted, tokens[-1][None])  # (1, hidden)
                self.fed += 1
            logits = self.logits(predicted[0])  # (vocab,)
            token, step_probs = sampler.pick(logits, generator)  # (); the warped p, or None (greedy)
            tokens.append(token)
            probs.append(step_probs)
            if keep_drafting is not None and not keep_drafting(logits.float().softmax(-1)):  # its own confidence
                break
        return Draft(torch.stack(tokens), None if sampler.greedy else torch.stack(probs))  # (n,), (n, vocab) or None

    def _tree(self, tree, predicted):
        tokens = []  # per depth
        for depth in range(1, tree.depth + 1):
            level = [node for node, node_depth in enumerate(tree.depths) if node_depth == depth]  # contiguous
            # rows of predicted (0 the root, i + 1 node i), and ranks, on the device once per shape
            parent_rows = on_device([tree.parents[node] + 1 for node in level], predicted.device)
            ranks = [tree.ranks[node] for node in level]
            ranked = self.logits(predicted.index_select(0, parent_rows)).topk(max(ranks) + 1).indices  # (m, rank + 1)
            tokens.append(ranked.gather(1, on_device(ranks, predicted.device)[:, None])[:, 0])
            if depth < tree.depth:  # feed this level, each node paired with its parent's predicted feature
                inputs = tree_inputs(tree.parents[: level[-1] + 1], self.cache, level[0] + 1, predicted.dtype,
                                     predicted.device)
                predicted = torch.cat([predicted, self._feed(predicted.index_select(0, parent_rows), tokens[-1],
                                                             **inputs)])
                self.fed += len(level)
        return Draft(torch.cat(tokens), parents=tree.parents)

    def _dynamic(self, k, predicted):
        """EAGLE-2: grow a `DynamicTree`, each expanded level's pairs fed with the tree mask."""
        def feed(tokens, fed_parents):  # (m,) new nodes -> their log p (m, vocab)
            nonlocal predicted  # (1 + nodes fed, hidden): row 0 the root, row i + 1 the i-th node fed
            inputs = tree_inputs(fed_parents, self.cache, len(fed_parents) - len(tokens) + 1, predicted.dtype,
                                 predicted.device)
            features = self._feed(predicted.index_select(0, fed_parents[-len(tokens):] + 1), tokens, **inputs)  # (m, .)
            predicted, self.fed = torch.cat([predicted, features]), len(fed_parents)
            return self.logits(features).float().log_softmax(-1)

        tokens, parents, _ = grow_dynamic_tree(self.logits(predicted[0]).float().log_softmax(-1), feed, self.tree, k)
        return Draft(tokens, parents=parents)

    def update(self, num_accepted, next_token, path=None):
        rollback(self.cache, self.fed)  # every drafted pair: the committed ones come back with true features
        accepted = self.proposed[:num_accepted]  # (accepted,), on the device: a chain's, or a tree's path's
        if path is not None:  # the path's nodes as verification left them on the device
            accepted = self.proposed.index_select(0, path_order(path, self.proposed.device)[: len(path)])
        next_token = torch.full((1,), next_token, dtype=self.tokens.dtype, device=self.tokens.device)  # no copy
        self.tokens = torch.cat([self.tokens, accepted, next_token])
        self.proposed, self.fed = self.proposed[:0], 0

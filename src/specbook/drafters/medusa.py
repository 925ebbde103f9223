"""Medusa: draft K tokens at once from the target's last feature (Cai et al. 2024).

No draft model: `specbook.heads.MedusaHeads` sit on the target's feature f_t at the last position
whose feature the target has computed -- the one before the pending token x_{t+1}, which the
target itself drew from lm_head(f_t). Head i guesses x_{t+i+2}, so the K heads give a draft of
K tokens after the pending one from one feature and no extra target call. The engine hands the
features over after every verification (``observe_features``), so drafting costs the heads alone.

The heads guess every depth independently, so one candidate per depth rarely survives long;
Medusa's answer is a tree (Section 2.1.2): at depth d, the top few tokens of head d - 1, under
every kept node of depth d - 1 -- the Cartesian product of the heads' top choices, pruned to a
`specbook.trees.TreeSpec`. Node (r_1, ..., r_d) is the r_d-th most likely token of head d - 1.
Both the chain and the tree are deterministic (the heads' top choices), so the draft reports no p:
verification accepts a candidate x with probability q(x) and samples siblings without replacement,
which keeps speculative sampling lossless (`specbook.trees`).
"""

import torch

from ..heads import MedusaHeads, check_hidden_size
from ..trees import TreeSpec
from .base import Draft, Drafter

# A sparse tree of depth 4 (16 nodes), denser where the heads are surest: the first head's top 4,
# the second's top 3 under its best parents, and so on -- the shape of Medusa's own sparse trees.
DEFAULT_TREE = TreeSpec([(0,), (1,), (2,), (3,),
                         (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0),
                         (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0),
                         (0, 0, 0, 0), (0, 0, 0, 1)])


class MedusaDrafter(Drafter):
    """Draft with Medusa heads on ``target``: a chain (``tree=None``) or a token tree (the default).

    ``tree`` is a `TreeSpec`, a branching tuple such as (3, 2, 1), or None for a chain of each
    head's top token; its depth can be at most the number of heads (the default, `DEFAULT_TREE`,
    is cut to the heads there are). ``propose(k, ...)`` drafts the depths <= k. A chain stops early
    where ``keep_drafting`` says so (it sees each head's softmax); a tree ignores it. Until the
    target has computed a feature (a one-token prompt) it drafts nothing.
    """

    uses_features = True

    @property
    def drafts_trees(self) -> bool:
        return self.tree is not None

    def __init__(self, target: torch.nn.Module, heads: MedusaHeads, tree=DEFAULT_TREE):
        check_hidden_size(heads, target)
        if tree is DEFAULT_TREE:
            tree = tree.truncated(heads.num_heads)
        if tree is not None and not isinstance(tree, TreeSpec):
            tree = TreeSpec.from_branching(tree)
        if tree is not None and tree.depth > heads.num_heads:
            raise ValueError(f"tree has depth {tree.depth} but there are {heads.num_heads} heads: give a tree of depth "
                             f"in [1, {heads.num_heads}] (e.g. tree.truncated({heads.num_heads})) or tree=None")
        self.target, self.heads, self.tree = target, heads, tree
        self.lm_head = target.get_output_embeddings()
        self.calls = 0

    @classmethod
    def from_pretrained(cls, name_or_path, target: torch.nn.Module, num_heads: int | None = None,
                        tree=DEFAULT_TREE) -> "MedusaDrafter":
        """Medusa heads for ``target``: ``"shakespeare"`` (trained on the built-in target) or a saved directory.

        ``num_heads`` keeps the first few trained heads (all by default). The target is not loaded
        here: pass the very model you verify with, e.g. ``load_pair("shakespeare").target``.
        """
        return cls(target, MedusaHeads.from_pretrained(name_or_path, target, num_heads), tree)

    def start(self, input_ids):
        self.feature = None  # the target's feature at the last position before the pending token
        self.calls = 0

    def observe_features(self, features):
        self.feature = features[-1]

    def propose(self, k, sampler, generator, keep_drafting=None):
        if self.feature is None:
            return Draft(torch.empty(0, dtype=torch.long, device=self.target.device))
        logits = self.heads(self.feature, self.lm_head)  # (heads, vocab): row i guesses the token i + 1 after pending
        self.calls += 1
        if self.tree is None:
            count = min(k, self.heads.num_heads)
            if keep_drafting is not None:  # stop after the first head unsure of its token
                count = next((i + 1 for i in range(count) if not keep_drafting(logits[i].float().softmax(-1))), count)
            return Draft(logits[:count].argmax(-1))
        tree = self.tree.truncated(k)
        ranked = logits[: tree.depth].topk(max(tree.ranks) + 1).indices  # (depth, max rank + 1)
        depths, ranks = (torch.tensor(values, device=ranked.device) for values in (tree.depths, tree.ranks))
        return Draft(ranked[depths - 1, ranks], parents=tree.parents)

    def update(self, num_accepted, next_token, path=None):
        """Nothing to roll back: the next feature arrives with ``observe_features``."""

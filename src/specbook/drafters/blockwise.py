"""Blockwise parallel decoding (Stern, Shazeer and Uszkoreit 2018): a block of k tokens guessed from one feature.

The model has k heads p_1 .. p_k on the feature of the last accepted position: p_1 is its own
next-token head, and head i guesses the token i positions ahead (Section 3). One step has three
substeps:

- **predict** the block: every head's argmax, ŷ_{j+1} .. ŷ_{j+k};
- **verify**: one call of the model on the block scores all k positions in parallel; k̂ is the
  largest number such that every ŷ_{j+i}, i <= k̂, is p_1's argmax given the prefix before it;
- **accept** those k̂ >= 1 tokens (ŷ_{j+1} is p_1's own argmax, so at least one always is).

Section 4's combined step merges the next predict into this verify: the verifying call computes
the feature at every position of the block, so the heads read the newest accepted position's
feature from it and need no call of their own -- m tokens then take about m / k̂ + 1 calls
instead of 2m / k̂. That is how this book's engine runs every drafter that ``uses_features``
(`specbook.drafters.medusa`): the target's feature arrives with ``observe_features`` after each
verification. ``combined=False`` undoes the merge for comparison: each predict runs the target
once more, on the committed text (without a KV cache: count its calls, do not time them).

In the engine's terms p_1's guess is the pending token (the target's own argmax), the other k - 1
heads are Medusa heads (`specbook.heads.MedusaHeads`: a residual feed-forward block under the
shared LM head, the shape Stern et al. describe and Medusa kept), the block after the pending
token is a chain of k - 1 drafts, and the greedy check is chapter 2's rule at temperature 0. The
heads here are the built-in Medusa heads, trained on the frozen target (Section 5.1's "frozen
base", whose p_1 is the untouched target). What Medusa adds (Cai et al. 2024): a tree of each
head's top few tokens instead of one guess per depth, and sampling. Blockwise parallel decoding is
greedy, so this drafter refuses a sampler with a temperature; `MedusaDrafter(target, heads,
tree=None)` is the same chain under sampling. The paper's relaxed checks (top-k, distance,
minimum block size; Section 5) change the output and are not offered.
"""

import torch

from ..heads import MedusaHeads
from ..models import target_features
from .base import Draft
from .medusa import MedusaDrafter


class BlockwiseDrafter(MedusaDrafter):
    """Blockwise parallel decoding with blocks of ``block_size`` = k tokens: the pending token and k - 1 heads.

    ``block_size`` is in [1, heads + 1] (default: every head); 1 is plain greedy decoding. A step
    proposes min(K, k - 1) tokens. ``predict_calls`` counts the extra target calls of
    ``combined=False``.
    """

    def __init__(self, target: torch.nn.Module, heads: MedusaHeads, block_size: int | None = None,
                 combined: bool = True):
        super().__init__(target, heads, tree=None)
        if block_size is None:
            block_size = heads.num_heads + 1
        if not isinstance(block_size, int) or isinstance(block_size, bool) or \
                not 1 <= block_size <= heads.num_heads + 1:
            raise ValueError(f"block_size must be an integer in [1, {heads.num_heads + 1}]: the pending token and one "
                             f"token per head, {heads.num_heads} heads here (got {block_size!r})")
        self.block_size, self.combined = block_size, combined

    @classmethod
    def from_pretrained(cls, name_or_path, target: torch.nn.Module, block_size: int | None = None,
                        combined: bool = True) -> "BlockwiseDrafter":
        """Heads for ``target`` (``"shakespeare"`` or a directory of saved Medusa heads), blocks of ``block_size``."""
        return cls(target, MedusaHeads.from_pretrained(name_or_path, target), block_size, combined)

    def start(self, input_ids):
        super().start(input_ids)
        self.committed, self.pending = input_ids[0, :-1], input_ids[0, -1:]  # (T - 1,) and (1,)
        self.block = self.pending[:0]
        self.predict_calls = 0

    def propose(self, k, sampler, generator, keep_drafting=None):
        if not sampler.greedy:
            raise ValueError("blockwise parallel decoding is greedy (Stern et al. 2018): give Sampler(0), or draft "
                             "with MedusaDrafter(target, heads, tree=None) to sample with the same heads")
        if k < 1 or self.block_size == 1 or self.feature is None:
            self.block = self.pending[:0]
            return Draft(self.block)
        if not self.combined:  # the predict substep as a call of its own
            with torch.no_grad():
                self.feature = target_features(self.target, self.committed[None])[0, -1]
            self.predict_calls += 1
        self.block = super().propose(min(k, self.block_size - 1), sampler, generator).tokens
        return Draft(self.block)

    def update(self, num_accepted, next_token, path=None):
        """Commit the pending token and the accepted part of the block (the text ``combined=False`` reads)."""
        self.committed = torch.cat([self.committed, self.pending, self.block[:num_accepted]])
        self.pending = torch.tensor([next_token], device=self.committed.device)

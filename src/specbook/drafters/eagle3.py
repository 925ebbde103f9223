"""EAGLE-3: draft tokens from the target's fused low, middle and high features (Li et al. 2025).

The bookkeeping is EAGLE's (`specbook.drafters.eagle`): pairs of (feature, next token) in the head's
own KV cache, the drafted pairs rolled back after verification and the committed positions fed again
with the target's true states. What differs is what the pairs hold and what comes out:

- the engine hands over the target's hidden states after the head's ``feature_layers`` side by side
  (`Drafter.feature_layers`), which the head fuses to one vector g_t of the target's width;
- a drafted pair holds the head's own output a_t, which is not a predicted feature: nothing ties it
  to the target's hidden states (no feature regression), and the training-time test taught the head
  to read it (`specbook.eagle3`);
- the draft's logits come from the head's own LM head, over its vocabulary; with a reduced one p is
  zero on every other token, and verification stays exact.

Chains, static trees and EAGLE-2's dynamic trees draft as for EAGLE.
"""

from ..eagle3 import Eagle3Head
from .eagle import EagleDrafter


class Eagle3Drafter(EagleDrafter):
    """Draft with an `specbook.eagle3.Eagle3Head` on ``target``: a sampled chain (``tree=None``), a top-k tree (a
    `TreeSpec` or a branching tuple) or a `DynamicTree`, as `EagleDrafter`."""

    def __init__(self, target, head: Eagle3Head, tree=None):
        head.check_target(target)
        super().__init__(target, head, tree)
        self.feature_layers = head.feature_layers

    @classmethod
    def from_pretrained(cls, name_or_path, target, tree=None, vocab=None) -> "Eagle3Drafter":
        """An EAGLE-3 head for ``target``: ``"shakespeare"`` (trained on the built-in target) or a saved directory.
        ``vocab``: a reduced draft vocabulary (`Eagle3Head.with_vocabulary`: a number of the most frequent
        tokens, or token ids)."""
        head = Eagle3Head.from_pretrained(name_or_path, target)
        return cls(target, head if vocab is None else head.with_vocabulary(vocab), tree)

    def observe_features(self, features):
        self.features.append(self.head.fused(features))  # (n, layers * hidden) -> g (n, hidden)

    def logits(self, predicted):
        return self.head.logits(predicted)

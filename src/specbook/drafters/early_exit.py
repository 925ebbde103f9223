"""Self-speculative decoding: the target drafts for itself, cut short after its first L layers.

LayerSkip (Elhoushi et al. 2024), Draft & Verify (Zhang et al. 2024) and Kangaroo (Liu et al.
2024) need no second model: the draft is the target's embedding and first L decoder layers,
finished by an exit head (`specbook.heads.ExitHead`: a final norm and an LM head trained to
predict the next token from layer L's hidden state), and the whole target verifies. The draft
costs about L / (number of layers) of a target step, so c is set by the choice of L, and so, the
other way, is α: the shallower the exit, the cheaper and the less accurate the draft.
"""

import torch

from ..heads import ExitHead, early_exit_model
from .model import ModelDrafter


class SelfSpeculativeDrafter(ModelDrafter):
    """Draft with ``target``'s first ``head.exit_layer`` layers and ``head``: a `ModelDrafter` on `early_exit_model`.

    What is reused: the weights -- the draft model's embedding and layers *are* the target's modules
    (no copy, a packed target's packed layers included), and only the head's norm and LM head are
    its own. The draft's KV cache for layers 0 .. L - 1 holds exactly what the target computes for
    those layers at the same positions. What is not: that cache is a second copy, and since a
    Hugging Face model call cannot start at layer L, verification runs the target from layer 0 on
    the drafted tokens, recomputing layers 0 .. L - 1 that drafting already computed. LayerSkip
    avoids both with its own kernels (one shared cache, verification resumed at layer L); here a
    step costs K draft calls of L layers plus one full target call, as with any draft model.
    ``cache``, ``compile`` and ``max_length`` are `ModelDrafter`'s.
    """

    def __init__(self, target: torch.nn.Module, head: ExitHead, cache: str = "dynamic", compile: bool = False,
                 max_length: int | None = None):
        super().__init__(early_exit_model(target, head), cache, compile, max_length)

    @classmethod
    def from_pretrained(cls, name_or_path, target: torch.nn.Module, **options) -> "SelfSpeculativeDrafter":
        """An exit head for ``target``: ``"shakespeare"`` (trained on the built-in target) or a saved directory.

        Pass the very model you verify with, e.g. ``load_pair("shakespeare").target``; ``options``
        go to the constructor.
        """
        return cls(target, ExitHead.from_pretrained(name_or_path, target), **options)

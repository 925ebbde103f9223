"""Drafters: everything that proposes tokens for the target to verify.

Every drafter implements the one `Drafter` interface, so the verifier in `specbook.decoding`
is written once: a model drafter, n-gram / prompt-lookup drafters, tree drafters, Medusa, EAGLE and EAGLE-3 heads,
lookahead decoding, self-speculative decoding, blockwise parallel decoding, Ouroboros, GliDe with CaPE,
parallel drafting (PARD).
"""

from .base import Draft, Drafter
from .blockwise import BlockwiseDrafter
from .eagle import EagleDrafter
from .eagle3 import Eagle3Drafter
from .early_exit import SelfSpeculativeDrafter
from .glide import CaPE, GlideDrafter
from .lookahead import LookaheadDrafter
from .medusa import MedusaDrafter
from .model import ModelDrafter, as_drafter
from .ngram import LookupDrafter, NGramDrafter, NGramStorage, PromptLookupDrafter
from .ouroboros import OuroborosDrafter
from .pard import PardDrafter
from .tree import SampledTreeDrafter, TopKTreeDrafter

__all__ = ["BlockwiseDrafter", "CaPE", "Draft", "Drafter", "Eagle3Drafter", "EagleDrafter", "GlideDrafter",
           "LookaheadDrafter", "LookupDrafter", "MedusaDrafter", "ModelDrafter", "NGramDrafter", "NGramStorage",
           "OuroborosDrafter", "PardDrafter", "PromptLookupDrafter", "SampledTreeDrafter", "SelfSpeculativeDrafter",
           "TopKTreeDrafter"]

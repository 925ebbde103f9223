"""specbook: speculative decoding from first principles.

The package behind the specbook textbook. Notation (fixed everywhere): q is the target
model's distribution, p the draft's, K the draft length, alpha the acceptance rate and c
the draft's cost per token relative to the target's.
"""

from . import display  # noqa: F401  (registers and enables the "specbook" Altair renderer)
from .decoding import autoregressive_generate, speculative_generate
from .drafters import (Draft, Drafter, Eagle3Drafter, EagleDrafter, LookaheadDrafter, MedusaDrafter, ModelDrafter,
                       NGramDrafter, PardDrafter, PromptLookupDrafter, SampledTreeDrafter, SelfSpeculativeDrafter,
                       TopKTreeDrafter)
from .eagle3 import Eagle3Head
from .heads import EagleHead, ExitHead, MedusaHeads
from .models import ModelPair, load_model, load_pair
from .policies import BatchSizeK, ConfidenceStop, DraftLength, EntropyGuidedK, FixedK, HeuristicK
from .records import BatchGeneration, BatchStats, Generation, Stats, Step
from .rejection import acceptance_rate, output_distribution, residual_distribution, verify_chain, verify_chain_greedy
from .sampling import Sampler
from .theory import expected_tokens_per_step, optimal_k, speedup
from .tree_verification import verify_tree, verify_tree_greedy
from .trees import DynamicTree, TreeSpec, tree_attention_mask, tree_positions

__all__ = [
    "BatchGeneration", "BatchSizeK", "BatchStats", "ConfidenceStop", "Draft", "DraftLength", "Drafter", "DynamicTree",
    "Eagle3Drafter", "Eagle3Head", "EagleDrafter", "EagleHead",
    "EntropyGuidedK", "ExitHead", "FixedK", "Generation", "HeuristicK", "LookaheadDrafter", "MedusaDrafter",
    "MedusaHeads", "ModelDrafter", "ModelPair", "NGramDrafter", "PardDrafter", "PromptLookupDrafter", "SampledTreeDrafter", "Sampler",
    "SelfSpeculativeDrafter", "Stats", "Step", "TopKTreeDrafter", "TreeSpec", "acceptance_rate",
    "autoregressive_generate", "expected_tokens_per_step", "load_model", "load_pair", "optimal_k", "output_distribution",
    "residual_distribution", "speculative_generate", "speedup",
    "tree_attention_mask", "tree_positions", "verify_chain", "verify_chain_greedy", "verify_tree",
    "verify_tree_greedy",
]

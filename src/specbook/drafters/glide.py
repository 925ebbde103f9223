"""GliDe with a CaPE (Du et al., ICML 2024, arXiv 2402.02082): a draft that reads the target's KV cache,
and token trees shaped by the draft's confidence.

`GlideDrafter` drafts with a `specbook.glide.GlideForCausalLM` like a `ModelDrafter` drafts with a draft
model -- its own KV cache, rolled back to the accepted prefix after every step -- except that every
draft call also reads the target's cache of the committed context. The engine hands the drafter the
target's cache once per generation, after the prompt's prefill (``uses_target_cache``,
`Drafter.observe_cache`); the drafter counts the positions committed since, so that a call reads the
keys and values of exactly those: not the pending token (the target has not seen it yet), not the
rejected drafts a static cache still holds past its pointer. After a rejection the engine rolls the
target's cache back and the next step reads the refreshed one.

CaPE, confidence-aware proposal expansion (``generate_proposals`` in the authors' code):
the draft proposes its greedy chain d_1 .. d_K, and at each depth where its top-1 probability is low it
adds the next most likely tokens as leaf siblings of d_i, as many as the confidence bin of that depth
says (`CaPE`). One target call verifies the chain and the siblings as a token tree
(`specbook.tree_verification.verify_tree`): when d_i is rejected, a sibling may still be accepted, and
the step keeps one more token. Every node is picked deterministically (argmax, then the next ranks), so the tree
is reported without p (one-hot): under sampling each node is accepted with probability q(x), else x
leaves q and the next sibling is tried -- the rule that keeps deterministic siblings lossless. (The
authors' sampled path tests each node on its own, without a residual: not lossless.) Tree steps run on
the engine's dynamic cache, or on its static one where the target runs on the package's decoder.
"""

import torch

from ..cache import is_static
from ..glide import GlideForCausalLM, read_target_cache
from ..policies import check_integer
from ..sampling import Sampler
from ..tree_verification import path_order
from ..trees import on_device
from .base import Draft
from .model import ModelDrafter

GREEDY = Sampler(0)
# Candidates per depth (the greedy token included) by the draft's top-1 probability p, bin floor(10 p), the last
# bin taking the rest: the paper's bins for Vicuna, 8 8 8 6 6 6 4 4 2 2 2 2, scaled down for the small built-in pair.
BINS = (3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1)


class CaPE:
    """Confidence-aware proposal expansion: ``bins[floor(10 p)]`` candidates at a depth where the draft's top-1
    probability is p (the last bin for the rest), the greedy token and the next ranks, at most ``budget`` nodes in
    all, the chain's included. The shallowest depths get their siblings first: a sibling at depth i is only tried
    when the chain's first i - 1 tokens were accepted."""

    def __init__(self, budget: int = 10, bins=BINS):
        check_integer("budget", budget, 1)
        if not bins or not all(isinstance(count, int) and not isinstance(count, bool) and count >= 1 for count in bins):
            raise ValueError(f"bins must be a non-empty sequence of integers >= 1, candidates per depth (got {bins!r})")
        self.budget, self.bins = budget, tuple(bins)

    def expand(self, chain: torch.Tensor, own_probs: torch.Tensor) -> Draft:
        """The token tree of the greedy ``chain`` (n,) and the draft's own distributions (n, vocab) it was picked
        from: the chain first (nodes 0 .. n - 1, each the child of the one before), then the siblings of each
        d_i, children of d_i's parent, most likely first. Deterministic: no p."""
        others = self._candidates(chain, own_probs)  # (n, width)
        top1 = own_probs.max(-1).values.tolist()  # (n,): the step's one read, for the tree's shape on the host
        tokens, parents, room = [chain], list(range(-1, len(chain) - 1)), self.budget - len(chain)
        for depth, confidence in enumerate(top1):
            wanted = min(self.bins[min(int(10 * confidence), len(self.bins) - 1)] - 1, room)
            siblings = others[depth, :wanted]  # the next ranks after the chain's token (it never comes first)
            tokens.append(siblings)
            parents += [depth - 1] * len(siblings)
            room -= len(siblings)
        return Draft(torch.cat(tokens), None, parents)

    def expand_on_device(self, chain: torch.Tensor, own_probs: torch.Tensor) -> Draft:
        """`expand` without reading the confidence on the host, for the GPU path: every depth gets the most
        siblings the bins allow, in slots of a shape fixed for the chain's length, and a slot its confidence
        (or the budget) leaves out holds the chain's own token again, a sibling verification never accepts (an
        earlier sibling has its token). Its parents stay on the device (`Draft`), so drafting reads nothing."""
        n, device = len(chain), chain.device
        others = self._candidates(chain, own_probs)  # (n, width): a slot per sibling a depth may get
        width = others.shape[1]
        bins = on_device(self.bins, device)
        wanted = bins[(10 * own_probs.max(-1).values).long().clamp(max=len(self.bins) - 1)] - 1  # (n,)
        room = (self.budget - n) - (wanted.cumsum(0) - wanted)  # what the shallower depths left
        wanted = torch.minimum(wanted, room.clamp(min=0))
        live = torch.arange(width, device=device) < wanted[:, None]  # (n, width)
        siblings = torch.where(live, others, chain[:, None])  # a slot left out: the chain's token again
        depths = torch.arange(n, device=device)
        parents = torch.cat([depths - 1, (depths - 1).repeat_interleave(width)])
        return Draft(torch.cat([chain, siblings.flatten()]), None, parents)

    def _candidates(self, chain: torch.Tensor, own_probs: torch.Tensor) -> torch.Tensor:
        """Each depth's possible siblings (n, width): its draft's ranks after the chain's token (most bins' count
        minus one), the budget checked against the chain."""
        if len(chain) > self.budget:
            raise ValueError(f"CaPE's node budget (budget={self.budget}) is smaller than the chain of {len(chain)} "
                             "drafts it would expand")
        ranked = own_probs.topk(min(max(self.bins), own_probs.shape[-1]), -1).indices  # (n, width + 1)
        chain_last = torch.argsort((ranked == chain[:, None]).to(torch.uint8), stable=True)  # its token last
        return ranked.gather(1, chain_last)[:, :-1]

    def __repr__(self):
        return f"CaPE(budget={self.budget}, bins={self.bins})"


class _Reading(torch.nn.Module):
    """A GliDe model bound to the target's KV cache: called like a causal LM, and every call reads the keys and
    values of the first ``committed`` positions of ``cache`` (`specbook.glide.read_target_cache`)."""

    def __init__(self, glide: GlideForCausalLM):
        super().__init__()
        self.glide, self.cache, self.committed = glide, None, 0
        self.config, self.generation_config = glide.config, glide.generation_config

    @property
    def device(self) -> torch.device:
        return self.glide.device

    def get_input_embeddings(self):
        return self.glide.get_input_embeddings()

    def get_output_embeddings(self):
        return self.glide.get_output_embeddings()

    def forward(self, input_ids, **inputs):
        context = read_target_cache(self.cache, self.glide.target_layers, self.committed)
        return self.glide(input_ids, target_context=context, **inputs)


class GlideDrafter(ModelDrafter):
    """Draft with a GliDe model (`specbook.glide.GlideForCausalLM`): a chain sampled from its p, reported with it,
    or with ``cape`` (a `CaPE`) its greedy chain and, where it is unsure, siblings: a token tree.

    The model must have been trained on the target it drafts for: the engine's target is checked when the
    generation starts (`GlideForCausalLM.check_target`). Its own cache is dynamic.
    """

    uses_target_cache = True

    @property
    def drafts_trees(self) -> bool:
        return self.cape is not None

    def __init__(self, glide: GlideForCausalLM, cape: CaPE | None = None):
        if not isinstance(glide, GlideForCausalLM):
            raise ValueError(f"glide must be a GlideForCausalLM (got {type(glide).__name__}): for a plain draft model "
                             "use ModelDrafter")
        if cape is not None and not isinstance(cape, CaPE):
            raise ValueError(f"cape must be None or a CaPE (got {type(cape).__name__})")
        super().__init__(_Reading(glide))
        self.glide, self.cape, self.chain, self.drafted = glide, cape, 0, None

    def observe_cache(self, target, cache):
        self.glide.check_target(target)
        self.model.cache, self.model.committed = cache, int(cache.get_seq_length())
        self.on_device = is_static(cache)  # the GPU path: CaPE shapes its trees without reading

    def propose(self, k, sampler, generator, keep_drafting=None):
        if self.cape is None:
            return super().propose(k, sampler, generator, keep_drafting)
        if k > self.cape.budget:
            raise ValueError(f"CaPE's node budget (budget={self.cape.budget}) is smaller than the chain of k={k} "
                             "drafts: raise the budget or lower k")
        own = []  # per depth: the draft's own distribution (vocab,), what the confidence bins read

        def record(probs):
            own.append(probs)
            return keep_drafting is None or keep_drafting(probs)

        chain = super().propose(k, GREEDY, None, record).tokens  # (n,): argmax, deterministic
        draft = (self.cape.expand_on_device if self.on_device else self.cape.expand)(chain, torch.stack(own))
        self.chain, self.drafted = len(chain), draft.tokens
        return draft

    def update(self, num_accepted, next_token, path=None):
        self.model.committed += num_accepted + 1  # the target's cache now holds the pending token and the accepted
        if path is None:
            return super().update(num_accepted, next_token)
        chain = sum(node < self.chain for node in path)  # the path: the chain's first nodes, then maybe a sibling
        super().update(chain, next_token)
        if len(path) > chain:  # an accepted sibling: the draft has not read it yet
            last = path_order(path, self.drafted.device)[len(path) - 1:len(path)]  # (1,): its last node
            self.pending = torch.cat([self.pending[:-1], self.drafted.index_select(0, last), self.pending[-1:]])

"""The interface between a drafter and the verifier.

A generation is a conversation: the engine calls ``start`` once with the prompt, then for every
step ``propose`` (up to k tokens, with the distributions they were drawn from) and ``update``
(how many the target accepted and which token it emitted next), so the drafter can roll its
state back to the accepted prefix and extend it. A tree drafter (`specbook.trees`) proposes a
`Draft` with ``parents`` and is told which path was accepted. A drafter that reads the target's
hidden states (Medusa, EAGLE) sets ``uses_features`` and is handed them after every step; one that
reads the target's KV cache (GliDe) sets ``uses_target_cache`` and is handed the cache itself. A
drafter that asks the target to score rows of its own in the same call (lookahead decoding's
Jacobi window, ``Draft.side_tokens``) is handed their logits.
"""

from dataclasses import dataclass

import torch

from ..sampling import one_hot


@dataclass
class Draft:
    """Proposed tokens (n,) and the draft distributions p they were drawn from (n, vocab).

    ``probs`` is None for a deterministic drafter (n-grams, prompt lookup, a draft model decoding
    greedily): its p is one-hot on each proposed token, and the accept rule min(1, q/p) becomes
    "accept with probability q(x)".

    ``parents`` None is a chain: token i continues token i - 1. Otherwise the draft is a token
    tree: ``parents[i]`` is the node token i continues, -1 for the pending token, parents before
    children (`specbook.trees` says which trees verify losslessly). A list, or a long tensor on the
    device for a tree the drafter shaped there (EAGLE-2's, `specbook.trees.grow_dynamic_tree`), which
    the engine reads with the step's outcome; such a tree is deterministic (``probs`` None).

    ``side_tokens`` (m,) with ``side_parents`` (m,) is a second tree after the pending token that
    the target scores in the same call but nobody verifies: its rows only feed the drafter's next
    drafts (`Drafter.observe_side`). ``side_parents`` index the side tree's own nodes, -1 for the
    pending token. Only a tree draft (``parents`` set) may carry one.
    """

    tokens: torch.Tensor  # (n,) long
    probs: torch.Tensor | None = None  # (n, vocab) or None
    parents: list[int] | torch.Tensor | None = None  # (n,) or None for a chain
    side_tokens: torch.Tensor | None = None  # (m,) long, or None
    side_parents: list[int] | None = None  # (m,) or None

    def __post_init__(self):
        if isinstance(self.parents, torch.Tensor) and self.probs is not None:
            raise ValueError("a tree shaped on the device (parents a tensor) must be deterministic (probs None): its "
                             "verification removes each rejected sibling's token from q")

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def over(self, vocab: int) -> torch.Tensor:
        """The draft's p (n, vocab) over the target's ``vocab``: its reported distributions, zero on the rows
        a narrower draft lacks, or one-hot rows for a deterministic drafter."""
        if self.probs is not None:
            return torch.nn.functional.pad(self.probs, (0, vocab - self.probs.shape[1]))
        return one_hot(self.tokens, vocab)


class Drafter:
    """What the engine needs from a drafter. Subclasses override ``start``, ``propose`` and ``update``.

    ``uses_features = True`` asks the engine for the target's *features*: its final hidden states
    after the final norm, the input of its LM head (`specbook.models.target_features`). The engine
    then runs the target's base model and LM head separately, and calls ``observe_features`` with
    the features of every position it commits. Other drafters leave it False and the engine calls
    the target as usual. ``feature_layers`` says which hidden states: indices into Hugging Face's
    ``hidden_states`` (0 the embeddings, l the output of the first l layers, -1 the features), handed
    over side by side (`specbook.models.read_features`); EAGLE-3 reads a low, a middle and a high layer.

    ``uses_target_cache = True`` asks for the target's KV cache (GliDe's cross-attention reads it): the
    engine then feeds the prompt to the target before drafting, as for features, and calls
    ``observe_cache`` once, before ``start``.
    """

    uses_features = False
    feature_layers = (-1,)  # with uses_features: which hidden states, side by side
    uses_target_cache = False

    @property
    def drafts_trees(self) -> bool:
        """Whether ``propose`` may return a token tree (a `Draft` with ``parents``), now or later in a generation:
        the engine refuses a cache that cannot verify one before the first token, not at the first tree."""
        return False

    @property
    def needs_prefill(self) -> bool:
        """Whether the engine reads the prompt into the target's cache with a call of its own before the first
        step: a drafter that reads the target's features or its cache needs the prompt's."""
        return self.uses_features or self.uses_target_cache

    def start(self, input_ids: torch.Tensor) -> None:
        """Begin a generation on a (1, T) prompt."""
        raise NotImplementedError

    def propose(self, k: int, sampler, generator: torch.Generator | None, keep_drafting=None) -> Draft:
        """Propose up to ``k`` tokens continuing the current context (fewer, even none, is allowed).

        A drafter that samples token by token calls ``keep_drafting(draft_probs)`` after each token
        (when given) and stops early when it returns False.
        """
        raise NotImplementedError

    def update(self, num_accepted: int, next_token: int, path: list[int] | None = None) -> None:
        """The target kept the first ``num_accepted`` proposed tokens, then emitted ``next_token``.

        After a tree draft, ``path`` lists the ``num_accepted`` accepted nodes from the root down;
        only drafters that propose trees are given it.
        """
        raise NotImplementedError

    def draft_ahead(self, outcome: torch.Tensor, k: int, sampler, generator: torch.Generator | None) -> bool:
        """Draft the next step's ``k`` tokens before the host reads this step's ``outcome`` (2,), on the device:
        [number accepted, next token]. Called after ``propose`` and before ``update``, only where the next step
        drafts ``k`` whatever the outcome; ``update`` follows, then ``propose(k)``, which returns that draft. A
        drafter that can (`ModelDrafter`, where its drafts replay as a graph) overrides this; the default
        declines, returning False."""
        return False

    def observe_target(self, target_probs: torch.Tensor) -> None:
        """After ``update``: the target's distributions (num_accepted + 1, vocab) at the positions the
        step committed, row i the one that predicted its i-th token. A drafter that learns from the
        target (the n-gram filler) overrides this; the default ignores it."""

    def observe_features(self, features: torch.Tensor) -> None:
        """Only for ``uses_features``: the target's features (n, hidden) at newly committed positions, in order
        (n, len(feature_layers) * hidden for several layers).

        After ``start``, the prompt's positions 0 .. T - 2 (every token but the pending last one;
        not called for a one-token prompt). After each step, following ``update`` and
        ``observe_target``, the num_accepted + 1 positions the step committed: the pending token,
        then the accepted drafts (for a tree, the root then the accepted path). The feature at a
        position is what the target predicts the next token from, so the newest one predicts the
        new pending token.
        """
        raise NotImplementedError

    def observe_cache(self, target, cache) -> None:
        """Only for ``uses_target_cache``: the ``target`` model (to check, refusing one the drafter cannot read) and
        its KV cache (`specbook.cache`: dynamic or static), once per generation, before ``start``. The cache then
        holds the prompt's positions 0 .. T - 2 (none for a one-token prompt) and between steps every committed
        position but the pending token's: the drafter keeps it and counts the positions the steps commit (a
        static cache's buffers hold more, past its pointer: rejected drafts, older generations)."""
        raise NotImplementedError

    def read_encoder(self, encoder_outputs, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> None:
        """Only for an encoder-decoder target, before ``start``: the encoder's output for this generation and
        its input ``input_ids`` (1, S) and mask (`specbook.seq2seq`). A drafter that can draft for such a target
        overrides this; the default refuses."""
        raise ValueError(f"{type(self).__name__} cannot draft for an encoder-decoder target: use a draft model "
                         "(ModelDrafter), prompt lookup or NASD")

    def observe_side(self, logits: torch.Tensor) -> None:
        """Only for a drafter whose drafts carry ``side_tokens``: the target's logits (m, vocab) at the side
        rows of the last call, row i after side node i and its ancestors. Called before ``update``."""
        raise NotImplementedError

"""Parallel drafting: K draft tokens from one call of a draft model (PARD, An et al. 2026).

A draft model drafts K tokens with K calls, each waiting for the token before it. Where those calls
bind -- a small draft on a CPU, where every call pays its operators' fixed costs, or any draft on a GPU,
where every call pays its launches -- the draft's time grows with K while the target's verification
hardly does. PARD adapts an ordinary draft model to read K - 1 *mask tokens* after the context and
predict at each of them a token further ahead: fed

    [x_1 .. x_t, m, m, .., m]          (K - 1 masks, at positions t + 1 .. t + K - 1)

its output at x_t predicts x_{t+1}, as before, and its output at the j-th mask predicts x_{t+1+j}:
K drafts from one causal call. The masks see the context and the masks before them, never a draft:
draft j is predicted without knowing drafts 1 .. j - 1, the price of parallel drafting, paid in α at
the deeper positions (`specbook.train.pard` measures it, position by position). The mask token is one
id the tokenizer never produces (its config's ``pard_token``, which vLLM reads for ``parallel_drafting``),
and the draft is trained on it for up to ``pard_max_k`` drafts (Conditional Drop-token training,
`specbook.train.pard`).

Exact as any drafter is: draft j is drawn from the draft's distribution p_j at its mask, which depends
on the context only, and verification tests it against that p_j (Leviathan et al.'s proof holds for any
p that is a function of what precedes the draft). After verification the masks leave the draft's cache
(they were its last K - 1 slots), and the next call feeds what the cache has not seen as real tokens:
the accepted drafts and the target's next token, then K - 1 masks again.

Blockwise parallel decoding (Stern et al. 2018, `specbook.drafters.blockwise`) drafts K tokens in one
pass too, from K heads on the target; PARD puts the K positions in the sequence, so one small model,
its positions and its attention do the work, with no head per position, and the draft serves any target
that shares its tokenizer.
"""

import torch

from ..cache import rollback
from .base import Draft
from .model import ModelDrafter

PARD_TOKEN = "pard_token"  # the draft's config: its mask token's id (as vLLM reads it)
PARD_MAX_K = "pard_max_k"  # the draft's config: the most drafts a call was trained to give


def pard_token(model) -> int:
    """``model``'s mask token (its config's ``pard_token``), or a clear refusal for a draft never trained with one."""
    token = getattr(model.config, PARD_TOKEN, None)
    if not isinstance(token, int) or isinstance(token, bool):
        raise ValueError(f"{type(model).__name__} has no {PARD_TOKEN} in its config: PardDrafter drafts with a model "
                         "adapted to mask tokens (python -m specbook.train --stages pard, or a PARD checkpoint)")
    rows = model.get_input_embeddings().weight.shape[0]
    if not 0 <= token < rows:
        raise ValueError(f"the draft's {PARD_TOKEN} ({token}) is not a row of its embedding ({rows} rows)")
    return token


class PardDrafter(ModelDrafter):
    """Draft K tokens with one call of a PARD draft model (module docstring), on the dynamic cache or the static
    one (a replayed graph per number of positions on a GPU), its cache rolled back like a draft model's.
    ``model``: a causal LM whose config has ``pard_token`` (and ``pard_max_k``, the most drafts a call gives)."""

    def __init__(self, model, cache: str = "dynamic", compile: bool = False, max_length: int | None = None):
        super().__init__(model, cache, compile, max_length)
        self.mask, self.max_k = pard_token(model), getattr(model.config, PARD_MAX_K, None)

    def start(self, input_ids: torch.Tensor) -> None:
        super().start(input_ids)
        self.masks = 0  # masks in the cache, after the pending tokens it holds

    def propose(self, k, sampler, generator, keep_drafting=None):
        """``k`` drafts from one call on the pending tokens and k - 1 masks: the argmax at each (greedy), or a draw
        from each position's distribution, which verification uses as that draft's p. ``keep_drafting`` is asked
        after each draft, in order, and cuts the chain where it says stop."""
        if self.max_k is not None and k > self.max_k:
            raise ValueError(f"k must be at most {self.max_k} for this PARD draft (its pard_max_k: a call was trained "
                             f"to give that many drafts; got {k})")
        if k < 1:
            return self._drafted(self.pending[:0], None)
        pending, self.pending = self.pending, self.pending[:0]
        masks = torch.full((k - 1,), self.mask, dtype=pending.dtype, device=pending.device)
        inputs = torch.cat([pending, masks])[None]  # (1, n + k - 1)
        if self.forward is None:
            logits = self.call(inputs, past_key_values=self.cache, use_cache=True, logits_to_keep=k).logits[0]
        else:
            logits = self.forward(inputs, keep=k)[0]  # (k, vocab)
        logits = logits[:, : self.vocab_size]
        tokens, probs = sampler.pick(logits, generator)  # (k,); (k, vocab) or None (greedy)
        self.masks = k - 1
        if keep_drafting is not None:  # asked in order, until it says stop (as a drafting loop asks it)
            kept = next((i + 1 for i, row in enumerate(logits) if not keep_drafting(row.float().softmax(-1))), k)
            tokens, probs = tokens[:kept], None if probs is None else probs[:kept]
        self.calls += 1
        self.proposed = tokens
        return Draft(tokens, probs)

    def update(self, num_accepted, next_token):
        self._check_readable(next_token)
        rollback(self.cache, self.masks)  # the masks, the call's last slots
        next_token = torch.full((1,), next_token, dtype=self.pending.dtype, device=self.pending.device)
        self.pending = torch.cat([self.pending, self.proposed[:num_accepted], next_token])
        self.proposed, self.masks = self.proposed[:0], 0


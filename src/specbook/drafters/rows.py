"""Drafting for a batch of sequences (`specbook.batch`).

A batch step asks for up to k_b drafts for each row b and gets them as one (B, K) tensor, K the
longest row's, shorter rows padded with filler that verification never reads. Two drafters batch:

- a draft model (`ModelRows`) runs once per drafted position for the whole batch, over a
  batch cache (`specbook.row_graphs.batch_cache`): rows that draft fewer tokens feed filler the cache hides, and
  after verification each row keeps its own accepted drafts. Each row samples from its own random
  stream, as it would alone;
- a drafter that reads the committed tokens (prompt lookup, NASD: `specbook.drafters.ngram`) costs
  no model call, so each row gets its own copy (`LookupRows`), fed the row's own tokens.

The others are refused at batch size > 1 (`for_batch`): token trees and heads need a tree mask
per row, and their drafters keep one sequence's state.
"""

import copy

import torch

from ..decoder import decoder_for
from ..row_graphs import batch_cache
from ..seq2seq import is_encoder_decoder
from .model import ModelDrafter
from .ngram import LookupDrafter


class ModelRows:
    """A `ModelDrafter`'s model drafting for every row of a (B, T) left-padded batch (``visible`` its mask)."""

    observes_target = False  # a draft model learns nothing from the target's distributions

    def __init__(self, drafter: ModelDrafter, input_ids: torch.Tensor, visible: torch.Tensor,
                 static_length: int | None = None):
        self.model, self.vocab_size, self.calls = drafter.model, drafter.vocab_size, 0
        static = static_length is not None and decoder_for(self.model) is not None  # else Hugging Face's forward
        self.cache = batch_cache(self.model, input_ids.shape[0], static_length if static else 2 * input_ids.shape[1],
                                 "static" if static else "dynamic", "draft")  # (a dynamic one grows)
        if input_ids.shape[1] > 1:
            self.cache(input_ids[:, :-1], visible[:, :-1], logits_to_keep=1)
        self.pending = [[token] for token in input_ids[:, -1].tolist()]  # per row: tokens the cache has not seen
        self.proposed, self.fed = None, None  # this step's drafts (B, K), and how many of each row's are in the cache

    def propose(self, ks: list[int], sampler, generators: list, keep_drafting: list | None = None):
        """Up to ``ks[b]`` drafts for row b: tokens (B, K), their draft distributions (B, K, vocab) and the
        number each row drafted (fewer than asked where its ``keep_drafting[b]`` said stop)."""
        ks, width = list(ks), max(ks)
        inputs, visible = self._pending()
        tokens, probs = [], []
        for i in range(width):
            logits = self.cache(inputs, visible, logits_to_keep=1).logits[:, -1, : self.vocab_size]
            step_probs = sampler.probs(logits)  # (B, vocab): the warped p, what verification uses
            token = sampler.sample_rows(step_probs, generators, [i < k for k in ks])  # (B,)
            tokens.append(token)
            probs.append(step_probs)
            for row, stop in enumerate(keep_drafting or []):
                if stop is not None and i < ks[row] and not stop(logits[row].float().softmax(-1)):
                    ks[row] = i + 1
            inputs, visible = token[:, None], torch.tensor([[i < k] for k in ks])  # filler is hidden
        self.calls += width
        self.proposed = torch.stack(tokens, 1)  # (B, K)
        self.fed = [min(k, width - 1) for k in ks]  # the last position was sampled, never fed
        return self.proposed, torch.stack(probs, 1), ks

    def _pending(self):
        """The pending tokens, left-padded to the longest row: (B, n) tokens and (B, n) visible."""
        width = max(map(len, self.pending))
        tokens = torch.tensor([[0] * (width - len(row)) + row for row in self.pending], device=self.model.device)
        visible = torch.tensor([[False] * (width - len(row)) + [True] * len(row) for row in self.pending])
        self.pending = [[] for _ in self.pending]
        return tokens, visible

    def update(self, accepted: list[int], next_tokens: list[int]) -> None:
        """Row b kept its first ``accepted[b]`` drafts and then emitted ``next_tokens[b]``."""
        if self.proposed is None:  # nothing drafted this step: the next tokens join the pending ones
            self.pending = [row + [token] for row, token in zip(self.pending, next_tokens)]
            return
        width = self.proposed.shape[1]
        self.cache.forget(width - 1, [min(a, fed) for a, fed in zip(accepted, self.fed)])
        proposed = self.proposed.tolist()
        self.pending = [proposed[row][fed:a] + [token]
                        for row, (fed, a, token) in enumerate(zip(self.fed, accepted, next_tokens))]
        self.proposed = self.fed = None

    def select(self, rows: list[int]) -> None:
        self.cache.select(rows)
        self.pending = [self.pending[row] for row in rows]


class LookupRows:
    """A copy of a drafter that reads committed tokens for every row of a (B, T) left-padded batch."""

    observes_target = True  # NASD's filler learns from the target's distributions

    def __init__(self, drafter: LookupDrafter, input_ids: torch.Tensor, visible: torch.Tensor):
        self.rows, self.calls = [copy.deepcopy(drafter) for _ in range(input_ids.shape[0])], 0
        for row, (tokens, shown) in zip(self.rows, zip(input_ids, visible)):
            row.start(tokens[shown.to(tokens.device)][None])

    def propose(self, ks: list[int], sampler, generators: list, keep_drafting: list | None = None):
        drafts = [row.propose(k, sampler, generator) if k else None
                  for row, k, generator in zip(self.rows, ks, generators)]
        lengths = [len(draft) if draft is not None else 0 for draft in drafts]
        tokens = torch.zeros(len(drafts), max(lengths), dtype=torch.long)  # (B, K), filler 0
        for row, draft in enumerate(drafts):
            if draft is not None:
                tokens[row, : len(draft)] = draft.tokens.cpu()
        return tokens.to(self.rows[0].device), None, lengths

    def update(self, accepted: list[int], next_tokens: list[int]) -> None:
        for row, a, token in zip(self.rows, accepted, next_tokens):
            row.update(a, token)

    def observe_target(self, row: int, target_probs: torch.Tensor) -> None:
        self.rows[row].observe_target(target_probs)

    def select(self, rows: list[int]) -> None:
        self.rows = [self.rows[row] for row in rows]


def for_batch(drafter, input_ids: torch.Tensor, visible: torch.Tensor, static_length: int | None = None):
    """The batch form of ``drafter`` (from `as_drafter`) started on a (B, T) left-padded batch, or a clear refusal.
    ``static_length``: the target's static cache's slots a row, which a draft model's static cache gets too."""
    if type(drafter) is ModelDrafter and not is_encoder_decoder(drafter.seq2seq):
        if drafter.compile:
            raise ValueError("a batch decodes with compile=False: give the ModelDrafter no compile (compiled steps "
                             "are for a batch of one)")
        return ModelRows(drafter, input_ids, visible, static_length)
    if isinstance(drafter, LookupDrafter):
        return LookupRows(drafter, input_ids, visible)
    raise ValueError(f"{type(drafter).__name__} drafts for one sequence at a time: at batch size > 1, draft with a "
                     "draft model (ModelDrafter), PromptLookupDrafter or NGramDrafter, or decode the prompts one by one")

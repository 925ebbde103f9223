"""Drafting without a draft model: prompt lookup and n-gram storages.

Text repeats itself: code, quotes, names, a speaker's refrain. Both drafters here read the
committed tokens (prompt + output so far) and propose a continuation seen there before, at no
model cost at all, so the cost ratio c of chapter 3 is ~0.

- `PromptLookupDrafter`: prompt lookup decoding (Saxena 2023). Find the most recent earlier
  occurrence of the last n tokens, n = max_ngram down to min_ngram, and copy what followed it.
- `NGramDrafter`: n-gram assisted speculative decoding (NASD, romsto 2024). A table of next-token
  counts after short contexts (`NGramStorage`), filled from the prompt, updated with every
  committed token and optionally with the target's top-k at each verified position (the
  "filler"), chained greedily. Its multi-level storage, longest context first, then shorter ones,
  is the adaptive n of ANPD (Ou et al. 2024).

Both are deterministic: a `Draft` with probs None, which the engine verifies as a one-hot p. The
accept rule min(1, q/p) becomes "accept x with probability q(x)" and a rejection draws from the
residual norm((q - p)+), which is q with x removed -- never a fresh draw from q, which would
favour x -- so the output still follows q exactly. A drafter never guesses a random token: at a
context it has not seen it proposes fewer tokens, even none.
"""

from collections import Counter

import torch

from ..policies import check_integer
from .base import Draft, Drafter


class LookupDrafter(Drafter):
    """A drafter that reads the committed tokens instead of running a model.

    It keeps ``tokens``, the prompt plus every token the target committed. Subclasses say what
    they learn when a token joins them (``_learn``) and how they propose up to k tokens
    (``_continue``). Drafts join ``tokens`` only once accepted, so there is nothing to roll back.
    """

    source = ()  # an encoder-decoder target's encoder input, read before the decoder's prompt

    def read_encoder(self, encoder_outputs, input_ids, attention_mask):
        """An encoder-decoder target: its encoder's input tokens come first, as text the output may copy (a
        summary quotes its document, a translation its names); T5, BART and Marian share one vocabulary. An
        encoder that reads features (Whisper's spectrogram) gives no tokens: the lookup reads the output alone."""
        if input_ids.is_floating_point():
            self.source = ()
            return
        kept = input_ids[0] if attention_mask is None else input_ids[0][attention_mask[0].bool()]
        self.source = tuple(kept.tolist())

    def start(self, input_ids: torch.Tensor) -> None:
        self.device = input_ids.device
        self.tokens = []  # the encoder's input, if any, then the prompt and the committed output
        self.proposed = []  # this step's drafts
        source, self.source = self.source, ()  # read for this generation only
        self._commit(list(source) + input_ids[0].tolist())

    def propose(self, k, sampler, generator, keep_drafting=None):
        self.proposed = self._continue(k)
        return Draft(torch.tensor(self.proposed, dtype=torch.long, device=self.device))  # (n,), probs None

    def update(self, num_accepted, next_token):
        self._commit(self.proposed[:num_accepted] + [next_token])
        self.proposed = []

    def _commit(self, tokens: list[int]) -> None:
        for token in tokens:
            self._learn(token)
            self.tokens.append(token)

    def _learn(self, token: int) -> None:
        """``token`` comes next after ``self.tokens``."""
        raise NotImplementedError

    def _continue(self, k: int) -> list[int]:
        raise NotImplementedError


class PromptLookupDrafter(LookupDrafter):
    """Prompt lookup decoding (Saxena 2023): copy what followed the last n tokens the last time they occurred.

    Tries n = max_ngram, ..., min_ngram and uses the first n whose n-gram occurred before. Every
    committed token is indexed as it arrives (n-gram -> where its latest follower sits), so a
    lookup is a dict access, not a scan of the context. If the copied stretch reaches the present
    it goes on copying the tokens it just proposed: a repeating pattern keeps repeating. Saxena's
    version takes the earliest occurrence and stops at the end of the context.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        check_integer("min_ngram", min_ngram, 1)
        check_integer("max_ngram", max_ngram, 1)
        if min_ngram > max_ngram:
            raise ValueError(f"min_ngram must be <= max_ngram (got min_ngram={min_ngram} > max_ngram={max_ngram})")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def start(self, input_ids):
        self.follower = {}  # n-gram -> position of the token after its most recent occurrence
        super().start(input_ids)

    def _learn(self, token):
        position = len(self.tokens)
        for n in range(self.min_ngram, min(self.max_ngram, position) + 1):
            self.follower[tuple(self.tokens[position - n:])] = position

    def _continue(self, k):
        end = len(self.tokens)
        for n in range(min(self.max_ngram, end), self.min_ngram - 1, -1):
            source = self.follower.get(tuple(self.tokens[end - n:]))
            if source is not None:
                draft = []
                for i in range(source, source + k):  # past the end, copy the draft itself
                    draft.append(self.tokens[i] if i < end else draft[i - end])
                return draft
        return []

    def __repr__(self):
        return f"PromptLookupDrafter(max_ngram={self.max_ngram}, min_ngram={self.min_ngram})"


class NGramStorage:
    """Next-token counts after short contexts: an n-gram model that learns as it goes (NASD).

    ``kind="onelevel"`` counts continuations of exactly n - 1 tokens. ``kind="multilevel"``
    counts every context length from n - 1 down to 1 (the bigram) and looks the longest one up
    first, backing off to shorter ones (ANPD's multi-level n-gram): long contexts are precise,
    short ones cover more. ``unigram=True`` adds a last level with the empty context, the most
    frequent token so far, so ``lookup`` always answers once anything was counted. n = 1 is the
    unigram storage of either kind.

    The most frequent continuation of each context is kept up to date as counts grow, so a
    lookup is one dict access per level; ties go to the token that reached the top count last.
    """

    KINDS = ("multilevel", "onelevel")

    def __init__(self, n: int = 3, kind: str = "multilevel", unigram: bool = False):
        check_integer("n", n, 1)
        if kind not in self.KINDS:
            raise ValueError(f"storage must be one of {self.KINDS} (got {kind!r})")
        shortest = min(n - 1, 1) if kind == "multilevel" else n - 1
        # context lengths counted and looked up, longest first
        self.context_lengths = tuple(range(n - 1, shortest - 1, -1)) + ((0,) if unigram and shortest > 0 else ())
        self.n, self.kind = n, kind
        self.clear()

    def clear(self) -> None:
        self.counts = {}  # context (tuple of 0..n-1 tokens) -> Counter of next tokens
        self.best = {}  # context -> its most frequent next token

    def add(self, context: list[int], tokens: list[int]) -> None:
        """Count each of ``tokens`` once as a continuation of the tail of ``context``, at every level."""
        for length in self.context_lengths:
            if length <= len(context):
                key = tuple(context[len(context) - length:])
                counts = self.counts.setdefault(key, Counter())
                for token in tokens:
                    counts[token] += 1
                    if counts[token] >= counts[self.best.get(key, token)]:
                        self.best[key] = token

    def lookup(self, context: list[int]) -> int | None:
        """The most frequent continuation of the longest known tail of ``context``; None if no level knows it."""
        for length in self.context_lengths:
            if length <= len(context):
                token = self.best.get(tuple(context[len(context) - length:]))
                if token is not None:
                    return token
        return None

    def __repr__(self):
        return f"NGramStorage(n={self.n}, kind={self.kind!r}, context_lengths={self.context_lengths})"


class NGramDrafter(LookupDrafter):
    """NASD: draft by chaining the most frequent continuation in an `NGramStorage`.

    Each drafted token joins the context of the next lookup, up to k tokens. The storage is filled
    from the prompt at ``start`` (emptied first when ``reset``; kept, and growing, across
    generations otherwise) and learns every committed token. With ``filler_top_k`` > 0 it also
    counts the target's top-k tokens (those with q > 0) at every committed position: the engine
    shows them through ``observe_target``, so the table learns what the target would have said,
    not only what it said. ``stop_if_unknown=True`` ends the draft at a context no level knows;
    False backs off to the most frequent token so far instead (a unigram level) -- never a random
    token.
    """

    def __init__(self, n: int = 3, storage: str = "multilevel", filler_top_k: int = 0, stop_if_unknown: bool = True,
                 reset: bool = True):
        check_integer("filler_top_k", filler_top_k, 0)
        self.storage = NGramStorage(n, storage, unigram=not stop_if_unknown)
        self.filler_top_k, self.stop_if_unknown, self.reset = filler_top_k, stop_if_unknown, reset

    def start(self, input_ids):
        if self.reset:
            self.storage.clear()
        super().start(input_ids)

    def _context(self, end: int) -> list[int]:
        """The tokens before position ``end`` that a lookup can use: at most n - 1 of them."""
        return self.tokens[max(end - self.storage.n + 1, 0):end]

    def _learn(self, token):
        self.storage.add(self._context(len(self.tokens)), [token])

    def _continue(self, k):
        context, draft = self._context(len(self.tokens)), []
        while len(draft) < k and (token := self.storage.lookup(context)) is not None:
            draft.append(token)
            context.append(token)
        return draft

    def observe_target(self, target_probs: torch.Tensor) -> None:
        """The filler: count the target's top-k at each position the last step committed.

        ``target_probs`` (m, vocab) are the target's distributions at the m = accepted + 1
        positions the last ``update`` committed; row i predicted the i-th of them. Tokens with
        q = 0 (cut by the sampler's warp) are skipped: the target cannot emit them.
        """
        if not self.filler_top_k:
            return
        values, indices = target_probs.topk(min(self.filler_top_k, target_probs.shape[-1]))  # (m, top_k) each
        first = len(self.tokens) - target_probs.shape[0]  # position of the token row 0 predicted
        for row, (probs, tokens) in enumerate(zip(values.tolist(), indices.tolist())):
            self.storage.add(self._context(first + row), [token for token, prob in zip(tokens, probs) if prob > 0])

    def __repr__(self):
        return (f"NGramDrafter(n={self.storage.n}, storage={self.storage.kind!r}, filler_top_k={self.filler_top_k}, "
                f"stop_if_unknown={self.stop_if_unknown}, reset={self.reset})")

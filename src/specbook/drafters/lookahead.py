"""Lookahead decoding (Fu et al. 2024): the target drafts for itself, by Jacobi iteration.

No draft model, no trained heads, no repetitive prompt. Every target call carries two branches
after the pending token, under one attention mask:

- the *lookahead branch*, a window of W columns and up to N - 1 levels of guessed tokens. Level 0
  is a chain of W guesses for the positions after the pending token; the token of level j in
  column i sits one position after the token of level j - 1 in the same column, and sees the
  level-0 tokens of columns 0..i and the earlier levels of its own column. So each column is
  a diagonal trajectory of Jacobi iteration, and the target's greedy token after the last level
  of column i is one more step of it (Section 3.1, Figure 2). Those W new tokens become the
  newest level, the oldest level is dropped, and each column leaves behind an N-gram: its N - 1
  levels and the new token (Section 3.2). The branch is a token tree (level 0 a chain from the
  pending token, every other token a child of the level below it in its column), so the tree
  mask and depth positions of `specbook.trees` build its mask -- drawn in chapter 6.
- the *verification branch*: the pool's N-grams that start with the pending token, up to
  ``candidates`` of them, their remaining N - 1 tokens merged into a trie (shared prefixes share
  nodes), verified as a token tree by the engine (Section 3.3).

The lookahead rows reach the engine as the `Draft`'s side tree: the target scores them in the
same call, the drafter reads their logits (`observe_side`), and the KV cache keeps only the
accepted path. At the start the window holds one level of tokens taken from the prompt; it gains
a level per call until it has N - 1 (the paper's warm-up), and only then leaves N-grams behind.

Exactness: the candidates are deterministic (p one-hot) and siblings in the trie are distinct
tokens, so the tree rule of `specbook.trees` -- accept x with probability q(x), else remove x
from q and try the next sibling -- keeps the output distributed exactly as the target's, greedy
or sampled. (The paper's sampling variant is this rule.) The lookahead branch itself is greedy
Jacobi iteration whatever the sampler: it only decides what is proposed, never what is accepted.
"""

import random

import torch

from ..policies import check_integer
from .base import Draft, Drafter


def lookahead_parents(window: int, levels: int) -> list[int]:
    """The parents of a lookahead window's tokens, level by level (token (j, i) is node j * window + i).

    Level 0 is a chain from the pending token (-1); token (j, i), j >= 1, continues token (j - 1, i).
    So token (j, i) sits at depth i + j + 1 and sees level 0 up to column i and its own column below it.
    """
    return [i - 1 if j == 0 else (j - 1) * window + i for j in range(levels) for i in range(window)]


def merge_candidates(candidates: list[tuple[int, ...]]) -> tuple[list[int], list[int]]:
    """Merge token sequences into a trie after the pending token: (tokens, parents), parents before children.

    Sequences that share a prefix share its nodes, so siblings are distinct tokens.
    """
    tokens, parents, index = [], [], {}  # index: (parent, token) -> node
    for candidate in candidates:
        parent = -1
        for token in candidate:
            if (parent, token) not in index:
                index[parent, token] = len(tokens)
                tokens.append(token)
                parents.append(parent)
            parent = index[parent, token]
    return tokens, parents


class LookaheadDrafter(Drafter):
    """Lookahead decoding: a Jacobi window of ``window`` (W) columns and ``ngram`` - 1 levels, an N-gram
    pool, and up to ``candidates`` (G) of the pool's N-grams verified per call (Fu et al. 2024, Algorithm 1).

    The pool keeps, for every first token, its ``candidates`` most recent distinct N-grams. A step
    with draft length k verifies their first min(k, N - 1) tokens. Run it with ``k = ngram - 1``.
    """

    drafts_trees = True

    def __init__(self, window: int = 5, ngram: int = 4, candidates: int = 5):
        check_integer("window", window, 1)
        check_integer("ngram", ngram, 2)
        check_integer("candidates", candidates, 1)
        self.window, self.ngram, self.candidates = window, ngram, candidates

    def start(self, input_ids: torch.Tensor) -> None:
        self.device = input_ids.device
        prompt = input_ids[0].tolist()
        self.pending = prompt[-1]
        self.levels = [random.Random(0).choices(prompt, k=self.window)]  # level 0: guesses from the prompt
        self.pool = {}  # first token -> {its N - 1 next tokens: None}, oldest first

    def propose(self, k, sampler, generator, keep_drafting=None):
        depth = min(k, self.ngram - 1)
        candidates = [ngram[:depth] for ngram in reversed(self.pool.get(self.pending, {}))]  # newest first
        tokens, parents = merge_candidates(candidates)
        side = [token for level in self.levels for token in level]
        return Draft(torch.tensor(tokens, dtype=torch.long, device=self.device), parents=parents,
                     side_tokens=torch.tensor(side, dtype=torch.long, device=self.device),
                     side_parents=lookahead_parents(self.window, len(self.levels)))

    def observe_side(self, logits):
        """One Jacobi step: the target's greedy token after each column's last level is its new level."""
        new = logits[-self.window:].argmax(-1).tolist()  # (W,): the rows of the last level
        if len(self.levels) == self.ngram - 1:  # a full window: each column leaves its N-gram, the oldest level goes
            for column, first in enumerate(self.levels[0]):
                self._remember(first, tuple(level[column] for level in self.levels[1:]) + (new[column],))
            self.levels = self.levels[1:]
        self.levels.append(new)

    def _remember(self, first: int, rest: tuple[int, ...]) -> None:
        ngrams = self.pool.setdefault(first, {})
        ngrams.pop(rest, None)
        ngrams[rest] = None  # the newest last
        if len(ngrams) > self.candidates:
            del ngrams[next(iter(ngrams))]

    def update(self, num_accepted, next_token, path=None):
        self.pending = next_token

    def __repr__(self):
        return f"LookaheadDrafter(window={self.window}, ngram={self.ngram}, candidates={self.candidates})"

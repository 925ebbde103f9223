"""Checkers for the exercises of chapter 6b, lookahead, self-speculation and the whole family: one
Jacobi iteration, the parents of lookahead's window, the N-grams a full window leaves behind, and
the speedup of a draft made of the target's first layers.

The references are the package's where it has one: `specbook.drafters.lookahead.lookahead_parents`
for the window and `specbook.theory.speedup` for the speedup, with c = exit_layer / layers +
overhead. The other two are written here from the package's rules: a Jacobi iteration takes every
new guess from one causal call on the prompt and the old guesses (row len(prompt) - 1 + i predicts
guess i), and a full window leaves one N-gram per column, its levels oldest first and then its new
token, as `LookaheadDrafter.observe_side` does (tests/test_exercises.py checks both against the
package). The Jacobi cases run on small deterministic rules and on tiny random models
(`specbook.exercises.tiny`), never the book's trained pair.
"""

from __future__ import annotations

import math
import random

import torch

from ..drafters.lookahead import lookahead_parents
from ..theory import expected_tokens_per_step, speedup
from .ch03 import _tokens_per_step_error
from .core import Case, Check, _as_float, _as_int, _as_ints, _as_token_list, _same_number, _type_name, _Wrong
from .tiny import random_prompt, tiny_model

# --- One Jacobi iteration ---------------------------------------------------------------------------


class GreedyRows:
    """``next_tokens(tokens)``: one causal call; entry t is the model's greedy token after tokens[:t + 1].

    The model is a rule on prefixes (``rule(prefix) -> token``) or a Hugging Face causal LM. Every
    call's length is appended to ``calls``, so a checker can tell one call from m calls; `rows`
    gives the same answer without recording it.
    """

    def __init__(self, label: str, rule=None, model=None):
        self.label, self._rule, self._model = label, rule, model
        self.calls: list[int] = []

    def __call__(self, tokens) -> list[int]:
        tokens = _as_token_list(tokens, "next_tokens: a list of token ids") if isinstance(tokens, torch.Tensor) \
            else [int(token) for token in tokens]
        self.calls.append(len(tokens))
        return self.rows(tokens)

    def rows(self, tokens: list[int]) -> list[int]:
        if not tokens:
            raise ValueError("next_tokens needs at least one token: row t predicts the token after tokens[:t + 1]")
        if self._model is None:
            return [self._rule(tokens[: t + 1]) for t in range(len(tokens))]
        with torch.inference_mode():
            return self._model(torch.tensor([tokens])).logits[0].argmax(-1).tolist()  # (len(tokens),)

    def __repr__(self) -> str:
        return f"<next_tokens of {self.label}>"


def jacobi_reference(next_tokens, prompt: list[int], guesses: list[int]) -> list[int]:
    """One Jacobi iteration: new guess i is the greedy token after prompt + guesses[:i], all from one call."""
    rows = next_tokens(prompt + guesses)  # (len(prompt) + m,)
    return rows[len(prompt) - 1: len(prompt) - 1 + len(guesses)]


def greedy_continuation(next_tokens, prompt: list[int], m: int) -> list[int]:
    """The m greedy tokens after ``prompt``, one call per token: the fixed point of Jacobi iteration."""
    tokens = list(prompt)
    for _ in range(m):
        tokens.append(next_tokens(tokens)[-1])
    return tokens[len(prompt):]


def _counting(prefix):
    return (prefix[-1] + 1) % 10


def _bigram_rule(seed: int, vocab: int = 16):
    table = random.Random(seed).choices(range(vocab), k=vocab)
    return lambda prefix: table[prefix[-1]]


def _trigram_rule(prefix):
    last = ([0, 0] + list(prefix))[-3:]
    return (5 * last[2] + 3 * last[1] + last[0] + len(prefix)) % 16


def _jacobi_cases() -> list[Case]:
    rng = random.Random(65)
    models = {"counting": ("a counting rule: the token after t is t + 1 (mod 10)", {"rule": _counting}),
              "bigram": ("a bigram table over 16 tokens", {"rule": _bigram_rule(66)}),
              "trigram": ("a rule that reads the last three tokens", {"rule": _trigram_rule}),
              "tiny 0": ("a tiny random model", {"model": tiny_model(0)}),
              "tiny 1": ("another tiny random model", {"model": tiny_model(1)})}

    def rows(model):  # a fresh recorder for every case
        label, how = models[model]
        return GreedyRows(label, **how)

    def guesses(model, prompt, m, right=0, vocab=16):
        """m guesses whose first ``right`` are the greedy tokens and the rest wrong."""
        greedy = greedy_continuation(rows(model).rows, prompt, m)
        return greedy[:right] + [(token + 1 + rng.randrange(vocab - 1)) % vocab for token in greedy[right:]]

    tiny_prompts = [random_prompt(67, 6)[0].tolist(), random_prompt(68, 3)[0].tolist()]
    settings = [  # (label, model, prompt, guesses)
        ("random guesses", "trigram", [1, 5, 2], guesses("trigram", [1, 5, 2], 4)),
        ("every guess wrong", "counting", [3], [0, 0, 0]),
        ("random guesses", "bigram", [4, 9, 1, 12], guesses("bigram", [4, 9, 1, 12], 5)),
        ("the guesses are the greedy output already: a fixed point", "bigram", [7, 2],
         greedy_continuation(rows("bigram").rows, [7, 2], 6)),
        ("the first 2 guesses right", "trigram", [1, 5, 2], guesses("trigram", [1, 5, 2], 6, right=2)),
        ("one guess after a one-token prompt", "trigram", [11], [3]),
        ("random guesses", "tiny 0", tiny_prompts[0], guesses("tiny 0", tiny_prompts[0], 5, vocab=48)),
        ("the first 3 guesses right", "tiny 1", tiny_prompts[1], guesses("tiny 1", tiny_prompts[1], 6, 3, vocab=48)),
        ("ten random guesses", "trigram", [2, 2, 9, 14], guesses("trigram", [2, 2, 9, 14], 10)),
    ]
    cases = []
    for label, model, prompt, old in settings:
        next_tokens = rows(model)
        cases.append(Case(f"{next_tokens.label}, {label}: prompt {prompt}, guesses {old}", (next_tokens, prompt, old),
                          jacobi_reference(next_tokens.rows, prompt, old)))
    return cases


def _compare_jacobi(got, case: Case) -> str | None:
    next_tokens, prompt, guesses = case.args
    new = _as_ints(got, "the new guesses, a list of token ids", "a token id")
    expected, m, calls = case.expected, len(guesses), next_tokens.calls
    rows = next_tokens.rows(prompt + guesses)
    if new == expected:
        if len(calls) > 1:
            return (f"the right guesses, but from {len(calls)} calls of next_tokens. One Jacobi iteration is one "
                    "call: next_tokens(prompt + guesses) gives every row at once, and row len(prompt) - 1 + i "
                    "predicts guess i.")
        return None
    message = f"expected {expected}, got {new}"
    if len(new) != m:
        if new == rows:
            return (f"{message}: that is every row of prompt + guesses. Keep the {m} rows that predict the guessed "
                    f"positions, len(prompt) - 1 … len(prompt) + {m} - 2.")
        return f"{message}: one new guess for each of the {m} old ones."
    if new == greedy_continuation(next_tokens.rows, prompt, m):  # Gauss–Seidel: each guess from the new ones
        return (f"{message}: that updates the guesses one at a time, each from the ones just updated (Gauss–Seidel): "
                "that is greedy decoding, one call per token. Jacobi computes every new guess from the old guesses, "
                "all in one call.")
    if new == rows[len(prompt): len(prompt) + m]:
        return (f"{message}: each guess is taken from its own row, one position too far. Row t predicts the token "
                "after it, so guess i comes from the row before it, len(prompt) - 1 + i.")
    if new == next_tokens.rows(guesses):
        return f"{message}: the prompt is left out. The guesses continue the prompt: call it on prompt + guesses."
    if new == guesses:
        return f"{message}: those are the old guesses, unchanged."
    if new[0] != expected[0]:
        return (f"{message}: the first new guess is the target's token after the prompt alone, right after one "
                "iteration whatever the old guesses were.")
    return f"{message}. New guess i is the target's greedy token after prompt + guesses[:i], the old guesses."


def _jacobi_error(error: Exception, case: Case) -> str | None:
    if isinstance(error, IndexError):
        _, prompt, guesses = case.args
        return (f"next_tokens(prompt + guesses) returns {len(prompt) + len(guesses)} rows; guess i comes from row "
                "len(prompt) - 1 + i.")
    return None


check_jacobi_step = Check("jacobi_step", _jacobi_cases, _compare_jacobi, error_hint=_jacobi_error)


# --- The lookahead window as a tree -----------------------------------------------------------------------


def _window_cases() -> list[Case]:
    settings = [
        ("one token", 1, 1),
        ("one level, the first call of the warm-up: a chain", 4, 1),
        ("one column of three levels", 1, 3),
        ("two levels", 3, 2),
        ("the paper's W = 5 with N = 4: three levels", 5, 3),
        ("many levels", 2, 5),
        ("a wide window", 7, 4),
        ("a wide window of many levels", 4, 6),
    ]
    return [Case(f"{label}: window = {window}, levels = {levels}", (window, levels), lookahead_parents(window, levels))
            for label, window, levels in settings]


def _column_major(window: int, levels: int) -> list[int]:
    """The window's parents with the tokens numbered column by column, token (j, i) as node i × levels + j."""
    return [(-1 if i == 0 else (i - 1) * levels) if j == 0 else i * levels + j - 1
            for i in range(window) for j in range(levels)]


def _compare_window(got, case: Case) -> str | None:
    window, levels = case.args
    parents, expected = _as_ints(got, "a list of parents", "a parent index"), case.expected
    if parents == expected:
        return None
    if len(parents) != len(expected):
        return (f"expected {len(expected)} parents, one for each of the W × levels = {window} × {levels} tokens, "
                f"got {len(parents)}.")

    def name(node: int) -> str:
        return "the pending token (-1)" if node == -1 else f"token {divmod(node, window)} (node {node})"

    node = next(node for node, (a, b) in enumerate(zip(parents, expected)) if a != b)
    level, column = divmod(node, window)
    got_name = name(parents[node]) if -1 <= parents[node] < len(expected) else f"{parents[node]}, not a node"
    message = f"token ({level}, {column}) (node {node}) should continue {name(expected[node])}, got {got_name}"
    if parents == [parent + 1 for parent in expected]:
        return (f"{message}: every parent is one too high, as if the pending token were node 0 (it is row 0 of the "
                "mask). Nodes count from 0, and -1 is the pending token.")
    if parents == _column_major(window, levels):
        return (f"{message}: that numbers the window column by column. Number it level by level, token (j, i) as "
                "node j × W + i: the drafter lays its levels side by side, level 0 first.")
    if level == 0:
        return (f"{message}. Level 0 is a chain after the pending token, guesses for consecutive positions: token "
                "(0, i) continues (0, i - 1), and (0, 0) the pending token.")
    if all(parents[j * window + i] == (-1 if i == 0 else j * window + i - 1)
           for j in range(levels) for i in range(window)):
        return (f"{message}: that makes each level a chain of its own. A level j ≥ 1 token continues the token "
                "below it in its column, one step further along that column's Jacobi trajectory.")
    return (f"{message}. Number the window level by level, node j × W + i for token (j, i); a token of level "
            "j ≥ 1 continues the token below it in its own column.")


check_window_parents = Check("window_parents", _window_cases, _compare_window)


# --- What a full window leaves behind ------------------------------------------------------------------


def collect_ngrams_reference(levels: list[list[int]], new: list[int]) -> list[tuple[int, tuple[int, ...]]]:
    """The N-grams a full window leaves behind, one per column i, in column order, duplicates included:
    (levels[0][i], (levels[1][i], …, levels[N - 2][i], new[i])), as `LookaheadDrafter.observe_side` stores them."""
    return [(first, tuple(level[column] for level in levels[1:]) + (new[column],))
            for column, first in enumerate(levels[0])]


def _collect_cases() -> list[Case]:
    rng = random.Random(69)

    def window(width, ngram, vocab=10):
        levels = [[rng.randrange(vocab) for _ in range(width)] for _ in range(ngram - 1)]
        return levels, [rng.randrange(vocab) for _ in range(width)]

    settings = [
        ("W = 3, N = 3", [[1, 2, 3], [4, 5, 6]], [7, 8, 9]),
        ("W = 1, N = 2: one bigram", [[5]], [6]),
        ("N = 2: one level, bigrams", [[3, 1, 4, 1]], [5, 9, 2, 6]),
        ("two columns alike: both N-grams, duplicates included", [[2, 7, 2], [8, 1, 8], [4, 4, 4]], [0, 3, 0]),
        ("the paper's W = 5, N = 4", *window(5, 4)),
        ("W = 2, N = 6", *window(2, 6)),
        ("W = 7, N = 5", *window(7, 5, vocab=6)),
        ("W = 1, N = 4", *window(1, 4)),
    ]
    return [Case(f"{label}: levels {levels}, new {new}", (levels, new), collect_ngrams_reference(levels, new))
            for label, levels, new in settings]


def _read_ngrams(got, ngram: int) -> list[tuple[int, tuple[int, ...]]]:
    """A list of (first, rest) pairs, rest a tuple of ints, from a list or tuple of pairs."""
    if not isinstance(got, (list, tuple)):
        raise _Wrong(f"expected a list of (first, rest) pairs, got {_type_name(got)}.")
    pairs = []
    for item in got:
        if isinstance(item, (list, tuple)) and len(item) == ngram and ngram > 2 and \
                all(isinstance(token, int) for token in item):
            raise _Wrong(f"got the N-gram {tuple(item)} as one flat tuple. Return it as a pair (first, rest), "
                         f"({item[0]}, {tuple(item[1:])}): the pool files it under its first token.")
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise _Wrong(f"expected pairs (first, rest), got {item!r}.")
        first, rest = item
        rest = [rest] if isinstance(rest, int) else rest
        pairs.append((_as_int(first, "a first token"), tuple(_as_ints(rest, "the rest, a tuple of tokens", "a token"))))
    return pairs


def _compare_collect(got, case: Case) -> str | None:
    levels, new = case.args
    ngram, width = len(levels) + 1, len(new)
    ngrams, expected = _read_ngrams(got, ngram), case.expected
    if ngrams == expected:
        return None
    message = f"expected {expected}, got {ngrams}"
    across = [(level[0], tuple(level[1:])) for level in levels + [new]]
    if ngrams in (across, across[:-1]):
        return (f"{message}: that reads the levels across. A level holds one iteration's guesses for {width} "
                "consecutive positions; an N-gram runs down a column: its levels, oldest first, then its new token.")
    if len(ngrams) != width:
        if set(ngrams) == set(expected):
            return (f"{message}: keep one N-gram per column, in column order, duplicates included. Removing them is "
                    "the pool's job.")
        return f"{message}: one N-gram for each of the W = {width} columns."
    column = next(column for column, (a, b) in enumerate(zip(ngrams, expected)) if a != b)
    message = f"column {column} should leave {expected[column]}, got {ngrams[column]}"
    if ngrams == [(first, rest[:-1]) for first, rest in expected]:
        return (f"{message}: the new token is missing. It is the N-th token, the target's greedy token after the "
                "column's last level.")
    if all(len(rest) == ngram - 1 for _, rest in ngrams) and \
            ngrams == [(new[i], tuple(level[i] for level in reversed(levels))) for i in range(width)]:
        return f"{message}: newest first. An N-gram reads down the column in order: level 0, level 1, …, then new."
    if len(ngrams[column][1]) != ngram - 1:
        return (f"{message}: the rest has N - 1 = {ngram - 1} tokens, levels 1 … N - 2 of the column and its new "
                "token.")
    return (f"{message}. Column i leaves (levels[0][i], (levels[1][i], …, levels[N - 2][i], new[i])): its "
            "tokens oldest first, then the new one.")


check_collect_ngrams = Check("collect_ngrams", _collect_cases, _compare_collect)


# --- When does self-speculation pay? -----------------------------------------------------------------------


def self_speculative_reference(alpha: float, k: int, layers: int, exit_layer: int, overhead: float) -> float:
    """Chapter 3's speedup with c = exit_layer / layers + overhead: a draft call runs the target's first
    exit_layer of its layers, plus the embedding, the exit head and the fixed cost of a call."""
    return speedup(alpha, k, exit_layer / layers + overhead)


def _self_speculative_cases() -> list[Case]:
    settings = [  # (label, alpha, k, layers, exit_layer, overhead)
        ("a quarter of the layers", 0.8, 4, 12, 3, 0.05),
        ("a 32-layer target", 0.6, 2, 32, 8, 0.02),
        ("half the layers, K = 1", 0.5, 1, 24, 12, 0.1),
        ("no overhead", 0.9, 6, 12, 6, 0.0),
        ("a shallow exit that is often wrong: slower than plain decoding", 0.3, 3, 12, 2, 0.2),
        ("an exit head that is never right", 0.0, 2, 16, 4, 0.05),
        ("an 80-layer target", 0.75, 5, 80, 20, 0.01),
        ("the whole target as its own draft: always accepted, and no faster", 1.0, 3, 12, 12, 0.0),
    ]
    return [Case(f"{label}: alpha = {alpha}, k = {k}, layers = {layers}, exit_layer = {exit_layer}, "
                 f"overhead = {overhead}", (alpha, k, layers, exit_layer, overhead),
                 self_speculative_reference(alpha, k, layers, exit_layer, overhead))
            for label, alpha, k, layers, exit_layer, overhead in settings]


def _compare_self_speculative(got, case: Case) -> str | None:
    alpha, k, layers, exit_layer, overhead = case.args
    got = _as_float(got, "a number")
    if _same_number(got, case.expected):
        return None
    cost_ratio = exit_layer / layers + overhead
    message = f"expected a speedup of {case.expected:.6g}, got {got:.6g}"
    if math.isnan(got) or math.isinf(got):
        return (f"{message}. At α = 1 the closed form is 0/0: every draft is accepted and a step emits K + 1 tokens. "
                "Sum the series, or use specbook.expected_tokens_per_step.")
    tokens = expected_tokens_per_step(alpha, k)
    mistakes = [
        (speedup(alpha, k, exit_layer / layers),
         "the overhead is left out. A draft call also pays the embedding, the exit head and the fixed cost of a "
         "call: c = exit_layer / layers + overhead"),
        (speedup(alpha, k, layers / exit_layer + overhead),
         "c is upside down. It is the draft's cost relative to the target's: the share of the layers it runs, "
         "exit_layer / layers, plus the overhead"),
        (tokens / (k * exit_layer / layers + overhead + 1),
         "the overhead is paid once per step. Every one of the K draft calls pays it: c·K, with the overhead in c"),
        (tokens / (cost_ratio * (k + 1) + 1),
         "that runs K + 1 draft calls. A step drafts K tokens, then one target call checks them"),
        (tokens, "that is the tokens per step, not divided by the cost of a step, c·K + 1 target calls"),
        (tokens / (cost_ratio * k + 1 + overhead),
         "the target call pays the overhead on top of its 1. Count a target call as 1, everything included"),
    ]
    for value, mistake in mistakes:
        if _same_number(got, value):
            return f"{message}: {mistake}."
    return (f"{message}. With c = exit_layer / layers + overhead = {cost_ratio:.4g}, chapter 3's speedup is "
            "(1 − α^(K+1)) / ((1 − α)(c·K + 1)).")


check_self_speculative_speedup = Check("self_speculative_speedup", _self_speculative_cases, _compare_self_speculative,
                                       error_hint=_tokens_per_step_error)  # alpha first, as in chapter 3

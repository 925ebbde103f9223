"""Checkers for the exercises of chapter 6c, four more systems: how many tokens of a block blockwise
parallel decoding accepts, the multi-token loss, how many siblings CaPE adds at each depth of GliDe's
chain, and the phrases Ouroboros' pool offers after a token.

The references are the package's where it has one: `specbook.drafters.CaPE`'s ``expand``, run on
probability rows built with the given top-1 probabilities, for the siblings, and
`specbook.drafters.ouroboros.PhrasePool` for the phrases. The other two are written here from the
package's rules: k̂ is the leading run of block tokens equal to the base model's choices, as the
engine's greedy verification accepts a `BlockwiseDrafter`'s block, and the multi-token loss is the
sum over heads of each head's mean cross entropy, as `specbook.train.heads.mtp_loss` computes it
(tests/test_exercises.py checks both against the package). Every case is a small list or a seeded
random tensor: no model, trained or random, is needed.
"""

from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F

from ..drafters.glide import BINS, CaPE
from ..drafters.ouroboros import PhrasePool
from .core import Case, Check, _as_float, _as_int, _as_ints, _type_name, _Wrong

# --- Blockwise acceptance ------------------------------------------------------------------------------


def blockwise_accept_reference(block: list[int], base_choices: list[int]) -> int:
    """k̂: the number of leading block tokens equal to the base model's choices (0 for an empty block)."""
    return next((i for i, (guess, choice) in enumerate(zip(block, base_choices)) if guess != choice), len(block))


def _blockwise_cases() -> list[Case]:
    settings = [  # (label, block, base_choices)
        ("a block of 4, the second guess wrong, the later ones right", [7, 3, 9, 1], [7, 5, 9, 1]),
        ("every guess right", [2, 8, 8, 4, 6], [2, 8, 8, 4, 6]),
        ("the third guess wrong, the fourth right again", [5, 1, 4, 4, 2, 0], [5, 1, 3, 4, 7, 0]),
        ("a block of one: plain greedy decoding", [11], [11]),
        ("an empty block", [], []),
        ("the last guess wrong", [9, 9, 9, 2], [9, 9, 9, 9]),
        ("the paper's k = 8, the first five right", [4, 0, 6, 6, 3, 5, 2, 2], [4, 0, 6, 6, 3, 1, 2, 2]),
        ("a block of 2, both right", [13, 13], [13, 13]),
        ("only ŷ_1 right", [3, 3, 3], [3, 1, 3]),
    ]
    return [Case(f"{label}: block {block}, base_choices {choices}", (block, choices),
                 blockwise_accept_reference(block, choices)) for label, block, choices in settings]


def _compare_blockwise(got, case: Case) -> str | None:
    block, choices = case.args
    got, expected = _as_int(got, "k̂, the number of block tokens accepted"), case.expected
    if got == expected:
        return None
    message = f"expected k̂ = {expected}, got {got}"
    if not block:
        return f"{message}: an empty block has no token to accept, so k̂ = 0."
    if got == sum(guess == choice for guess, choice in zip(block, choices)):
        return (f"{message}: that counts every position where the block matches, not the leading run. After the "
                "first mismatch the base model's choices were made on a text the block got wrong: stop there.")
    if expected == len(block) and got == len(block) - 1:
        return (f"{message}: the block's last token is never compared. Every one of the k tokens is checked, and "
                "when all match, k̂ = k.")
    if got == expected + 1:
        return (f"{message}: one too many, as if a bonus token came with the block. The base model's choice after "
                "ŷ_k̂ is not in this block: it is the next block's ŷ_1.")
    if got == expected - 1:
        return (f"{message}: one short. k̂ counts ŷ_1 too, the base model's own choice, which always passes: "
                "k̂ >= 1 for a block that is not empty.")
    return f"{message}. k̂ is the largest n with ŷ_i == c_i for every i <= n."


check_blockwise_accept = Check("blockwise_accept", _blockwise_cases, _compare_blockwise)


# --- The multi-token loss -------------------------------------------------------------------------------


def multi_token_loss_reference(logits: torch.Tensor, tokens: torch.Tensor) -> float:
    """Σ_i of head i's mean cross entropy on tokens[t + 1 + i], over the T - 1 - i positions t that have one.

    ``logits`` (n, T, vocab): head i (0-based) at every position of one text; ``tokens`` (T,).
    """
    heads, length, _ = logits.shape
    return float(sum(F.cross_entropy(logits[i, : length - 1 - i], tokens[1 + i:]) for i in range(heads)))


def _multi_token_cases() -> list[Case]:
    generator = torch.Generator().manual_seed(62)
    settings = [  # (label, heads, length, vocab, scale)
        ("two heads", 2, 6, 8, 2.0),
        ("one head: the next-token loss", 1, 7, 10, 2.0),
        ("the paper's n = 4", 4, 12, 16, 2.0),
        ("three heads, the last with one target", 3, 4, 6, 2.0),
        ("three heads on a longer text", 3, 20, 12, 1.0),
        ("two confident heads", 2, 9, 5, 6.0),
        ("four heads, the last with one target", 4, 5, 9, 3.0),
        ("two heads on three tokens", 2, 3, 7, 2.0),
    ]
    cases = []
    for label, heads, length, vocab, scale in settings:
        logits = scale * torch.randn(heads, length, vocab, generator=generator, dtype=torch.float64)
        tokens = torch.randint(vocab, (length,), generator=generator)
        cases.append(Case(f"{label}: n = {heads}, T = {length}, vocab = {vocab}", (logits, tokens),
                          multi_token_loss_reference(logits, tokens)))
    return cases


def _head_terms(logits, tokens, shift=1):
    """Per head i, the cross entropies (positions,) on tokens[t + shift + i], for the positions that have one."""
    heads, length, _ = logits.shape
    return [F.cross_entropy(logits[i, : max(length - shift - i, 0)], tokens[shift + i:], reduction="none")
            for i in range(heads)]


def _multi_token_variants(logits, tokens) -> list[tuple[float, str]]:
    heads, length, _ = logits.shape
    terms = _head_terms(logits, tokens)
    pad = torch.zeros(heads, dtype=tokens.dtype)
    mistakes = [
        (sum(F.cross_entropy(logits[i, :-1], tokens[1:]) for i in range(heads)),
         "every head is scored on the next token. Head i predicts the token i + 1 ahead, tokens[t + 1 + i]"),
        (sum(F.cross_entropy(logits[i], tokens.roll(-1 - i)) for i in range(heads)),
         "the targets wrap around the end of the text. Head i has targets at the first T - 1 - i positions "
         "only: score those and no others"),
        (sum(F.cross_entropy(logits[i], torch.cat([tokens[1 + i:], pad[: i + 1]])) for i in range(heads)),
         "the targets are padded past the end with real token ids, so the last positions are scored on tokens "
         "that are not there. Score head i on its first T - 1 - i positions only"),
        (sum(term.mean() for term in _head_terms(logits, tokens, shift=0)),
         "the shift is one short: head i is scored on tokens[t + i], head 0 on the token it already reads. "
         "Head i predicts tokens[t + 1 + i]"),
        (sum(term.mean() for term in _head_terms(logits, tokens, shift=2)),
         "the shift is one too far: head i is scored on tokens[t + 2 + i]. Head 0 is the next-token head, "
         "scored on tokens[t + 1]"),
        (sum(term.mean() for term in terms) / heads,
         "that is the mean over the heads. The multi-token loss adds the heads' losses: sum them"),
        (torch.cat(terms).mean(),
         "that pools every head's positions into one mean, which weighs the heads by their number of targets. "
         "Take each head's mean, then sum the heads"),
        (sum(term.sum() for term in terms),
         "that sums over the positions. Take each head's mean over its positions (as F.cross_entropy does), "
         "then sum the heads"),
        (-sum(term.mean() for term in terms), "the sign is wrong: a cross entropy is a negative log-likelihood"),
    ]
    return [(float(value), mistake) for value, mistake in mistakes]


def _compare_multi_token(got, case: Case) -> str | None:
    got = _as_float(got, "the loss, a number")
    if math.isclose(got, case.expected, rel_tol=1e-6, abs_tol=1e-9):
        return None
    message = f"expected a loss of {case.expected:.6g}, got {got:.6g}"
    if math.isnan(got):
        return (f"{message}: the mean of no terms is NaN. Head i has T - 1 - i targets; are your slices of the "
                "logits and the tokens the same length?")
    for value, mistake in _multi_token_variants(*case.args):
        if math.isclose(got, value, rel_tol=1e-6, abs_tol=1e-9):
            return f"{message}: {mistake}."
    return (f"{message}. Head i's logits at positions 0 … T - 2 - i against tokens[1 + i:], one mean cross "
            "entropy per head, summed over the heads.")


def _multi_token_error(error: Exception, case: Case) -> str | None:
    if isinstance(error, (ValueError, RuntimeError)) and ("size" in str(error) or "shape" in str(error)):
        return ("Head i has T - 1 - i positions with a target: slice its logits [: T - 1 - i] and the tokens "
                "[1 + i:], the same length.")
    return None


check_multi_token_loss = Check("multi_token_loss", _multi_token_cases, _compare_multi_token,
                               error_hint=_multi_token_error)


# --- CaPE's proposal -------------------------------------------------------------------------------------


VOCAB = 64  # the rows' width: more tokens than any bin asks for


def confidence_rows(top1_probs: list[float], seed: int) -> torch.Tensor:
    """(n, VOCAB) float64 distributions whose largest entry is top1_probs[i], at a random token; the rest of the
    mass spread over the other tokens, each below it (for top-1 probabilities of 0.05 and up)."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for top1 in top1_probs:
        rest = torch.rand(VOCAB - 1, generator=generator, dtype=torch.float64) * 0.5 + 0.5
        rest = rest / rest.sum() * (1 - top1)
        index = int(torch.randint(VOCAB, (1,), generator=generator))
        rows.append(torch.cat([rest[:index], torch.tensor([top1], dtype=torch.float64), rest[index:]]))
    return torch.stack(rows)


def cape_siblings_reference(rows: torch.Tensor, bins, budget: int) -> list[int]:
    """The siblings per depth of `CaPE`'s tree for the greedy chain of ``rows`` (n, vocab)."""
    chain = rows.argmax(-1)  # (n,)
    draft = CaPE(budget, bins).expand(chain, rows)
    extra = draft.parents[len(chain):]  # a sibling of d_i is a child of d_i's parent, node i - 1
    return [extra.count(depth - 1) for depth in range(len(chain))]


PAPER_BINS = (8, 8, 8, 6, 6, 6, 4, 4, 2, 2, 2, 2)  # Du et al.'s bins for Vicuna


def _cape_cases() -> list[Case]:
    settings = [  # (label, top1_probs, bins, budget)
        ("one unsure depth", [0.25], BINS, 10),
        ("a confident chain", [0.93, 0.85, 0.97], BINS, 10),
        ("a budget of 5 for a chain of 3", [0.18, 0.26, 0.09], BINS, 5),
        ("an unsure chain, the budget runs out", [0.12, 0.31, 0.07, 0.22], BINS, 10),
        ("middling confidence", [0.45, 0.62, 0.78, 0.55], BINS, 10),
        ("bins read with floor(10 p)", [0.36, 0.78, 0.17], BINS, 12),
        ("p = 1.0 and a table of five bins", [1.0, 0.05, 0.72], (3, 3, 2, 2, 1), 10),
        ("the paper's bins", [0.18, 0.43, 0.67, 0.91, 0.29, 0.55], PAPER_BINS, 30),
        ("a budget equal to the chain: no room", [0.1, 0.2], BINS, 2),
        ("the paper's first ten bins, a sure depth", [0.64, 1.0, 0.23, 0.38], PAPER_BINS[:10], 20),
    ]
    rng = random.Random(63)
    top1 = [round(rng.uniform(0.05, 0.99), 3) for _ in range(10)]
    settings.append(("ten random depths", top1, BINS, 16))
    cases = []
    for number, (label, probs, bins, budget) in enumerate(settings):
        rows = confidence_rows(probs, seed=630 + number)
        read = rows.max(-1).values.tolist()  # (n,): what CaPE reads, to the last bit
        cases.append(Case(f"{label}: top1_probs {probs}, bins {bins}, budget = {budget}", (read, bins, budget),
                          cape_siblings_reference(rows, bins, budget)))
    return cases


def _siblings_by_rule(top1_probs, bins, budget, *, greedy=1, shared=True, limited=True, deepest_first=False,
                      bin_of=lambda p: int(10 * p)) -> list[int]:
    """The siblings per depth by CaPE's rule, and with switches the usual mistakes (for naming them)."""
    room = (budget - len(top1_probs) if shared else budget) if limited else math.inf
    counts = [0] * len(top1_probs)
    depths = range(len(top1_probs))
    for depth in reversed(depths) if deepest_first else depths:
        wanted = bins[min(bin_of(top1_probs[depth]), len(bins) - 1)] - greedy
        counts[depth] = max(0, min(wanted, room))
        room -= counts[depth]
    return counts


def _compare_cape(got, case: Case) -> str | None:
    top1_probs, bins, budget = case.args
    counts, expected = _as_ints(got, "a list of sibling counts, one per depth", "a count"), case.expected
    if counts == expected:
        return None
    message = f"expected {expected}, got {counts}"
    if len(counts) != len(expected):
        return f"{message}: one count for each of the {len(expected)} depths of the chain."
    mistakes = [
        (dict(greedy=0), "a bin counts the candidates at a depth, the chain's greedy token included: its "
                         "siblings are one fewer"),
        (dict(limited=False), "the budget is ignored. The tree has at most `budget` nodes in all: when it is "
                              "spent, the deeper depths get no siblings"),
        (dict(shared=False), "the budget counts the chain's nodes too: budget - len(top1_probs) nodes are left "
                             "for siblings"),
        (dict(deepest_first=True), "the budget goes to the deepest depths first. The shallowest come first: a "
                                   "sibling at depth i is only tried when the chain's first i - 1 tokens passed"),
        (dict(bin_of=lambda p: round(10 * p)), "that reads the bin of round(10 p). The bin is floor(10 p): "
                                               "bin 3 holds every p in [0.3, 0.4)"),
    ]
    named = [mistake for switches, mistake in mistakes if counts == _siblings_by_rule(top1_probs, bins, budget,
                                                                                     **switches)]
    if named:
        return f"{message}: {' Or '.join(named)}."
    if sum(counts) > budget - len(counts):
        return (f"{message}: {sum(counts)} siblings and {len(counts)} chain tokens are more than budget = {budget} "
                "nodes.")
    return (f"{message}. At each depth, shallowest first: bins[min(floor(10 p), len(bins) - 1)] - 1 siblings, "
            "as many as the budget has left.")


def _cape_error(error: Exception, case: Case) -> str | None:
    top1_probs, bins, _ = case.args
    if isinstance(error, IndexError) and max(int(10 * p) for p in top1_probs) >= len(bins):
        return (f"floor(10 p) can pass the last of the {len(bins)} bins (p = 1.0 gives 10): the last bin takes "
                "the rest, index min(floor(10 p), len(bins) - 1).")
    return None


check_cape_siblings = Check("cape_siblings", _cape_cases, _compare_cape, error_hint=_cape_error)


# --- Ouroboros' phrase pool ----------------------------------------------------------------------------------


def phrases_after_reference(tokens: list[int], key: int, phrase_length: int, count: int) -> list[tuple[int, ...]]:
    """What a `PhrasePool` that learned ``tokens`` offers after ``key``: up to ``count`` phrases, newest first.

    The pool keeps at most ``per_key`` phrases per key, the newest; any per_key >= count gives the same
    answer, so the reference keeps exactly ``count``.
    """
    pool = PhrasePool(phrase_length, per_key=count)
    pool.add(list(tokens))
    return [tuple(phrase) for phrase in pool.after(key, count)]


def _phrase_cases() -> list[Case]:
    rng = random.Random(64)
    speech = [9, 1, 2, 3, 4, 0, 9, 5, 6, 0, 9, 1, 2, 7, 0, 9, 5, 6, 0, 9, 1, 2, 3, 4]  # 9: a speaker's tag
    settings = [  # (label, tokens, key, phrase_length, count)
        ("a phrase seen twice", [1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2, 3], 1, 2, 3),
        ("the key never occurs", [4, 5, 6, 4, 5], 7, 2, 3),
        ("the key twice, the second time too near the end", [3, 8, 3, 2, 8, 1], 8, 3, 2),
        ("the key only at the end: no whole phrase", [5, 1, 2, 3, 7, 7], 7, 2, 3),
        ("more phrases than count", [6, 1, 6, 2, 6, 3, 6, 4, 6, 5], 6, 2, 2),
        ("phrases that run into the key", [4, 4, 4, 4, 4], 4, 2, 3),
        ("a speaker's tag, phrases of 3", speech, 9, 3, 3),
        ("a speaker's tag, phrases of 4, count 1", speech, 9, 4, 1),
        ("one whole phrase, one cut off by the end", [2, 5, 5, 7, 2, 5], 2, 3, 4),
        ("random tokens", [rng.randrange(5) for _ in range(40)], 2, 3, 3),
        ("random tokens, long phrases", [rng.randrange(4) for _ in range(50)], 1, 5, 4),
    ]
    return [Case(f"{label}: tokens {tokens}, key = {key}, phrase_length = {length}, count = {count}",
                 (tokens, key, length, count), phrases_after_reference(tokens, key, length, count))
            for label, tokens, key, length, count in settings]


def _read_phrases(got) -> list[tuple[int, ...]]:
    if isinstance(got, torch.Tensor) and got.ndim == 2:
        got = got.tolist()
    if not isinstance(got, (list, tuple)):
        raise _Wrong(f"expected a list of phrases (tuples of token ids), got {_type_name(got)}.")
    return [tuple(_as_ints(phrase, "a phrase, a tuple of token ids", "a token id")) for phrase in got]


def _compare_phrases(got, case: Case) -> str | None:
    tokens, key, length, count = case.args
    phrases, expected = _read_phrases(got), case.expected
    if phrases == expected:
        return None
    message = f"expected {expected}, got {phrases}"
    starts = [i for i, token in enumerate(tokens) if token == key]
    tails = {tuple(tokens[i + 1:]) for i in starts if i + length >= len(tokens)}  # fewer than length tokens
    short = {phrase for phrase in phrases if len(phrase) < length}
    if short and short <= tails:
        return (f"{message}: a phrase is cut off by the end of tokens. Near the end fewer than phrase_length = "
                f"{length} tokens follow the key: that is no phrase yet, skip it.")
    if phrases and all(phrase[:1] == (key,) for phrase in phrases) and any(
            phrases == list(dict.fromkeys(tuple(tokens[i: i + size]) for i in reversed(starts)
                                          if i + size <= len(tokens)))[:count] for size in (length, length + 1)):
        return (f"{message}: the phrases start with the key. A phrase is the {length} tokens after it; the key is "
                "what it is filed under.")
    if any(len(phrase) != length for phrase in phrases):
        return f"{message}: every phrase has phrase_length = {length} tokens, the ones after the key."
    if len(set(phrases)) < len(phrases):
        return f"{message}: a phrase is repeated. Offer each once, at the newest place it occurred."
    if len(phrases) > count:
        return f"{message}: at most count = {count} phrases."
    every = phrases_after_reference(tokens, key, length, len(tokens))  # each phrase once, newest first
    if len(every) > 1 and phrases == every[::-1][:count]:
        return f"{message}: oldest first. The pool offers the newest first, the phrases most likely to come back."
    whole = [tuple(tokens[i + 1: i + 1 + length]) for i in starts if i + length < len(tokens)]  # oldest first
    if phrases == list(dict.fromkeys(whole))[::-1][:count]:
        return (f"{message}: that orders the phrases by the first place each occurred. A phrase seen again is new "
                "again: order them by the newest place each occurred.")
    if set(phrases) <= set(every):
        return (f"{message}: order the phrases by the newest place each occurred, newest first, and keep the "
                f"first {count}.")
    return (f"{message}. After every occurrence of the key with {length} tokens after it, those tokens are a "
            "phrase: newest first, each once, at most count.")


check_phrases_after = Check("phrases_after", _phrase_cases, _compare_phrases)

"""Checkers for the exercises of chapter 5, n-gram drafting: the output of the fresh-draw verifier,
prompt lookup, a multi-level n-gram drafter, and the heuristic draft-length schedule.

The references are the package's: `specbook.rejection.output_distribution` with a one-hot draft,
`specbook.PromptLookupDrafter`, the counts of `specbook.drafters.NGramStorage` (a draft is checked
token by token against them, so that any of several equally frequent continuations is accepted),
and `specbook.HeuristicK`.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from ..drafters import NGramDrafter, PromptLookupDrafter
from ..policies import HeuristicK
from ..rejection import output_distribution
from ..sampling import Sampler
from .core import Case, Check, _as_int, _as_token_list, _as_vector, _close, _fmt, _probs

# --- The fresh draw after a mismatch ---------------------------------------------------------------


def fresh_draw_reference(target_probs: torch.Tensor, draft_token: int) -> torch.Tensor:
    """The exact distribution of the emitted token when a mismatch draws a fresh token from q."""
    one_hot = torch.nn.functional.one_hot(torch.tensor(draft_token), target_probs.shape[-1]).to(target_probs)
    return output_distribution(target_probs, one_hot, correction="target")


def _fresh_draw_cases() -> list[Case]:
    toy = _probs([0.45, 0.25, 0.15, 0.10, 0.05])  # chapter 2's q: mat, floor, sofa, roof, moon
    settings = [(f"the toy q of §5.1, draft {name!r}", toy, token)
                for token, name in enumerate(("mat", "floor", "sofa", "roof", "moon")) if token in (0, 1, 4)]
    rng = np.random.default_rng(5)
    for vocab in (3, 8, 12):
        target_probs = torch.tensor(rng.dirichlet(np.full(vocab, 0.5)))
        settings.append((f"random q, vocab {vocab}", target_probs, int(rng.integers(vocab))))
    settings += [("the draft is a token q never emits", _probs([0.5, 0.5, 0.0, 0.0]), 3),
                 ("greedy: q is one-hot on the draft", _probs([0.0, 1.0, 0.0]), 1),
                 ("greedy: q is one-hot elsewhere", _probs([0.0, 1.0, 0.0]), 2)]
    return [Case(f"{label}: q = {_fmt(target_probs)}, draft_token = {token}", (target_probs, token),
                 fresh_draw_reference(target_probs, token).numpy()) for label, target_probs, token in settings]


def _compare_fresh_draw(got, case: Case) -> str | None:
    target_probs, token = case.args
    got = _as_vector(got, tuple(target_probs.shape), "a probability vector")
    if _close(got, case.expected):
        return None
    expected = f"expected {_fmt(case.expected)}, got {_fmt(got)}"
    q_x = float(target_probs[token])
    without_x = target_probs.clone()
    without_x[token] = 0
    if _close(got, target_probs):
        return (f"{expected}: that is q, what the correct verifier emits. Here a mismatch draws a fresh token "
                "from q, which can be the draft again.")
    if _close(got, (1 - q_x) * target_probs):
        return f"{expected}: that leaves out the accepted draft, which comes out with probability q(x) = {q_x:.4g}."
    if q_x < 1 and _close(got, without_x / without_x.sum()):
        return f"{expected}: that is the residual, q without x. The emitted token is the draft or the fresh draw."
    return f"{expected}. Emitted = x with probability q(x), else a fresh draw from q: q(x) e_x + (1 − q(x)) q."


check_fresh_draw_output = Check("fresh_draw_output", _fresh_draw_cases, _compare_fresh_draw)


# --- Prompt lookup -------------------------------------------------------------------------------


def prompt_lookup_reference(tokens: list[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """What `PromptLookupDrafter` proposes after reading ``tokens``."""
    drafter = PromptLookupDrafter(max_ngram, min_ngram)
    drafter.start(torch.tensor([tokens]))
    return drafter.propose(k, Sampler(0), None).tokens.tolist()


def _lookup_variant(tokens, k, max_ngram=3, min_ngram=1, *, most_recent=True, extend=True, longest_first=True):
    """Prompt lookup with switches that turn it into the usual mistakes (to name them)."""
    end = len(tokens)
    lengths = range(min(max_ngram, end), min_ngram - 1, -1)
    for n in (lengths if longest_first else reversed(lengths)):
        starts = range(end - n - 1, -1, -1) if most_recent else range(end - n)
        for start in starts:
            if tokens[start:start + n] == tokens[end - n:]:
                copied = list(tokens)
                for i in range(start + n, start + n + k):
                    if i >= len(copied) or (not extend and i >= end):
                        break
                    copied.append(copied[i])
                return copied[end:]
    return []


LOOKUP_SETTINGS = [  # (label, tokens, k, max_ngram, min_ngram)
    ("the last 3 tokens occurred once before", [1, 2, 3, 4, 5, 9, 1, 2, 3], 4, 3, 1),
    ("two earlier occurrences: the most recent one counts", [7, 1, 2, 8, 5, 1, 2, 9, 6, 1, 2], 3, 2, 1),
    ("only the last token occurred before", [5, 6, 7, 8, 1, 5], 3, 3, 1),
    ("a longer match beats a more recent shorter one", [1, 2, 3, 9, 8, 3, 7, 1, 2, 3], 2, 3, 1),
    ("nothing matches", [1, 2, 3, 4], 3, 3, 1),
    ("the copy runs past the end: copy the copy", [4, 5, 4, 5, 4], 6, 3, 1),
    ("min_ngram = 2 forbids one-token matches", [5, 6, 7, 8, 1, 5], 3, 3, 2),
    ("max_ngram = 1", [3, 1, 2, 3, 4, 2, 3], 2, 1, 1),
    ("k = 1", [1, 2, 3, 1, 2], 1, 3, 1),
    ("a one-token context", [7], 3, 3, 1),
]


def _lookup_cases() -> list[Case]:
    settings = list(LOOKUP_SETTINGS)
    rng = random.Random(5)
    for _ in range(12):
        max_ngram = rng.randrange(1, 5)
        settings.append(("random tokens", [rng.randrange(4) for _ in range(rng.randrange(2, 16))],
                         rng.randrange(1, 7), max_ngram, rng.randrange(1, max_ngram + 1)))
    return [Case(f"{label}: tokens {tokens}, k = {k}, max_ngram = {max_ngram}, min_ngram = {min_ngram}",
                 (tokens, k, max_ngram, min_ngram), prompt_lookup_reference(tokens, k, max_ngram, min_ngram))
            for label, tokens, k, max_ngram, min_ngram in settings]


def _compare_lookup(got, case: Case) -> str | None:
    tokens = _as_token_list(got, "a list of drafted token ids")
    if tokens == case.expected:
        return None
    expected = f"expected {case.expected}, got {tokens}"
    mistakes = {"the earliest occurrence; the most recent one tracks the text as it changes":
                dict(most_recent=False),
                "a copy that stops at the end of the context; past the end, go on copying what you just proposed":
                dict(extend=False),
                "the shortest n first; try the longest n first, it is the more specific match":
                dict(longest_first=False)}
    for mistake, change in mistakes.items():
        if tokens == _lookup_variant(*case.args, **change):
            return f"{expected}: that follows {mistake}."
    if len(tokens) > case.args[1]:
        return f"{expected}: at most k = {case.args[1]} tokens."
    if not tokens:
        return (f"{expected}: you found no match. Look for the last n tokens at earlier positions only (not at "
                "the end itself), for n = max_ngram down to min_ngram.")
    return f"{expected}."


check_prompt_lookup = Check("prompt_lookup", _lookup_cases, _compare_lookup)


# --- A multi-level n-gram drafter -------------------------------------------------------------------


def ngram_draft_reference(tokens: list[int], k: int, n: int = 3) -> list[int]:
    """What `NGramDrafter(n, "multilevel")` proposes after reading ``tokens`` (one of the right answers)."""
    drafter = NGramDrafter(n=n, storage="multilevel")
    drafter.start(torch.tensor([tokens]))
    return drafter.propose(k, Sampler(0), None).tokens.tolist()


def _ngram_counts(tokens: list[int], n: int) -> dict:
    """context (tuple of 1 .. n - 1 tokens) -> Counter of next tokens, as NGramStorage counts them."""
    drafter = NGramDrafter(n=n, storage="multilevel")
    drafter.start(torch.tensor([tokens]))
    return drafter.storage.counts


NGRAM_SETTINGS = [  # (label, tokens, k, n)
    ("a repeated phrase", [1, 2, 3, 4, 9, 1, 2, 3, 4, 8, 1, 2], 4, 3),
    ("the 2-token context is new, the 1-token context is known", [5, 6, 7, 1, 8, 6], 3, 3),
    ("the last token never occurred before: draft nothing", [1, 2, 3, 1, 2, 9], 4, 3),
    ("counts decide: 2 follows 1 twice, 3 once", [1, 2, 0, 1, 3, 0, 1, 2, 0, 1], 3, 2),
    ("bigrams only, n = 2", [4, 5, 6, 4, 5, 7, 4], 5, 2),
    ("n = 4", [1, 2, 3, 4, 2, 3, 5, 1, 2, 3], 4, 4),
    ("k = 1", [3, 3, 1, 3], 1, 3),
]


def _ngram_cases() -> list[Case]:
    settings = list(NGRAM_SETTINGS)
    rng = random.Random(6)
    for _ in range(10):
        settings.append(("random tokens", [rng.randrange(5) for _ in range(rng.randrange(3, 25))],
                         rng.randrange(1, 8), rng.randrange(2, 5)))
    return [Case(f"{label}: tokens {tokens}, k = {k}, n = {n}", (tokens, k, n), ngram_draft_reference(tokens, k, n),
                 extra={"counts": _ngram_counts(tokens, n)}) for label, tokens, k, n in settings]


def _show_counts(counter) -> str:
    return "{" + ", ".join(f"{token}: {count}" for token, count in counter.most_common()) + "}"


def _compare_ngram(got, case: Case) -> str | None:
    tokens, k, n = case.args
    draft, counts = _as_token_list(got, "a list of drafted token ids"), case.extra["counts"]
    if len(draft) > k:
        return f"expected at most k = {k} tokens, got {len(draft)}: {draft}."
    for i in range(k):
        context = tokens + draft[:i]
        known = [tuple(context[len(context) - length:]) for length in range(n - 1, 0, -1)
                 if length <= len(context) and tuple(context[len(context) - length:]) in counts]
        where = f"draft token {i + 1} (after {draft[:i]})" if i else "the first draft token"
        if not known:
            if i < len(draft):
                return (f"{where}: no level knows the context (its last 1 … {n - 1} tokens never came before "
                        f"another token), so the draft should stop here; you proposed {draft[i]}. Stop rather "
                        "than guess.")
            return None
        longest = known[0]
        best = max(counts[longest].values())
        if i == len(draft):
            return (f"{where}: you stopped, but the context {list(longest)} is known, followed by "
                    f"{_show_counts(counts[longest])}; propose {counts[longest].most_common(1)[0][0]} and go on "
                    f"(up to k = {k}).")
        if counts[longest][draft[i]] != best:
            hint = ""
            if any(counts[context][draft[i]] == max(counts[context].values()) for context in known[1:]):
                hint = " That is the answer of a shorter context: back off only when the longer one is unknown."
            return (f"{where}: the longest known context is {list(longest)} ({len(longest)} tokens), followed by "
                    f"{_show_counts(counts[longest])}; you proposed {draft[i]}, expected one of "
                    f"{sorted(t for t, c in counts[longest].items() if c == best)}.{hint}")
    return None


check_ngram_draft = Check("ngram_draft", _ngram_cases, _compare_ngram)


# --- Grow on success, shrink on failure -----------------------------------------------------------


def heuristic_next_k_reference(k, drafted, accepted, k_min=1, k_max=16) -> int:
    """The K after one step, as `HeuristicK` updates it."""
    policy = HeuristicK(k_start=k, k_min=k_min, k_max=k_max)
    policy.update(drafted, accepted, None)
    return policy.next_k()


HEURISTIC_SETTINGS = [  # (k, drafted, accepted, k_min, k_max)
    (4, 4, 4, 1, 16), (4, 4, 2, 1, 16), (4, 4, 0, 1, 16), (15, 15, 15, 1, 16), (1, 1, 0, 1, 16),
    (4, 0, 0, 1, 16), (6, 3, 3, 1, 16), (6, 3, 2, 1, 16), (8, 8, 8, 1, 8), (3, 3, 3, 2, 20), (2, 2, 1, 2, 20),
    (10, 10, 9, 1, 16),
]


def _heuristic_cases() -> list[Case]:
    labels = {(4, 0, 0, 1, 16): "nothing drafted (the budget ran out)",
              (6, 3, 3, 1, 16): "only 3 drafted near the end, all accepted",
              (6, 3, 2, 1, 16): "only 3 drafted near the end, 2 accepted"}
    cases = []
    for setting in HEURISTIC_SETTINGS:
        k, drafted, accepted, k_min, k_max = setting
        label = labels.get(setting, f"{accepted} of {drafted} accepted")
        cases.append(Case(f"{label}: k = {k}, drafted = {drafted}, accepted = {accepted}, k_min = {k_min}, "
                          f"k_max = {k_max}", (k, drafted, accepted), heuristic_next_k_reference(*setting),
                          kwargs={"k_min": k_min, "k_max": k_max}))
    return cases


def _compare_heuristic(got, case: Case) -> str | None:
    k, drafted, accepted = case.args
    k_min, k_max = case.kwargs["k_min"], case.kwargs["k_max"]
    got = _as_int(got, "the next K")
    if got == case.expected:
        return None
    expected = f"expected K = {case.expected}, got {got}"
    if drafted == 0:
        return f"{expected}: a step that drafted nothing says nothing about α; leave K as it is."
    if not k_min <= got <= k_max:
        return f"{expected}, outside k_min … k_max = {k_min} … {k_max}: clamp the new K."
    if accepted == drafted < k and got == max(k - 1, k_min):
        return (f"{expected}: every one of the {drafted} drafts was accepted, which is a success even though "
                f"fewer than k = {k} were drafted. Compare accepted with drafted, not with k.")
    if accepted == drafted:
        return f"{expected}: after a fully accepted step, grow K by 2 (up to k_max)."
    return f"{expected}: after a step with a rejection, shrink K by 1 (down to k_min)."


check_heuristic_next_k = Check("heuristic_next_k", _heuristic_cases, _compare_heuristic)

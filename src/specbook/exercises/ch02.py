"""Checkers for the exercises of chapter 2, speculative sampling: one draft's accept test, the
residual, a chain of drafts verified by hand, the acceptance rate, and the shortcut's bias.

The references are `specbook.rejection`'s functions.
"""

from __future__ import annotations

import numpy as np
import torch

from ..rejection import acceptance_rate, output_distribution, residual_distribution, verify_chain
from .core import ATOL, Case, Check, _as_float, _as_int, _as_vector, _close, _fmt, _probs, _random_pair, \
    _type_name

# The toy pair of chapter 2 (§2.1): "The cat sat on the" -> mat, floor, sofa, roof, moon.
TOY_TOKENS = ("mat", "floor", "sofa", "roof", "moon")


def _toy_pair():
    target_probs = torch.tensor([0.45, 0.25, 0.15, 0.10, 0.05], dtype=torch.float64)  # q
    draft_probs = torch.tensor([0.60, 0.10, 0.10, 0.05, 0.15], dtype=torch.float64)  # p
    return target_probs, draft_probs


def _pair_cases(seed: int) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """Distribution pairs for the one-position exercises: (label, target_probs, draft_probs)."""
    rng = np.random.default_rng(seed)
    toy_q, toy_p = _toy_pair()
    pairs = [("the toy pair of §2.1", toy_q, toy_p)]
    for vocab in (3, 6, 10):
        pairs.append((f"random, vocab {vocab}", *_random_pair(rng, vocab)))
    pairs.append(("random with zeros, vocab 8", *_random_pair(rng, 8, sparse=True)))
    pairs.append(("q has zeros where p does not", _probs([0.5, 0.5, 0.0, 0.0]),
                  _probs([0.25, 0.25, 0.25, 0.25])))
    pairs.append(("p has zeros where q does not", _probs([0.25, 0.25, 0.25, 0.25]),
                  _probs([0.7, 0.3, 0.0, 0.0])))
    # The draft is alpha q plus mass where q is zero: the residual is q itself.
    pairs.append(("p = 0.6 q + mass where q = 0", _probs([0.5, 0.3, 0.2, 0.0]),
                  _probs([0.3, 0.18, 0.12, 0.4])))
    pairs.append(("p and q do not overlap", _probs([0.6, 0.4, 0.0]), _probs([0.0, 0.0, 1.0])))
    return pairs



def _accept_draft_cases() -> list[Case]:
    cases = []
    target_probs, draft_probs = _toy_pair()
    for token, uniform in ((0, 0.5), (0, 0.8), (4, 0.3), (4, 0.4), (1, 0.99), (2, 0.0)):
        cases.append((f"the toy pair of §2.1, draft {TOY_TOKENS[token]!r}", token, target_probs,
                      draft_probs, uniform))
    rng = np.random.default_rng(2)
    while len(cases) < 30:
        target_probs, draft_probs = _random_pair(rng, 6, sparse=len(cases) % 2 == 0)
        token = int(rng.choice(6, p=draft_probs.numpy()))
        uniform = float(rng.random())
        accept_prob = min(1.0, float(target_probs[token] / draft_probs[token]))
        if abs(uniform - accept_prob) > 1e-9:
            cases.append(("random, vocab 6", token, target_probs, draft_probs, uniform))
    result = []
    for label, token, target_probs, draft_probs, uniform in cases:
        q, p = float(target_probs[token]), float(draft_probs[token])
        accept_prob = min(1.0, q / p)
        result.append(Case(f"{label}: q(x) = {q:.3g}, p(x) = {p:.3g}, uniform = {uniform:.3g}",
                           (token, target_probs, draft_probs, uniform), uniform < accept_prob,
                           extra={"accept_prob": accept_prob}))
    return result


def _compare_accept_draft(got, case: Case) -> str | None:
    if isinstance(got, torch.Tensor) and got.numel() == 1 and got.dtype == torch.bool:
        got = bool(got)
    if isinstance(got, (np.ndarray, np.bool_)) and np.asarray(got).size == 1 \
            and np.asarray(got).dtype == bool:
        got = bool(got)
    if not isinstance(got, bool):
        return (f"expected True or False, got {got!r} ({_type_name(got)}). "
                "Return the verdict: is the uniform below min(1, q(x)/p(x))?")
    if got == case.expected:
        return None
    verdict = "True (accept)" if case.expected else "False (reject)"
    relation = "<" if case.expected else ">="
    return (f"expected {verdict}, since uniform {relation} min(1, q(x)/p(x)) = "
            f"{case.extra['accept_prob']:.4g}; got {got}.")


check_accept_draft = Check("accept_draft", _accept_draft_cases, _compare_accept_draft)


def _residual_cases() -> list[Case]:
    cases = [Case(label, (q, p), residual_distribution(q, p)) for label, q, p in _pair_cases(3)]
    same = _probs([0.5, 0.3, 0.2])
    cases.append(Case("q == p", (same, same.clone()), None))
    return cases


def _compare_residual(got, case: Case) -> str | None:
    target_probs, draft_probs = case.args
    vocab = target_probs.shape[0]
    got = _as_vector(got, (vocab,), "a probability vector")
    if not np.isfinite(got).all():
        if case.expected is None:
            return ("got NaN: when q == p, (q − p)+ is all zeros and its normaliser is 0. No draft "
                    "is ever rejected then, so any distribution is a safe answer: return q.")
        return f"got {_fmt(got)}, which is not finite."
    if case.expected is None:  # q == p: any distribution will do
        if (got < -ATOL).any() or abs(got.sum() - 1) > ATOL:
            return (f"when q == p any probability vector will do (no draft is ever rejected), but "
                    f"got {_fmt(got)}, which is not one.")
        return None
    if _close(got, case.expected):
        return None
    expected = f"expected {_fmt(case.expected)}, got {_fmt(got)}"
    excess = (target_probs - draft_probs).clamp(min=0)
    swapped = residual_distribution(draft_probs, target_probs)
    if _close(got, excess):
        return (f"{expected}: that is (q − p)+ without normalising (it sums to "
                f"{float(excess.sum()):.4g}); divide by its sum.")
    if _close(got, swapped):
        return (f"{expected}: that is norm((p − q)+), the letters swapped. Here q is the target, "
                "p the draft (Leviathan et al. write them the other way round).")
    if _close(got, target_probs):
        return f"{expected}: that is q itself. The residual is zero wherever p ≥ q."
    return f"{expected}."


check_residual = Check("residual", _residual_cases, _compare_residual)


def _verify_chain_cases() -> list[Case]:
    """Seeded chains; the expected verdicts come from specbook.rejection.verify_chain itself.

    verify_chain draws its K uniforms first, with torch.rand(K, generator=...), so the learner's
    function gets exactly those uniforms and must make the same decisions.
    """
    rng = np.random.default_rng(4)
    chains = []
    for seed in range(24):
        k = int(rng.integers(1, 6))
        vocab = 6
        draft_probs = torch.tensor(rng.dirichlet(np.full(vocab, 0.5), size=k))  # (K, vocab)
        target_probs = torch.tensor(rng.dirichlet(np.full(vocab, 0.5), size=k + 1))  # (K + 1, vocab)
        if seed % 6 == 5:  # a draft close to the target: long runs of acceptances and bonus tokens
            draft_probs = 0.9 * target_probs[:k] + 0.1 * draft_probs
        chains.append((f"random, K = {k}", seed, draft_probs, target_probs))
    same = torch.tensor(rng.dirichlet(np.full(6, 0.5), size=4))  # (K + 1, vocab), K = 3
    chains.append(("K = 3, p == q at every position", 100, same[:3].clone(), same))
    one_hot = torch.eye(6, dtype=torch.float64)
    chains.append(("K = 4, greedy (one-hot p and q)", 101, one_hot[[2, 3, 1, 5]],
                   one_hot[[2, 3, 4, 0, 1]]))
    cases = []
    for label, seed, draft_probs, target_probs in chains:
        k = draft_probs.shape[0]
        tokens = torch.multinomial(draft_probs, 1, generator=torch.Generator().manual_seed(seed))
        draft_tokens = tokens.squeeze(1)  # (K,)
        uniforms = torch.rand(k, generator=torch.Generator().manual_seed(seed))  # (K,)
        verdict = verify_chain(draft_tokens, draft_probs, target_probs,
                               generator=torch.Generator().manual_seed(seed))
        accepted = verdict.num_accepted
        if accepted < k:
            next_probs = residual_distribution(target_probs[accepted], draft_probs[accepted])
        else:
            next_probs = target_probs[k]
        positions = torch.arange(k)
        accept_probs = (target_probs[positions, draft_tokens]
                        / draft_probs[positions, draft_tokens]).clamp(max=1.0)  # (K,)
        cases.append(Case(f"{label}, uniforms {_fmt(uniforms)}, min(1, q/p) at the drafts "
                          f"{_fmt(accept_probs)}",
                          (draft_tokens, draft_probs, target_probs, uniforms.double()),
                          (accepted, next_probs),
                          extra={"accept_probs": accept_probs, "uniforms": uniforms.double()}))
    return cases


def _compare_verify_chain(got, case: Case) -> str | None:
    draft_tokens, draft_probs, target_probs, _ = case.args
    k, vocab = draft_probs.shape
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return (f"expected a pair (num_accepted, next_probs), got {_type_name(got)}"
                + (f" of length {len(got)}" if isinstance(got, (tuple, list)) else "") + ".")
    expected_accepted, expected_probs = case.expected
    num_accepted = _as_int(got[0], "num_accepted")
    if num_accepted != expected_accepted:
        passed = case.extra["uniforms"] < case.extra["accept_probs"]  # (K,)
        hint = ""
        if num_accepted == int(passed.sum()) != expected_accepted:
            hint = (" You counted every draft that passed its test; verification stops at the "
                    "first rejection, and the drafts after it are discarded.")
        return (f"expected {expected_accepted} accepted draft(s), got {num_accepted}. Draft t is "
                f"accepted when uniforms[t] < min(1, q_t(x_t)/p_t(x_t)).{hint}")
    next_probs = _as_vector(got[1], (vocab,), "next_probs, a probability vector over the vocabulary")
    if _close(next_probs, expected_probs):
        return None
    expected = f"{num_accepted} accepted is right, but next_probs should be {_fmt(expected_probs)}, " \
               f"got {_fmt(next_probs)}"
    if num_accepted < k:
        if _close(next_probs, target_probs[num_accepted]):
            return (f"{expected}: that is q at the rejected position. The correction comes from the "
                    "residual norm((q_t − p_t)+), or the output is biased (§2.5).")
        return f"{expected}: the residual norm((q_t − p_t)+) at the rejected position t = {num_accepted}."
    return (f"{expected}: all K = {k} drafts passed, so the bonus token comes from the last target "
            f"row, target_probs[K] = target_probs[{k}].")


check_verify_chain = Check("verify_chain_by_hand", _verify_chain_cases, _compare_verify_chain,
                           "check_verify_chain")


def _acceptance_rate_cases() -> list[Case]:
    cases = [Case(label, (q, p), float(acceptance_rate(q, p))) for label, q, p in _pair_cases(5)]
    same = _probs([0.2, 0.5, 0.3])
    cases.append(Case("q == p", (same, same.clone()), 1.0))
    rng = np.random.default_rng(6)
    batch = [_random_pair(rng, 6) for _ in range(4)]
    target_probs = torch.stack([q for q, _ in batch])  # (4, vocab)
    draft_probs = torch.stack([p for _, p in batch])  # (4, vocab)
    cases.append(Case("a batch of 4 pairs, shape (4, 6)", (target_probs, draft_probs),
                      acceptance_rate(target_probs, draft_probs).numpy()))
    return cases


def _compare_acceptance_rate(got, case: Case) -> str | None:
    target_probs, draft_probs = case.args
    if isinstance(case.expected, np.ndarray):
        batch = tuple(target_probs.shape[:-1])
        got = _as_vector(got, batch, "one acceptance rate per pair (sum over the last dimension)")
    else:
        got = _as_float(got, "a number")
    if _close(got, case.expected):
        return None
    expected = f"expected α = {_fmt(case.expected)}, got {_fmt(got)}"
    maximum = torch.maximum(target_probs, draft_probs).sum(-1).numpy()
    distance = (target_probs - draft_probs).abs().sum(-1).numpy()
    if _close(got, maximum):
        return f"{expected}: that is Σ max(p, q). A draft passes on the overlap, Σ min(p, q)."
    if _close(got, 1 - distance):
        return (f"{expected}: that is 1 − Σ|p − q|. The total-variation distance has a ½: "
                "TV(p, q) = ½ Σ|p − q|.")
    return f"{expected}."


check_acceptance_rate = Check("acceptance_rate_by_hand", _acceptance_rate_cases,
                              _compare_acceptance_rate, "check_acceptance_rate")


def _shortcut_cases() -> list[Case]:
    cases = []
    for label, q, p in _pair_cases(7):
        shortcut = output_distribution(q, p, correction="target")
        cases.append(Case(label, (q, p), shortcut, extra={"tv": 0.5 * float((shortcut - q).abs().sum())}))
    return cases


def _compare_shortcut_output(got, case: Case) -> str | None:
    target_probs, draft_probs = case.args
    got = _as_vector(got, tuple(target_probs.shape), "a probability vector")
    if _close(got, case.expected):
        return None
    expected = f"expected {_fmt(case.expected)}, got {_fmt(got)}"
    if _close(got, target_probs):
        return (f"{expected}: that is q, what the real algorithm emits. With corrections from q a "
                "token is emitted with probability min(p(x), q(x)) + (1 − α) q(x).")
    if _close(got, torch.minimum(target_probs, draft_probs)):
        return f"{expected}: that is only the accepted part, min(p, q); add the corrections."
    return f"{expected}. Emitted = accepted, min(p, q), plus rejected-then-corrected, (1 − α) q."


check_shortcut_output = Check("shortcut_output", _shortcut_cases, _compare_shortcut_output)


def _compare_shortcut_bias(got, case: Case) -> str | None:
    target_probs, draft_probs = case.args
    got = _as_float(got, "a number, the total-variation distance")
    expected_tv = case.extra["tv"]
    if abs(got - expected_tv) <= ATOL:
        return None
    expected = f"expected TV(shortcut, q) = {expected_tv:.4g}, got {got:.4g}"
    mistakes = []
    if abs(got - 2 * expected_tv) <= ATOL:
        mistakes.append("Σ|shortcut − q| without the ½")
    if abs(got - (1 - float(acceptance_rate(target_probs, draft_probs)))) <= ATOL:
        mistakes.append("TV(p, q) = 1 − α, the draft's distance from q rather than the output's")
    if mistakes:
        return f"{expected}: that is {', or '.join(mistakes)}. The bias is ½ Σ|shortcut − q|."
    return f"{expected}. The bias is ½ Σ|shortcut − q|."


check_shortcut_bias = Check("shortcut_bias", _shortcut_cases, _compare_shortcut_bias)


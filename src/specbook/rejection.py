"""The accept/reject math of speculative sampling, on probability vectors.

One speculative step drafts K tokens x_1..x_K from the draft distributions p_1..p_K and scores
them with one target call, which gives q_1..q_{K+1}. Draft x_i is accepted with probability
min(1, q_i(x_i) / p_i(x_i)), in order, until the first rejection. A rejected position emits a
token from the residual norm((q_i - p_i)+) instead; if all K drafts pass, a bonus token is drawn
from q_{K+1}. Either way every emitted token follows the target q exactly, and the chance that a
draft passes is alpha = sum_x min(p(x), q(x)) = 1 - TV(p, q).

References:
- Leviathan, Kalman, Matias 2023, "Fast Inference from Transformers via Speculative Decoding":
  Algorithm 1, the proof that the output follows the target (Theorem 1, Appendix A.1) and
  alpha = sum min(p, q) (Section 3.2, Corollary 3.6). Caution: they write p for the target and
  q for the draft, the other way round from this book.
- Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative Sampling":
  Algorithm 2 and Theorem 1 (modified rejection sampling recovers the target). Same letters as
  this book: q is the target, p the draft.

Every function takes probabilities (not logits) with the vocabulary on the last dimension.
"""

from typing import NamedTuple

import torch

from .sampling import draw, exponential_race, one_hot

CORRECTIONS = ("residual", "target")


def check_distribution(probs: torch.Tensor, name: str, atol: float = 1e-4) -> None:
    """Raise ValueError unless `probs` holds probability vectors along its last dimension.

    The rules: a floating-point tensor with a non-empty last dimension, no NaN, no negative
    entry, every row summing to 1 within `atol`. The message names the argument (`name`) and
    the broken rule. The tensor checks cost two reductions and one host sync.
    """
    if not isinstance(probs, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor (got {type(probs).__name__})")
    if not probs.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor (got {probs.dtype})")
    if probs.ndim == 0 or probs.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty last (vocabulary) dimension "
                         f"(got shape {tuple(probs.shape)})")
    row_errors = (probs.sum(-1) - 1).abs()  # (...)
    smallest, worst = torch.stack([probs.amin(), row_errors.amax()]).tolist()  # amin keeps NaN
    if smallest != smallest:
        raise ValueError(f"{name} must not contain NaN")
    if smallest < 0:
        raise ValueError(f"{name} must be non-negative (got an entry {smallest:.6g})")
    if worst > atol:
        worst_sum = probs.sum(-1).flatten()[row_errors.argmax()].item()
        raise ValueError(f"{name} must sum to 1 along the last dimension (got {worst_sum:.6g})")


def _check_pair(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> None:
    """Validate a target/draft pair: two distributions of the same shape."""
    check_distribution(target_probs, "target_probs")
    check_distribution(draft_probs, "draft_probs")
    if target_probs.shape != draft_probs.shape:
        raise ValueError("target_probs and draft_probs must have the same shape "
                         f"(got {tuple(target_probs.shape)} and {tuple(draft_probs.shape)})")


def _accept_probs(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """min(1, q(x) / p(x)) elementwise: the chance that a drafted x is accepted.

    Where p(x) = 0 the token is never drafted, so any value is safe; we return 1, which keeps
    p(x) * min(1, q(x) / p(x)) = 0 there without a 0/0.
    """
    ratio = torch.where(draft_probs > 0, target_probs / draft_probs, 1.0)
    return ratio.clamp(max=1.0)


def acceptance_rate(target_probs: torch.Tensor, draft_probs: torch.Tensor, *,
                    validate: bool = True) -> torch.Tensor:
    """alpha = sum_x min(p(x), q(x)) = 1 - TV(p, q): the chance that one draft is accepted.

    Shapes (..., vocab) -> (...). Symmetric in p and q, and 1 exactly when p == q.
    """
    if validate:
        _check_pair(target_probs, draft_probs)
    return torch.minimum(target_probs, draft_probs).sum(-1)


def residual_distribution(target_probs: torch.Tensor, draft_probs: torch.Tensor, *,
                          validate: bool = True) -> torch.Tensor:
    """norm((q - p)+): where a rejected position draws its token (Chen et al. Algorithm 2).

    Shapes (..., vocab) -> (..., vocab). The residual is zero wherever p >= q: those tokens
    already got all the probability q allows through acceptance.

    When q == p there is no residual mass (0/0). Then min(1, q/p) = 1 for every token the draft
    can propose, so no draft is ever rejected and the residual is never sampled; any
    distribution is a safe answer, and we return q itself.
    """
    if validate:
        _check_pair(target_probs, draft_probs)
    excess = (target_probs - draft_probs).clamp(min=0)  # (..., vocab)
    mass = excess.sum(-1, keepdim=True)  # (..., 1)
    has_mass = mass > 0
    return torch.where(has_mass, excess / torch.where(has_mass, mass, 1.0), target_probs)


def output_distribution(target_probs: torch.Tensor, draft_probs: torch.Tensor,
                        correction: str = "residual", *, validate: bool = True) -> torch.Tensor:
    """The exact distribution of the token one speculative position emits, from the mechanism.

    P(x) = p(x) min(1, q(x)/p(x)) + (1 - alpha) r(x): drafted and accepted, or rejected and
    corrected by a draw from r. With correction="residual", r = norm((q - p)+) and P == q
    (Chen et al. Theorem 1; Leviathan et al. Appendix A.1). With correction="target", r = q: a
    deliberately wrong rule, kept to show its bias (it overweights tokens the draft likes).
    Shapes (..., vocab) -> (..., vocab).
    """
    if correction not in CORRECTIONS:
        raise ValueError(f"correction must be one of {CORRECTIONS} (got {correction!r})")
    if validate:
        _check_pair(target_probs, draft_probs)
    accepted = draft_probs * _accept_probs(target_probs, draft_probs)  # (..., vocab)
    rejected = 1 - accepted.sum(-1, keepdim=True)  # (..., 1), equals 1 - alpha
    if correction == "residual":
        corrected = residual_distribution(target_probs, draft_probs, validate=False)
    else:
        corrected = target_probs
    return accepted + rejected * corrected


class Verification(NamedTuple):
    """The outcome of verifying K drafts: emit draft_tokens[:num_accepted], then next_token.

    bonus is True when all K drafts were accepted and next_token came from q_{K+1}.
    """

    num_accepted: int
    next_token: int
    bonus: bool


def _check_chain(draft_tokens: torch.Tensor, draft_probs: torch.Tensor,
                 target_probs: torch.Tensor) -> None:
    """Validate the shapes, dtypes and token ids that verify_chain expects."""
    if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.ndim != 1 \
            or draft_tokens.numel() == 0:
        raise ValueError("draft_tokens must be a 1-D tensor of K >= 1 token ids")
    if draft_tokens.is_floating_point() or draft_tokens.is_complex() \
            or draft_tokens.dtype == torch.bool:
        raise ValueError(f"draft_tokens must be an integer tensor (got {draft_tokens.dtype})")
    check_distribution(draft_probs, "draft_probs")
    check_distribution(target_probs, "target_probs")
    k = draft_tokens.shape[0]
    if draft_probs.ndim != 2 or draft_probs.shape[0] != k:
        raise ValueError(f"draft_probs must have shape (K, vocab) = ({k}, vocab) "
                         f"(got {tuple(draft_probs.shape)})")
    vocab = draft_probs.shape[1]
    if tuple(target_probs.shape) != (k + 1, vocab):
        raise ValueError(f"target_probs must have shape (K + 1, vocab) = ({k + 1}, {vocab}) "
                         f"(got {tuple(target_probs.shape)})")
    if ((draft_tokens < 0) | (draft_tokens >= vocab)).any():
        raise ValueError(f"draft_tokens must be token ids in [0, {vocab}) "
                         f"(got {draft_tokens.tolist()})")
    drafted = draft_tokens.to(draft_probs.device, torch.long)  # (K,)
    if (draft_probs[torch.arange(k, device=draft_probs.device), drafted] <= 0).any():
        raise ValueError("draft_probs must give each of draft_tokens a positive probability "
                         "(a token with p = 0 cannot have been drafted from p)")


def verify_chain(draft_tokens: torch.Tensor, draft_probs: torch.Tensor,
                 target_probs: torch.Tensor, generator: torch.Generator | None = None, *,
                 validate: bool = True) -> Verification:
    """Verify K drafted tokens with one batch of target probabilities (Chen et al. Algorithm 2).

    draft_tokens (K,) are the drafts, draft_probs (K, vocab) the distributions they were sampled
    from (a deterministic drafter passes one-hot rows), target_probs (K + 1, vocab) the target's
    distributions at the K drafted positions plus the one after them. Draft i is accepted with
    probability min(1, q_i(x_i) / p_i(x_i)), stopping at the first rejection, which emits a token
    from the residual; if all K pass, a bonus token is drawn from the last target row. With one-hot
    p and q (greedy) the outcome is deterministic: drafts are kept while they equal the target's
    argmax, then the argmax follows. validate=False skips the input checks (for a decode loop
    whose inputs are known good).

    The decision is `chain_outcome`, made on the device; this reads its two numbers back.
    """
    if validate:
        _check_chain(draft_tokens, draft_probs, target_probs)
    num_accepted, next_token = chain_outcome(draft_tokens, draft_probs, target_probs, generator).tolist()
    return Verification(num_accepted, next_token, num_accepted == draft_tokens.shape[0])


def chain_outcome(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                  generator: torch.Generator | None = None, noise: tuple | None = None) -> torch.Tensor:
    """`verify_chain`'s decision left on the device: a (2,) tensor [number accepted, next token].

    The whole decision is one vectorised step on the probabilities' device: all K uniforms are
    tested at once, and a candidate next token is drawn at every position -- from the residual at
    positions 1..K, from q_{K+1} after them -- before the one after the accepted run is picked.
    The candidates are independent of the uniforms, so the picked one has exactly the
    distribution it needs, and nothing waits for the device: the engine reads the outcome back
    together with the drafts, once per step (`specbook.decoding`). ``noise``: the K uniforms and the
    (K + 1, vocab) exponentials of the race (`specbook.sampling.draw`), drawn beforehand in that order,
    as a CUDA graph takes its random numbers (`specbook.graphs.StaticModel.verify`).
    """
    k = draft_tokens.shape[0]
    positions = torch.arange(k, device=draft_probs.device)
    draft_tokens = draft_tokens.to(draft_probs.device, torch.long)
    accept_probs = _accept_probs(target_probs[positions, draft_tokens],
                                 draft_probs[positions, draft_tokens])  # (K,)
    # float32 uniforms even for half-precision probs: u < a must hold with probability a.
    uniforms = torch.rand(k, generator=generator, device=draft_probs.device) if noise is None else noise[0]  # (K,)
    num_accepted = (uniforms < accept_probs).long().cumprod(0).sum()  # (): the leading run of accepts
    next_probs = torch.cat([residual_distribution(target_probs[:k], draft_probs, validate=False),
                            target_probs[k:]])  # (K + 1, vocab): where each position's next token comes from
    candidates = draw(next_probs, generator) if noise is None else exponential_race(next_probs, noise[1])
    # gather, not candidates[num_accepted]: indexing by a tensor scalar reads it on the host (a sync)
    return torch.cat([num_accepted.view(1), candidates.gather(0, num_accepted.view(1))])


def chain_decision(logits: torch.Tensor, draft_tokens: torch.Tensor, draft_probs, sampler, generator=None,
                   noise=None) -> tuple[torch.Tensor, torch.Tensor]:
    """A chain step's decision from the target's ``logits`` (K + 1, vocab) after the pending token and each of
    ``draft_tokens`` (K,): the outcome (2,) [number accepted, next token] (`chain_outcome_greedy`, or
    `chain_outcome` with the draft's p (K, vocab) and ``generator`` or ``noise``), and the target's
    distributions under ``sampler`` (K + 1, vocab), for the drafter's and the policy's hooks."""
    if sampler.greedy:
        target_tokens = logits.argmax(-1)  # (K + 1,)
        return chain_outcome_greedy(draft_tokens, target_tokens), one_hot(target_tokens, logits.shape[-1])
    target_probs = sampler.probs(logits)  # (K + 1, vocab)
    return chain_outcome(draft_tokens, draft_probs, target_probs, generator, noise), target_probs


def verify_chain_greedy(draft_tokens: torch.Tensor, target_tokens: torch.Tensor) -> Verification:
    """Greedy verification: keep drafts while they equal the target's argmax, then the argmax follows.

    draft_tokens (K,) are the drafts, target_tokens (K + 1,) the target's greedy tokens at the K
    drafted positions plus the one after them. The answer `verify_chain` gives when the target's
    distributions are one-hot (temperature 0), whatever the draft's: min(1, q(x) / p(x)) is 1 on
    the argmax and 0 elsewhere, and the residual (q - p)+ keeps the argmax alone. No uniforms, no
    residuals: one comparison (`chain_outcome_greedy`), and one read of two numbers.
    """
    k = draft_tokens.shape[0]
    if target_tokens.shape != (k + 1,):
        raise ValueError(f"target_tokens must have shape ({k + 1},), one more than draft_tokens "
                         f"(got {tuple(target_tokens.shape)})")
    num_accepted, next_token = chain_outcome_greedy(draft_tokens, target_tokens).tolist()
    return Verification(num_accepted, next_token, num_accepted == k)


def chain_outcome_greedy(draft_tokens: torch.Tensor, target_tokens: torch.Tensor) -> torch.Tensor:
    """`verify_chain_greedy`'s decision left on the device: a (2,) tensor [number accepted, next token]."""
    k = draft_tokens.shape[0]
    matches = draft_tokens.to(target_tokens.device, torch.long) == target_tokens[:k]  # (K,)
    num_accepted = matches.long().cumprod(0).sum().view(1)  # (1,): the leading run of matches
    return torch.cat([num_accepted, target_tokens.gather(0, num_accepted)])

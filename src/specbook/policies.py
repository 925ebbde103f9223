"""Draft-length policies: how many tokens to draft before the next verification.

The engine asks the policy for K before every step, model drafters ask it after every drafted
token whether to go on, and the policy hears how the step went. Any policy keeps the output
lossless: the verifier does not care how many tokens were drafted, only how they were drawn.

Chapter 3 shows why K matters: the expected tokens per target call (1 - alpha^(K+1)) / (1 - alpha)
saturates while the drafting cost grows with K, so the best K is small when alpha is low and
large when it is high. The policies here estimate "is alpha high right now?" from what a step
reveals: whether everything was accepted (`HeuristicK`), how sure the draft is of each token
(`ConfidenceStop`), or the draft's entropy over recent tokens (`EntropyGuidedK`).
"""

import torch

from .theory import batch_speedup


def check_integer(name: str, value, minimum: int) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is an integer >= ``minimum`` (bool is refused)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum} (got {value!r})")


class DraftLength:
    """The interface. Subclasses override what they need; the defaults draft a fixed K."""

    def start(self) -> None:
        """A new generation begins."""

    def next_k(self) -> int:
        """The most tokens to draft in the next step."""
        raise NotImplementedError

    def keep_drafting(self, draft_probs: torch.Tensor) -> bool:
        """After a token was drafted: draft another one?

        ``draft_probs`` (vocab,) is the draft model's own next-token distribution, the softmax of
        its logits before the sampler's warp -- its confidence, which greedy sampling (a one-hot p)
        would otherwise hide.
        """
        return True

    def update(self, drafted: int, accepted: int, draft_probs: torch.Tensor | None) -> None:
        """The step drafted ``drafted`` tokens (distributions (drafted, vocab), or None) and ``accepted`` passed."""

    def observe_batch(self, rows: int) -> None:
        """Before a step of a batch (`specbook.batch`): ``rows`` sequences are decoding together."""


class FixedK(DraftLength):
    """Always draft K tokens: the setting of Leviathan et al. and Chen et al."""

    def __init__(self, k: int):
        check_integer("k", k, 1)
        self.k = k

    def next_k(self) -> int:
        return self.k

    def __repr__(self):
        return f"FixedK({self.k})"


class HeuristicK(DraftLength):
    """Grow K by 2 after a step in which every draft was accepted, shrink it by 1 otherwise.

    The schedule of Hugging Face's assisted generation (``num_assistant_tokens_schedule=
    "heuristic"``), kept between ``k_min`` and ``k_max``: long drafts while the draft keeps
    agreeing with the target, short ones after a miss. A step that drafted nothing (the token
    budget ran out, or an n-gram drafter had nothing to propose) says nothing about alpha and
    leaves K alone. It needs no draft probabilities, so it suits every drafter.
    """

    def __init__(self, k_start: int = 4, k_min: int = 1, k_max: int = 16):
        for name, value in (("k_start", k_start), ("k_min", k_min), ("k_max", k_max)):
            check_integer(name, value, 1)
        if not k_min <= k_start <= k_max:
            raise ValueError(f"k_min <= k_start <= k_max must hold (got k_min={k_min}, k_start={k_start}, "
                             f"k_max={k_max})")
        self.k_start, self.k_min, self.k_max = k_start, k_min, k_max
        self.k = k_start

    def start(self) -> None:
        self.k = self.k_start

    def next_k(self) -> int:
        return self.k

    def update(self, drafted, accepted, draft_probs):
        if drafted:
            self.k = min(self.k + 2, self.k_max) if accepted == drafted else max(self.k - 1, self.k_min)

    def __repr__(self):
        return f"HeuristicK(k_start={self.k_start}, k_min={self.k_min}, k_max={self.k_max})"


class ConfidenceStop(DraftLength):
    """Draft up to ``k_max`` tokens, but stop after a token whose draft distribution peaks under ``threshold``.

    Hugging Face's ``assistant_confidence_threshold``: a draft unsure of its own token (top
    probability max_x p(x) < threshold, read from the draft's unwarped distribution, so it works
    under greedy sampling too) is unlikely to match the target, so drafting past it wastes draft
    calls and verification positions. The unsure token itself is still proposed. Model drafters
    report their confidence (a chain after every token, a draft model's tree after every depth,
    `specbook.drafters.tree`): with a deterministic drafter (n-grams) it never stops early and
    acts as FixedK(k_max).
    """

    def __init__(self, threshold: float = 0.5, k_max: int = 8):
        if not isinstance(threshold, (int, float)) or isinstance(threshold, bool) or not 0 < threshold < 1:
            raise ValueError(f"threshold must be a probability in (0, 1) (got {threshold!r})")
        check_integer("k_max", k_max, 1)
        self.threshold, self.k_max = threshold, k_max

    def next_k(self) -> int:
        return self.k_max

    def keep_drafting(self, draft_probs):
        return float(draft_probs.max()) >= self.threshold

    def __repr__(self):
        return f"ConfidenceStop(threshold={self.threshold}, k_max={self.k_max})"


class EntropyGuidedK(HeuristicK):
    """Entropy-guided K (EGAG): long drafts while the draft is confident, short ones while it is not.

    The policy keeps an exponential moving average of the draft's entropy, token by token: for each
    drafted token i with draft distribution p_i, H_i = -sum_x p_i(x) log p_i(x) (in nats) and
    H <- ema * H + (1 - ema) * H_i (the first token sets H). The average sets the draft length

        K(H) = round(gamma_max - (gamma_max - gamma_min) * min(H / entropy_ref, 1)),

    so K = gamma_max for a certain draft (H = 0) and gamma_min once H reaches ``entropy_ref``.

    A model drafter shows the policy each token's distribution as it drafts (``keep_drafting``;
    a draft model's tree: depth by depth), and drafting goes on while the draft is shorter than
    K(H) as it stands after that token: through a confident stretch the draft runs to gamma_max,
    and an uncertain token cuts it short at once, no shorter than gamma_min. (The draft's entropy
    as a predictor of acceptance also drives AdaEDL's early stopping, Agrawal et al. 2024.) These
    are the draft model's own distributions, before the sampler's warp -- under greedy sampling
    the p that verification uses is one-hot, entropy 0, whatever the draft believes. A drafter
    that reports its p with the step but never asks ``keep_drafting`` has the step's tokens folded
    in afterwards, and the next step drafts K(H). A deterministic drafter (n-grams) shows no
    confidence at all, and the policy then falls back to HeuristicK's accept-driven schedule (grow
    by 2 on a fully accepted step, shrink by 1 otherwise) between gamma_min and gamma_max.

    The defaults fit the small distilled draft of the built-in pair, which averages 3.2 nats per
    token along the target's greedy continuations of held-out verse yet still has about 0.7 of its
    most uncertain quarter of tokens accepted there: a reference of 6 nats keeps its drafts long,
    and a floor of 2 lets an uncertain stretch cut them short. Chapter 5
    measures the policy against every fixed K.
    """

    def __init__(self, gamma_min: int = 2, gamma_max: int = 10, ema: float = 0.5, entropy_ref: float = 6.0):
        check_integer("gamma_min", gamma_min, 1)
        check_integer("gamma_max", gamma_max, 1)
        if gamma_min > gamma_max:
            raise ValueError(f"gamma_min must be <= gamma_max (got gamma_min={gamma_min} > gamma_max={gamma_max})")
        if not isinstance(ema, (int, float)) or isinstance(ema, bool) or not 0 <= ema < 1:
            raise ValueError(f"ema must be in [0, 1) (got {ema!r}): the weight of the past in the moving average")
        if not isinstance(entropy_ref, (int, float)) or isinstance(entropy_ref, bool) or not entropy_ref > 0:
            raise ValueError(f"entropy_ref must be a number of nats > 0 (got {entropy_ref!r})")
        super().__init__(k_start=gamma_max, k_min=gamma_min, k_max=gamma_max)
        self.ema, self.entropy_ref = ema, entropy_ref
        self.entropy = None  # the moving average H, None before the first informative token
        self.drafted = 0  # tokens drafted so far in this step, as keep_drafting saw them

    def start(self) -> None:
        super().start()
        self.entropy, self.drafted = None, 0

    def k_of_entropy(self) -> int:
        """K(H) for the current moving average H."""
        return round(self.k_max - (self.k_max - self.k_min) * min(self.entropy / self.entropy_ref, 1))

    def _fold(self, entropy: float) -> None:
        self.entropy = entropy if self.entropy is None else self.ema * self.entropy + (1 - self.ema) * entropy

    def next_k(self) -> int:
        self.drafted = 0
        return self.k

    def keep_drafting(self, draft_probs):
        self._fold(float(torch.special.entr(draft_probs).sum()))
        self.drafted += 1
        return self.drafted < self.k_of_entropy()

    def update(self, drafted, accepted, draft_probs):
        if self.drafted:  # keep_drafting saw every token and cut the draft: next step's cap is gamma_max
            self.k = self.k_max
            return
        entropies = torch.special.entr(draft_probs).sum(-1).tolist() if drafted and draft_probs is not None else []
        if not any(entropies):  # no confidence signal: a deterministic drafter (one-hot p, or none)
            super().update(drafted, accepted, draft_probs)
            return
        for entropy in entropies:
            self._fold(entropy)
        self.k = self.k_of_entropy()

    def __repr__(self):
        return (f"EntropyGuidedK(gamma_min={self.k_min}, gamma_max={self.k_max}, ema={self.ema}, "
                f"entropy_ref={self.entropy_ref})")


class BatchSizeK(DraftLength):
    """K from the batch size: long drafts for a few rows, shorter ones for many, none for a full batch.

    At batch size one a target call that scores K + 1 positions costs about what a call on one
    position costs, which is what makes speculation pay. In a batch every row adds K + 1 positions to
    the call, the call turns from memory-bound to compute-bound, and its cost grows with K (chapter 7
    measures it), so the best K shrinks as the batch grows, down to K = 0, plain decoding. vLLM
    turns speculation off above a batch size (``disable_by_batch_size``); this policy keeps a K per
    batch size. ``k_by_batch`` maps a batch size to the K used from it on: {1: 4, 8: 2, 16: 0}
    drafts 4 tokens for 1 to 7 rows, 2 for 8 to 15, none from 16. `from_costs` fills it from costs
    measured on the machine at hand. The batch-of-one loop never reports a batch size: each generation
    starts at one row (`start`), so a policy object's last batch does not leak into the next generation.
    """

    def __init__(self, k_by_batch: dict[int, int]):
        if not isinstance(k_by_batch, dict) or 1 not in k_by_batch:
            raise ValueError(f"k_by_batch must be a dict from batch sizes to K that starts at batch size 1 "
                             f"(got {k_by_batch!r})")
        for batch, k in k_by_batch.items():
            check_integer("k_by_batch's batch sizes", batch, 1)
            check_integer("k_by_batch's K", k, 0)
        self.k_by_batch = dict(sorted(k_by_batch.items()))
        self.rows = 1

    def start(self) -> None:
        self.rows = 1  # until a batch says otherwise (`observe_batch`): the batch-of-one loop never does

    @classmethod
    def from_costs(cls, alpha: float, cost_ratio: dict[int, float], verify_ratio: dict[int, list[float]],
                   min_speedup: float = 1.2):
        """The K that maximises `specbook.theory.batch_speedup` at each measured batch size, or 0 where no K is
        predicted to reach ``min_speedup``. ``cost_ratio[B]``: a draft call's cost relative to a target call on
        one position, at batch size B; ``verify_ratio[B][K]``: a target call on K + 1 positions per row
        relative to one on one position (so ``verify_ratio[B][0]`` is 1), for K = 0 ... K_max.

        The formula prices isolated calls; a fixed batch also pays for its tail of rows that finish late,
        and its calls attend over its longest row, which chapter 7 measures at 20 to 40% of a step's cost at
        large batches. So by default the policy speculates only where the formula promises 1.2x
        (``min_speedup=1`` takes the formula at its word), and `from_speedups` fits the measurement instead.

        The measured batch sizes need not start at 1: below the smallest one, the policy drafts that one's K.
        A smaller batch's verification is no dearer relative to a call on one position (v_B(K + 1) grows with B),
        so that K pays there at least as well; it is the measured choice, where a longer one would be a guess."""
        if not isinstance(min_speedup, (int, float)) or isinstance(min_speedup, bool) or not min_speedup >= 1:
            raise ValueError(f"min_speedup must be a number >= 1 (got {min_speedup!r})")
        if not isinstance(verify_ratio, dict) or not verify_ratio:
            raise ValueError(f"verify_ratio must be a non-empty dict from batch sizes to [ratio for K = 0 ... K_max] "
                             f"(got {verify_ratio!r})")
        for batch in verify_ratio:
            check_integer("verify_ratio's batch sizes", batch, 1)
        missing = [batch for batch in verify_ratio if batch not in cost_ratio]
        if missing:
            raise ValueError(f"cost_ratio must hold every batch size of verify_ratio (missing {missing})")
        table = {}
        for batch, ratios in verify_ratio.items():
            ks = range(1, len(ratios))
            gains = [batch_speedup(alpha, k, cost_ratio[batch], ratios[k]) for k in ks]
            best = max(gains, default=0.0)
            table[batch] = ks[gains.index(best)] if best > 1 and best >= min_speedup else 0
        if 1 not in table:  # from one row on: the smallest measured batch size's K
            table[1] = table[min(table)]
        return cls(table)

    @classmethod
    def from_speedups(cls, speedups: dict[int, dict[int, tuple[float, float]]], min_speedup: float = 1.0):
        """The K that measured fastest at each batch size, or 0 where none was faster than autoregressive decoding
        in every round. ``speedups[B][K]``: (median, lowest) of the per-round speedups of a fixed K over batched
        autoregressive decoding at batch size B (the batch suite's rows, `specbook.batch_bench`); a K counts only
        where its lowest round reaches ``min_speedup``.

        Where `from_costs` trusts the formula, this trusts the measurement: what a server tuned on its own
        hardware does. Below the smallest measured batch size it drafts that one's K, as `from_costs` does."""
        if not isinstance(min_speedup, (int, float)) or isinstance(min_speedup, bool) or not min_speedup >= 1:
            raise ValueError(f"min_speedup must be a number >= 1 (got {min_speedup!r})")
        if not isinstance(speedups, dict) or not speedups:
            raise ValueError(f"speedups must be a non-empty dict from batch sizes to {{K: (median, lowest)}} "
                             f"(got {speedups!r})")
        table = {}
        for batch, by_k in speedups.items():
            check_integer("speedups' batch sizes", batch, 1)
            paying = {k: median for k, (median, lowest) in by_k.items() if lowest >= min_speedup}
            table[batch] = max(paying, key=paying.get) if paying else 0
        if 1 not in table:
            table[1] = table[min(table)]
        return cls(table)

    def observe_batch(self, rows: int) -> None:
        self.rows = rows

    def k_for(self, rows: int) -> int:
        """The K this policy drafts for a batch of ``rows`` sequences."""
        return [k for batch, k in self.k_by_batch.items() if batch <= rows][-1]

    def next_k(self) -> int:
        return self.k_for(self.rows)

    def __repr__(self):
        return f"BatchSizeK({self.k_by_batch})"


def as_policy(k) -> DraftLength:
    """An int K becomes FixedK(K); a policy is used as it is."""
    return k if isinstance(k, DraftLength) else FixedK(k)

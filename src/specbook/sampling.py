"""Turning logits into the distribution a token is drawn from: greedy, temperature, top-k, top-p.

Speculative sampling is lossless with respect to whatever distribution the target's logits are
warped into, provided the draft's logits go through the *same* warp (Leviathan et al. 2023,
Section 3.1: "the standard sampling methods ... can be seen as sampling from an adjusted
distribution"). So the `Sampler` is one object applied to both models.

The warp follows Hugging Face's order and meaning so that `Sampler(t, k, p)` and
`model.generate(do_sample=True, temperature=t, top_k=k, top_p=p)` sample the same distribution:
divide by the temperature, keep the logits at least as large as the k-th largest (ties kept),
then keep the smallest set of most likely tokens whose probability reaches top_p (nucleus
sampling, Holtzman et al. 2020). Temperature 0 means greedy: a one-hot distribution on the argmax,
which turns the accept rule min(1, q/p) into "accept while the draft equals the target's argmax".
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampler:
    """How a token is chosen from logits. ``Sampler()`` samples at temperature 1; ``Sampler(0)`` is greedy."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0:
            raise ValueError(f"temperature must be a number >= 0 (got {self.temperature!r}); 0 means greedy")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise ValueError(f"top_k must be an integer >= 1 or None (got {self.top_k!r})")
        if self.top_p is not None and (not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1] or None (got {self.top_p!r})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def warp(self, logits: torch.Tensor) -> torch.Tensor:
        """Temperature, then top-k, then top-p, on logits (..., vocab); removed tokens get -inf."""
        logits = logits.float() / self.temperature
        if self.top_k is not None and self.top_k < logits.shape[-1]:
            kth_largest = torch.topk(logits, self.top_k).values[..., -1:]  # (..., 1)
            logits = logits.masked_fill(logits < kth_largest, float("-inf"))
        if self.top_p is not None and self.top_p < 1:
            sorted_logits, order = torch.sort(logits, descending=False)
            cumulative = sorted_logits.softmax(-1).cumsum(-1)  # mass of this token and all less likely ones
            remove_sorted = cumulative <= 1 - self.top_p
            remove_sorted[..., -1].fill_(False)  # the most likely token always stays (a fill: capturable)
            logits = logits.masked_fill(remove_sorted.scatter(-1, order, remove_sorted), float("-inf"))
        return logits

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution a token is drawn from: (..., vocab) logits -> (..., vocab) probabilities."""
        if self.greedy:
            return one_hot(logits.argmax(-1), logits.shape[-1])
        return self.warp(logits).softmax(-1)

    def sample(self, probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """One token per row of ``probs`` (..., vocab) -> (...) token ids (`draw`)."""
        if self.greedy:
            return probs.argmax(-1)
        return draw(probs, generator)

    def pick(self, logits: torch.Tensor, generator: torch.Generator | None = None):
        """A drafted token from ``logits`` (..., vocab), and the p verification tests it against: (token (...),
        probs (..., vocab)); greedily the argmax and None, a deterministic draft's p, one-hot and left implicit
        (`specbook.drafters.Draft`)."""
        if self.greedy:
            return logits.argmax(-1), None
        probs = self.probs(logits)
        return self.sample(probs, generator), probs

    def sample_rows(self, probs: torch.Tensor, generators: list, active: list[bool]) -> torch.Tensor:
        """One token per row of a batch, ``probs`` (B, vocab) -> (B,), row b drawn from its own stream
        ``generators[b]`` exactly as `sample` draws it alone, so a row's tokens do not depend on the
        other rows. Rows not ``active`` get the argmax and leave their stream untouched."""
        tokens = probs.argmax(-1)  # (B,)
        if not self.greedy:
            for row in (row for row, on in enumerate(active) if on):
                tokens[row] = self.sample(probs[row], generators[row])
        return tokens


def one_hot(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """The one-hot distributions (..., vocab), float32, of ``tokens`` (...): ``F.one_hot(tokens, vocab).float()``
    in two kernels, without its check of the tokens' range (two reductions on a CPU)."""
    return torch.zeros(tokens.shape + (vocab,), device=tokens.device).scatter_(-1, tokens[..., None], 1.0)


def draw(probs: torch.Tensor, generator: torch.Generator | None = None, race: bool | None = None) -> torch.Tensor:
    """One index per row of ``probs`` (..., n) -> (...), drawn with the row's probabilities.

    On a CPU, ``torch.multinomial``. On a GPU (or with ``race=True``) the exponential race: with
    E_1, ..., E_n independent Exp(1), the index of the largest p_i / E_i is i with probability p_i (the
    E_i / p_i are exponentials of rates p_i, and the first of them to arrive is i with probability
    p_i / sum p). The same distribution, drawn without the host: ``torch.multinomial`` checks its input
    on the host, a wait for the GPU at every draw (pytorch/pytorch#108968), and cannot be captured in
    a CUDA graph. The two consume the random stream differently, so a seed gives other tokens on a GPU.
    """
    if race is None:
        race = probs.device.type == "cuda"
    if not race:
        flat = probs.reshape(-1, probs.shape[-1])
        return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])
    return exponential_race(probs, torch.empty_like(probs, dtype=torch.float32).exponential_(generator=generator))


def exponential_race(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """`draw`'s exponential race on given ``noise`` (..., n) of independent Exp(1) draws: the index of the
    largest p_i / E_i per row (..., n) -> (...). A CUDA graph that drafts several tokens races on noise
    drawn before its replay (`specbook.graphs.StaticModel.chain`)."""
    return torch.where(probs > 0, probs / noise, -1.0).argmax(-1)  # a zero p never wins, even against E = 0


def make_generator(seed: int | None, device) -> torch.Generator | None:
    """A random stream on ``device`` seeded with ``seed``; None (the global stream) for no seed."""
    return None if seed is None else torch.Generator(device).manual_seed(seed)

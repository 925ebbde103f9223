"""Where a speculative step's time goes: drafting, the target call, probabilities, verification, rollback.

`step_profile` runs `speculative_generate` unchanged and times, from the outside, the parts the
engine calls (each wrapped for the run and restored after): the drafter's ``propose`` (the draft
model's forward passes and its sampling), the target's forward (`decoding._target_forward`), the
target's probabilities (``Sampler.probs`` outside drafting), verification (`verify_chain` or
`verify_tree`), and the rollback of both caches (`cache.rollback` and the drafter's ``update``).
What is left of a step's wall time is the engine's own bookkeeping. Times are exclusive: a part
called inside another counts once, in the innermost. On a GPU every boundary synchronises, so the
profile slows the run down a little and says where the time goes, not how fast the run is.

Chapter 3's formula puts a step at K draft calls plus one target call; the rest is what an engine
adds: part of the gap between the formula's speedup and the measured one (chapter 4).
"""

import statistics
from contextlib import ExitStack
from unittest import mock

import torch

from . import decoding
from .bench import _clock
from .decoding import speculative_generate
from .drafters import ModelDrafter
from .sampling import Sampler

PARTS = ("draft", "target call", "probabilities", "verification", "rollback", "prefill")
WRAPPED = [(decoding, "_target_forward", "target call"), (decoding, "verify_chain", "verification"),
           (decoding, "verify_chain_greedy", "verification"),
           (decoding, "verify_tree", "verification"), (decoding, "rollback", "rollback"),
           (decoding, "_prefill", "prefill"), (Sampler, "probs", "probabilities")]  # (owner, attribute, part)


class _Timer:
    """Exclusive wall time per part: entering a part pauses the one it was called from."""

    def __init__(self):
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self.stack = []  # [part, started]

    def wrap(self, part, function):
        def timed(*args, **kwargs):
            if self.stack and self.stack[-1][0] == "draft":  # the draft's own probabilities are drafting
                return function(*args, **kwargs)
            now = _clock()
            if self.stack:
                outer = self.stack[-1]
                self.seconds[outer[0]] += now - outer[1]
            self.stack.append([part, now])
            try:
                return function(*args, **kwargs)
            finally:
                now = _clock()
                self.seconds[part] += now - self.stack.pop()[1]
                if self.stack:
                    self.stack[-1][1] = now
        return timed


def copy_bandwidth(device="cpu", megabytes=256, repeats=5) -> float:
    """The device's memory bandwidth in GB/s: the bytes a large copy reads plus those it writes, over its
    median time. The ceiling a decoding step that reads every weight once can approach at batch one."""
    source = torch.ones(megabytes * 2**20 // 4, device=device)  # float32
    target = torch.empty_like(source)
    times = []
    for _ in range(repeats + 1):  # the first copy is a warm-up
        started = _clock()
        target.copy_(source)
        times.append(_clock() - started)
    return 2 * source.numel() * source.element_size() / statistics.median(times[1:]) / 1e9


def step_profile(target, drafter, prompts, k=4, max_new_tokens=64, sampler=Sampler(0), seed=0, **path) -> dict:
    """Milliseconds per speculative step, split into parts, over ``prompts`` ((1, T) tensors).

    ``drafter`` is a `Drafter` (or a draft model); ``path`` the GPU path's ``cache`` and ``compile``.
    Returns ``{"steps": n, "ms_per_step": {part: ms, ..., "engine": ms}, "tokens_per_step": float}``,
    where ``engine`` is what the parts leave of the generation's wall time, a separate prefill excluded
    (the engine reads the prompt in its first verification call unless the drafter needs it earlier). The
    first prompt runs once untimed first (lazy initialisation, compilation).
    """
    if isinstance(drafter, torch.nn.Module):
        drafter = ModelDrafter(drafter, **path)
    speculative_generate(target, drafter, prompts[0], max_new_tokens, k, sampler, seed, **path)
    timer = _Timer()
    total, steps, tokens = 0.0, 0, 0
    with ExitStack() as patches:
        for module, name, part in WRAPPED:
            patches.enter_context(mock.patch.object(module, name, timer.wrap(part, getattr(module, name))))
        patches.enter_context(mock.patch.object(drafter, "propose", timer.wrap("draft", drafter.propose)))
        patches.enter_context(mock.patch.object(drafter, "update", timer.wrap("rollback", drafter.update)))
        for input_ids in prompts:
            started = _clock()
            generation = speculative_generate(target, drafter, input_ids, max_new_tokens, k, sampler, seed, **path)
            total += _clock() - started
            steps += len(generation.steps)
            tokens += len(generation.token_ids)
    parts = {part: 1000 * seconds / steps for part, seconds in timer.seconds.items() if part != "prefill"}
    # the parts are disjoint intervals of the total, so only rounding could take the remainder below zero
    parts["engine"] = max(0.0, 1000 * (total - sum(timer.seconds.values())) / steps)
    return {"steps": steps, "ms_per_step": parts, "tokens_per_step": tokens / steps}

"""Where a speculative step's time goes: drafting, the target call, probabilities, verification, rollback.

`step_profile` runs `speculative_generate` unchanged and times, from the outside, the parts the
engine calls (each wrapped for the run and restored after): the drafter's ``propose`` (the draft
model's forward passes and its sampling), the target's forward (`decoding._target_forward`), the
target's probabilities (``Sampler.probs`` outside drafting), verification (`chain_decision` or
`tree_outcome`; where a chain's replays inside the target call's graph, it counts as the target call),
and the rollback of both caches (`cache.rollback` and the drafter's ``update``). What is left of a step's wall time is the engine's own bookkeeping. Times are exclusive: a part
called inside another counts once, in the innermost. On a GPU every boundary synchronises, so the
profile slows the run down a little and says where the time goes, not how fast the run is; and the
steps run one after the other, without the next chain drafted ahead of the host's read
(`specbook.drafters.ModelDrafter.draft_ahead`), so that each part's time is its own.

Chapter 3's formula puts a step at K draft calls plus one target call; the rest is what an engine
adds: part of the gap between the formula's speedup and the measured one (chapter 4).

`host_profile` asks what the host does per call rather than how long a step takes: the host's
microseconds per decode call (on a GPU, where the host queues work and waits only at a sync, that is
its launch overhead, not the GPU's time), the operators dispatched per step outside the model calls
(sampling, verification, bookkeeping: each one a kernel launch on a GPU) and inside them, and the
conversions of tensors to Python values per step (`host_reads`: on a GPU each one waits for the
device). It runs on a CPU too, where it counts the same things.
"""

import statistics
import time
from collections import Counter
from contextlib import ExitStack, contextmanager
from unittest import mock

import torch

from . import decoding, kernels
from .bench import _clock
from .decoding import autoregressive_generate, gpu_path, speculative_generate
from .drafters import as_drafter
from .sampling import Sampler

PARTS = ("draft", "target call", "probabilities", "verification", "rollback", "prefill")
WRAPPED = [(decoding, "_target_forward", "target call"), (decoding, "chain_decision", "verification"),
           (decoding, "tree_outcome", "verification"), (decoding, "tree_outcome_greedy", "verification"),
           (decoding, "rollback", "rollback"),
           (decoding, "prefill", "prefill"), (Sampler, "probs", "probabilities")]  # (owner, attribute, part)


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


def step_profile(target, drafter, prompts, k=4, max_new_tokens=64, sampler=Sampler(0), seed=0, warm=True,
                 **path) -> dict:
    """Milliseconds per speculative step, split into parts, over ``prompts`` ((1, T) tensors).

    ``drafter`` is a `Drafter` (or a draft model); ``path`` the GPU path's ``cache`` and ``compile``.
    Returns ``{"steps": n, "ms_per_step": {part: ms, ..., "engine": ms}, "tokens_per_step": float,
    "draft_calls_per_step": float}``, where ``engine`` is what the parts leave of the generation's wall time, a
    separate prefill excluded (the engine reads the prompt in its first verification call unless the drafter
    needs it earlier). With ``warm``, the first prompt runs once untimed first (lazy initialisation, compilation).
    """
    drafter = as_drafter(drafter, target, *gpu_path(target, **path))  # a model drafts on the engine's path
    if warm:
        speculative_generate(target, drafter, prompts[0], max_new_tokens, k, sampler, seed, **path)
    timer = _Timer()
    total, steps, tokens, draft_calls = 0.0, 0, 0, 0
    with ExitStack() as patches:
        for module, name, part in WRAPPED:
            patches.enter_context(mock.patch.object(module, name, timer.wrap(part, getattr(module, name))))
        patches.enter_context(mock.patch.object(drafter, "propose", timer.wrap("draft", drafter.propose)))
        patches.enter_context(mock.patch.object(drafter, "update", timer.wrap("rollback", drafter.update)))
        patches.enter_context(mock.patch.object(drafter, "draft_ahead", lambda *args, **options: False))
        for input_ids in prompts:
            started = _clock()
            generation = speculative_generate(target, drafter, input_ids, max_new_tokens, k, sampler, seed, **path)
            total += _clock() - started
            steps += len(generation.steps)
            tokens += len(generation.token_ids)
            draft_calls += generation.stats.draft_calls
    parts = {part: 1000 * seconds / steps for part, seconds in timer.seconds.items() if part != "prefill"}
    # the parts are disjoint intervals of the total, so only rounding could take the remainder below zero
    parts["engine"] = max(0.0, 1000 * (total - sum(timer.seconds.values())) / steps)
    return {"steps": steps, "ms_per_step": parts, "tokens_per_step": tokens / steps,
            "draft_calls_per_step": draft_calls / steps}


def autoregressive_ms(target, prompts, max_new_tokens=64, sampler=Sampler(0), seed=0, warm=True, **path) -> float:
    """Milliseconds per token of autoregressive decoding over ``prompts`` ((1, T) tensors), after one untimed run
    with ``warm``: the baseline a speculative step's parts are weighed against. A step of E tokens whose target
    call takes t ms can run at most E * (this) / t times as fast, even were drafting and the engine free."""
    if warm:
        autoregressive_generate(target, prompts[0], max_new_tokens, sampler, seed, **path)
    started, tokens = _clock(), 0
    for input_ids in prompts:
        tokens += len(autoregressive_generate(target, input_ids, max_new_tokens, sampler, seed, **path).token_ids)
    return 1000 * (_clock() - started) / tokens


CONVERSIONS = ("item", "tolist", "__int__", "__float__", "__bool__", "__index__")  # tensor -> Python value


@contextmanager
def host_reads():
    """Count the conversions of tensors to Python values made inside the block (``.item()``, ``.tolist()``,
    ``int(t)``, ``float(t)``, ``if t:``, ``t`` as an index): yields a `Counter` by method. On a GPU each one
    waits for the device (torch's sync debug mode, ``torch.cuda.set_sync_debug_mode``, catches the others:
    copies to the host made inside torch's own operators); on a CPU they are what the engine would wait for."""
    counts, inside = Counter(), [False]
    own = {name: torch.Tensor.__dict__.get(name) for name in CONVERSIONS}

    def counting(name, convert):
        def counted(self, *args, **kwargs):
            if inside[0]:  # a conversion that a torch function mode passes on is the same one (`kernels.counting`)
                return convert(self, *args, **kwargs)
            counts[name] += 1
            inside[0] = True
            try:
                return convert(self, *args, **kwargs)
            finally:
                inside[0] = False
        return counted

    try:
        for name in CONVERSIONS:
            setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))
        yield counts
    finally:
        for name, convert in own.items():
            if convert is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, convert)


def host_profile(target, drafter, input_ids, k=4, max_new_tokens=64, sampler=Sampler(0), seed=0, **path) -> dict:
    """What the host does per call in a speculative generation of ``input_ids`` (1, T): a dict with

    - ``steps`` and ``draft_calls`` of the generation;
    - ``syncs_per_step``: conversions of tensors to Python values per step (`host_reads`) made by the engine and
      the drafter, outside the target's calls (a generation's own few, such as checking the prompt, spread over
      its steps), and ``syncs_in_calls_per_step`` those made inside its decode calls (Hugging Face's eager code
      reads a static cache's length; a replayed graph or a compiled call does not);
    - ``target_host_us_per_call`` and ``draft_host_us_per_call``: the host's microseconds from a decode call's
      start to its return (the target's verification calls, the drafter's ``propose`` and ``draft_ahead`` per
      draft call), the prompt's call excluded. On a GPU the host does not wait for the device inside them (it waits once a
      step, after them), so this is what launching a call costs; on a CPU the call's work is done by then too;
    - ``operators_per_step_outside_calls``, ``operators_per_target_call``, ``operators_per_draft_call``:
      kernels per step outside the model calls (sampling, verification, bookkeeping) and per decode call inside
      them, counted as `specbook.kernels.count_kernels` counts them (`specbook.kernels.counting`): each is a launch
      on a GPU, unless a replayed CUDA graph holds it (the prompt's call is counted in neither). Compiled calls run
      without the count (torch.compile refuses it): None inside them.

    ``drafter`` is a `Drafter` or a draft model; ``path`` the engine's ``cache`` and ``compile``. One untimed
    run first (allocation, capture, compilation); the counts come from a second run, the times from a third.
    """
    drafter = as_drafter(drafter, target, *gpu_path(target, **path))  # a model drafts on the engine's path
    seconds, calls, inside = Counter(), Counter(), Counter()  # inside: reads per call kind
    forward, propose = decoding._target_forward, drafter.propose
    first = [True]  # the run's first target call reads the prompt, unless the engine prefilled it for the drafter

    def timed(part, function):
        def call(*args, **kwargs):
            name = part
            if part == "target" and first[0]:
                first[0] = False
                if not drafter.needs_prefill:  # the prompt's call: not a decode call, nor the step's own work
                    name = "prompt"
            reads, operators = counting.get("reads"), counting.get("kernels")
            outer = operators.part if operators is not None else None
            if operators is not None:
                operators.part = name
            read = sum(reads.values()) if reads is not None else 0
            started = time.perf_counter()
            try:
                if path.get("compile"):  # compiled code refuses to run under a counting mode
                    with kernels.paused():
                        return function(*args, **kwargs)
                return function(*args, **kwargs)
            finally:
                seconds[name] += time.perf_counter() - started
                calls[name] += 1
                if operators is not None:
                    operators.part = outer
                if reads is not None and name != "draft":
                    inside[name] += sum(reads.values()) - read
        return call

    def run():
        first[0] = True
        return speculative_generate(target, drafter, input_ids, max_new_tokens, k, sampler, seed, **path)

    run()
    counting = {}  # the counters of host reads and of kernels while the counted run lasts
    with ExitStack() as patches:
        patches.enter_context(mock.patch.object(decoding, "_target_forward", timed("target", forward)))
        patches.enter_context(mock.patch.object(drafter, "propose", timed("draft", propose)))
        patches.enter_context(mock.patch.object(drafter, "draft_ahead", timed("draft", drafter.draft_ahead)))
        with host_reads() as reads, kernels.counting() as operators:
            counting.update(reads=reads, kernels=operators)
            generation = run()
        counting.clear()
        target_calls, counts = calls["target"], dict(operators.parts)
        seconds.clear()
        run()
    steps, draft_calls, compiled = len(generation.steps), generation.stats.draft_calls, bool(path.get("compile"))
    return {"steps": steps, "draft_calls": draft_calls,
            "syncs_per_step": (sum(reads.values()) - inside["target"] - inside["prompt"]) / steps,
            "syncs_in_calls_per_step": inside["target"] / steps,
            "target_host_us_per_call": 1e6 * seconds["target"] / max(target_calls, 1),
            "draft_host_us_per_call": 1e6 * seconds["draft"] / max(draft_calls, 1),
            "operators_per_step_outside_calls": counts.get("outside", 0) / steps,
            "operators_per_target_call": None if compiled else counts.get("target", 0) / max(target_calls, 1),
            "operators_per_draft_call": None if compiled else counts.get("draft", 0) / max(draft_calls, 1)}

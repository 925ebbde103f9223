"""Checkers for the exercises of chapter 4, a full implementation: rolling back a KV cache, how
far back each of the two caches goes after a step, greedy speculative decoding from scratch, and
the acceptance rate read off a trace of steps.

The references are the package's: keys and values cropped along the sequence dimension as
`specbook.cache.rollback` crops a `DynamicCache`; the bookkeeping of `specbook.decoding` and
`specbook.drafters.ModelDrafter`; `specbook.autoregressive_generate` for the tokens greedy
speculative decoding must reproduce, on tiny random models (`specbook.exercises.tiny`); and
`Generation.stats.acceptance_rate`.
"""

from __future__ import annotations

import math

import torch
from transformers import DynamicCache

from ..decoding import Step, autoregressive_generate, speculative_generate
from ..drafters import PromptLookupDrafter
from ..policies import HeuristicK
from ..sampling import Sampler
from .ch01 import _compare_tokens
from .core import Case, Check, _as_float, _as_int, _same_number, _type_name
from .tiny import random_prompt, recorded, tiny_model

# --- Roll back one KV cache ----------------------------------------------------------------------


def _random_cache(generator, layers: int, shape: tuple) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.randn(shape, generator=generator), torch.randn(shape, generator=generator))
            for _ in range(layers)]


def _model_cache(length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The keys and values a tiny model's DynamicCache holds after reading ``length`` tokens."""
    cache = DynamicCache()
    with torch.inference_mode():
        tiny_model(0)(random_prompt(5, length), past_key_values=cache, use_cache=True)
    return [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]


def _rollback_cache_cases() -> list[Case]:
    generator = torch.Generator().manual_seed(4)
    settings = [
        ("2 layers of keys and values (1, 2, 7, 4)", _random_cache(generator, 2, (1, 2, 7, 4)), 3),
        ("1 layer, drop the last position", _random_cache(generator, 1, (1, 2, 6, 4)), 1),
        ("drop 0 positions: nothing was rejected", _random_cache(generator, 2, (1, 2, 5, 4)), 0),
        ("drop every position", _random_cache(generator, 1, (1, 2, 4, 4)), 4),
        ("a batch of 2, 3 layers of (2, 4, 9, 8)", _random_cache(generator, 3, (2, 4, 9, 8)), 2),
        ("heads, positions and head size all 5", _random_cache(generator, 2, (1, 5, 5, 5)), 2),
        ("a tiny model's cache after 6 tokens", _model_cache(6), 2),
    ]
    cases = []
    for label, cache, num_tokens in settings:
        keep = cache[0][0].shape[2] - num_tokens
        expected = [(keys[:, :, :keep], values[:, :, :keep]) for keys, values in cache]
        cases.append(Case(f"{label}, num_tokens = {num_tokens}", (cache, num_tokens), expected))
    return cases


def _compare_rollback_cache(got, case: Case) -> str | None:
    cache, num_tokens = case.args
    if not isinstance(got, (list, tuple)) or len(got) != len(cache):
        return (f"expected a list of {len(cache)} (keys, values) pairs, one per layer, got {_type_name(got)}"
                + (f" of length {len(got)}." if isinstance(got, (list, tuple)) else "."))
    for layer, (pair, original, wanted) in enumerate(zip(got, cache, case.expected)):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            return f"layer {layer}: expected a pair (keys, values), got {_type_name(pair)}."
        for index, name in enumerate(("keys", "values")):
            tensor, before, after = pair[index], original[index], wanted[index]
            where = f"layer {layer}, {name}"
            if not isinstance(tensor, torch.Tensor):
                return f"{where}: expected a tensor, got {_type_name(tensor)}."
            shape, length = tuple(tensor.shape), before.shape[2]
            if shape != tuple(after.shape):
                expected = f"{where}: expected shape {tuple(after.shape)}, got {shape}"
                if shape == tuple(before.shape) and num_tokens:
                    return f"{expected}: nothing was dropped. Drop the last {num_tokens} positions."
                if len(shape) == 4 and shape[2] == 0 and num_tokens == 0:
                    return (f"{expected}: `[:, :, :-0]` keeps nothing, since -0 is 0. Slice with "
                            f"`[:, :, :length - num_tokens]`, or return the cache as it is when num_tokens is 0.")
                if len(shape) == 4 and shape[2] == num_tokens and shape[:2] + shape[3:] == after.shape[:2] + \
                        after.shape[3:]:
                    return f"{expected}: that keeps the last {num_tokens} positions; drop them, keep the rest."
                return (f"{expected}. The positions are dimension 2 (or -2) of (batch, heads, positions, head_dim): "
                        f"keep the first {length - num_tokens} of {length}.")
            if not torch.equal(tensor, after):
                if torch.equal(tensor, wanted[1 - index]):
                    return f"{where}: the keys and values are swapped. Return (keys, values) in that order."
                if torch.equal(tensor, before[:, :, num_tokens:]):
                    return (f"{where}: that drops the first {num_tokens} positions. The rejected drafts are the "
                            "last ones; the prefix must stay.")
                return (f"{where}: the shape is right but the numbers are not. Keep positions 0 … "
                        f"{length - num_tokens - 1} along dimension 2, unchanged.")
    return None


check_rollback_cache = Check("rollback_cache", _rollback_cache_cases, _compare_rollback_cache)


# --- How far back each cache goes ------------------------------------------------------------------


def rollback_counts_reference(k: int, num_accepted: int) -> tuple[int, int]:
    """(target positions to drop, draft positions to drop) after a step that drafted k tokens.

    The target scored [pending, d_1, ..., d_k] and keeps the pending token and the accepted drafts
    (`specbook.decoding`); the draft fed [pending, d_1, ..., d_{k-1}] (d_k was sampled, never fed)
    and keeps the same accepted prefix, as far as it has it (`ModelDrafter.update`).
    """
    in_draft_cache = k - 1
    return k - num_accepted, in_draft_cache - min(num_accepted, in_draft_cache)


def _rollback_counts_cases() -> list[Case]:
    settings = [(4, 2), (4, 0), (4, 4), (4, 3), (1, 0), (1, 1), (2, 1), (6, 5), (6, 1), (8, 8), (3, 0)]
    return [Case(f"K = {k}, {accepted} accepted", (k, accepted), rollback_counts_reference(k, accepted))
            for k, accepted in settings]


def _positions(count: int) -> str:
    return f"{count} position" + ("" if count == 1 else "s")


def _compare_rollback_counts(got, case: Case) -> str | None:
    k, accepted = case.args
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return (f"expected a pair (target_drop, draft_drop), got {_type_name(got)}"
                + (f" of length {len(got)}." if isinstance(got, (tuple, list)) else "."))
    target_drop, draft_drop = _as_int(got[0], "target_drop"), _as_int(got[1], "draft_drop")
    expected_target, expected_draft = case.expected
    if target_drop != expected_target:
        expected = f"the target's cache should drop {_positions(expected_target)}, got {target_drop}"
        if target_drop == expected_target + 1:
            return (f"{expected}: that drops the pending token too. It was committed before the step; only the "
                    f"rejected drafts d_{accepted + 1} … d_{k} go.")
        if target_drop == expected_target - 1:
            return (f"{expected}. The token emitted after the accepted drafts was never fed to the target: it is "
                    "the new pending token, not in the cache.")
        return (f"{expected}. The target scored [pending, d_1 … d_K] and keeps the pending token and the accepted "
                "drafts.")
    if draft_drop != expected_draft:
        expected = f"the draft's cache should drop {_positions(expected_draft)}, got {draft_drop}"
        if draft_drop == k - accepted:
            return (f"{expected}: the draft's cache never saw d_K (it was sampled, never fed), so it holds only "
                    f"d_1 … d_{k - 1} of the drafts.")
        return (f"{expected}. The draft fed [pending, d_1 … d_(K-1)]; it keeps the pending token and the accepted "
                "drafts it has.")
    return None


check_rollback_counts = Check("rollback_counts", _rollback_counts_cases, _compare_rollback_counts)


# --- Greedy speculative decoding, from scratch --------------------------------------------------------


@torch.inference_mode()
def speculative_greedy_reference(target, draft, input_ids, max_new_tokens, k, trim=True):
    """Greedy speculative decoding without a cache: (new tokens, target calls).

    ``trim`` drafts at most max_new_tokens - written - 1 tokens, as `specbook.speculative_generate`
    does; without it every step drafts k and the output is cut at the end.
    """
    context, new_tokens, calls = input_ids[0].tolist(), [], 0
    while len(new_tokens) < max_new_tokens:
        budget = min(k, max_new_tokens - len(new_tokens) - 1) if trim else k
        drafted = []
        for _ in range(budget):
            drafted.append(int(draft(torch.tensor([context + drafted])).logits[0, -1].argmax()))
        choices = target(torch.tensor([context + drafted])).logits[0, -(budget + 1):].argmax(-1).tolist()
        calls += 1
        accepted = 0
        while accepted < budget and drafted[accepted] == choices[accepted]:
            accepted += 1
        emitted = drafted[:accepted] + [choices[accepted]]  # a correction, or the bonus after k
        context += emitted
        new_tokens += emitted
    return new_tokens[:max_new_tokens], calls


SPECULATIVE_SETTINGS = [  # (label, draft noise or None for an unrelated draft, prompt seed, length, new tokens, k)
    ("a draft identical to the target: every draft is accepted", 0.0, 10, 5, 12, 3),
    ("a draft close to the target", 0.2, 11, 6, 16, 4),
    ("a draft close to the target, K = 1", 0.2, 12, 4, 10, 1),
    ("a rough draft", 0.5, 13, 8, 14, 2),
    ("an unrelated draft: nearly every draft is rejected", None, 14, 5, 8, 3),
    ("a one-token prompt, identical draft", 0.0, 15, 1, 7, 4),
    ("K larger than max_new_tokens", 0.3, 16, 6, 3, 6),
]


def _speculative_cases() -> list[Case]:
    target = tiny_model(0)
    cases = []
    for label, noise, prompt_seed, length, max_new_tokens, k in SPECULATIVE_SETTINGS:
        draft = tiny_model(9, hidden_size=16, num_layers=1) if noise is None else \
            tiny_model(0, noise=noise, noise_seed=prompt_seed)
        prompt = random_prompt(prompt_seed, length)  # (1, T)
        expected = autoregressive_generate(target, prompt, max_new_tokens, Sampler(0)).token_ids
        allowed = max(speculative_greedy_reference(target, draft, prompt, max_new_tokens, k, trim)[1]
                      for trim in (True, False))
        copy, calls = recorded(target)
        cases.append(Case(f"{label}, prompt {prompt[0].tolist()}, max_new_tokens = {max_new_tokens}, k = {k}",
                          (copy, draft, prompt, max_new_tokens, k), expected,
                          extra={"calls": calls, "allowed": allowed, "identical": noise == 0}))
    return cases


def _compare_speculative(got, case: Case) -> str | None:
    _, _, prompt, max_new_tokens, k = case.args
    problem = _compare_tokens(got, case, prompt, (
        "Greedy speculative decoding must write exactly what greedy autoregressive decoding writes. The target's "
        "logits at the pending token's position give its verdict on d_1; at the first draft it disagrees with, "
        "emit the target's argmax there, not the draft's token, and discard the drafts after it."))
    if problem:
        return problem
    calls, allowed = len(case.extra["calls"]), case.extra["allowed"]
    if calls <= allowed:
        return None
    message = (f"the tokens are right, but your loop called the target {calls} times for {max_new_tokens} tokens; "
               f"speculative decoding with k = {k} needs at most {allowed} here.")
    if calls >= max_new_tokens:
        return (f"{message} That is a call per token, like autoregressive decoding: draft k tokens first, then "
                "score them all with one target call.")
    if case.extra["identical"]:
        return (f"{message} Every draft is accepted here: after k accepted drafts emit the bonus token, the argmax "
                "of the target's last row, which the same call already computed.")
    return f"{message} Call the target once per step, on the context plus all k drafts."


check_speculative_greedy = Check("speculative_greedy", _speculative_cases, _compare_speculative)


# --- The acceptance rate from a trace --------------------------------------------------------------


def acceptance_from_steps_reference(steps: list[Step]) -> float:
    """alpha-hat = accepted / (accepted + rejected) drafts, as `specbook.decoding` computes its Stats."""
    accepted = sum(step.accepted for step in steps)
    rejected = sum(step.accepted < len(step.drafted) for step in steps)  # at most one per step
    return accepted / (accepted + rejected)


def _traced_steps() -> list[tuple[str, list[Step], float]]:
    """Steps of real greedy runs on tiny models, with draft lengths that change from step to step, and
    the acceptance rate `speculative_generate` reported for each."""
    target = tiny_model(0)
    prompt = random_prompt(20, 6)  # (1, 6)
    runs = [("a run with a close draft and HeuristicK", tiny_model(0, noise=0.3, noise_seed=20), prompt,
             HeuristicK(k_start=2, k_max=6)),
            ("a prompt-lookup run on a repetitive prompt", PromptLookupDrafter(), prompt.repeat(1, 3), 4)]
    traces = []
    for label, drafter, input_ids, k in runs:
        # Seeded, so that the run leaves the global random state alone (greedy verification still draws).
        generation = speculative_generate(target, drafter, input_ids, 30, k, Sampler(0), seed=0)
        traces.append((f"{label}: {len(generation.steps)} steps, draft lengths "
                       f"{[len(step.drafted) for step in generation.steps]}", generation.steps,
                       generation.stats.acceptance_rate))
    return traces


def _acceptance_from_steps_cases() -> list[Case]:
    logs = [
        ("3 steps of K = 4", [Step([5, 6, 7, 8], 2, 9, False), Step([1, 2, 3, 4], 4, 5, True),
                              Step([3, 3, 3, 3], 0, 1, False)]),
        ("every draft accepted", [Step([1, 2], 2, 3, True), Step([4, 5], 2, 6, True)]),
        ("every first draft rejected", [Step([1, 2, 3], 0, 7, False), Step([4, 5, 6], 0, 7, False)]),
        ("the last step drafted nothing (the budget ran out)",
         [Step([1, 2, 3, 4], 1, 8, False), Step([5, 6, 7, 8], 4, 9, True), Step([], 0, 2, False)]),
        ("draft lengths that vary", [Step([1, 2, 3, 4, 5, 6], 6, 0, True), Step([1, 2, 3, 4, 5, 6, 7, 8], 3, 0, False),
                                     Step([1, 2, 3, 4, 5, 6, 7], 7, 0, True), Step([1], 0, 0, False)]),
    ]
    cases = []
    for label, steps in logs:
        label += ": " + ", ".join(f"{step.accepted} of {len(step.drafted)} accepted" for step in steps)
        cases.append(Case(label, (steps,), acceptance_from_steps_reference(steps)))
    return cases + [Case(label, (steps,), alpha) for label, steps, alpha in _traced_steps()]


def _compare_acceptance_from_steps(got, case: Case) -> str | None:
    (steps,) = case.args
    got = _as_float(got, "a number")
    if _same_number(got, case.expected):
        return None
    expected = f"expected α̂ = {case.expected:.6g}, got {got:.6g}"
    accepted = sum(step.accepted for step in steps)
    drafted = sum(len(step.drafted) for step in steps)
    mistakes = [  # the first that matches names the mistake
        (accepted / drafted, "accepted / drafted. The drafts after a rejection were discarded untested: they say "
                             "nothing about α, and counting them pulls the estimate down"),
        (accepted / (accepted + len(steps)), "a rejection counted in every step, but a step that accepts all its "
                                             "drafts rejected none (its extra token is the bonus)"),
        (accepted / (accepted + sum(not step.bonus for step in steps)), "a rejection counted in every step without "
                                                                        "a bonus, but a step that drafted nothing "
                                                                        "tested nothing"),
    ]
    if all(step.drafted for step in steps):
        mistakes.append((sum(step.accepted / len(step.drafted) for step in steps) / len(steps),
                         "the mean of accepted / drafted per step, which counts untested drafts too"))
    for value, mistake in mistakes:
        if not math.isclose(value, case.expected, rel_tol=1e-9) and math.isclose(got, value, rel_tol=1e-9):
            return f"{expected}: that is {mistake}."
    return f"{expected}. α̂ = accepted / (accepted + rejected): a step rejects at most one draft."


check_acceptance_from_steps = Check("acceptance_from_steps", _acceptance_from_steps_cases,
                                    _compare_acceptance_from_steps)

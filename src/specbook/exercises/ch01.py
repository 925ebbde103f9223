"""Checkers for the exercises of chapter 1, autoregressive decoding: a softmax that cannot
overflow, the sampling warp, greedy decoding with a KV cache, and the bytes and FLOPs of one
decoding step.

The references are `torch.softmax`, `specbook.Sampler` (temperature, then top-k, then top-p, as
Hugging Face orders them), `specbook.autoregressive_generate` on tiny random models, and the cost model of
chapter 1 (§1.7): a step that scores ``tokens`` new positions reads every weight and the KV cache
once, and does 2N FLOPs per position plus attention's 4 x layers x width per cached position.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..decoding import autoregressive_generate
from ..sampling import Sampler
from .core import Case, Check, _as_float, _as_token_list, _close, _fmt, _Wrong
from .tiny import random_prompt, recorded, tiny_model

PROBS_ATOL = 1e-5  # the warp runs in float32

# --- A softmax that cannot overflow -------------------------------------------------------------------

SOFTMAX_SETTINGS = [  # (label, logits)
    ("small logits", [2.0, 1.0, 0.5, -1.0, 0.0]),
    ("large logits: exp(1000) overflows", [1000.0, 999.0, 998.0]),
    ("very negative logits: exp(-1000) underflows to 0", [-1000.0, -1001.0, -1002.0]),
    ("equal logits", [0.0, 0.0, 0.0, 0.0]),
    ("masked tokens (logit -inf), as after top-k", [3.0, float("-inf"), 1.0, float("-inf")]),
    ("one token", [5.0]),
    ("a wide range", [50.0, 0.0, -50.0, 20.0]),
]


def _softmax_cases() -> list[Case]:
    settings = [(label, torch.tensor(values)) for label, values in SOFTMAX_SETTINGS]
    generator = torch.Generator().manual_seed(0)
    settings.append(("random logits, vocab 20", 10 * torch.randn(20, generator=generator)))
    batch = 4 * torch.randn(3, 6, generator=generator)
    batch[1] += 500  # a row that overflows if the maximum is not subtracted row by row
    settings.append(("a batch of 3 rows, shape (3, 6), one of them near 500", batch))
    return [Case(label + (f": logits {_fmt(logits)}" if logits.numel() <= 8 else ""), (logits,),
                 torch.softmax(logits.double(), -1).numpy()) for label, logits in settings]


def _compare_softmax(got, case: Case) -> str | None:
    (logits,) = case.args
    if isinstance(got, torch.Tensor):
        got = got.detach().double().numpy()
    got = np.asarray(got, dtype=float)
    if got.shape != tuple(logits.shape):
        raise _Wrong(f"expected probabilities of shape {tuple(logits.shape)}, like the logits, got shape {got.shape}.")
    if not np.isfinite(got).all():
        finite = logits[torch.isfinite(logits)]
        largest = "each row's largest logit (max over dim=-1, keepdim=True)" if logits.ndim == 2 \
            else "the largest logit"
        if logits.ndim == 2:
            bad_rows = [row for row in range(logits.shape[0]) if not np.isfinite(got[row]).all()]
            if any(float(logits[row].max()) < 88 for row in bad_rows):
                return (f"got NaN in rows {bad_rows}: their exponentials underflow to 0 (and 0/0 is NaN) once a "
                        f"larger row's maximum is subtracted. Subtract {largest}.")
        if float(finite.max()) > 88:
            return (f"got {_fmt(got)}: exp({float(finite.max()):.4g}) overflows float32 (anything above about 88.7 "
                    f"is inf, and inf/inf is NaN). Subtract {largest} first.")
        if float(finite.max()) < -87:
            return (f"got {_fmt(got)}: every exp underflows to 0 and 0/0 is NaN. Subtract {largest} first: "
                    "then the largest exponential is exp(0) = 1.")
        if torch.isinf(logits).any():
            return (f"got {_fmt(got)}: a logit of -inf marks a removed token and must come out as probability 0. "
                    "Subtract the largest logit, which is finite; -inf minus -inf is NaN.")
        return f"got {_fmt(got)}, which is not finite."
    if _close(got, case.expected, PROBS_ATOL):
        return None
    expected = f"expected {_fmt(case.expected)}, got {_fmt(got)}"
    if logits.ndim == 2:
        if abs(got.sum() - 1) < 1e-4:
            return (f"{expected}: that sums to 1 over the whole batch. Each row is a distribution: normalise over "
                    "dim=-1.")
        return f"{expected}. Each row is a distribution: subtract each row's maximum, normalise over dim=-1."
    if _close(got, torch.log_softmax(logits.double(), -1).numpy(), PROBS_ATOL):
        return f"{expected}: those are log-probabilities. Return the probabilities."
    return f"{expected}. softmax(z) = exp(z − max z) / Σ exp(z − max z)."


check_softmax = Check("softmax", _softmax_cases, _compare_softmax)


# --- The sampling warp ---------------------------------------------------------------------------


def _warp(logits, temperature=1.0, top_k=None, top_p=None, *, top_p_first=False, temperature_last=False,
          keep_crossing=True, keep_ties=True) -> torch.Tensor:
    """The warp in float64, with switches that turn it into the usual mistakes (to name them)."""
    logits = logits.double()
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(), logits.shape[-1]).double()
    if not temperature_last:
        logits = logits / temperature

    def cut_top_k(logits):
        if top_k is None or top_k >= logits.shape[-1]:
            return logits
        if keep_ties:
            return logits.masked_fill(logits < torch.topk(logits, top_k).values[-1], float("-inf"))
        keep = torch.zeros_like(logits, dtype=torch.bool).scatter(0, torch.topk(logits, top_k).indices, True)
        return logits.masked_fill(~keep, float("-inf"))

    def cut_top_p(logits):
        if top_p is None or top_p >= 1:
            return logits
        sorted_probs, order = torch.sort(logits.softmax(-1), descending=True)
        mass = sorted_probs.cumsum(0)  # this token and every more likely one
        keep_sorted = mass - sorted_probs < top_p if keep_crossing else mass <= top_p
        keep_sorted[0] = True  # the most likely token always stays
        return logits.masked_fill(~torch.zeros_like(keep_sorted).scatter(0, order, keep_sorted), float("-inf"))

    for cut in ((cut_top_p, cut_top_k) if top_p_first else (cut_top_k, cut_top_p)):
        logits = cut(logits)
    if temperature_last:
        logits = logits / temperature
    return logits.softmax(-1)


WARP_SETTINGS = [  # (label, logits, temperature, top_k, top_p)
    ("plain softmax", [2.0, 1.0, 0.5, -1.0, 0.0], 1.0, None, None),
    ("temperature 0.5 sharpens", [2.0, 1.0, 0.5, -1.0, 0.0], 0.5, None, None),
    ("temperature 2 flattens", [2.0, 1.0, 0.5, -1.0, 0.0], 2.0, None, None),
    ("greedy", [0.3, 2.5, -1.0, 2.4, 0.0], 0.0, None, None),
    ("greedy, top_k and top_p set too", [0.3, 2.5, -1.0, 2.4, 0.0], 0.0, 3, 0.5),
    ("top-k", [1.0, 3.0, -0.5, 2.0, 0.5, 2.5], 1.0, 3, None),
    ("top-k, a tie at the k-th largest logit", [3.0, 1.0, 1.0, 0.0, -2.0], 1.0, 2, None),
    ("top-k larger than the vocabulary", [0.5, -0.5, 1.5, 0.0], 1.0, 10, None),
    ("top-p", [2.0, 1.0, 0.5, -1.0, 0.0, 1.5], 1.0, None, 0.6),
    ("top-p, the top token alone is enough", [4.0, 1.0, 0.5, 0.0], 1.0, None, 0.5),
    ("top-p = 1 keeps everything", [2.0, 1.0, 0.5, -1.0], 1.0, None, 1.0),
    ("temperature, then top-p", [2.0, 1.2, 0.8, 0.3, -0.5, 0.1], 0.5, None, 0.8),
    ("top-k, then top-p", [2.0, 1.5, 1.4, 1.3, 1.2, 0.0, -1.0], 1.0, 4, 0.5),
    ("all three", [1.0, 2.2, -0.3, 1.7, 0.4, 1.9, -1.5, 0.8], 0.7, 5, 0.7),
]


def _warp_cases() -> list[Case]:
    settings = [(label, torch.tensor(values), t, k, p) for label, values, t, k, p in WARP_SETTINGS]
    generator = torch.Generator().manual_seed(1)
    for vocab, temperature, top_k, top_p in ((10, 0.8, None, 0.9), (20, 1.3, 8, None), (20, 0.6, 12, 0.85)):
        settings.append((f"random logits, vocab {vocab}", 2 * torch.randn(vocab, generator=generator),
                         temperature, top_k, top_p))
    cases = []
    for label, logits, temperature, top_k, top_p in settings:
        label = (f"{label}: logits {_fmt(logits)}" if len(logits) <= 8 else label) + \
            f", temperature = {temperature}, top_k = {top_k}, top_p = {top_p}"
        expected = Sampler(temperature, top_k, top_p).probs(logits)  # (vocab,) float32
        cases.append(Case(label, (logits, temperature, top_k, top_p), expected.double().numpy()))
    return cases


def _compare_warp(got, case: Case) -> str | None:
    logits, temperature, top_k, top_p = case.args
    vocab = logits.shape[0]
    if isinstance(got, torch.Tensor) and got.ndim == 2 and got.shape[0] == 1:
        got = got[0]
    if isinstance(got, torch.Tensor):
        got = got.detach().double().numpy()
    got = np.asarray(got, dtype=float)
    if got.shape != (vocab,):
        raise _Wrong(f"expected a probability vector of shape ({vocab},), got shape {got.shape}.")
    if not np.isfinite(got).all():
        if temperature == 0:
            return ("got NaN or inf: at temperature 0, dividing the logits by T = 0 does not work. Temperature "
                    "0 means greedy: return a one-hot vector on the argmax of the logits.")
        return f"got {_fmt(got)}, which is not finite."
    if _close(got, case.expected, PROBS_ATOL):
        return None
    expected = f"expected {_fmt(case.expected)}, got {_fmt(got)}"
    if abs(got.sum() - 1) > 1e-4:
        if (got < 0).any() or got.sum() > 1 + 1e-4:
            return f"{expected}: that is not a probability vector (it sums to {got.sum():.4g}). Apply the softmax."
        return (f"{expected}: that sums to {got.sum():.4g}. Renormalise the tokens you keep: set the others' "
                "logits to -inf and take the softmax.")
    mistakes = {
        "the temperature left out": dict(temperature=1.0),
        "top-p applied before top-k (Hugging Face applies top-k first)": dict(top_p_first=True),
        "the temperature applied after top-k and top-p (it comes first, and changes which tokens top-p keeps)":
            dict(temperature_last=True),
        "top-p without the token that crosses p (keep the smallest set whose mass *reaches* p)":
            dict(keep_crossing=False),
        "top-k with ties broken (a token tied with the k-th largest logit is kept)": dict(keep_ties=False),
        "top-k left out": dict(top_k=None),
        "top-p left out": dict(top_p=None),
    }
    settings = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    for mistake, change in mistakes.items():
        if _close(got, _warp(logits, **{**settings, **change}).numpy(), PROBS_ATOL):
            return f"{expected}: that is {mistake}."
    return f"{expected}. Divide by the temperature, then cut to the top k, then to the top p, then softmax."


def _warp_error(error: Exception, case: Case) -> str | None:
    logits, temperature, top_k, _ = case.args
    if temperature == 0:
        return "Temperature 0 means greedy: a one-hot vector on the argmax, without dividing by T."
    if top_k is not None and top_k > logits.shape[-1]:
        return "A top_k larger than the vocabulary keeps every token (torch.topk needs k <= the vocabulary size)."
    return None


check_warped_probs = Check("warped_probs", _warp_cases, _compare_warp, error_hint=_warp_error)


# --- Greedy decoding with a KV cache -------------------------------------------------------------

GREEDY_SETTINGS = [  # (label, model seed, prompt seed, prompt length, max_new_tokens)
    ("a one-token prompt", 0, 0, 1, 6),
    ("one new token", 0, 1, 5, 1),
    ("a 4-token prompt", 0, 2, 4, 10),
    ("a 12-token prompt", 1, 3, 12, 16),
    ("another model", 2, 4, 7, 12),
]


def _greedy_cases() -> list[Case]:
    cases = []
    for label, model_seed, prompt_seed, length, max_new_tokens in GREEDY_SETTINGS:
        model = tiny_model(model_seed)
        prompt = random_prompt(prompt_seed, length)  # (1, T)
        expected = autoregressive_generate(model, prompt, max_new_tokens, Sampler(0)).token_ids
        copy, calls = recorded(model)
        cases.append(Case(f"{label}, tiny random model {model_seed}, prompt {prompt[0].tolist()}, "
                          f"max_new_tokens = {max_new_tokens}", (copy, prompt, max_new_tokens), expected,
                          extra={"calls": calls}))
    return cases


def _compare_tokens(got, case: Case, prompt: torch.Tensor, method: str) -> str | None:
    """None when the learner's new tokens are the expected ones, else what is wrong with them."""
    tokens, expected = _as_token_list(got, "a list of new token ids"), case.expected
    if tokens == expected:
        return None
    prompt_ids = prompt[0].tolist()
    if tokens == prompt_ids + expected:
        return "that is the prompt followed by the right new tokens. Return only the new tokens."
    if len(tokens) != len(expected):
        return f"expected {len(expected)} new tokens, got {len(tokens)}: {_fmt(tokens)}."
    first = next(i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b)
    return (f"new token {first} (counting from 0) should be {expected[first]}, got {tokens[first]}; "
            f"expected {expected}, got {tokens}. {method}")


def _compare_greedy(got, case: Case) -> str | None:
    model, prompt, max_new_tokens = case.args
    problem = _compare_tokens(got, case, prompt, "Each token is the argmax of the logits at the last position "
                                                "(logits[0, -1]) of the call that fed the token before it.")
    if problem:
        return problem
    calls, length = case.extra["calls"], prompt.shape[1]
    fed = sum(calls)
    if fed > length + max_new_tokens:
        return (f"the tokens are right, but your loop fed the model {fed} positions in {len(calls)} calls "
                f"({_fmt(calls[:6])}{'…' if len(calls) > 6 else ''}). With a KV cache the prompt is fed once and "
                f"every later call feeds only the newest token: {length + max_new_tokens - 1} positions here. "
                "Pass past_key_values=cache (and use_cache=True) on every call.")
    return None


check_greedy_generate = Check("greedy_generate", _greedy_cases, _compare_greedy)


# --- Bytes and FLOPs of one decoding step ---------------------------------------------------------


def step_cost_reference(parameters, layers, width, kv_width, context, tokens=1, bytes_per_parameter=2):
    """(FLOPs, bytes moved) of one step that scores ``tokens`` positions of one sequence (§1.7)."""
    kv_cache = 2 * layers * kv_width * context * bytes_per_parameter  # keys and values, every layer
    bytes_moved = parameters * bytes_per_parameter + kv_cache
    flops = tokens * (2 * parameters + 4 * layers * width * context)
    return flops, bytes_moved


STEP_COST_SETTINGS = [  # (label, parameters, layers, width, kv_width, context, tokens, bytes_per_parameter)
    ("7B model of Llama-2-7B's shape, bf16, one token", 6.7e9, 32, 4096, 4096, 1024, 1, 2),
    ("7B, verifying K + 1 = 5 tokens", 6.7e9, 32, 4096, 4096, 1024, 5, 2),
    ("7B, a 32k context", 6.7e9, 32, 4096, 4096, 32_768, 1, 2),
    ("70B with grouped-query attention (keys 1,024 wide), 9 tokens", 69e9, 80, 8192, 1024, 4096, 9, 2),
    ("7B in 8-bit weights", 6.7e9, 32, 4096, 4096, 2048, 1, 1),
    ("a 7M-parameter model in float32", 7.3e6, 8, 256, 256, 100, 3, 4),
    ("the first token, nothing cached yet", 1.3e9, 24, 2048, 2048, 0, 1, 2),
]


def _step_cost_cases() -> list[Case]:
    cases = []
    for label, *args in STEP_COST_SETTINGS:
        parameters, layers, width, kv_width, context, tokens, size = args
        cases.append(Case(f"{label}: parameters = {parameters:.3g}, layers = {layers}, width = {width}, "
                          f"kv_width = {kv_width}, context = {context}, tokens = {tokens}, "
                          f"bytes_per_parameter = {size}", tuple(args), step_cost_reference(*args)))
    return cases


def _compare_step_cost(got, case: Case) -> str | None:
    parameters, layers, width, kv_width, context, tokens, size = case.args
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return "expected a pair (flops, bytes_moved), got " + (
            f"a {type(got).__name__} of length {len(got)}." if isinstance(got, (tuple, list)) else f"{got!r}.")
    flops, bytes_moved = _as_float(got[0], "flops, a number"), _as_float(got[1], "bytes_moved, a number")
    expected_flops, expected_bytes = case.expected
    weights, attention_flops = parameters * size, 4 * layers * width * context
    if not math.isclose(bytes_moved, expected_bytes, rel_tol=1e-9):
        expected = f"expected {expected_bytes:.6g} bytes moved, got {bytes_moved:.6g}"
        cache_numbers = 2 * layers * kv_width * context
        hints = [(weights, "the weights only; add the KV cache, which the step reads too"),
                 (tokens * weights + cache_numbers * size, "the weights read once per token; one step reads them "
                                                           "once, however many positions it scores"),
                 (weights + cache_numbers, "the cache counted in numbers, not bytes"),
                 (weights + cache_numbers * size / 2, "the keys without the values (or the values without the keys)"),
                 (weights + 2 * layers * width * context * size, "the cache with the query width; with grouped-query "
                                                                 "attention the keys and values are kv_width wide"),
                 (parameters + cache_numbers * size, "the weights counted in parameters, not bytes")]
        for value, hint in hints:
            if value != expected_bytes and math.isclose(bytes_moved, value, rel_tol=1e-9):
                return f"{expected}: that is {hint}."
        return f"{expected}. Bytes moved = the weights (parameters x bytes each) + keys and values of every layer."
    if not math.isclose(flops, expected_flops, rel_tol=1e-9):
        expected = f"expected {expected_flops:.6g} FLOPs, got {flops:.6g}"
        hints = [(tokens * 2 * parameters, "the linear layers only; add attention's 4 x layers x width FLOPs per "
                                           "cached position, for every scored token"),
                 (tokens * (parameters + attention_flops), "one FLOP per weight; a multiply and an add make two"),
                 (2 * parameters + attention_flops, "one token's worth; every scored position does this work"),
                 (tokens * (2 * parameters + attention_flops / 2), "half of attention: each position multiplies "
                                                                   "with every cached key and every cached value")]
        for value, hint in hints:
            if value != expected_flops and math.isclose(flops, value, rel_tol=1e-9):
                return f"{expected}: that is {hint}."
        return f"{expected}. FLOPs = tokens x (2 x parameters + 4 x layers x width x context)."
    return None


check_step_cost = Check("step_cost", _step_cost_cases, _compare_step_cost)

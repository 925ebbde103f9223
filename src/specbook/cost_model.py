"""One account of time: the cost of a speculative step on this machine, measured once, and the speed it predicts.

A speculative step is one target call on the n positions it scores (the pending token and the drafts: K + 1 for
a chain, the nodes plus one for a tree), the drafter's calls, and the engine's own work (the target's
probabilities, verification, rollback of both caches, bookkeeping). In milliseconds,

    step = T(n) + calls x t_draft + engine,        ms a token = step / E,

with T(n) the target's call on n positions, t_draft one call of the drafter (its share of ``propose``), and E
the tokens a step writes (tokens per call). Dividing by T(1) gives chapter 3's terms: v(n) = T(n) / T(1),
c = t_draft / T(1). Autoregressive decoding writes one token per call of T(1) plus its own engine. The bound of
a method is T(n) / E: its speed were drafting and the engine free.

`measure` times every term on the reader's machine in one run, in interleaved rounds (each round times every
term, so that a slow moment of the machine falls on all of them alike): the target's call on each n of
``positions`` after a prompt, with the forward and cache the engine uses (`specbook.decoder.cache_and_forward`);
autoregressive decoding's ms a token; and for each drafter one speculative generation split by
`specbook.profile.step_profile` into its drafting (per call) and the engine's work (per step). `CostModel.predict`
turns a method's counts (tokens per call, positions per call, draft calls a step) into ms a token, and
`predicted` adds the prediction and the bound to `specbook.bench.run_benchmark`'s rows, with each prompt's
prefill, T(prompt length), shared by the tokens written after it (a generation of 64 tokens after a prompt of 75
pays about five tokens' worth for it). `benchmark` times the terms in the benchmark's own rounds (`Meter`), so that
the prediction and the measurement share the machine's moments. `call_anatomy` splits one
call's T(1) into the fixed cost of its operators and the reading of its weights, by timing twins of the model at
other widths (the same operators, other weights).

    costs = measure(pair.target, prompts, {"draft model": (pair.draft, 4)})
    costs.predict(tokens_per_call=2.7, positions_per_call=5, draft_calls_per_step=4, drafter="draft model")
"""

import copy
import hashlib
import json
import os
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from .bench import ENGINE_SOURCES, OPEN_ENDED, _clock, cpu_model, machine, run_benchmark
from .cache import rollback
from .decoder import cache_and_forward, forward_name
from .drafters import PardDrafter
from .kernels import count_kernels
from .models import assets_dir, load_model, weight_bytes
from .policies import check_integer
from .profile import autoregressive_ms, copy_bandwidth, step_profile
from .sampling import Sampler

POSITIONS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64)  # the n at which the target's call is timed
CALLS_PER_ROUND = 5  # the target's calls in a row on each n a round, of which the round keeps the median
ENGINE_PARTS = ("probabilities", "verification", "rollback", "engine")  # `step_profile`'s parts that are the engine's


@dataclass
class DrafterCost:
    """One drafter's terms, in ms: a call (None for a drafter that makes no model call, such as an n-gram lookup:
    then ``step_ms`` is its host work a step), its drafting a step, and the engine's work a step beside it."""

    call_ms: float | None
    step_ms: float
    engine_ms: float
    calls_per_step: float
    k: int


@dataclass
class CostModel:
    """The measured terms (module docstring): ``target_ms`` {n: median ms of a call on n positions},
    ``ar_ms`` autoregressive decoding's ms a token, ``drafters`` {name: `DrafterCost`}, ``rounds`` the rounds
    the medians are over, ``spread`` a typical term's range of rounds over its median (the median over the terms:
    one slow moment that falls on one term does not set it), the machine, and when."""

    target_ms: dict
    ar_ms: float
    drafters: dict = field(default_factory=dict)
    rounds: int = 0
    spread: float = 0.0
    machine: str = ""
    cpu: str = ""
    forward: str = ""
    when: str = ""  # when the terms were measured (UTC, to the minute)

    def call_ms(self, positions: float) -> float:
        """T(n): the target's call on ``positions`` (a mean over calls may fall between the timed n: linear
        between the two nearest; refused beyond the largest)."""
        timed = sorted(self.target_ms)
        if not timed[0] <= positions <= timed[-1]:
            raise ValueError(f"positions must be in [{timed[0]}, {timed[-1]}], the calls this model timed "
                             f"(got {positions})")
        above = next(n for n in timed if n >= positions)
        below = max(n for n in timed if n <= positions)
        if above == below:
            return self.target_ms[above]
        share = (positions - below) / (above - below)
        return (1 - share) * self.target_ms[below] + share * self.target_ms[above]

    def v(self, positions: float) -> float:
        """Chapter 3's v(n) = T(n) / T(1)."""
        return self.call_ms(positions) / self.target_ms[1]

    def c(self, drafter: str) -> float:
        """Chapter 3's c for ``drafter``: one of its calls over the target's call on one position."""
        cost = self._drafter(drafter)
        if cost.call_ms is None:
            raise ValueError(f"{drafter!r} makes no model call: it has no c (its host work is "
                             f"{cost.step_ms:.3f} ms a step)")
        return cost.call_ms / self.target_ms[1]

    def _drafter(self, name: str) -> DrafterCost:
        if name not in self.drafters:
            raise ValueError(f"drafter must be one this model measured, one of {sorted(self.drafters)} (got {name!r})")
        return self.drafters[name]

    def predict(self, tokens_per_call: float, positions_per_call: float, draft_calls_per_step: float,
                drafter: str) -> dict:
        """ms a token of a method that writes ``tokens_per_call`` tokens a step, scores ``positions_per_call``
        positions a target call and calls ``drafter`` ``draft_calls_per_step`` times a step; its bound (drafting
        and the engine free); and both as speedups over the measured autoregressive decoding."""
        if not tokens_per_call >= 1:
            raise ValueError(f"tokens_per_call must be >= 1, every step writes a token (got {tokens_per_call})")
        if not draft_calls_per_step >= 0:
            raise ValueError(f"draft_calls_per_step must be >= 0 (got {draft_calls_per_step})")
        cost = self._drafter(drafter)
        target = self.call_ms(positions_per_call)
        drafting = cost.step_ms if cost.call_ms is None else draft_calls_per_step * cost.call_ms
        step = target + drafting + cost.engine_ms
        return {"ms_per_token": step / tokens_per_call, "bound_ms_per_token": target / tokens_per_call,
                "speedup": self.ar_ms * tokens_per_call / step, "bound_speedup": self.ar_ms * tokens_per_call / target,
                "step_ms": {"target call": target, "draft": drafting, "engine": cost.engine_ms}}

    def as_dict(self) -> dict:
        """The terms as a results file keeps them."""
        return {"machine": self.machine, "cpu": self.cpu, "forward": self.forward, "when": self.when,
                "rounds": self.rounds, "spread": self.spread,
                "target_ms": {str(n): ms for n, ms in self.target_ms.items()}, "ar_ms": self.ar_ms,
                "drafters": {name: vars(cost) for name, cost in self.drafters.items()}}

    @classmethod
    def from_dict(cls, terms: dict) -> "CostModel":
        """The model that `as_dict` wrote."""
        return cls(**{**terms, "target_ms": {int(n): ms for n, ms in terms["target_ms"].items()},
                      "drafters": {name: DrafterCost(**cost) for name, cost in terms["drafters"].items()}})


def _target_calls(target, input_ids, positions, calls: int = CALLS_PER_ROUND):
    """A function that times one round of the target's calls on each of ``positions`` after ``input_ids`` (1, T),
    over the engine's cache and forward, rolling the cache back after each: {n: seconds}, the median of ``calls``
    calls in a row on each n. In a row, as a generation makes them: a call right after a wider one runs slower
    (its activations have pushed the weights out of the CPU's caches), and one call lasts milliseconds, within
    the reach of a single hiccup of the machine."""
    cache, forward = cache_and_forward(target, input_ids.shape[1] + max(positions))
    forward(input_ids, past_key_values=cache, logits_to_keep=1)
    filler = input_ids[:, -1:]

    def round_():
        seconds = {n: [] for n in positions}
        for n in positions:
            for _ in range(calls):
                started = _clock()
                forward(filler.repeat(1, n), past_key_values=cache, logits_to_keep=n)
                seconds[n].append(_clock() - started)
                rollback(cache, n)
        return {n: statistics.median(times) for n, times in seconds.items()}
    return round_


class Meter:
    """Times a `CostModel`'s terms one round at a time (`measure` says which), so that a benchmark can time them in
    its own rounds (`benchmark`): a slow moment of the machine then falls on the prediction and the measurement
    alike. The first round is untimed (lazy initialisation); `model` takes the medians of the others."""

    def __init__(self, target, prompts, drafters=None, positions=POSITIONS, max_new_tokens: int = 64,
                 sampler=Sampler(0), seed: int = 0):
        if not prompts:
            raise ValueError("prompts must hold at least one (1, T) tensor of token ids")
        for n in positions:
            check_integer("positions", n, 1)
        positions = sorted(set(positions))
        if positions[0] != 1:
            raise ValueError(f"positions must include 1, the call every ratio is over (got {positions})")
        self.target, self.prompts, self.drafters = target, prompts, dict(drafters or {})
        self.max_new_tokens, self.sampler, self.seed = max_new_tokens, sampler, seed
        self.calls = _target_calls(target, prompts[0], positions)
        self.times, self.ar, self.profiles = {n: [] for n in positions}, [], {name: [] for name in self.drafters}

    @torch.inference_mode()
    def __call__(self) -> None:
        """One round: the target's calls on every n, autoregressive decoding, and each drafter's generation."""
        for n, seconds in self.calls().items():
            self.times[n].append(seconds)
        self.ar.append(autoregressive_ms(self.target, self.prompts, self.max_new_tokens, self.sampler, self.seed,
                                         warm=False))
        for name, (drafter, k) in self.drafters.items():
            self.profiles[name].append(step_profile(self.target, drafter, self.prompts, k, self.max_new_tokens,
                                                    self.sampler, self.seed, warm=False))

    def model(self) -> CostModel:
        """The medians of the rounds after the first."""
        if len(self.ar) < 2:
            raise ValueError(f"a cost model needs a timed round after the untimed first (got {len(self.ar)} rounds)")
        times = {n: seconds[1:] for n, seconds in self.times.items()}
        target_ms = {n: 1000 * statistics.median(seconds) for n, seconds in times.items()}
        spreads = [(max(seconds) - min(seconds)) / statistics.median(seconds) for seconds in times.values()]
        costs = {name: _drafter_cost(runs[1:], self.drafters[name][1]) for name, runs in self.profiles.items()}
        ar_ms = statistics.median(self.ar[1:])
        spreads.append((max(self.ar[1:]) - min(self.ar[1:])) / ar_ms)
        return CostModel(target_ms, ar_ms, costs, len(self.ar) - 1, statistics.median(spreads), machine(), cpu_model(),
                         forward_name(self.target), datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))


def measure(target, prompts, drafters=None, positions=POSITIONS, rounds: int = 5, max_new_tokens: int = 64,
            sampler=Sampler(0), seed: int = 0) -> CostModel:
    """The `CostModel` of ``target`` on this machine (module docstring).

    ``prompts``: (1, T) tensors; the target's calls are timed after the first, the generations run on all.
    ``drafters``: {name: (drafter, k)}, a `Drafter` or a draft model and the draft length its generation uses.
    ``positions``: the n of T(n), 1 among them. ``rounds``: timed rounds, after one untimed (lazy initialisation).
    """
    check_integer("rounds", rounds, 1)
    meter = Meter(target, prompts, drafters, positions, max_new_tokens, sampler, seed)
    for _ in range(rounds + 1):
        meter()
    return meter.model()


STORE = Path(os.environ.get("SPECBOOK_CACHE", Path.home() / ".cache" / "specbook"))  # where `book_costs` keeps its own
BOOK_K = 4  # the draft length of the book's measurement


def engine_key(pair) -> str:
    """What a stored measurement holds for: the machine, torch, the target's forward, the pair, its models' shapes
    (their configs) and the source of the modules that set speed (`specbook.bench.ENGINE_SOURCES`), hashed."""
    package, digest = Path(__file__).parent, hashlib.sha256()
    for name in ENGINE_SOURCES:
        path = package / name.removeprefix("src/specbook/")
        for source in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            digest.update(source.read_bytes())
    for config in sorted(assets_dir(pair.name).glob("*/config.json")):
        digest.update(config.read_bytes())
    for part in (machine(), torch.__version__, forward_name(pair.target), pair.name):
        digest.update(part.encode())
    return digest.hexdigest()[:16]


def book_costs(pair, refresh: bool = False) -> CostModel:
    """The book's one measurement of its pair's terms (chapter 4, §4.9): the target's call on n = 1 .. 64 positions
    after the first open prompt, autoregressive decoding, and the draft model's and the PARD draft's generations at
    K = 4, on the book's open prompts, 64 tokens, greedy, five rounds. Measured on the first call on this machine
    and engine (`engine_key`), or with ``refresh``, and stored under ``SPECBOOK_CACHE`` (default ~/.cache/specbook);
    every later call, in this notebook or in another chapter's, reads the same terms back, so that the book's
    predictions share one T(1), one v(n) and one c per drafter. ``pair``: `load_pair`'s (its draft and the PARD
    draft of its name)."""
    if not (assets_dir(pair.name) / "pard").is_dir():
        raise ValueError(f"book_costs measures a built-in pair beside its PARD draft, and {pair.name!r} has none: "
                         "measure() times any pair's terms")
    stored = STORE / f"costs-{pair.name}-{engine_key(pair)}.json"
    if stored.is_file() and not refresh:
        return CostModel.from_dict(json.loads(stored.read_text()))
    pard = load_model(pair.name, "pard", pair.target.device, pair.target.dtype)
    drafters = {"draft model": (pair.draft, BOOK_K), "PARD": (PardDrafter(pard), BOOK_K)}
    costs = measure(pair.target, [pair.encode(text) for text in OPEN_ENDED], drafters)
    stored.parent.mkdir(parents=True, exist_ok=True)
    written = stored.with_suffix(f".{os.getpid()}.tmp")
    written.write_text(json.dumps(costs.as_dict(), indent=1))
    os.replace(written, stored)  # whole: a chapter run beside this one never reads half a file
    return costs


def _drafter_cost(profiles: list[dict], k: int) -> DrafterCost:
    """A drafter's terms from its rounds' step profiles: the median of each."""
    def median(part):
        return statistics.median(part(profile) for profile in profiles)
    calls = median(lambda profile: profile["draft_calls_per_step"])
    drafting = median(lambda profile: profile["ms_per_step"]["draft"])
    engine = median(lambda profile: sum(profile["ms_per_step"][part] for part in ENGINE_PARTS))
    return DrafterCost(drafting / calls if calls else None, drafting, engine, calls, k)


def for_methods(methods, prompts, max_new_tokens: int = 64, sampler=Sampler(0), seed: int = 0,
                positions=POSITIONS) -> tuple[Meter | None, dict]:
    """The `Meter` for a table's ``methods`` (`specbook.bench.Method`), its rounds not yet run: one drafter for each
    drafter among them, named after the first method that drafts with it and timed at its draft length; and
    {method name: drafter name}, what `predicted` reads. None and {} where no method drafts on the default path (on
    the GPU path's options, or an encoder-decoder target, the model does not time the calls those runs make)."""
    timed = [method for method in methods if method.drafter is not None
             and not getattr(method.target.config, "is_encoder_decoder", False)]
    if not timed:
        return None, {}
    targets = {id(method.target) for method in timed}
    if len(targets) > 1:
        raise ValueError("methods must share one target: a cost model times one target's calls")
    drafters, names, seen = {}, {}, {}
    for method in timed:
        if id(method.drafter) not in seen:
            seen[id(method.drafter)] = method.name
            drafters[method.name] = (method.drafter, method.draft_length)
        names[method.name] = seen[id(method.drafter)]
    return Meter(timed[0].target, prompts, drafters, positions, max_new_tokens, sampler, seed), names


def benchmark(methods, prompts, repeats: int = 3, seed: int = 0, max_new_tokens: int = 64, sampler=Sampler(0),
              cost_prompts=None, progress: bool = True) -> list[dict]:
    """`specbook.bench.run_benchmark`'s rows, each with the cost model's prediction beside it (`predicted`), the
    model's terms timed in the benchmark's own rounds, one round of theirs before each of its (on ``cost_prompts``,
    default the first prompt: the terms are per call and per step, the rows give each method's counts), the
    target's call on every prompt's length among them (its prefill)."""
    lengths = {input_ids.shape[1] for input_ids in prompts}
    meter, drafters = for_methods(methods, cost_prompts or prompts[:1], max_new_tokens, sampler, seed,
                                  sorted(set(POSITIONS) | lengths))
    if meter is not None:
        meter()  # its untimed round
    rows = run_benchmark(methods, prompts, repeats, seed, progress, between_rounds=meter)
    return predicted(rows, meter.model() if meter is not None else None, drafters, prompts)


def predicted(rows: list[dict], costs: CostModel | None, drafters: dict, prompts=None) -> list[dict]:
    """`specbook.bench.run_benchmark`'s ``rows`` with the prediction beside each measurement: for each row whose
    method ``drafters`` maps to a drafter of ``costs`` ({method name: drafter name}), ``predicted_ms_per_token``,
    ``bound_ms_per_token``, ``predicted_speedup`` and ``bound_speedup`` from its own counts (its tokens over its
    target calls, pooled over the prompts as its time is, not the mean of each prompt's ratio); NaN elsewhere. The
    speedups are over the cost model's autoregressive decoding (prefills included). ``prompts``: the
    benchmark's, (1, T) each: a row's time holds one prefill of each (the target's call on T positions, shared by
    its ``tokens``), which the prediction and the bound then hold too; their lengths must be among the timed n."""
    out = []
    for row in rows:
        prediction = {"predicted_ms_per_token": float("nan"), "bound_ms_per_token": float("nan"),
                      "predicted_speedup": float("nan"), "bound_speedup": float("nan")}
        if costs is not None and row["method"] in drafters:
            tokens = row["tokens"] / row["target_calls"]
            guess = costs.predict(tokens, row["positions_per_call"], row["draft_calls_per_token"] * tokens,
                                  drafters[row["method"]])
            prefill = sum(costs.call_ms(ids.shape[1]) for ids in prompts) / row["tokens"] if prompts else 0.0
            ms, bound = guess["ms_per_token"] + prefill, guess["bound_ms_per_token"] + prefill
            prediction = {"predicted_ms_per_token": ms, "bound_ms_per_token": bound,
                          "predicted_speedup": costs.ar_ms / ms, "bound_speedup": costs.ar_ms / bound}
        out.append({**row, **prediction})
    return out


WIDTHS = ("hidden_size", "intermediate_size", "head_dim")  # what `resized` multiplies


def resized(model, factor: float):
    """A model of ``model``'s architecture with every width (`WIDTHS`) multiplied by ``factor``, its layers, heads and
    vocabulary kept, and random weights: a call dispatches the same operators over about factor^2 the weights."""
    from .costs import build_model

    config = copy.deepcopy(model.config)
    config.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    for name in WIDTHS:
        setattr(config, name, max(2, 2 * round(getattr(config, name) * factor / 2)))  # even: the rotary halves
    return build_model(config, model.device, model.dtype)


@torch.inference_mode()
def call_anatomy(model, input_ids, factors=(0.125, 1, 2, 4), rounds: int = 5) -> list[dict]:
    """Where a call's time goes (chapter 4, §4.9): ``model``'s call on one position after ``input_ids`` (1, T),
    and the same call of its twins with every width multiplied by each of ``factors`` (`resized`; factor 1 is
    ``model`` itself). The operators a call dispatches are the same at every width, the weights grow with the
    square of it, so the narrowest twin's call is the operators' fixed cost alone, and what a wider call adds is
    the cost of its weights. Per factor: ``operators`` (`specbook.kernels.count_kernels`), ``weight_mb``, ``ms``
    (T(1), medians of ``rounds`` rounds of `CALLS_PER_ROUND` calls in a row), ``us_per_operator`` (ms over
    operators), ``gb_s`` (weights over the time above the narrowest twin's), beside ``copy_gb_s``, the machine's
    copy bandwidth."""
    check_integer("rounds", rounds, 1)
    if not factors or any(not factor > 0 for factor in factors):
        raise ValueError(f"factors must be widths' multipliers > 0 (got {factors})")
    rows = []
    for factor in sorted(factors):
        twin = model if factor == 1 else resized(model, factor)
        calls = _target_calls(twin, input_ids, [1])
        ms = 1000 * statistics.median([calls()[1] for _ in range(rounds + 1)][1:])  # round 0 is untimed
        cache, forward = cache_and_forward(twin, input_ids.shape[1] + 1)
        forward(input_ids, past_key_values=cache, logits_to_keep=1)
        operators = count_kernels(forward, input_ids[:, -1:], past_key_values=cache)
        rows.append({"factor": factor, "hidden_size": twin.config.hidden_size, "operators": operators,
                     "weight_mb": weight_bytes(twin) / 1e6, "ms": ms, "us_per_operator": 1000 * ms / operators})
    floor = rows[0]["ms"]
    copy_gb_s = copy_bandwidth(model.device)
    for row in rows:
        above = row["ms"] - floor
        row["gb_s"] = row["weight_mb"] / 1e3 / (above / 1e3) if above > 0 else float("nan")
        row["copy_gb_s"] = copy_gb_s
    return rows

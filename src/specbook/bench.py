"""Benchmarks: autoregressive, speculative and Hugging Face assisted generation on the same prompts.

Every method runs on every prompt ``repeats`` times, in interleaved rounds; a method's time on a
prompt is the median of its rounds, and its speed is the total of those medians. Speedups are
ratios of times measured in the same run, against autoregressive decoding of the same target (and
against Hugging Face's ``generate(assistant_model=...)``), never against numbers from another run.
Every time and speedup comes with the spread of its rounds (`specbook.spread.speedup_range`), and a
"fastest" method is named only with the methods its spread cannot tell it from (`specbook.spread.fastest`).

This module holds the book's prompts, the rows a benchmark times (`Method`: `autoregressive`, `speculative`,
`hugging_face_assisted`), the runner, the recorded runs, and what the chapters read beside a benchmark (per-token
latency, alpha); each chapter's list of rows is in `specbook.suites`.
"""

import json
import os
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .decoder import hugging_face_forward
from .decoding import autoregressive_generate, speculative_generate
from .models import assets_dir, weight_bytes
from .policies import check_integer
from .records import acceptance_rate
from .sampling import Sampler
from .spread import speedup_range

# Two prompt sets: open-ended (the model must invent) and input-grounded (the continuation repeats the prompt).
OPEN_ENDED = [
    "KING HENRY:\nNow, lords,",
    "JULIET:\nO gentle night,",
    "FIRST CITIZEN:\nWhat say you to the",
    "HAMLET:\nThere is a",
]
INPUT_GROUNDED = [
    "ROMEO:\nBut, soft! what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n\n"
    "JULIET:\nWhat did he say?\n\nNURSE:\nHe said: But, soft! what light through yonder window breaks?\nIt is",
    "HAMLET:\nTo be, or not to be: that is the question:\nWhether 'tis nobler in the mind to suffer\n"
    "The slings and arrows of outrageous fortune,\n\nHORATIO:\nMy lord repeats it: To be, or not to be: that",
    "MACBETH:\nTo-morrow, and to-morrow, and to-morrow,\nCreeps in this petty pace from day to day\n\n"
    "LADY MACBETH:\nSay it again.\n\nMACBETH:\nTo-morrow, and to-morrow, and to-morrow,\nCreeps",
    "PORTIA:\nThe quality of mercy is not strain'd,\nIt droppeth as the gentle rain from heaven\n\n"
    "NERISSA:\nMadam, you said: The quality of mercy is not strain'd,\nIt droppeth",
]
PROMPT_SETS = {"open": OPEN_ENDED, "grounded": INPUT_GROUNDED}
# A third kind for the comparison of every method: text that repeats a pattern (refrains, chants, lists).
REPETITIVE = [
    "FIRST WITCH:\nDouble, double toil and trouble;\nFire burn and cauldron bubble.\n\nSECOND WITCH:\n"
    "Double, double toil and trouble;\nFire burn and cauldron bubble.\n\nTHIRD WITCH:\nDouble, double",
    "CAPULET:\nGood night, good night! Good night, good night!\n\nNURSE:\nGood night, good night!\n\n"
    "ROMEO:\nGood night, good",
    "MACBETH:\nTo-morrow, and to-morrow, and to-morrow, and to-morrow, and to-morrow, and",
    "FIRST LORD:\nGod save the king!\n\nSECOND LORD:\nGod save the king!\n\nTHIRD LORD:\nGod save the king!\n\n"
    "FOURTH LORD:\nGod",
]
# Verse of the three plays the built-in pair never trained on, cut before a line ends (`specbook.train.corpus`).
HELD_OUT = json.loads((assets_dir("shakespeare") / "heldout_prompts.json").read_text())
CATEGORIES = {"open": OPEN_ENDED, "grounded": INPUT_GROUNDED, "repetitive": REPETITIVE}  # the kinds chapters 4-6c time
ALL_CATEGORIES = {**CATEGORIES, "held-out": HELD_OUT[:8]}  # and verse the book never prompts with (--suite pard)


@dataclass
class Method:
    """One row of a benchmark: a name and a function (input_ids, seed) -> (token_ids, stats or None); for a
    speculative row on the engine's default path, its target, drafter and draft length (an int or a policy),
    which `specbook.cost_model` times."""

    name: str
    run: object
    k: int | None = None
    weight_bytes: int = 0  # the target's weights, which every target call reads
    drafter: object = None
    draft_length: object = None
    target: object = None


def autoregressive(target, sampler, max_new_tokens, **path):
    """``path``: the GPU path's ``cache`` and ``compile`` options, or an ``eos_token_id`` (`autoregressive_generate`)."""
    def run(input_ids, seed):
        result = autoregressive_generate(target, input_ids, max_new_tokens, sampler, seed, **path)
        return result.token_ids, result.stats
    return Method("autoregressive", run, weight_bytes=weight_bytes(target))


def speculative(target, drafter, k, sampler, max_new_tokens, name=None, **path):
    """``drafter`` is a Drafter or a draft model; ``k`` an int or a draft-length policy; ``path`` as above."""
    label = name or f"speculative k={k}"

    def run(input_ids, seed):
        result = speculative_generate(target, drafter, input_ids, max_new_tokens, k, sampler, seed, **path)
        return result.token_ids, result.stats
    return Method(label, run, k if isinstance(k, int) else None, weight_bytes(target),
                  None if path else drafter, k, target)  # the cost model times the default path only


def with_hugging_face_forward(method: Method) -> Method:
    """``method`` run with Hugging Face's forward (`specbook.decoder.hugging_face_forward`): to know which
    autoregressive decoding is the fastest baseline."""
    def run(input_ids, seed):
        with hugging_face_forward():
            return method.run(input_ids, seed)
    return Method(f"{method.name}, Hugging Face's forward", run, method.k, method.weight_bytes)


def generate_options(target, sampler, max_new_tokens, eos_token_id=None) -> dict:
    """Keyword arguments that make Hugging Face's ``generate`` decode as ``sampler`` does: the same warp, no
    repetition penalty, and an early stop only at ``eos_token_id`` (None: never), whatever its generation config."""
    options = dict(do_sample=not sampler.greedy, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
                   pad_token_id=target.config.eos_token_id, repetition_penalty=1.0)
    if not sampler.greedy:
        options.update(temperature=sampler.temperature, top_k=sampler.top_k or 0, top_p=sampler.top_p or 1.0)
    return options


def hugging_face_assisted(target, draft, sampler, max_new_tokens, k=None, eos_token_id=None):
    """``target.generate(assistant_model=draft)``: its own schedule when k is None, else exactly k drafts a step.

    Like the other methods it stops early only at ``eos_token_id`` (by default never), and it applies no
    repetition penalty, whatever the models' generation configs say. An encoder-decoder target reads ``input_ids``
    with its encoder and so does the assistant with its own (Hugging Face shares the target's encoder states only
    with an assistant that has no encoder). The draft length is read from the *assistant's* generation config,
    so a fixed k is set there for the call.
    """
    from transformers import GenerationConfig
    from transformers.utils import logging

    options = generate_options(target, sampler, max_new_tokens, eos_token_id)
    assistant = dict(num_assistant_tokens=k, num_assistant_tokens_schedule="constant",
                     assistant_confidence_threshold=0.0) if k is not None else {}
    config = GenerationConfig(**options, **assistant)

    def run(input_ids, seed):
        if seed is not None:
            torch.manual_seed(seed)
        saved = {name: getattr(draft.generation_config, name) for name in assistant}
        verbosity = logging.get_verbosity()
        logging.set_verbosity_error()  # its inner generate() call warns about its own arguments
        try:
            for name, value in assistant.items():
                setattr(draft.generation_config, name, value)
            with torch.inference_mode():
                output = target.generate(input_ids, generation_config=config, assistant_model=draft,
                                         attention_mask=torch.ones_like(input_ids))
        finally:
            logging.set_verbosity(verbosity)
            for name, value in saved.items():
                setattr(draft.generation_config, name, value)
        start = 1 if target.config.is_encoder_decoder else input_ids.shape[1]  # after the decoder's start token
        return output[0, start:].tolist(), None
    return Method("HF assisted" + (f" k={k}" if k is not None else " (its schedule)"), run, k, weight_bytes(target))


def run_benchmark(methods, prompts, repeats=3, seed=0, progress=True, warm_every_prompt=False, counts_from_rows=False,
                  between_rounds=None):
    """Time every method on every prompt (``prompts``: list of (1, T) tensors); return a list of row dicts.

    The runs are interleaved: each of ``repeats`` rounds runs every method on every prompt in turn,
    so a machine that speeds up or slows down during the benchmark (another process, the CPU's
    clock) touches every method alike instead of the ones that happened to run then. A method's time
    on a prompt is the median of its rounds, its time the total over prompts. The first method is
    the baseline (autoregressive): ``speedup`` is its time over each method's. ``same_tokens`` says
    whether a method produced exactly the baseline's tokens on every prompt (expected in greedy
    mode); ``draft_calls_per_token`` counts the drafter's forward passes (model or head calls) per
    token, from the last round; ``bandwidth_gb_s`` the target's weight bytes times tokens per second
    (gpt-fast's "bandwidth achieved": past the machine's copy bandwidth, `specbook.profile.copy_bandwidth`,
    only a method that makes several tokens per read of the weights can go). Each method runs once
    untimed first, to pay for lazy initialisation (unless the environment sets ``SPECBOOK_QUICK_TIMING``,
    as `make nbval` does: then one round on the first prompt and no warm-up, since nbval ignores timing
    cells' outputs; ``counts_from_rows`` says that a later cell counts from the rows -- acceptance, tokens
    per call -- and nbval compares what it prints, so every prompt runs, once);
    ``warm_every_prompt`` runs it untimed on every prompt, so that compiled steps meet every input length the
    timed runs will; ``between_rounds`` is called before each round (`specbook.cost_model.benchmark`'s own).

    The spread of the rounds: ``seconds_min`` and ``seconds_max`` are the totals over prompts of
    each prompt's fastest and slowest round (so seconds_min <= seconds <= seconds_max);
    ``round_seconds`` is the method's total over prompts in each round. Round r ran every method on
    every prompt, so the baseline's round-r total over a method's is that round's speedup, with the
    machine's state of the moment in both; ``speedup_min`` and ``speedup_max`` are the extremes of
    those per-round speedups, widened to hold ``speedup`` where the medians fall outside them
    (`speedup_range`). Two methods whose ranges overlap are not told apart by this run (`fastest`).
    """
    check_integer("repeats", repeats, 1)
    quick = bool(os.environ.get("SPECBOOK_QUICK_TIMING"))  # `make nbval`: timing cells run, unchecked
    repeats = 1 if quick else repeats
    prompts = prompts[:1] if quick and not counts_from_rows else prompts
    for method in [] if quick else methods:
        for input_ids in prompts if warm_every_prompt else prompts[:1]:
            method.run(input_ids, seed)
    times = [[[] for _ in prompts] for _ in methods]  # [method][prompt] -> seconds of each round
    outputs = [[None] * len(prompts) for _ in methods]
    stats = [[None] * len(prompts) for _ in methods]
    rounds = tqdm(total=repeats * len(prompts) * len(methods), desc="benchmark", disable=not progress)
    for _ in range(repeats):
        if between_rounds is not None:
            between_rounds()
        for p, input_ids in enumerate(prompts):
            for m, method in enumerate(methods):
                started = _clock()
                outputs[m][p], stats[m][p] = method.run(input_ids, seed)
                times[m][p].append(_clock() - started)
                rounds.update()
    rounds.close()
    rows = []
    for method, method_times, method_outputs, method_stats in zip(methods, times, outputs, stats):
        seconds = sum(statistics.median(prompt_times) for prompt_times in method_times)
        tokens = sum(len(token_ids) for token_ids in method_outputs)
        measured = [s for s in method_stats if s is not None]
        rows.append({"method": method.name, "k": method.k, "seconds": seconds,
                     "seconds_min": sum(min(prompt_times) for prompt_times in method_times),
                     "seconds_max": sum(max(prompt_times) for prompt_times in method_times), "tokens": tokens,
                     "ms_per_token": 1000 * seconds / tokens,
                     "bandwidth_gb_s": (method.weight_bytes * tokens / seconds / 1e9 if method.weight_bytes
                                        else float("nan")),
                     "acceptance_rate": _mean([s.acceptance_rate for s in measured]),
                     "tokens_per_call": _mean([s.tokens_per_step for s in measured]),
                     "positions_per_call": _mean([s.positions_per_call for s in measured]),
                     "draft_calls_per_token": sum(s.draft_calls for s in measured) / tokens if measured else float("nan"),
                     "target_calls": sum(s.target_calls for s in measured) if measured else float("nan"),
                     "round_seconds": [sum(rounds) for rounds in zip(*method_times)]})
    for row, method_outputs in zip(rows, outputs):
        row["speedup"] = rows[0]["seconds"] / row["seconds"]
        row["speedup_min"], row["speedup_max"] = speedup_range(rows[0]["round_seconds"], row["round_seconds"],
                                                               row["speedup"])
        row["same_tokens"] = method_outputs == outputs[0]
    return rows


def _mean(values):
    values = [v for v in values if v == v]  # drop NaN (a generation in which nothing was drafted)
    return statistics.fmean(values) if values else float("nan")


def _clock():
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


# ----------------------------------------------------------------------------- the book's recorded runs

RECORDED_BY = {  # results/<name>: the command that records it, from the repository's root
    "family.json": "python -m specbook bench --suite family --repeats 5 --json results/family.json",
    "batch.json": "python -m specbook bench --suite batch --batch-sizes 1,2,4,8,16,32 --ks 1,2,3,4 --repeats 5 "
                  "--json results/batch.json",
    "seq2seq.json": "python -m specbook bench --suite seq2seq --ks 2,4,6 --repeats 5 --max-new-tokens 96 "
                    "--json results/seq2seq.json",
    "pard.json": "python -m specbook bench --suite pard --pard-variants data/pard-ablation --json results/pard.json",
    "eagle3.json": "python -m specbook bench --suite eagle3 --eagle3-variants data/eagle3-ablation "
                   "--json results/eagle3.json",
    "vllm.json": "make vllm-env && .venv-vllm/bin/python scripts/vllm_side_by_side.py --json results/vllm.json",
}
ENGINE_SOURCES = tuple(f"src/specbook/{name}" for name in (  # what sets how fast the package decodes: a results file
    "batch.py", "cache.py", "decoder.py", "decoding.py", "drafters", "eagle3.py", "glide.py", "graphs.py", "heads.py",
    "masks.py", "models.py", "mtp.py", "packed.py", "policies.py", "ragged.py", "rejection.py", "row_graphs.py",
    "sampling.py", "seq2seq.py", "tree_verification.py", "trees.py"))  # from a commit where they differ is stale


RESULTS = Path(__file__).parent / "results"  # the repository's results/, which the package ships (a link in src/)


def read_recorded(name: str, required: bool = True) -> dict | None:
    """A run the book shows from its results file, ``results/<name>`` (JSON): the repository's ``results/``, which
    the package ships as ``specbook/results`` (``src/specbook/results`` links to it), so a notebook finds them from
    any folder and on Colab, where the package is installed and the repository is not cloned. Where the file is
    missing: None if not ``required`` (a GPU run this machine has not made), else a FileNotFoundError that says how
    to record it."""
    path = RESULTS / name
    if path.exists():
        return json.loads(path.read_text())
    if not required:
        return None
    how = RECORDED_BY.get(name, "scripts/gpu_results.sh on a machine with a GPU")
    raise FileNotFoundError(f"results/{name} is not among the book's recorded runs ({RESULTS}): record it from the "
                            f"repository's root with {how}")


def machine() -> str:
    """The machine a benchmark ran on, in words, for captions and result files."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"{cpu_model()}, {torch.get_num_threads()} CPU threads"


def cpu_model() -> str:
    """The CPU's model name, as Linux's /proc/cpuinfo gives it (else what the platform says): CPUs of one
    architecture differ by several times in what a small model's call costs."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def project_commit() -> str | None:
    """The commit of the package's source, with "+" where the source differs from it (uncommitted changes under
    ``src``); None outside a clone (an installed wheel)."""
    root = Path(__file__).resolve().parents[2]
    try:
        run = [subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout
               for args in (["rev-parse", "HEAD"], ["status", "--porcelain", "--", "src"])]
    except (OSError, subprocess.CalledProcessError):
        return None
    return run[0].strip() + ("+" if run[1].strip() else "")


@torch.inference_mode()
def decode_latency(model, input_ids, new_tokens=64, repeats=3, **path):
    """Median seconds per decoded token (batch 1, KV cache, greedy) after prefilling ``input_ids``.

    The time of ``new_tokens - 1`` decoding steps: a run of ``new_tokens`` minus a run of one (each the median of
    ``repeats``), so the prompt's prefill and the setup cancel out; on a GPU the prefill runs uncompiled and would
    otherwise inflate every step. ``path``: the GPU path's ``cache`` and ``compile`` options; the model runs once
    untimed first (lazy initialisation, compilation)."""
    if new_tokens < 2:
        raise ValueError(f"new_tokens must be >= 2: one run is subtracted from another (got {new_tokens})")

    def run_seconds(tokens):
        times = []
        for _ in range(repeats):
            started = _clock()
            autoregressive_generate(model, input_ids, tokens, Sampler(0), **path)
            times.append(_clock() - started)
        return statistics.median(times)

    autoregressive_generate(model, input_ids, new_tokens, Sampler(0), **path)
    return (run_seconds(new_tokens) - run_seconds(1)) / (new_tokens - 1)


def acceptance(target, drafter, prompts: list[torch.Tensor], new_tokens: int = 64, k: int = 4,
               eos_token_id: int | None = None) -> dict:
    """How much of the target's greedy continuation of each prompt ``drafter`` gets accepted.

    Runs greedy speculative decoding (up to ``eos_token_id``, when given) and returns the mean
    ``tokens_per_step`` (accepted drafts + 1 per target call: the "acceptance length" tau of the
    Medusa and EAGLE papers) and the ``acceptance_rate`` alpha, over ``prompts`` ((1, T) tensors).
    """
    runs = [speculative_generate(target, drafter, prompt, new_tokens, k=k, sampler=Sampler(0),
                                 eos_token_id=eos_token_id) for prompt in prompts]
    steps = [step for run in runs for step in run.steps]
    return {"tokens_per_step": sum(len(run.token_ids) for run in runs) / len(steps),
            "acceptance_rate": acceptance_rate(steps)}


def acceptance_by_position(target, drafter, prompts: list[torch.Tensor], new_tokens: int = 64, k: int = 5,
                           sampler=Sampler(0), seed: int = 0) -> dict:
    """α at each draft position of a chain: α_i, the share of steps whose i-th draft was accepted among those that
    drafted it and accepted drafts 1 .. i - 1 (EAGLE-3's Figure 7 plots the like), over ``prompts`` ((1, T)
    tensors), ``k`` drafts a step. Returns ``alpha_by_position`` (k values; None where no step got that far),
    ``tokens_per_step`` and the generations' ``steps`` counted."""
    runs = [speculative_generate(target, drafter, prompt, new_tokens, k=k, sampler=sampler, seed=seed + index)
            for index, prompt in enumerate(prompts)]
    steps = [step for run in runs for step in run.steps]
    reached = [sum(len(step.drafted) >= i and step.accepted >= i - 1 for step in steps) for i in range(1, k + 1)]
    accepted = [sum(step.accepted >= i for step in steps) for i in range(1, k + 1)]
    return {"alpha_by_position": [hits / tried if tried else None for hits, tried in zip(accepted, reached)],
            "tokens_per_step": sum(len(run.token_ids) for run in runs) / len(steps), "steps": len(steps)}


@torch.inference_mode()
def measure_alpha(target, draft, prompts, new_tokens=64, seed=0, greedy=None):
    """How well the draft predicts the target, along the target's own continuations of ``prompts``.

    Returns ``greedy``: the share of the target's greedy tokens that the draft's greedy choice
    matches (the acceptance rate of greedy speculative decoding), and ``sampled``: the mean of
    alpha = sum_x min(p(x), q(x)) over positions of continuations sampled from the target at
    temperature 1 (the acceptance rate of speculative sampling, Leviathan et al. Definition 3.1).
    ``greedy`` (optional): the target's greedy continuation of each prompt (lists of token ids), where
    the caller has them already; by default they are generated here, ``new_tokens`` each.
    """
    from .rejection import acceptance_rate

    if greedy is not None and len(greedy) != len(prompts):
        raise ValueError(f"greedy: one continuation per prompt, got {len(greedy)} for {len(prompts)} prompts")
    matches, positions, alphas = 0, 0, []
    for index, input_ids in enumerate(prompts):
        start = input_ids.shape[1] - 1  # logits at position t predict token t + 1
        greedy_ids = (autoregressive_generate(target, input_ids, new_tokens, Sampler(0)).token_ids if greedy is None
                      else greedy[index])
        sequence = torch.cat([input_ids[0], torch.tensor(greedy_ids, device=input_ids.device)])[None]
        draft_choice = draft(sequence).logits[0, start:-1].argmax(-1)  # (new_tokens,)
        matches += int((draft_choice == sequence[0, start + 1:]).sum())
        positions += len(greedy_ids)
        sampled = autoregressive_generate(target, input_ids, new_tokens, Sampler(1.0), seed=seed + index).token_ids
        sequence = torch.cat([input_ids[0], torch.tensor(sampled, device=input_ids.device)])[None]
        target_probs = target(sequence).logits[0, start:-1].float().softmax(-1)  # (new_tokens, vocab)
        vocab = target_probs.shape[-1]  # as in the engine: the draft's p over the target's vocabulary
        draft_probs = draft(sequence).logits[0, start:-1, :vocab].float().softmax(-1)
        draft_probs = torch.nn.functional.pad(draft_probs, (0, vocab - draft_probs.shape[-1]))
        alphas.append(acceptance_rate(target_probs, draft_probs))
    return {"greedy": matches / positions, "sampled": float(torch.cat(alphas).mean())}

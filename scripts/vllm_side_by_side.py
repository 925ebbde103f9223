"""Record results/vllm.json: the book's engine beside vLLM on this machine, on the same prompts (chapter 7, §7.11).

    make vllm-env
    .venv-vllm/bin/python scripts/vllm_side_by_side.py --json results/vllm.json

Three phases, one after the other on a quiet machine (each engine alone: vLLM's engine core polls while it waits,
so nothing of the package is timed while a vLLM engine lives):

1. **The package**, one request at a time: autoregressive decoding, the draft model at each K, prompt lookup,
   PARD and the EAGLE-3 head's chain, interleaved prompt by prompt over the rounds; then batches of B rows (B =
   each --concurrency) over the concurrency prompts, autoregressive and the draft model at K = 4.
2. **vLLM offline** (``vllm.LLM``), one engine per method and K, compiled (its default), each prompt alone.
3. **vLLM's server** (OpenAI-compatible, on 127.0.0.1), the concurrency prompts sent with B requests in flight.

Every row gives ms a token (batch one) or tokens a second (concurrency), its tokens per target call where it
drafts (vLLM's ``spec_decode`` counters; the package's steps that drafted K tokens, as vLLM always does), and
whether its greedy tokens equal the package's autoregressive ones, with the first differing position and the
margin between the target's two top logits there where they do not.
"""

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

import torch
import transformers

from specbook import (Eagle3Drafter, PardDrafter, PromptLookupDrafter, Sampler, autoregressive_generate, load_pair,
                      speculative_generate)
from specbook.batch_bench import batch_prompts
from specbook.bench import HELD_OUT, INPUT_GROUNDED, OPEN_ENDED, cpu_model, machine, project_commit
from specbook.export import export_pair
from specbook.models import load_model
from specbook.vllm_runs import (concurrent_requests, counts_between, first_difference, llm_generate, offline,
                                require_vllm, serve, server_counts, spec_counts)

GREEDY = Sampler(0)
# vLLM's CPU backend reads these (its CPU installation guide): unset, it binds its model to all cores but one,
# which it leaves to its front end, and allocates with the system's malloc and the GNU OpenMP.
VLLM_CPU_SETTINGS = ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU", "LD_PRELOAD", "OMP_NUM_THREADS")


def options():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", required=True, help="the results file to write")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ks", type=lambda text: [int(k) for k in text.split(",")], default=[1, 2, 3, 4, 5, 6])
    parser.add_argument("--concurrency", type=lambda text: [int(c) for c in text.split(",")], default=[1, 2, 4, 8, 16])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--eager", action="store_true", help="vLLM without compilation (a quick check, not a record)")
    return parser.parse_args()


def full_k_tokens_per_call(steps, k) -> float | None:
    """1 + accepted drafts per step that drafted ``k`` (vLLM drafts K at every step; the package no more than the
    tokens still to write)."""
    full = [step for step in steps if len(step.drafted) == k]
    return 1 + sum(step.accepted for step in full) / len(full) if full else None


def margin(target, prompt: list[int], tokens: list[int], position: int) -> float:
    """The target's top logit minus its second at ``position`` of the continuation ``tokens`` of ``prompt``."""
    with torch.inference_mode():
        logits = target(torch.tensor([prompt + tokens[:position]])).logits[0, -1].float()
    top = logits.topk(2).values
    return float(top[0] - top[1])


def agreement(pair, prompts, outputs, reference) -> dict:
    """Whether ``outputs`` equal the ``reference`` tokens; where not, the first prompt's first differing position
    and the target's margin there."""
    for prompt, ours, theirs in zip(prompts, reference, outputs):
        position = first_difference(ours, theirs)
        if position is not None:
            return {"same_tokens": False, "first_difference": position,
                    "margin": margin(pair.target, prompt, ours, position)}
    return {"same_tokens": True}


def package_methods(pair, ks):
    """The package's methods, one request at a time, by (method, K): what the README's calls run."""
    methods = {("autoregressive", None): lambda ids, n: autoregressive_generate(pair.target, ids, n, GREEDY)}
    for k in ks:
        methods["draft", k] = lambda ids, n, k=k: speculative_generate(pair.target, pair.draft, ids, n, k=k,
                                                                       sampler=GREEDY)
    pard = PardDrafter(load_model("shakespeare", "pard"))
    methods["ngram", 4] = lambda ids, n: speculative_generate(pair.target, PromptLookupDrafter(3, 1), ids, n, k=4,
                                                              sampler=GREEDY)
    methods["pard", 4] = lambda ids, n: speculative_generate(pair.target, pard, ids, n, k=4, sampler=GREEDY)
    eagle3 = Eagle3Drafter.from_pretrained("shakespeare", pair.target)
    methods["eagle3", 4] = lambda ids, n: speculative_generate(pair.target, eagle3, ids, n, k=4, sampler=GREEDY)
    return methods


def package_rows(pair, prompts, args) -> tuple[list[dict], list[list[int]]]:
    methods = package_methods(pair, args.ks)
    for run in methods.values():  # warm every method once
        run(torch.tensor([prompts[0]]), 8)
    seconds = {key: [0.0] * args.rounds for key in methods}
    runs = {key: [] for key in methods}
    for round_ in range(args.rounds):
        for prompt in prompts:
            for key, run in methods.items():
                start = time.perf_counter()
                generation = run(torch.tensor([prompt]), args.new_tokens)
                seconds[key][round_] += time.perf_counter() - start
                if round_ == 0:
                    runs[key].append(generation)
    reference = [generation.token_ids for generation in runs["autoregressive", None]]
    rows = []
    for (method, k), generations in runs.items():
        per_token = [1000 * total / (args.new_tokens * len(prompts)) for total in seconds[method, k]]
        steps = [step for generation in generations for step in generation.steps]
        rows.append({"engine": "specbook", "api": "one request", "method": method, "k": k,
                     "ms_per_token": statistics.median(per_token), "ms_per_token_rounds": per_token,
                     "tokens_per_call": full_k_tokens_per_call(steps, k) if k else None,
                     **agreement(pair, prompts, [g.token_ids for g in generations], reference)})
    return rows, reference


def package_batches(pair, texts, reference, args) -> list[dict]:
    """The concurrency prompts in batches of B rows, B after B: the package's engine under B requests at once."""
    runs = {"autoregressive": lambda ids, mask: autoregressive_generate(
        pair.target, ids, args.new_tokens, GREEDY, attention_mask=mask),
        "draft": lambda ids, mask: speculative_generate(pair.target, pair.draft, ids, args.new_tokens, k=4,
                                                        sampler=GREEDY, attention_mask=mask)}
    batches = {b: [pair.encode_batch(texts[i: i + b]) for i in range(0, len(texts), b)] for b in args.concurrency}
    for run in runs.values():
        run(*batches[max(args.concurrency)][0])  # warm
    seconds = {(method, b): [] for method in runs for b in args.concurrency}
    same = {key: True for key in seconds}
    for _ in range(args.rounds):
        for b, groups in batches.items():
            for method, run in runs.items():
                start = time.perf_counter()
                outputs = [row.token_ids for ids, mask in groups for row in run(ids, mask)]
                seconds[method, b].append(time.perf_counter() - start)
                same[method, b] &= outputs == reference
    return [{"engine": "specbook", "api": "batches", "method": method, "k": 4 if method == "draft" else None,
             "concurrency": b, "tokens_per_second": len(texts) * args.new_tokens / statistics.median(times),
             "seconds_rounds": times, "same_tokens": same[method, b]} for (method, b), times in seconds.items()]


def vllm_offline_rows(pair, folders, prompts, reference, args) -> list[dict]:
    configs = [("autoregressive", None)] + [("draft", k) for k in args.ks] + [("ngram", 4), ("pard", 4), ("eagle3", 4)]
    rows = []
    for method, k in configs:
        start = time.perf_counter()
        with offline(folders, method, k or 1, eager=args.eager) as llm:
            startup = time.perf_counter() - start
            llm_generate(llm, prompts[:1], 8)  # warm
            before, per_token, outputs = spec_counts(llm), [], []
            for round_ in range(args.rounds):
                total = 0.0
                for prompt in prompts:
                    tokens, seconds = llm_generate(llm, [prompt], args.new_tokens)
                    total += seconds
                    if round_ == 0:
                        outputs += tokens
                per_token.append(1000 * total / (args.new_tokens * len(prompts)))
            counts = counts_between(before, spec_counts(llm))
        rows.append({"engine": "vllm", "api": "offline", "method": method, "k": k, "startup_s": startup,
                     "ms_per_token": statistics.median(per_token), "ms_per_token_rounds": per_token,
                     "tokens_per_call": counts["tokens_per_call"] if k else None,
                     "accepted_by_position": counts["accepted_by_position"] if k else None,
                     "drafts": counts["drafts"] if k else None,
                     **agreement(pair, prompts, outputs, reference)})
        print(rows[-1], flush=True)
    return rows


def vllm_server_rows(pair, folders, prompts, reference, args) -> list[dict]:
    rows = []
    for method, k in [("autoregressive", None), ("draft", 4), ("pard", 4)]:
        start = time.perf_counter()
        with serve(folders, method, k or 1, port=args.port, eager=args.eager) as url:
            startup = time.perf_counter() - start
            concurrent_requests(url, prompts[:2], 8, 2)  # warm
            seconds, outputs, before = {b: [] for b in args.concurrency}, None, server_counts(url)
            for _ in range(args.rounds):
                for b in args.concurrency:
                    outputs, elapsed = concurrent_requests(url, prompts, args.new_tokens, b)
                    seconds[b].append(elapsed)
            counts = counts_between(before, server_counts(url))
        for b, times in seconds.items():
            rows.append({"engine": "vllm", "api": "server", "method": method, "k": k, "concurrency": b,
                         "startup_s": startup,
                         "tokens_per_second": len(prompts) * args.new_tokens / statistics.median(times),
                         "seconds_rounds": times, "tokens_per_call": counts["tokens_per_call"] if k else None,
                         **agreement(pair, prompts, outputs, reference)})
        print(rows[-1], flush=True)
    return rows


def main():
    args = options()
    vllm = require_vllm()
    pair = load_pair("shakespeare")
    texts = OPEN_ENDED[:2] + INPUT_GROUNDED[:2] + HELD_OUT[:2]
    prompts = [pair.encode(text)[0].tolist() for text in texts]
    many_texts = batch_prompts(max(args.concurrency))
    many = [pair.encode(text)[0].tolist() for text in many_texts]
    started, commit = time.perf_counter(), project_commit()  # the code the run starts with
    settings = {name: os.environ.get(name) for name in VLLM_CPU_SETTINGS}  # before vLLM sets any for its children
    rows, reference = package_rows(pair, prompts, args)
    many_reference = [autoregressive_generate(pair.target, torch.tensor([ids]), args.new_tokens, GREEDY).token_ids
                      for ids in many]
    rows += package_batches(pair, many_texts, many_reference, args)
    with tempfile.TemporaryDirectory() as folder:
        folders = export_pair(folder)
        rows += vllm_offline_rows(pair, folders, prompts, reference, args)
        rows += vllm_server_rows(pair, folders, many, many_reference, args)
    record = {"cpu": cpu_model(), "machine": machine(), "project_commit": commit,
              "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
              "vllm": vllm.__version__, "target_forward": "specbook.decoder", "new_tokens": args.new_tokens,
              "rounds": args.rounds, "prompts": texts, "concurrency_prompts": len(many),
              "vllm_compiled": not args.eager,
              "vllm_cpu_settings": settings,
              "minutes": (time.perf_counter() - started) / 60, "rows": rows}
    with open(args.json, "w") as file:
        json.dump(record, file, indent=1)
    print(f"wrote {args.json} in {record['minutes']:.1f} min")


if __name__ == "__main__":
    main()

"""The GPU path with and without the three costs it cut last: the prompt's call replayed as a padded graph
(`specbook.graphs.PROMPT_BUCKETS`), the next chain drafted before the host reads a step's outcome
(`specbook.drafters.ModelDrafter.draft_ahead`), and Hugging Face's forward replaced by the package's decoder
(`specbook.decoder`). One interleaved run of the built-in pair: autoregressive and speculative decoding under
each variant, each variant's speedup from the same rounds, and every variant's times side by side (the
fastest autoregressive row is the honest baseline).

    python scripts/gpu_ablation.py --device cuda --dtype bfloat16 --k 5 --repeats 3

On a CPU it runs too (the graphs' stand-in, ``CAPTURE_ON_CPU``, with ``--capture-on-cpu``): that checks the
script, not the speed.
"""

import argparse
from contextlib import ExitStack
from unittest import mock

import pandas as pd
import torch

from specbook import Sampler, graphs, load_pair
from specbook.bench import PROMPT_SETS, Method, autoregressive, machine, run_benchmark, speculative
from specbook.decoder import hugging_face_forward
from specbook.drafters import ModelDrafter

VARIANTS = {  # (prompt graphs, drafting ahead, the package's decoder)
    "decoder, prompt graphs, drafting ahead": (True, True, True),
    "Hugging Face's forward, prompt graphs, drafting ahead": (True, True, False),
    "decoder, eager prompt, drafting ahead": (False, True, True),
    "decoder, prompt graphs, drafting after the read": (True, False, True),
    "decoder, eager prompt, drafting after the read": (False, False, True)}


def under(method: Method, variant: str) -> Method:
    """``method`` run with the GPU path's prompt graphs, drafting ahead and decoder switched as ``variant`` says."""
    prompt_graphs, ahead, decoder = VARIANTS[variant]

    def run(input_ids, seed):
        with ExitStack() as patches:
            if not decoder:
                patches.enter_context(hugging_face_forward())
            if not prompt_graphs:  # no bucket holds any prompt: its call runs eagerly
                patches.enter_context(mock.patch.object(graphs, "PROMPT_BUCKETS", ()))
            if not ahead:
                patches.enter_context(mock.patch.object(ModelDrafter, "draft_ahead", lambda *args, **kwargs: False))
            return method.run(input_ids, seed)
    return Method(f"{method.name}, {variant}", run, method.k, method.weight_bytes)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default=None, choices=[None, "bfloat16", "float16", "float32"])
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--capture-on-cpu", action="store_true", help="the CPU's stand-in for graphs (a check)")
    args = parser.parse_args()
    graphs.CAPTURE_ON_CPU = args.capture_on_cpu
    pair = load_pair("shakespeare", device=args.device, dtype=getattr(torch, args.dtype) if args.dtype else None)
    prompts = [pair.encode(text) for text in PROMPT_SETS["open"]]
    greedy, path = Sampler(0), dict(cache="static")
    methods = []
    for variant in VARIANTS:
        methods += [under(autoregressive(pair.target, greedy, args.max_new_tokens, **path), variant),
                    under(speculative(pair.target, pair.draft, args.k, greedy, args.max_new_tokens, **path), variant)]
    for method in methods:  # capture every graph (each prompt's bucket too) before the timed rounds
        for input_ids in prompts:
            method.run(input_ids, 0)
    rows = run_benchmark(methods, prompts, args.repeats, progress=False)
    table = []
    for variant, (ar, spec) in zip(VARIANTS, zip(rows[::2], rows[1::2])):
        ratios = [a / s for a, s in zip(ar["round_seconds"], spec["round_seconds"])]
        table.append({"variant": variant, "autoregressive ms/token": ar["ms_per_token"],
                      "speculative ms/token": spec["ms_per_token"], "speedup": ar["seconds"] / spec["seconds"],
                      "rounds min": min(ratios), "rounds max": max(ratios),
                      "same tokens": spec["same_tokens"] and ar["same_tokens"]})
    print(f"{machine()}, {pair.target.dtype}, K = {args.k}, {len(prompts)} prompts, {args.max_new_tokens} tokens, "
          f"{args.repeats} rounds")
    print(pd.DataFrame(table).set_index("variant").round(3).to_string())


if __name__ == "__main__":
    main()

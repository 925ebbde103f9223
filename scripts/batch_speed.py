"""Batched autoregressive decoding timed on this machine against the single path, the calls a reader makes:
``autoregressive_generate`` on one prompt, and on a left-padded batch of B prompts with its attention mask. The
built-in pair, greedy, the batch benchmark's prompts (`specbook.batch_bench.batch_prompts`), interleaved rounds,
medians, every ratio from the same run; the CPU's model named. At B = 1 the batched engine's own loop
(`specbook.batch.generate_batch` on one row, which a batch of one otherwise skips) is timed too. ``--caches``
times the batches over each cache named (a GPU's default is the static one, its calls replayed as graphs per
batch bucket: `specbook.row_graphs`; a CPU's the dynamic one).

    python scripts/batch_speed.py --tokens 64 --batch-sizes 1,4,8 --rounds 9
    python scripts/batch_speed.py --device cuda --dtype bfloat16 --caches dynamic,static --batch-sizes 1,4,16,32
"""

import argparse
import statistics
import time

import torch

from specbook import Sampler, autoregressive_generate, load_pair
from specbook.batch import generate_batch
from specbook.batch_bench import batch_prompts
from specbook.bench import cpu_model, machine, project_commit
from specbook.decoder import forward_name


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batch-sizes", default="1,4,8")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: the device's)")
    parser.add_argument("--caches", default="dynamic", help="the batches' caches, comma-separated: dynamic, static")
    args = parser.parse_args()
    sizes, caches = [int(b) for b in args.batch_sizes.split(",")], args.caches.split(",")
    dtype = getattr(torch, args.dtype) if args.dtype else None
    pair, greedy = load_pair("shakespeare", device=args.device, dtype=dtype), Sampler(temperature=0)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"{cpu_model()} ({machine()})"
    print(f"{device}, {pair.target.dtype}, commit {project_commit()}, target on {forward_name(pair.target)}, torch "
          f"{torch.__version__}")
    singles = [pair.encode(text) for text in batch_prompts(max(sizes))]
    runs = {"single path": lambda: [autoregressive_generate(pair.target, ids, args.tokens, greedy).token_ids
                                    for ids in singles]}
    first, first_mask = pair.encode_batch(batch_prompts(1))
    runs["batched loop, B = 1"] = lambda: generate_batch(pair.target, None, first, args.tokens, 0, greedy,
                                                         attention_mask=first_mask).token_ids
    for b in sizes:
        ids, mask = pair.encode_batch(batch_prompts(b))
        for cache in caches:
            name = f"batched, B = {b}" + (f", {cache}" if len(caches) > 1 else "")
            runs[name] = (lambda ids=ids, mask=mask, cache=cache: autoregressive_generate(
                pair.target, ids, args.tokens, greedy, attention_mask=mask, cache=cache).token_ids)
    for run in runs.values():  # warm-up
        run()
    ms, tokens = {name: [] for name in runs}, {}
    for _ in range(args.rounds):
        for name, run in runs.items():
            started = time.perf_counter()
            tokens[name] = run()
            ms[name].append((time.perf_counter() - started) * 1e3 / sum(map(len, tokens[name])))
    single = statistics.median(ms["single path"])  # ms a token, one prompt at a time
    for name, values in ms.items():
        median = statistics.median(values)
        same = tokens[name] == tokens["single path"][: len(tokens[name])]
        print(f"{name:>28}: {median:6.2f} ms a token, {1e3 / median:7.1f} tokens/s (rounds {min(values):.2f}-"
              f"{max(values):.2f} ms), {single / median:5.2f}x the single path's tokens/s; same tokens: {same}")


if __name__ == "__main__":
    main()

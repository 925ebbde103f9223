"""The README's calls timed on this machine: autoregressive against speculative decoding with the built-in
pair, greedy, the book's open prompts (or another kind of text of `specbook.bench.ALL_CATEGORIES`, such as the verse of
plays the pair never trained on), interleaved rounds, medians, every ratio from the same run. Also
autoregressive decoding as the package ran it before its decoder (Hugging Face's forward on a target packed for
oneDNN, ``load_pair(pack=True)``), in the same rounds.

    python scripts/cpu_speed.py --tokens 96 --ks 3,4,5,6 --rounds 5
    python scripts/cpu_speed.py --prompts held-out
"""

import argparse
import statistics
import time

import torch

from specbook import Sampler, autoregressive_generate, load_pair, speculative_generate
from specbook.bench import ALL_CATEGORIES, machine


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--ks", default="3,4,5,6")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompts", choices=sorted(ALL_CATEGORIES), default="open", help="the kind of text")
    parser.add_argument("--pack", action=argparse.BooleanOptionalAction, default=None,
                        help="load_pair's pack (default: its own choice)")
    parser.add_argument("--threads", type=int, default=None, help="torch's threads (default: its own choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    ks = [int(k) for k in args.ks.split(",")]
    pair = load_pair("shakespeare", pack=args.pack)
    print(machine(), "| torch", torch.__version__, "| threads", torch.get_num_threads(), "|", args.prompts, "prompts")
    prompts = [pair.encode(text) for text in ALL_CATEGORIES[args.prompts]]
    greedy = Sampler(temperature=0)
    before = load_pair("shakespeare", pack=True)  # Hugging Face's forward on the packed target: the path before
    runs = {"AR": lambda p: autoregressive_generate(pair.target, p, args.tokens, sampler=greedy),
            "AR, Hugging Face's forward, packed": lambda p: autoregressive_generate(before.target, p, args.tokens,
                                                                                    sampler=greedy)}
    runs.update({f"K={k}": (lambda p, k=k: speculative_generate(pair.target, pair.draft, p, args.tokens, k=k,
                                                                  sampler=greedy)) for k in ks})
    for run in runs.values():  # warm-up
        run(prompts[0])
    times = {name: [] for name in runs}
    tokens = {}
    for _ in range(args.rounds):
        for name, run in runs.items():
            started, ids = time.perf_counter(), []
            for prompt in prompts:
                ids.append(run(prompt).token_ids)
            times[name].append((time.perf_counter() - started) * 1e3 / (args.tokens * len(prompts)))
            tokens[name] = ids
    base = statistics.median(times["AR"])
    for name, values in times.items():
        median = statistics.median(values)
        same = tokens[name] == tokens["AR"]
        print(f"{name:>36}: {median:6.2f} ms/token (rounds {min(values):.2f}-{max(values):.2f})  "
              f"{base / median:4.2f}x  same tokens: {same}")


if __name__ == "__main__":
    main()

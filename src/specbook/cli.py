"""The command line: ``python -m specbook generate | bench | chat | export``.

    python -m specbook generate "ROMEO:\\n" --k 4 --trace
    python -m specbook bench --prompts grounded --ks 1,2,4,6 --out bench.csv
    python -m specbook bench --suite heads --ks 4
    python -m specbook bench --suite gpu --device cuda --dtype bfloat16 --json results/gpu.json
    python -m specbook bench --suite profile --ks 2,4
    python -m specbook bench --suite family --json results/family.json
    python -m specbook bench --suite eagle3 --eagle3-variants data/eagle3-ablation --json results/eagle3.json
    python -m specbook bench --suite trees --gpu-path --device cuda --dtype bfloat16 --json results/trees-gpu.json
    python -m specbook generate "To be, or <mask> to be:" --pair shakespeare-seq2seq --trace
    python -m specbook bench --suite seq2seq --ks 2,4,6 --json results/seq2seq.json
    python -m specbook bench --suite batch --batch-sizes 1,2,4,8,16,32 --json results/batch.json
    python -m specbook bench --suite costs --device cuda --ks 8 --repeats 20 --json results/costs.json
    python -m specbook chat
    python -m specbook export --out served/

This module holds the options, ``generate``, ``chat`` and the checks ``bench`` makes before a suite runs;
the suites themselves run in `specbook.cli_bench`.
"""

import argparse
import shlex
import sys

import torch

from .bench import ALL_CATEGORIES, CATEGORIES
from .cli_bench import (run_batch, run_costs, run_eagle3, run_family, run_gpu, run_pard, run_profile, run_seq2seq,
                        run_table, run_trees, target_path)
from .costs import CPU_SCALE, PAIRS
from .decoding import autoregressive_generate, speculative_generate
from .drafters import ModelDrafter
from .export import SERVED, export_pair
from .heads import WITH_HEADS
from .models import load_pair
from .sampling import Sampler
from .viz import render_trace
from .vllm_runs import speculative_config


def _positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1 (got {text})")
    return value


def _choices(text, allowed):
    chosen = text.split(",")
    unknown = [name for name in chosen if name not in allowed]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {unknown}: choose from {', '.join(allowed)}")
    return chosen


def _add_model_options(parser):
    parser.add_argument("--pair", default=None, help="built-in pair name (default: shakespeare)")
    parser.add_argument("--target", help="Hugging Face model id of the target (with --draft; needs a network)")
    parser.add_argument("--draft", help="Hugging Face model id of the draft")
    parser.add_argument("--device", default=None, help="cpu, cuda, ... (default: cpu)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                        help="the models' precision (default: float32)")


def _add_sampling_options(parser):
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    parser.add_argument("--top-k", type=_positive_int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--max-new-tokens", type=_positive_int, default=64)
    parser.add_argument("--seed", type=int, default=0)


def _load(args):
    """The pair the options name; bench's ``--pack`` or ``--no-pack`` overrules `load_pair`'s choice."""
    dtype = getattr(torch, args.dtype) if args.dtype else None
    return load_pair(args.pair, target=args.target, draft=args.draft, device=args.device, dtype=dtype,
                     pack=getattr(args, "pack", None))


def _generate(pair, prompt, method, k, sampler, max_new_tokens, seed):
    input_ids = pair.encode(prompt)
    # an encoder-decoder model's output is a whole text: it stops at its end
    stop = dict(eos_token_id=pair.tokenizer.eos_token_id) if pair.target.config.is_encoder_decoder else {}
    if method == "ar":
        return autoregressive_generate(pair.target, input_ids, max_new_tokens, sampler, seed,
                                       tokenizer=pair.tokenizer, **stop)
    return speculative_generate(pair.target, ModelDrafter.for_pair(pair), input_ids, max_new_tokens, k, sampler, seed,
                                tokenizer=pair.tokenizer, **stop)


def _report(generation, pair, trace):
    if trace and generation.steps:
        print(render_trace(generation, pair.tokenizer, style="ansi"))
    else:
        print(generation.text)
    stats = generation.stats
    print(f"\n[{len(generation.token_ids)} tokens in {stats.seconds:.2f} s, {stats.target_calls} target calls, "
          f"{stats.tokens_per_step:.2f} tokens per call, alpha {stats.acceptance_rate:.2f}]", file=sys.stderr)


def generate(args):
    pair = _load(args)
    sampler = Sampler(args.temperature, args.top_k, args.top_p)
    _report(_generate(pair, args.prompt, args.method, args.k, sampler, args.max_new_tokens, args.seed), pair,
            args.trace)


def bench(args):
    """Check what the suite needs, load the pair and run the suite (`specbook.cli_bench`)."""
    if args.suite == "costs":  # builds the real pairs' shapes itself: no pair to load
        return run_costs(args)
    if args.categories is None:
        args.categories = list(ALL_CATEGORIES if args.suite == "pard" else CATEGORIES)
    if args.suite in ("heads", "family", "eagle3", "pard") and (args.target or args.draft
                                                         or args.pair not in (None, *WITH_HEADS)):
        raise ValueError(f"--suite {args.suite} needs a built-in pair (--pair shakespeare, the default): its heads "
                         "were trained on that target's hidden states and fit no other model")
    if args.suite == "seq2seq" and args.pair is None and args.target is None:
        args.pair = "shakespeare-seq2seq"
    pair = _load(args)
    if args.suite == "seq2seq" and not pair.target.config.is_encoder_decoder:
        raise ValueError(f"--suite seq2seq needs an encoder-decoder pair (--pair shakespeare-seq2seq, the default, or "
                         f"a Hugging Face pair); {pair.name} is decoder-only")
    if args.suite == "gpu":
        return run_gpu(pair, args)
    runs = {"profile": run_profile, "family": run_family, "eagle3": run_eagle3, "pard": run_pard, "trees": run_trees,
            "seq2seq": run_seq2seq, "batch": run_batch}
    runs.get(args.suite, run_table)(pair, args, target_path(pair.target))


CHAT_HELP = """Commands:
  /method ar|spec      autoregressive or speculative decoding
  /k N                 draft length K
  /temperature T       0 is greedy
  /top_k N|off         keep the N most likely tokens
  /top_p P|off         nucleus sampling
  /length N            new tokens per reply
  /seed N              random seed
  /trace on|off        colour the accepted / rejected / corrected / bonus tokens
  /help                this text
  /quit                leave
Anything else is a prompt (\\n starts a new line)."""


SETTINGS = {  # chat command -> how to read its value ("off" clears top_k and top_p)
    "method": str, "k": int, "temperature": float, "top_k": int, "top_p": float, "length": int, "seed": int,
    "trace": lambda text: {"on": True, "off": False}[text],
}


def _change(settings, command, text):
    """A copy of ``settings`` with one chat command applied; ValueError (or KeyError) if it is not valid."""
    changed = dict(settings)
    changed[command] = None if text == "off" and command in ("top_k", "top_p") else SETTINGS[command](text)
    Sampler(changed["temperature"], changed["top_k"], changed["top_p"])  # validates the three
    if changed["method"] not in ("ar", "spec") or changed["k"] < 1 or changed["length"] < 1:
        raise ValueError("method is ar or spec; k and length are integers >= 1")
    return changed


def chat(args, input_fn=input):
    pair = _load(args)
    settings = {"method": "spec", "k": 4, "temperature": args.temperature, "top_k": args.top_k,
                "top_p": args.top_p, "length": args.max_new_tokens, "seed": args.seed, "trace": True}
    print(f"specbook chat with the {pair.name} pair. /help lists the commands.")
    while True:
        try:
            line = input_fn("> ").strip()
        except EOFError:
            return
        if line in ("/quit", "/exit"):
            return
        if line.startswith("/"):
            command, *rest = shlex.split(line[1:]) or ["help"]
            if command not in SETTINGS or len(rest) != 1:
                print(CHAT_HELP)
                continue
            try:
                settings = _change(settings, command, rest[0])
                print(settings)
            except (ValueError, KeyError) as error:
                print(f"error: {command} {rest[0]!r} is not valid ({error})")
            continue
        if line:
            sampler = Sampler(settings["temperature"], settings["top_k"], settings["top_p"])
            try:
                generation = _generate(pair, line.replace("\\n", "\n"), settings["method"], settings["k"], sampler,
                                       settings["length"], settings["seed"])
            except ValueError as error:  # e.g. a prompt longer than the model's context
                print(f"error: {error}")
                continue
            _report(generation, pair, settings["trace"])


def export(args):
    folders = export_pair(args.out, args.pair or "shakespeare", args.models)
    for model, folder in folders.items():
        print(f"{model}: {folder}")
    if {"target", "draft"} <= set(folders):
        print(f"\nvLLM: LLM(model={str(folders['target'])!r}, dtype='float32', "
              f"speculative_config={speculative_config('draft', folders, 4)})")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m specbook", description="Speculative decoding from the shell.")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate from a prompt and show the trace")
    gen.add_argument("prompt")
    gen.add_argument("--method", choices=["spec", "ar"], default="spec")
    gen.add_argument("--k", type=_positive_int, default=4, help="draft length K (default: 4)")
    gen.add_argument("--trace", action="store_true", help="colour accepted/rejected/corrected/bonus tokens")
    _add_model_options(gen)
    _add_sampling_options(gen)
    ben = commands.add_parser("bench", help="benchmark AR, speculative (several K) and HF assisted generation")
    ben.add_argument("--suite", choices=["comparison", "ablation", "heads", "gpu", "profile", "family", "eagle3",
                                         "pard", "trees", "seq2seq", "batch", "costs"],
                     default="comparison",
                     help="comparison: AR, speculative for each K, HF assisted (chapter 4); ablation: model "
                          "drafter, EGAG, NASD, prompt lookup (chapter 5); heads: the model drafter as a chain "
                          "and a tree, Medusa and EAGLE (chapter 6, built-in pair only); gpu: the GPU path "
                          "(static caches, compiled steps) against AR and HF assisted, greedy and sampled, "
                          "written with --json (chapter 4); profile: where a speculative step's time goes, "
                          "for each K (specbook.profile); family: every method of the book on every kind of "
                          "text, greedy and sampled, written with --json (chapter 6, built-in pair only); "
                          "eagle3: EAGLE against EAGLE-3 and its ablations, chains and dynamic trees on every kind "
                          "of text, and alpha at each draft position, written with --json (chapter 6, built-in "
                          "pair only); pard: the draft model at K = 1..6 against its PARD adaptation drafting K "
                          "tokens in one call, and alpha at each draft position of both, written with --json "
                          "(chapter 6c, built-in pair only); trees: tokens per call and time per step against the "
                          "size of the draft model's dynamic tree, greedy, on every kind of text (with --gpu-path "
                          "on the GPU path), written with --json (chapter 6); "
                          "seq2seq: an encoder-decoder pair (default shakespeare-seq2seq) restoring held-out "
                          "passages: the draft on the target's encoder at each K, a draft with its own encoder, "
                          "prompt lookup and HF assisted, greedy and sampled, written with --json (chapter 4b); "
                          "batch: batched AR, HF generate and speculative decoding at each K and with the "
                          "batch-size policy, at each --batch-sizes, written with --json (chapter 7); "
                          "costs: the real pairs of --pairs built from their shapes with random weights (nothing "
                          "downloaded) and timed on this machine, static cache, CUDA graphs on a GPU: c, the "
                          "target's cost on 1..K+1 positions for K up to the largest --ks, over --repeats rounds, "
                          "and the speedup they predict for alpha 0.5..0.9, written with --json (chapter 3)")
    ben.add_argument("--pairs", type=lambda text: _choices(text, PAIRS), default=None,
                     help=f"--suite costs: the real pairs (default: {','.join(PAIRS)})")
    ben.add_argument("--scale", type=_positive_int, default=None,
                     help="--suite costs: divide every width of both models by this (1, 2, 4, 8, 16 or 32), "
                          f"keeping their layers and heads (default: 1 on CUDA, {CPU_SCALE} elsewhere)")
    ben.add_argument("--batch-sizes", type=lambda text: [_positive_int(b) for b in text.split(",")],
                     default=[1, 2, 4, 8, 16, 32], help="--suite batch: the batch sizes (default: 1,2,4,8,16,32)")
    ben.add_argument("--prompts", choices=["open", "grounded", "both"], default="both")
    ben.add_argument("--categories", type=lambda text: _choices(text, ALL_CATEGORIES), default=None,
                     help=f"--suite family, eagle3, pard and trees: the kinds of text, of {','.join(ALL_CATEGORIES)} "
                          f"(default: {','.join(CATEGORIES)}; for pard all of them)")
    ben.add_argument("--ks", type=lambda text: [_positive_int(k) for k in text.split(",")], default=[1, 2, 3, 4, 6],
                     help="draft lengths (default: 1,2,3,4,6; the ablation sweeps the model drafter over them "
                          "and gives the lookup drafters the largest; the heads suite uses the largest)")
    ben.add_argument("--k", type=_positive_int, default=4,
                     help="--suite family and eagle3: the draft length of its chains (trees draft to that depth, "
                          "Ouroboros K + 3; default 4, the K chapters 4 to 6c time)")
    ben.add_argument("--gpu-path", action="store_true",
                     help="--suite family and trees: every row on the GPU path (the static cache, its calls replayed "
                          "as CUDA graphs; off a GPU the CPU's stand-in for graphs, which checks exactness, not speed)")
    ben.add_argument("--eagle3-variants", default=None,
                     help="--suite eagle3: a folder of EAGLE-3 heads trained otherwise, one a subfolder (python -m "
                          "specbook.train --stages eagle3 --eagle3-dir FOLDER/NAME ...), each compared with the "
                          "built-in one")
    ben.add_argument("--pard-variants", default=None,
                     help="--suite pard: a folder of PARD drafts trained otherwise, one a subfolder (python -m "
                          "specbook.train --stages pard --pard-dir FOLDER/NAME ...), each compared with the built-in "
                          "one")
    ben.add_argument("--eagle3-vocab", type=_positive_int, default=512,
                     help="--suite eagle3: the reduced draft vocabulary's size, the most frequent tokens of the "
                          "training text (default: %(default)s)")
    ben.add_argument("--repeats", type=_positive_int, default=3)
    ben.add_argument("--passages", type=_positive_int, default=16,
                     help="--suite seq2seq: how many of the held-out passages (default: %(default)s)")
    ben.add_argument("--hf", action=argparse.BooleanOptionalAction, default=True,
                     help="include Hugging Face assisted generation (default: yes)")
    ben.add_argument("--out", help="write the table as CSV")
    ben.add_argument("--json", help="--suite gpu, family, eagle3, trees, seq2seq and batch: write the results file "
                                    "(JSON) here")
    ben.add_argument("--pack", action=argparse.BooleanOptionalAction, default=None,
                     help="pack a CPU target's linear layers once for oneDNN, for every method alike "
                          "(specbook.packed; a packed target keeps Hugging Face's forward); default: load_pair's "
                          "choice, which packs only a target that keeps Hugging Face's forward anyway")
    ben.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False,
                     help="--suite gpu: Inductor's fused kernels inside the GPU path's CUDA graphs (a compilation "
                          "per input length on first use; default: no, the models' own kernels, captured in a "
                          "second)")
    _add_model_options(ben)
    _add_sampling_options(ben)
    cha = commands.add_parser("chat", help="an interactive loop; /help inside lists the commands")
    _add_model_options(cha)
    _add_sampling_options(cha)
    exp = commands.add_parser("export", help="write the pair and its drafters in the folders vLLM and SGLang load")
    exp.add_argument("--out", required=True, help="the folder to write, one subfolder a model")
    exp.add_argument("--pair", default=None, help="built-in pair name, or a folder specbook.train wrote "
                                                  "(default: shakespeare)")
    exp.add_argument("--models", type=lambda text: text.split(","), default=list(SERVED),
                     help=f"which models (default: {','.join(SERVED)})")
    args = parser.parse_args(argv)
    try:
        with torch.inference_mode():
            {"generate": generate, "bench": bench, "chat": chat, "export": export}[args.command](args)
    except ValueError as error:
        parser.exit(2, f"error: {error}\n")


if __name__ == "__main__":
    main()

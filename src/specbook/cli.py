"""The command line: ``python -m specbook generate | bench | chat``.

    python -m specbook generate "ROMEO:\\n" --k 4 --trace
    python -m specbook bench --prompts grounded --ks 1,2,4,6 --out bench.csv
    python -m specbook bench --suite heads --ks 4
    python -m specbook bench --suite gpu --device cuda --dtype bfloat16 --json results/gpu.json
    python -m specbook bench --suite profile --ks 2,4
    python -m specbook bench --suite family --json results/family.json
    python -m specbook generate "To be, or <mask> to be:" --pair shakespeare-seq2seq --trace
    python -m specbook bench --suite seq2seq --ks 2,4,6 --json results/seq2seq.json
    python -m specbook bench --suite batch --batch-sizes 1,2,4,8,16,32 --json results/batch.json
    python -m specbook bench --suite costs --device cuda --ks 8 --repeats 20 --json results/costs.json
    python -m specbook chat

Long because every subcommand's options and each bench suite's few lines of running and printing read
best side by side, one suite after another.
"""

import argparse
import shlex
import sys

import torch

from .batch_bench import batch_suite, report
from .bench import (CATEGORIES, PROMPT_SETS, ablation, comparison, encoder_decoder, family, heads_and_trees, machine,
                    multi_token, run_benchmark)
from .costs import CPU_SCALE, PAIRS, cost_probe
from .costs import report as costs_report
from .decoding import autoregressive_generate, speculative_generate
from .drafters import ModelDrafter
from .gpu import gpu_benchmark, or_none, write_results
from .heads import WITH_HEADS
from .models import assets_dir, load_model, load_pair
from .packed import is_packed
from .profile import copy_bandwidth, step_profile
from .sampling import Sampler
from .spread import show_spreads, spread_of, tie_text
from .viz import render_trace


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
    """The pair the options name; ``--no-pack`` (bench) keeps a CPU target unpacked (`load_pair` packs it)."""
    dtype = getattr(torch, args.dtype) if args.dtype else None
    pack = None if getattr(args, "pack", True) else False
    return load_pair(args.pair, target=args.target, draft=args.draft, device=args.device, dtype=dtype, pack=pack)


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


def _built_in_heads(pair, kinds=("medusa", "eagle")):
    """The heads of ``kinds`` trained on the built-in pair's target: Medusa's, EAGLE's, the exit head."""
    from .heads import EagleHead, ExitHead, MedusaHeads

    classes = {"medusa": MedusaHeads, "eagle": EagleHead, "exit": ExitHead}
    try:
        return [classes[kind].from_pretrained(pair.name, pair.target) for kind in kinds]
    except FileNotFoundError as error:
        raise ValueError(str(error)) from error


def bench(args):
    import pandas as pd

    if args.suite == "costs":  # builds the real pairs' shapes itself: no pair to load
        return _costs_bench(args)
    if args.suite in ("heads", "family") and (args.target or args.draft or args.pair not in (None, *WITH_HEADS)):
        raise ValueError(f"--suite {args.suite} needs a built-in pair (--pair shakespeare, the default): its heads "
                         "were trained on that target's hidden states and fit no other model")
    if args.suite == "seq2seq" and args.pair is None and args.target is None:
        args.pair = "shakespeare-seq2seq"
    pair = _load(args)
    if args.suite == "seq2seq" and not pair.target.config.is_encoder_decoder:
        raise ValueError(f"--suite seq2seq needs an encoder-decoder pair (--pair shakespeare-seq2seq, the default, or "
                         f"a Hugging Face pair); {pair.name} is decoder-only")
    if args.suite == "gpu":
        return _gpu_bench(pair, args)
    packed = is_packed(pair.target)  # by load_pair: the target only, for every method alike (specbook.packed)
    if args.suite == "profile":
        return _profile(pair, args, packed)
    if args.suite == "family":
        return _family_bench(pair, args, packed)
    if args.suite == "seq2seq":
        return _seq2seq_bench(pair, args, packed)
    sampler = Sampler(args.temperature, args.top_k, args.top_p)
    if args.suite == "batch":
        results = batch_suite(pair, args.batch_sizes, args.ks, args.max_new_tokens, args.repeats, sampler, args.seed)
        print(report(results))
        if args.json:
            write_results({**results, "packed_target": packed}, args.json)
        return
    if args.suite == "comparison":
        methods = comparison(pair, sampler, args.max_new_tokens, args.ks, args.hf)
    elif args.suite == "ablation":
        methods = ablation(pair, sampler, args.max_new_tokens, max(args.ks), sweep=args.ks)
    else:
        methods = heads_and_trees(pair, *_built_in_heads(pair), sampler, args.max_new_tokens, max(args.ks))
    frames = []
    for name in (["open", "grounded"] if args.prompts == "both" else [args.prompts]):
        prompts = [pair.encode(text) for text in PROMPT_SETS[name]]
        frame = pd.DataFrame(run_benchmark(methods, prompts, args.repeats, args.seed))
        frames.append(frame.assign(prompts=name))
    table = pd.concat(frames, ignore_index=True).drop(columns="round_seconds").assign(machine=machine(),
                                                                                     packed_target=packed)
    shown = show_spreads(table.drop(columns=["machine", "packed_target"]), ["seconds"], unit=" s", digits=3)
    print(show_spreads(shown, ["speedup"]).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print("seconds and speedup: the median round (the lowest and highest round's)")
    print(f"{machine()}; the target's linear layers {'packed once (specbook.packed)' if packed else 'as loaded'}")
    print(f"bandwidth_gb_s: the target's weights read per second if every token read them once; this machine's "
          f"copy bandwidth is {copy_bandwidth(pair.target.device):.1f} GB/s")
    if args.out:
        table.to_csv(args.out, index=False)
        print(f"written to {args.out}", file=sys.stderr)


def _costs_bench(args):
    """The cost probe (`specbook.costs`): the real pairs of --pairs with random weights, timed on this machine;
    c, v(n) and the predicted speedups printed, and written as JSON with --json."""
    if args.pair or args.target or args.draft:
        raise ValueError("--suite costs builds the real pairs named by --pairs from their shapes (random weights, "
                         "nothing downloaded): drop --pair, --target and --draft")
    device = torch.device(args.device or "cpu")
    scale = args.scale if args.scale is not None else 1 if device.type == "cuda" else CPU_SCALE
    results = cost_probe(args.pairs, scale, max(args.ks), args.repeats, device=device,
                         dtype=getattr(torch, args.dtype) if args.dtype else None, seed=args.seed)
    print(costs_report(results))
    if args.json:
        write_results(results, args.json)
        print(f"written to {args.json}", file=sys.stderr)


def _gpu_bench(pair, args):
    """The GPU benchmark (`specbook.gpu.gpu_benchmark`), greedy and at temperature 1, written as JSON."""
    prompts = [pair.encode(text) for text in PROMPT_SETS["open" if args.prompts == "both" else args.prompts]]
    results = gpu_benchmark(pair, prompts, args.ks, args.max_new_tokens, args.repeats, compile=args.compile,
                            seed=args.seed, hf=args.hf)
    models, settings = results["models"], results["settings"]
    host = models["host_profile"]
    print(f"{results['device']}, {pair.name} in {models['target']['dtype']}: c = {models['c']:.3f}; first runs "
          f"(capture{', compilation' if settings['compile'] else ''}) {settings['warmup_seconds']['greedy']:.1f} s; "
          f"host per call: target {host['target_host_us_per_call']:.0f} us, draft "
          f"{host['draft_host_us_per_call']:.0f} us; {host['syncs_per_step']:.2f} syncs per step")
    for sampling, best in results["best"].items():
        tied = tie_text([f"k={k}" for k in best["tied_ks"]], best["distinguishable"])
        hf = (f", {spread_of(best, 'speedup_vs_hf')} HF assisted at the same k, "
              f"{spread_of(best, 'speedup_vs_fastest_hf')} the fastest HF setting ({best['fastest_hf']})"
              if best["fastest_hf"] else "")
        print(f"{sampling}: best k={best['k']} ({tied}), {spread_of(best, 'speedup_vs_ar')} autoregressive{hf}")
    if args.json:
        write_results(results, args.json)
        print(f"written to {args.json}", file=sys.stderr)


def _family_bench(pair, args, packed):
    """Every method on every kind of text (`specbook.bench.family`, with the built-in GliDe draft and its control),
    greedy and sampled (at --temperature, 1 if it is 0), and multi-token prediction against the MTP model's own
    autoregressive decoding (`specbook.bench.multi_token`); one row per method, category and sampling, written as
    JSON. A greedy row whose tokens differ from its baseline's stops the run: exactness is checked, not assumed."""
    import pandas as pd

    from .models import load_model
    from .mtp import load_mtp

    heads = _built_in_heads(pair, ("medusa", "eagle", "exit"))
    glide = {part.replace("-", "_"): load_model(pair.name, part, pair.target.device, pair.target.dtype)
             for part in ("glide", "glide-control")}
    mtp_target, mtp_heads = load_mtp(pair.name, pair.target)
    samplings = {"greedy": Sampler(0), "sampled": Sampler(args.temperature or 1.0, args.top_k, args.top_p)}
    rows = []
    for sampling, sampler in samplings.items():
        groups = [family(pair, *heads, sampler, args.max_new_tokens, max(args.ks), **glide),
                  multi_token(mtp_target, mtp_heads, sampler, args.max_new_tokens)]  # its own baseline
        for category, methods in ((category, methods) for category in args.categories for methods in groups):
            prompts = [pair.encode(text) for text in CATEGORIES[category]]
            for row in run_benchmark(methods, prompts, args.repeats, args.seed):
                if sampling == "greedy" and not row["same_tokens"]:
                    raise AssertionError(f"{row['method']} changed the greedy output on the {category} prompts")
                kept = ("k", "tokens_per_call", "acceptance_rate", "positions_per_call", "ms_per_token",
                        "draft_calls_per_token")
                rows.append({"method": row["method"], "category": category, "sampling": sampling,
                             "speedup_vs_ar": row["speedup"], "speedup_vs_ar_min": row["speedup_min"],
                             "speedup_vs_ar_max": row["speedup_max"],
                             "same_tokens": row["same_tokens"] if sampling == "greedy" else None,
                             **{key: row[key] for key in kept}})
    table = pd.DataFrame(rows)
    print(table.pivot_table(index="method", columns=["sampling", "category"], values="speedup_vs_ar", sort=False)
          .to_string(float_format=lambda x: f"{x:.2f}"))
    print(f"speedup over autoregressive decoding, {machine()}, the target's linear layers "
          f"{'packed' if packed else 'as loaded'}, {args.max_new_tokens} new tokens, {args.repeats} repeats")
    if args.json:
        results = {"machine": machine(), "packed_target": packed, "max_new_tokens": args.max_new_tokens,
                   "repeats": args.repeats, "sampled_temperature": samplings["sampled"].temperature,
                   "rows": [{key: or_none(value) for key, value in row.items()} for row in rows]}
        write_results(results, args.json)
        print(f"written to {args.json}", file=sys.stderr)


def _seq2seq_bench(pair, args, packed):
    """An encoder-decoder pair (`specbook.bench.encoder_decoder`) on held-out passages to restore, greedy and
    sampled (at --temperature, 1 if it is 0), every method stopping at the end of the text; one row per method
    and sampling, written as JSON. As in the family suite, a greedy row that differs from autoregressive
    decoding stops the run."""
    import json

    import pandas as pd

    built_in = pair.name == "shakespeare-seq2seq"
    own = load_model(pair.name, "draft-own-encoder", pair.target.device, pair.target.dtype) if built_in else pair.draft
    texts = [row["source"] for row in json.loads((assets_dir("shakespeare-seq2seq") / "heldout_passages.json")
                                                 .read_text())[: args.passages]]
    prompts = [pair.encode(text) for text in texts]
    rows = []
    for sampling, sampler in {"greedy": Sampler(0), "sampled": Sampler(args.temperature or 1.0, args.top_k,
                                                                       args.top_p)}.items():
        methods = encoder_decoder(pair, own, sampler, args.max_new_tokens, args.ks, pair.tokenizer.eos_token_id)
        for row in run_benchmark(methods, prompts, args.repeats, args.seed):
            if sampling == "greedy" and not row["same_tokens"]:
                raise AssertionError(f"{row['method']} changed the greedy output")
            rows.append({"method": row["method"], "sampling": sampling, "k": row["k"],
                         "speedup_vs_ar": row["speedup"], "speedup_vs_ar_min": row["speedup_min"],
                         "speedup_vs_ar_max": row["speedup_max"], "same_tokens": row["same_tokens"] if sampling == "greedy"
                         else None, **{key: row[key] for key in ("tokens_per_call", "acceptance_rate", "ms_per_token",
                                                                 "tokens")}})
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"{pair.name}, {len(prompts)} held-out passages, {machine()}, the target's linear layers "
          f"{'packed' if packed else 'as loaded'}, {args.repeats} repeats")
    if args.json:
        write_results({"machine": machine(), "pair": pair.name, "packed_target": packed, "passages": len(prompts),
                       "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
                       "rows": [{key: or_none(value) for key, value in row.items()} for row in rows]}, args.json)
        print(f"written to {args.json}", file=sys.stderr)


def _profile(pair, args, packed):
    """Milliseconds per speculative step, split into parts (`specbook.profile.step_profile`), one row per K."""
    import pandas as pd

    prompts = [pair.encode(text) for text in PROMPT_SETS["open" if args.prompts == "both" else args.prompts]]
    sampler = Sampler(args.temperature, args.top_k, args.top_p)
    rows = []
    for k in args.ks:
        profile = step_profile(pair.target, pair.draft, prompts, k, args.max_new_tokens, sampler, args.seed)
        rows.append({"k": k, **profile["ms_per_step"], "tokens_per_step": profile["tokens_per_step"]})
    print(f"milliseconds per step on {machine()}, the target's linear layers {'packed' if packed else 'as loaded'}")
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda x: f"{x:.3f}"))


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
    ben.add_argument("--suite", choices=["comparison", "ablation", "heads", "gpu", "profile", "family", "seq2seq",
                                         "batch", "costs"],
                     default="comparison",
                     help="comparison: AR, speculative for each K, HF assisted (chapter 4); ablation: model "
                          "drafter, EGAG, NASD, prompt lookup (chapter 5); heads: the model drafter as a chain "
                          "and a tree, Medusa and EAGLE (chapter 6, built-in pair only); gpu: the GPU path "
                          "(static caches, compiled steps) against AR and HF assisted, greedy and sampled, "
                          "written with --json (chapter 4); profile: where a speculative step's time goes, "
                          "for each K (specbook.profile); family: every method of the book on every kind of "
                          "text, greedy and sampled, written with --json (chapter 6, built-in pair only); "
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
    ben.add_argument("--categories", type=lambda text: _choices(text, CATEGORIES), default=list(CATEGORIES),
                     help=f"--suite family: the kinds of text (default: {','.join(CATEGORIES)})")
    ben.add_argument("--ks", type=lambda text: [_positive_int(k) for k in text.split(",")], default=[1, 2, 3, 4, 6],
                     help="draft lengths (default: 1,2,3,4,6; the ablation sweeps the model drafter over them "
                          "and gives the lookup drafters the largest; the heads suite uses the largest)")
    ben.add_argument("--repeats", type=_positive_int, default=3)
    ben.add_argument("--passages", type=_positive_int, default=16,
                     help="--suite seq2seq: how many of the held-out passages (default: %(default)s)")
    ben.add_argument("--hf", action=argparse.BooleanOptionalAction, default=True,
                     help="include Hugging Face assisted generation (default: yes)")
    ben.add_argument("--out", help="write the table as CSV")
    ben.add_argument("--json", help="--suite gpu, family, seq2seq and batch: write the results file (JSON) here")
    ben.add_argument("--pack", action=argparse.BooleanOptionalAction, default=True,
                     help="pack the target's linear layers once for oneDNN, for every method alike, where the "
                          "target is on the CPU (load_pair's default, specbook.packed; --no-pack to compare)")
    ben.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False,
                     help="--suite gpu: Inductor's fused kernels inside the GPU path's CUDA graphs (a compilation "
                          "per input length on first use; default: no, the models' own kernels, captured in a "
                          "second)")
    _add_model_options(ben)
    _add_sampling_options(ben)
    cha = commands.add_parser("chat", help="an interactive loop; /help inside lists the commands")
    _add_model_options(cha)
    _add_sampling_options(cha)
    args = parser.parse_args(argv)
    try:
        with torch.inference_mode():
            {"generate": generate, "bench": bench, "chat": chat}[args.command](args)
    except ValueError as error:
        parser.exit(2, f"error: {error}\n")


if __name__ == "__main__":
    main()

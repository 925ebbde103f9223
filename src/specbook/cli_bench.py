"""The ``bench`` command's suites (`specbook.cli`): each runs its benchmark, prints a table and writes its file.

``python -m specbook bench --suite NAME`` checks its options, loads the pair and hands it to one of these:
`run_table` for the chapters' tables (comparison, ablation, heads: `specbook.suites`), then one function per
suite that records a results file (gpu, family, eagle3, trees, seq2seq, batch, costs) or splits a step's time (profile).
"""

import json
import sys

import torch

from . import graphs
from .ablations import eagle3_heads, pard_variants
from .batch_bench import batch_suite, report
from .bench import ALL_CATEGORIES, PROMPT_SETS, acceptance_by_position, machine, run_benchmark
from .cost_model import benchmark
from .costs import CPU_SCALE, cost_probe
from .costs import report as costs_report
from .decoder import forward_name
from .gpu import gpu_benchmark, or_none, write_results
from .drafters import Eagle3Drafter, EagleDrafter, PardDrafter
from .eagle3 import Eagle3Head
from .heads import EagleHead, ExitHead, MedusaHeads
from .models import assets_dir, load_model
from .packed import is_packed
from .mtp import load_mtp
from .profile import autoregressive_ms, copy_bandwidth, step_profile
from .sampling import Sampler
from .spread import show_spreads, spread_of, tie_text
from .suites import (TREE_SIZES, ablation, comparison, eagle3_rows, encoder_decoder, family, heads_and_trees,
                     multi_token, parallel_drafting, tree_name, tree_sizes)


def target_path(target) -> dict:
    """How the target runs, for tables and results files: its forward, and whether its linear layers are packed."""
    return {"packed_target": is_packed(target), "target_forward": forward_name(target)}


def in_words(path: dict) -> str:
    packed = "packed once (specbook.packed)" if path["packed_target"] else "as loaded"
    return f"the target's forward {path['target_forward']}, its linear layers {packed}"


def _built_in_heads(pair, kinds=("medusa", "eagle")):
    """The heads of ``kinds`` trained on the built-in pair's target: Medusa's, EAGLE's, the exit head."""
    classes = {"medusa": MedusaHeads, "eagle": EagleHead, "exit": ExitHead}
    try:
        return [classes[kind].from_pretrained(pair.name, pair.target) for kind in kinds]
    except FileNotFoundError as error:
        raise ValueError(str(error)) from error


def run_table(pair, args, path):
    """A chapter's table (--suite comparison, ablation or heads) on each prompt set: printed with the spread of its
    rounds, and written as CSV with --out."""
    import pandas as pd

    sampler = Sampler(args.temperature, args.top_k, args.top_p)
    if args.suite == "comparison":
        methods = comparison(pair, sampler, args.max_new_tokens, args.ks, args.hf)
    elif args.suite == "ablation":
        methods = ablation(pair, sampler, args.max_new_tokens, max(args.ks), sweep=args.ks)
    else:
        methods = heads_and_trees(pair, *_built_in_heads(pair), sampler, args.max_new_tokens, max(args.ks))
    frames = []
    for name in (["open", "grounded"] if args.prompts == "both" else [args.prompts]):
        prompts = [pair.encode(text) for text in PROMPT_SETS[name]]
        rows = benchmark(methods, prompts, args.repeats, args.seed, args.max_new_tokens, sampler, cost_prompts=prompts)
        frames.append(pd.DataFrame(rows).assign(prompts=name))
    table = pd.concat(frames, ignore_index=True).drop(columns="round_seconds").assign(machine=machine(), **path)
    shown = show_spreads(table.drop(columns=["machine", *path]), ["seconds"], unit=" s", digits=3)
    print(show_spreads(shown, ["speedup"]).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print("seconds and speedup: the median round (the lowest and highest round's); predicted_ms_per_token: the cost "
          "model's (specbook.cost_model: the target's call on the row's positions, its drafter's calls and the "
          "engine's work, timed in the benchmark's rounds, over its tokens per call); bound_ms_per_token: drafting "
          "and the engine free")
    print(f"{machine()}; {in_words(path)}")
    print(f"bandwidth_gb_s: the target's weights read per second if every token read them once; this machine's "
          f"copy bandwidth is {copy_bandwidth(pair.target.device):.1f} GB/s")
    if args.out:
        table.to_csv(args.out, index=False)
        print(f"written to {args.out}", file=sys.stderr)


def run_batch(pair, args, path):
    """Batched decoding at each --batch-sizes (`specbook.batch_bench.batch_suite`), written as JSON with --json."""
    sampler = Sampler(args.temperature, args.top_k, args.top_p)
    results = batch_suite(pair, args.batch_sizes, args.ks, args.max_new_tokens, args.repeats, sampler, args.seed)
    print(report(results))
    if args.json:
        write_results({**results, **path}, args.json)


def run_costs(args):
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


def run_gpu(pair, args):
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


def _samplings(args) -> dict:
    """The suites' two samplings: greedy, and --temperature (1 if it is 0) with --top-k and --top-p."""
    return {"greedy": Sampler(0), "sampled": Sampler(args.temperature or 1.0, args.top_k, args.top_p)}


def _engine(pair, args) -> dict:
    """The engine's options for every row: with --gpu-path the static cache, its decode calls replayed as graphs (the
    CPU's stand-in for them off a GPU); else the defaults."""
    if not args.gpu_path:
        return {}
    graphs.CAPTURE_ON_CPU = pair.target.device.type != "cuda"
    return dict(cache="static")


def _rows_by_category(pair, args, groups_for, samplings=None) -> list[dict]:
    """Time ``groups_for(sampler)`` -- lists of methods, each with its baseline first -- on every kind of text of
    --categories, under each of ``samplings`` (default: greedy and sampled, `_samplings`): one row per method,
    category and sampling, with the cost model's prediction beside the measured time (`specbook.cost_model.benchmark`:
    its terms timed on the category's first prompt, in the benchmark's rounds). A greedy row whose tokens differ
    from its baseline's stops the run: exactness is checked, not assumed."""
    rows = []
    for sampling, sampler in (samplings or _samplings(args)).items():
        groups = groups_for(sampler)
        for category, methods in ((category, methods) for category in args.categories for methods in groups):
            prompts = [pair.encode(text) for text in ALL_CATEGORIES[category]]
            for row in benchmark(methods, prompts, args.repeats, args.seed, args.max_new_tokens, sampler):
                if sampling == "greedy" and not row["same_tokens"]:
                    raise AssertionError(f"{row['method']} changed the greedy output on the {category} prompts")
                kept = ("k", "tokens_per_call", "acceptance_rate", "positions_per_call", "ms_per_token",
                        "draft_calls_per_token", "predicted_ms_per_token", "bound_ms_per_token")
                rows.append({"method": row["method"], "category": category, "sampling": sampling,
                             "speedup_vs_ar": row["speedup"], "speedup_vs_ar_min": row["speedup_min"],
                             "speedup_vs_ar_max": row["speedup_max"],
                             "same_tokens": row["same_tokens"] if sampling == "greedy" else None,
                             **{key: row[key] for key in kept}})
    return rows


def _print_speedups(rows, args, path) -> None:
    """The speedups of `_rows_by_category`'s rows, a method a row, a sampling and category a column."""
    import pandas as pd

    print(pd.DataFrame(rows).pivot_table(index="method", columns=["sampling", "category"], values="speedup_vs_ar",
                                         sort=False).to_string(float_format=lambda x: f"{x:.2f}"))
    print(f"speedup over autoregressive decoding, {machine()}, {in_words(path)}, "
          f"{args.max_new_tokens} new tokens, {args.repeats} repeats")


def run_family(pair, args, path):
    """Every method on every kind of text (`specbook.suites.family`, with the built-in GliDe draft and its control),
    greedy and sampled (at --temperature, 1 if it is 0), and multi-token prediction against the MTP model's own
    autoregressive decoding (`specbook.suites.multi_token`); one row per method, category and sampling, written as
    JSON. A greedy row whose tokens differ from its baseline's stops the run: exactness is checked, not assumed."""
    heads = _built_in_heads(pair, ("medusa", "eagle", "exit"))
    glide = {part.replace("-", "_"): load_model(pair.name, part, pair.target.device, pair.target.dtype)
             for part in ("glide", "glide-control")}
    mtp_target, mtp_heads = load_mtp(pair.name, pair.target)
    eagle3 = Eagle3Head.from_pretrained(pair.name, pair.target)
    pard = load_model(pair.name, "pard", pair.target.device, pair.target.dtype)
    engine = _engine(pair, args)
    rows = _rows_by_category(pair, args, lambda sampler: [
        family(pair, *heads, sampler, args.max_new_tokens, args.k, **glide, eagle3=eagle3, pard=pard, **engine),
        multi_token(mtp_target, mtp_heads, sampler, args.max_new_tokens, **engine)])  # its own baseline
    _print_speedups(rows, args, path)
    if args.json:
        results = {"machine": machine(), **path, "k": args.k, "gpu_path": args.gpu_path,
                   "max_new_tokens": args.max_new_tokens,
                   "repeats": args.repeats, "sampled_temperature": _samplings(args)["sampled"].temperature,
                   "rows": [{key: or_none(value) for key, value in row.items()} for row in rows]}
        write_results(results, args.json)
        print(f"written to {args.json}", file=sys.stderr)


ALPHA_POSITIONS = 6  # the eagle3 suite measures α at draft positions 1 .. 6


def run_eagle3(pair, args, path):
    """EAGLE against EAGLE-3 (`specbook.suites.eagle3_rows`), greedy and sampled, on every kind of text: the built-in
    heads, the EAGLE-3 variants saved under --eagle3-variants, and the built-in EAGLE-3 with a reduced vocabulary of
    --eagle3-vocab tokens; and α at each of the first `ALPHA_POSITIONS` draft positions of a chain for every head
    (`specbook.bench.acceptance_by_position`) on all the prompts. One row per method, category and sampling, as in
    the family suite, written as JSON."""
    eagle = EagleHead.from_pretrained(pair.name, pair.target)
    heads = eagle3_heads(pair, args.eagle3_variants)
    built_in_name, built_in = next(iter(heads.items()))
    reduced = built_in.with_vocabulary(args.eagle3_vocab)
    prompts = [pair.encode(text) for category in args.categories for text in ALL_CATEGORIES[category]]
    positions = {}
    for sampling, sampler in _samplings(args).items():
        for name, drafter in [("EAGLE", EagleDrafter(pair.target, eagle))] + [
                (name, Eagle3Drafter(pair.target, head)) for name, head in heads.items()] + [
                (f"{built_in_name}, {args.eagle3_vocab}-token draft vocabulary", Eagle3Drafter(pair.target, reduced))]:
            measured = acceptance_by_position(pair.target, drafter, prompts, args.max_new_tokens, ALPHA_POSITIONS,
                                              sampler, args.seed)
            positions.setdefault(name, {})[sampling] = measured
            print(f"{sampling}, {name}: α by position " + " ".join(f"{alpha:.2f}" if alpha is not None else "-"
                                                                for alpha in measured["alpha_by_position"]))
    rows = _rows_by_category(pair, args, lambda sampler: [
        eagle3_rows(pair, eagle, heads, sampler, args.max_new_tokens, args.k, args.eagle3_vocab)])
    _print_speedups(rows, args, path)
    if args.json:
        training = {name: {"feature_layers": list(head.feature_layers), "ttt_steps": head.ttt_steps,
                           "draft_vocab": len(head.vocab)} for name, head in heads.items()}
        results = {"machine": machine(), **path, "k": args.k, "max_new_tokens": args.max_new_tokens,
                   "repeats": args.repeats, "sampled_temperature": _samplings(args)["sampled"].temperature,
                   "heads": training, "alpha_by_position": positions,
                   "rows": [{key: or_none(value) for key, value in row.items()} for row in rows]}
        write_results(results, args.json)
        print(f"written to {args.json}", file=sys.stderr)


def run_pard(pair, args, path):
    """The draft model against its PARD adaptation (`specbook.suites.parallel_drafting`), greedy and sampled, on every
    kind of text of --categories (verse of plays the pair never trained on included); α at each draft position of
    both, on all the prompts, the draft model at K = 6 and PARD at its largest trained K, and of each draft trained
    otherwise (`pard_variants`, with those saved under --pard-variants); written as JSON."""
    pard = load_model(pair.name, "pard", pair.target.device, pair.target.dtype)
    trained = pard_variants(pair, args.pard_variants)
    variants = {name: model for name, (model, _) in trained.items()}
    engine = _engine(pair, args)
    prompts = [pair.encode(text) for category in args.categories for text in ALL_CATEGORIES[category]]
    positions = {}
    for sampling, sampler in _samplings(args).items():
        for name, drafter, k in (("draft model", pair.draft, ALPHA_POSITIONS),
                                 ("PARD", PardDrafter(pard), pard.config.pard_max_k),
                                 *[(name, PardDrafter(model), model.config.pard_max_k)
                                   for name, model in variants.items()]):
            measured = acceptance_by_position(pair.target, drafter, prompts, args.max_new_tokens, k, sampler, args.seed)
            positions.setdefault(name, {})[sampling] = measured
            print(f"{sampling}, {name}: α by position " + " ".join(f"{alpha:.2f}" if alpha is not None else "-"
                                                                for alpha in measured["alpha_by_position"]))
    rows = _rows_by_category(pair, args, lambda sampler: [
        parallel_drafting(pair, pard, sampler, args.max_new_tokens, variants=variants, **engine)])
    _print_speedups(rows, args, path)
    if args.json:
        training = {"PARD": json.loads((assets_dir(pair.name) / "pard" / "training.json").read_text()),
                    **{name: meta for name, (_, meta) in trained.items()}}
        models = {"PARD": pard, **variants}
        results = {"machine": machine(), **path, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
                   "sampled_temperature": _samplings(args)["sampled"].temperature, "categories": args.categories,
                   "training": {part: {**{key: meta.get(key) for key in ("mask_token", "depths", "cod",
                                                                          "greedy_windows", "corpus_windows",
                                                                          "reached", "seconds", "step")},
                                       "layers": models[part].config.num_hidden_layers}
                                for part, meta in training.items()},
                   "alpha_by_position": positions,
                   "rows": [{key: or_none(value) for key, value in row.items()} for row in rows]}
        write_results(results, args.json)
        print(f"written to {args.json}", file=sys.stderr)


def run_trees(pair, args, path):
    """Tokens per call and time per step against the tree's size (`specbook.suites.tree_sizes`), greedy, on every
    kind of text of --categories, on --gpu-path or not: the family suite's rows (`_rows_by_category`), each with
    its tree's size (None for the chain and the baseline) and milliseconds per step, written as JSON."""
    import pandas as pd

    engine = _engine(pair, args)
    measured = _rows_by_category(pair, args, lambda sampler: [tree_sizes(pair, sampler, args.max_new_tokens, **engine)],
                                 {"greedy": Sampler(0)})
    sizes = {tree_name(nodes): nodes for nodes in TREE_SIZES}
    rows = [{**row, "tree_nodes": sizes.get(row["method"]), "ms_per_step": row["ms_per_token"] * row["tokens_per_call"]}
            for row in measured]
    print(pd.DataFrame(rows).pivot_table(index="method", columns="category", values=["tokens_per_call",
                                                                                    "ms_per_step"], sort=False)
          .to_string(float_format=lambda x: f"{x:.2f}"))
    print(f"greedy, {machine()}, {in_words(path)}, {args.max_new_tokens} new tokens, {args.repeats} repeats"
          + (", the GPU path" if args.gpu_path else ""))
    if args.json:
        write_results({"machine": machine(), **path, "gpu_path": args.gpu_path, "max_new_tokens": args.max_new_tokens,
                       "repeats": args.repeats, "rows": [{key: or_none(value) for key, value in row.items()}
                                                         for row in rows]}, args.json)
        print(f"written to {args.json}", file=sys.stderr)


def run_seq2seq(pair, args, path):
    """An encoder-decoder pair (`specbook.suites.encoder_decoder`) on held-out passages to restore, greedy and
    sampled (at --temperature, 1 if it is 0), every method stopping at the end of the text; one row per method
    and sampling, written as JSON. As in the family suite, a greedy row that differs from autoregressive
    decoding stops the run."""

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
    print(f"{pair.name}, {len(prompts)} held-out passages, {machine()}, {in_words(path)}, "
          f"{args.repeats} repeats")
    if args.json:
        write_results({"machine": machine(), "pair": pair.name, **path, "passages": len(prompts),
                       "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
                       "rows": [{key: or_none(value) for key, value in row.items()} for row in rows]}, args.json)
        print(f"written to {args.json}", file=sys.stderr)


def run_profile(pair, args, path):
    """Milliseconds per speculative step, split into parts (`specbook.profile.step_profile`), one row per K."""
    import pandas as pd

    prompts = [pair.encode(text) for text in PROMPT_SETS["open" if args.prompts == "both" else args.prompts]]
    sampler = Sampler(args.temperature, args.top_k, args.top_p)
    rows, baseline = [], autoregressive_ms(pair.target, prompts, args.max_new_tokens, sampler, args.seed)
    for k in args.ks:
        profile = step_profile(pair.target, pair.draft, prompts, k, args.max_new_tokens, sampler, args.seed)
        rows.append({"k": k, **profile["ms_per_step"], "tokens_per_step": profile["tokens_per_step"],
                     "at_most": profile["tokens_per_step"] * baseline / profile["ms_per_step"]["target call"]})
    print(f"milliseconds per step on {machine()}, {in_words(path)}")
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"at_most: the speedup over autoregressive decoding ({baseline:.3f} ms a token) were drafting and the engine "
          "free, tokens per step times that over the target call")

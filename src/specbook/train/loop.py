"""The training loop: batches (with copied passages and repeated sequences), the learning-rate
schedule, the loss (cross entropy, or KL to a teacher), evaluation, resumable checkpoints, and
the copy losses that tell a model that quotes its context from one that does not."""

import math
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm


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


def _kl_rows(teacher_logp, student_logits):
    """KL(q || p) at each position (the last dimension summed): q the teacher (target), p the student (draft)."""
    student_logp = student_logits.log_softmax(-1)
    return (teacher_logp.exp() * (teacher_logp - student_logp)).sum(-1)


def _kl(teacher_logp, student_logits):
    """KL(q || p) per position, averaged (`_kl_rows`)."""
    return _kl_rows(teacher_logp, student_logits).mean()


def _language_model_loss(model, teacher, inputs, targets):
    """Next-token cross entropy, or KL(q || p) to ``teacher``'s distributions when given."""
    logits = model(inputs).logits.float()
    if teacher is None:
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    with torch.no_grad():
        teacher_logp = teacher(inputs).logits.float().log_softmax(-1)
    return _kl(teacher_logp, logits)


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


def train_model(model, train_tokens, valid_tokens, config, ckpt_dir, device, teacher=None, desc="train",
                loss_fn=None, evaluate_fn=None, data=None):
    """Train ``model`` (cross entropy, or KL to ``teacher`` when given), resuming from ``ckpt_dir``.

    A model that is not a language model (a head) brings its own ``loss_fn(inputs, targets)`` and
    ``evaluate_fn()`` (a dict of held-out metrics); one trained on other examples than windows of
    ``train_tokens`` (an encoder-decoder model) brings ``data(generator)``, its endless batches.
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
    data = (data or partial(batches, train_tokens, config))(generator)
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

"""Medusa, EAGLE and exit heads trained on the frozen target (`specbook.heads`): their losses, and saving."""

import json
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from ..heads import eagle_predictions, exit_predictions, head_accuracy, medusa_predictions
from .loop import _kl, train_model


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


def exit_loss(head, target, inputs, targets):
    """KL(q || p) from the target's next-token distribution q to the early exit's p, at every position.

    Distillation, as Kangaroo trains its adapter on the full model's distribution (Liu et al. 2024)
    and as the built-in draft model was trained: a draft is accepted for agreeing with q, not with
    the text, and q's whole distribution says more per position than the one token of the text. No
    cross-entropy term on the text: where the text and q disagree it would pull p away from q, and
    α = 1 - TV(p, q) rewards only closeness to q. ``targets`` is unused: the labels are the target's.
    """
    exit_logits, target_logits = exit_predictions(head, target, inputs)  # (batch, block, vocab) each
    return _kl(target_logits.float().log_softmax(-1), exit_logits.float())


def save_head(head, out_dir, meta):
    """Save a head in float16 (`specbook.heads`: config.json, model.safetensors) with its training.json."""
    head.save(out_dir)
    (Path(out_dir) / "training.json").write_text(json.dumps(meta, indent=2))


def train_head(head, loss, target, train_tokens, valid_tokens, config, ckpt_dir, device, desc):
    """Train ``head`` with ``loss(head, target, inputs, targets)``; held-out metrics are `head_accuracy`'s."""
    return train_model(head, train_tokens, valid_tokens, config, ckpt_dir, device, desc=desc,
                       loss_fn=partial(loss, head, target),
                       evaluate_fn=partial(head_accuracy, target, head, valid_tokens, config.block_size, 16))

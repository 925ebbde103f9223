"""Medusa, EAGLE and exit heads trained on the frozen target (`specbook.heads`), and multi-token prediction's heads
trained with the target's top layers (`specbook.mtp`): their losses, and saving."""

import json
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from ..eagle3 import TTT_STEPS, ttt_predictions
from ..heads import eagle_predictions, exit_predictions, head_accuracy, medusa_predictions
from ..mtp import mtp_model, mtp_predictions
from .loop import _kl, evaluate, train_model


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


def eagle3_loss(head, target, inputs, targets, steps=TTT_STEPS, decay=0.8):
    """EAGLE-3's loss (Li et al. 2025, Section 3.3): over the training-time test's ``steps`` unrolled steps,
    sum of decay^j x CrossEntropy(q, p̂_j), step j's draft distribution against the target's q over the same
    token. No feature regression: nothing pulls the head's outputs to the target's features. The weights 0.8^j
    are the paper's code's. A head with a reduced vocabulary V is trained on it as the paper's code trains one:
    q renormalised over V, and the loss kept only where the target's own argmax lies in V (where it does not, no
    draft from V can match the target's greedy choice, and q over V says little).
    """
    window = torch.cat([inputs, targets[:, -1:]], 1)  # (batch, block + 1)
    in_vocab = torch.zeros(head.target_vocab, dtype=torch.bool, device=inputs.device)
    in_vocab[head.vocab] = True
    loss = 0.0
    for step, (outputs, target_logits) in enumerate(ttt_predictions(head, target, window, steps)):
        draft_logp = head.lm_head(outputs).float().log_softmax(-1)  # (batch, block - step, draft vocab)
        q = target_logits[..., head.vocab].softmax(-1)  # (batch, block - step, draft vocab): q over V
        kept = in_vocab[target_logits.argmax(-1)].float()  # (batch, block - step): the target's argmax in V
        cross_entropy = -(q * draft_logp).sum(-1)  # (batch, block - step)
        loss = loss + decay ** step * (cross_entropy * kept).sum() / kept.sum().clamp(min=1)
    return loss


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


def mtp_loss(heads, model, inputs, targets):
    """The multi-token loss (Gloeckle et al. 2024, Section 2, Eq. 2): Σ_i CE(x_{t+i}), i = 1 .. n, unweighted.

    ``model`` is the MTP model (`specbook.mtp.mtp_model`): its LM head scores x_{t+1} -- the
    ordinary next-token loss -- and ``heads``' block i - 2 scores x_{t+i}. The trainable top layers
    of the model's trunk learn from every term, the heads each from their own.
    """
    window = torch.cat([inputs, targets[:, -1:]], 1)  # (batch, block + 1): the whole text window
    return sum(F.cross_entropy(logits.flatten(0, 1), labels.flatten())
               for logits, labels in mtp_predictions(model, heads, window))


def train_mtp(mtp, target, train_tokens, valid_tokens, config, ckpt_dir, device, desc="mtp"):
    """Fine-tune ``mtp`` (`specbook.mtp.MultiTokenHeads`: top layers, norm, heads) on ``target`` with `mtp_loss`.

    Only ``mtp``'s parameters train and are checkpointed; the target's are shared and frozen. The
    held-out metrics are the MTP model's next-token ``loss`` and its heads' `head_accuracy`.
    """
    model = mtp_model(target, mtp)

    def held_out():
        return {**evaluate(model, valid_tokens, config, device),
                **head_accuracy(model, mtp.heads, valid_tokens, config.block_size, 16)}
    return train_model(mtp, train_tokens, valid_tokens, config, ckpt_dir, device, desc=desc,
                       loss_fn=partial(mtp_loss, mtp.heads, model), evaluate_fn=held_out)


def compare_mtp(target, mtp, valid_tokens, config, device, medusa=None, prompts=()):
    """The MTP model against the original ``target``, on the same held-out windows and ``prompts``.

    ``next_token_loss``: each model's next-token cross entropy (`evaluate`); Gloeckle et al. find
    multi-token training hurts small models (Section 3.1, Fig. 3). ``top1``: per head, token t + 2
    first, the teacher-forced top-1 accuracy (`head_accuracy`) of the MTP heads on the MTP model and
    of ``medusa``, heads trained on the frozen target, on it. ``tokens_per_call``: greedy drafts of
    depth n - 1, chain and tree, the MTP model drafting for itself and Medusa for the target.
    """
    from ..bench import acceptance
    from ..drafters.medusa import DEFAULT_TREE, MedusaDrafter

    model = mtp_model(target, mtp)
    report = {"next_token_loss": {"target": evaluate(target, valid_tokens, config, device)["loss"],
                                  "mtp": evaluate(model, valid_tokens, config, device)["loss"]},
              "top1": {}, "tokens_per_call": {}}
    depth = mtp.heads.num_heads
    for name, verifier, heads in [("mtp", model, mtp.heads)] + ([("medusa", target, medusa)] if medusa else []):
        report["top1"][name] = head_accuracy(verifier, heads, valid_tokens, config.block_size)["top1"]
        for shape, tree in (("chain", None), ("tree", DEFAULT_TREE)) if prompts else ():
            drafter = MedusaDrafter(verifier, heads, tree)  # the tree cut to depth n - 1 by k
            report["tokens_per_call"][f"{name}_{shape}"] = acceptance(verifier, drafter, prompts,
                                                                      k=depth)["tokens_per_step"]
    return report

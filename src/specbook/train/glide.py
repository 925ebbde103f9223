"""The ``glide`` stage: a GliDe draft (`specbook.glide`) and its control, trained on the frozen built-in target.

GliDe is trained with the target frozen, on the target's keys and values of each training window, under
the block-lag mask: a query in block b (blocks of ``block`` positions, 5 in the paper) sees the target's
keys of earlier blocks only, as at inference the target's cache stops at the last verification (Du et
al. 2024). The loss is the one the built-in draft was trained with, KL(q || p) to the
target's distribution at every position (`specbook.train.loop`), so that the comparison is fair.

The fair comparison (the study notes' control): both models start from the built-in draft, GliDe with
its cross-attention added with a zero output projection (so it starts as exactly that draft), and both
are fine-tuned with the same data, steps, seed and schedule; the control is the same draft without the
cross-attention. Whatever GliDe gains over its control comes from reading the target's cache.
"""

import json
from dataclasses import asdict
from functools import partial
from pathlib import Path

import torch
from torch import nn

from ..bench import acceptance
from ..drafters import CaPE, GlideDrafter
from ..glide import GlideForCausalLM, TargetContext, block_lag_limits
from .loop import _kl, evaluate, train_model
from .models import load_trained, save_model


@torch.no_grad()
def target_context(target, layers: list[int], block: int, inputs: torch.Tensor):
    """The frozen target on training windows ``inputs`` (batch, n): its log q (batch, n, vocab) and what GliDe
    reads, the keys and values of its ``layers`` with the block-lag limits of ``block`` positions."""
    outputs = target(inputs, use_cache=True)
    cached = [outputs.past_key_values.layers[index] for index in layers]
    context = TargetContext([layer.keys for layer in cached], [layer.values for layer in cached],  # (batch, kv, n, d)
                            block_lag_limits(inputs.shape[1], block, inputs.device))
    return outputs.logits.float().log_softmax(-1), context


def glide_loss(glide, read, inputs, targets):
    """KL(q || p) at every position of the windows, GliDe reading the target under the block-lag mask."""
    teacher_logp, context = read(inputs)
    return _kl(teacher_logp, glide(inputs, target_context=context).logits.float())


class _WithTarget(nn.Module):
    """GliDe called like a plain causal LM on training windows, for `specbook.train.loop.evaluate`."""

    def __init__(self, glide, read):
        super().__init__()
        self.glide, self.read = glide, read  # ``read`` is no module: evaluation switches only GliDe's mode

    def forward(self, input_ids):
        return self.glide(input_ids, target_context=self.read(input_ids)[1])


def heldout_acceptance(target, drafters: dict, tokenizer, texts: list[str], k: int, new_tokens: int = 64) -> dict:
    """Greedy tokens per target call and acceptance rate of each drafter on the held-out prompts ``texts``."""
    prompts = [tokenizer(text, return_tensors="pt").input_ids.to(target.device) for text in texts]
    return {name: acceptance(target, drafter, prompts, new_tokens, k) for name, drafter in drafters.items()}


def train_glide(target, draft_dir, train_tokens, valid_tokens, config, block, work, out, device, meta, tokenizer, k=4):
    """Fine-tune GliDe and its control from the draft in ``draft_dir`` with ``config``; save both under ``out``
    (``glide``, ``glide-control``) with their training.json, held-out losses and greedy acceptance."""
    states = {}
    for name in ("glide", "glide-control"):
        draft = load_trained(draft_dir, device)
        if name == "glide":
            torch.manual_seed(config.seed)  # the cross-attention's query projection
            model = GlideForCausalLM.from_draft(draft, target)
            read = partial(target_context, target, model.target_layers, block)
            evaluated = _WithTarget(model, read)
            options = dict(loss_fn=partial(glide_loss, model, read),
                           evaluate_fn=partial(evaluate, evaluated, valid_tokens, config, device, target))
        else:
            model, options = draft, dict(teacher=target)
        state = train_model(model.requires_grad_(True), train_tokens, valid_tokens, config, work / f"ckpt-{name}",
                            device, desc=name, **options)
        states[name] = {"config": asdict(config), "block": block, "init": str(draft_dir), **meta, **state,
                        "final": state["log"][-1]}
        save_model(model, out / name, states[name])
    glide, control = (load_trained(out / name, device) for name in states)
    started = Path(draft_dir).name  # the draft both were fine-tuned from
    heldout = heldout_acceptance(target, {"glide": GlideDrafter(glide), "glide+cape": GlideDrafter(glide, CaPE()),
                                          "glide-control": control, started: load_trained(draft_dir, device)},
                                 tokenizer, json.loads((out / "heldout_prompts.json").read_text()), k)
    for name, state in states.items():
        state["heldout_greedy"] = {"k": k, "new_tokens": 64, **heldout}
        (out / name / "training.json").write_text(json.dumps(state, indent=2))
    return heldout

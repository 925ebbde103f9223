"""Multi-token prediction, trained jointly, as a self-speculative drafter (Gloeckle et al. 2024, arXiv 2404.19737).

Gloeckle et al. put n output heads on one shared trunk f_s, with one shared unembedding f_u:
P(x_{t+i} | x_{1:t}) = softmax(f_u(f_{h_i}(f_s(x_{1:t})))), i = 1 .. n (Section 2). Head 1 is the
model's own next-token prediction; the trunk and all the heads are trained together on the sum of
the n cross entropies, L_n = -Σ_t Σ_i log P(x_{t+i} | x_{1:t}) (Section 2, Eq. 2). At inference
head 1 decodes as usual and heads 2 .. n draft the next tokens for it to verify: self-speculative
decoding (Section 3.2, Appendix A), blockwise parallel decoding's recipe (Stern et al. 2018).

Here the built-in target is *fine-tuned* under that loss, as Section 3.6 and Appendix D fine-tune
next-token models: `MultiTokenHeads` holds the n - 1 extra heads -- Medusa-shaped (`MedusaHeads`:
head j, 0-based, on f_t predicts x_{t+j+2}; the paper's heads are transformer layers) -- and the
target's top layers and final norm, the part of the trunk that is trained with them; the
embedding, the tied LM head and the lower layers stay frozen. `mtp_model` assembles the jointly
trained model, and `load_mtp` loads the built-in one. The heads draft with
``MedusaDrafter(mtp_target, heads)`` (chain or tree). Joint training changes the target: greedy
speculative output equals the *MTP model's* autoregressive output, not the original target's.
"""

import copy

import torch
from torch import nn

from .heads import MedusaHeads, _Head, assembled, decoder_parts, final_norm
from .models import target_features
from .packed import PackedLinear, is_packed, pack_linears

MAX_TOKENS = 4  # n at most: n = 4 did best among the paper's token-level models (Section 3.4)


def _check_range(name, value, low, high, why):
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}]: {why} (got {value!r})")


def _plain_copy(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` whose `PackedLinear` layers (packed weights cannot be copied) are ``nn.Linear``."""
    packed = [child for child in module.modules() if isinstance(child, PackedLinear)]
    copied = copy.deepcopy(module, {id(child.packed): None for child in packed})
    for parent in list(copied.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, PackedLinear):
                linear = nn.Linear(child.in_features, child.out_features, child.bias is not None, device="meta")
                linear.weight, linear.bias = child.weight, child.bias
                setattr(parent, name, linear)
    return copied


class MultiTokenHeads(_Head):
    """What multi-token fine-tuning adds to a target: its top ``layers``, final ``norm`` and n - 1 ``heads``.

    ``num_tokens`` is the paper's n, the tokens predicted at every position, the next one included;
    ``layers`` is a `nn.ModuleList` of the trunk's top decoder layers, fine-tuned, in place of the
    target's (of ``target_layers`` in all). Saved, it is those layers, the norm and the heads
    (float16, ``config.json`` and ``model.safetensors`` as every head); the rest is the target's.
    """

    kind = "mtp"

    def __init__(self, layers: nn.ModuleList, norm: nn.Module, heads: MedusaHeads, target_layers: int):
        super().__init__()
        self.layers, self.norm, self.heads, self.target_layers = layers, norm, heads, target_layers
        self.hidden_size = heads.hidden_size

    @property
    def num_tokens(self) -> int:
        return self.heads.num_heads + 1

    @classmethod
    def for_target(cls, target, num_tokens: int = MAX_TOKENS, layers: int = 2) -> "MultiTokenHeads":
        """Untrained: copies of ``target``'s top ``layers`` layers and final norm, and n - 1 fresh Medusa heads.

        A fresh head is the target's next-token prediction (`MedusaHeads` starts at zero), so the
        untrained MTP model is the target itself. Everything returned is trainable.
        """
        depth = target.config.num_hidden_layers
        _check_range("num_tokens", num_tokens, 2, MAX_TOKENS, f"the next token and 1 to {MAX_TOKENS - 1} more")
        _check_range("layers", layers, 1, depth, f"the target's top layers to fine-tune, of its {depth}")
        head = cls._from_config({"hidden_size": target.config.hidden_size, "num_tokens": num_tokens,
                                 "layers": layers, "target_layers": depth}, target)
        head.heads.to(target.device, target.dtype)
        return head.requires_grad_(True)

    def check_target(self, target) -> None:
        """Refuse a ``target`` of another width, depth or final norm than the one this was trained on."""
        super().check_target(target)
        if target.config.num_hidden_layers != self.target_layers or type(self.norm) is not type(final_norm(target)):
            raise ValueError(f"these MTP layers were trained on a target of {self.target_layers} layers ending in a "
                             f"{type(self.norm).__name__}; this one has {target.config.num_hidden_layers} ending in a "
                             f"{type(final_norm(target)).__name__}: a head only fits the target it was trained on")

    def _config(self):
        return {"hidden_size": self.hidden_size, "num_tokens": self.num_tokens, "layers": len(self.layers),
                "target_layers": self.target_layers}

    @classmethod
    def _from_config(cls, config, target):
        top = getattr(target.get_decoder(), decoder_parts(target)[0])[-config["layers"]:]
        return cls(_plain_copy(top), _plain_copy(final_norm(target)),
                   MedusaHeads(config["hidden_size"], config["num_tokens"] - 1), config["target_layers"])

    @classmethod
    def from_pretrained(cls, name_or_path, target):
        """Load for ``target`` (see `_Head.from_pretrained`); a packed target gets its layers packed too."""
        head = super().from_pretrained(name_or_path, target)
        if is_packed(target):
            pack_linears(head.layers)
        return head


def mtp_model(target, mtp: MultiTokenHeads):
    """The jointly trained model: ``target`` with ``mtp``'s top layers and final norm in place of its own.

    A causal LM of the target's class handed modules (`specbook.heads.assembled`, as the early exit is): the
    target's embedding, lower layers and LM head, shared, not copied, and ``mtp``'s layers and norm. The
    target itself is not modified.
    """
    mtp.check_target(target)
    lower = getattr(target.get_decoder(), decoder_parts(target)[0])[: mtp.target_layers - len(mtp.layers)]
    return assembled(target, [*lower, *mtp.layers], mtp.norm, target.get_output_embeddings(),
                     f"assemble an MTP model from {type(target).__name__}")


def load_mtp(name_or_path, target) -> tuple[nn.Module, MedusaHeads]:
    """The MTP model and its n - 1 drafting heads: ``"shakespeare"`` (the built-in target's) or a saved directory.

    Pass the built-in target, e.g. ``load_pair("shakespeare").target``; it is left as it was.
    Draft with ``MedusaDrafter(mtp_target, heads, tree=None)`` (a chain) or a tree, and verify with
    ``mtp_target``: the output is the MTP model's own, not ``target``'s.
    """
    mtp = MultiTokenHeads.from_pretrained(name_or_path, target)
    return mtp_model(target, mtp), mtp.heads


def mtp_predictions(model, heads: MedusaHeads, input_ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per head i = 1 .. n, its logits at every position with a label (batch, n_pos - i, vocab) and the labels.

    ``input_ids`` (batch, n_pos) is real text. Head 1 is ``model``'s LM head, scored on
    input_ids[:, t + 1]; head i >= 2 is ``heads``' block i - 2, scored on input_ids[:, t + i].
    Gradients reach the model's trainable layers: the trunk learns with the heads.
    """
    features = target_features(model, input_ids)  # (batch, n_pos, hidden)
    lm_head = model.get_output_embeddings()
    logits = torch.cat([lm_head(features)[:, :, None], heads(features, lm_head)], 2).float()  # (batch, n_pos, n, vocab)
    length = input_ids.shape[1]
    return [(logits[:, : length - i, i - 1], input_ids[:, i:]) for i in range(1, heads.num_heads + 2)]


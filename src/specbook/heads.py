"""Heads that draft from the target's own hidden states: Medusa, EAGLE and an early exit.

Both read the target's *features*: its final hidden states after the final norm, the input of its
LM head (`specbook.models.target_features`). Neither has an embedding or an LM head of its own: they borrow the
target's, frozen, and store only what they add.

- `MedusaHeads` (Cai et al. 2024, Section 2.1.1): K residual blocks on the feature f_t of the last
  committed position. The target's LM head turns f_t into its distribution over x_{t+1}; head i
  (0-based) turns it into a guess at x_{t+i+2}, so one feature yields K drafts at once, each
  blind to the ones before it.
- `EagleHead` (Li et al. 2024, Section 4): one transformer layer that runs autoregressively at the
  feature level. Its input at position t is the pair (f_t, embedding of x_{t+1}) -- the token
  advanced by one step removes the uncertainty of which token the target sampled -- and its output
  is a prediction f̂_{t+1} of the next feature; the target's LM head turns f̂_{t+1} into the draft
  distribution p over x_{t+2}. Feeding (f̂_{t+1}, x_{t+2}) back drafts the next token, and so on.

A third head reads the target *halfway*, for self-speculative decoding, where the draft is the
target itself cut short (LayerSkip, Elhoushi et al. 2024; Draft & Verify, Zhang et al. 2024;
Kangaroo, Liu et al. 2024):

- `ExitHead`: a final norm and an LM head of its own, read after the target's first L layers
  (``exit_layer``). `early_exit_model` builds the draft: the target's embedding and first L layers,
  shared, finished by the head. Draft & Verify skips layers without training anything; LayerSkip
  trains the whole model to exit early; Kangaroo also freezes the target, but trains an adapter (a
  transformer layer) on its shallow layers and reuses the target's LM head, where this head trains
  a final norm and an LM head of its own.

The drafters that use them live in `specbook.drafters.medusa`, `specbook.drafters.eagle` and
`specbook.drafters.early_exit`; the training recipes in `specbook.train`. A head saves to a
directory: ``config.json`` and ``model.safetensors`` (float16), with the built-in ones under
``specbook/assets/shakespeare``.
"""

import copy
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from .decoder import cache_and_forward, forward_over
from .models import assets_dir, target_features

WITH_HEADS = ("shakespeare",)  # the built-in pairs whose target has trained heads


def check_hidden_size(head, target) -> None:
    """Refuse a head built for another target: its hidden size must be the target's."""
    if head.hidden_size != target.config.hidden_size:
        raise ValueError(f"the {head.kind} head has hidden size {head.hidden_size} but the target's hidden size is "
                         f"{target.config.hidden_size}: a head only fits the target it was trained on")


class _Head(nn.Module):
    """Saving and loading, shared by the heads: ``config.json`` (what `_config` returns) and the weights."""

    kind = ""  # "medusa", "eagle" or "exit": the folder of the built-in head

    def _config(self) -> dict:
        raise NotImplementedError

    @classmethod
    def _from_config(cls, config: dict, target) -> "_Head":
        raise NotImplementedError

    def check_target(self, target) -> None:
        """Refuse a ``target`` this head was not built for."""
        check_hidden_size(self, target)

    def save(self, directory, dtype=torch.float16) -> None:
        """Write ``config.json`` and ``model.safetensors`` (in ``dtype``) to ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps({"kind": self.kind, **self._config()}, indent=2))
        save_file({name: tensor.detach().to("cpu", dtype).contiguous() for name, tensor in self.state_dict().items()},
                  directory / "model.safetensors")

    @classmethod
    def from_pretrained(cls, name_or_path, target):
        """Load a head for ``target``: a built-in name (``"shakespeare"``) or a directory written by `save`.

        The head comes back in eval mode, on the target's device and in its dtype.
        """
        if name_or_path in WITH_HEADS:
            directory = assets_dir(name_or_path) / cls.kind
            if not (directory / "config.json").exists():
                raise FileNotFoundError(f"the built-in {cls.kind} head is not in this copy of specbook ({directory}): "
                                        f"train it with `python -m specbook.train --stages {cls.kind}`")
        else:
            directory = Path(name_or_path)
            if not (directory / "config.json").is_file():
                raise ValueError(f"name_or_path must be a built-in name {list(WITH_HEADS)} or a directory holding "
                                 f"config.json and model.safetensors (got {str(name_or_path)!r})")
        config = json.loads((directory / "config.json").read_text())
        if config.pop("kind") != cls.kind:
            raise ValueError(f"{directory} holds no {cls.kind} head")
        head = cls._from_config(config, target)
        head.check_target(target)
        head.load_state_dict(load_file(directory / "model.safetensors"))
        return head.to(target.device, target.dtype).eval()


class MedusaHeads(_Head):
    """``num_heads`` Medusa heads: head i maps a feature f_t to logits over x_{t+i+2} (Cai et al. 2024, Eq. 1).

    Head i is the residual block h = f + SiLU(W_i f + b_i) followed by the target's LM head. W_i and
    b_i start at zero, so a fresh head is the target's own next-token prediction, the start Medusa
    trains from. Medusa-1 gives every head its own copy of the LM head; here the target's is shared
    and frozen -- `forward` takes it as an argument -- which saves a vocab x hidden matrix per head
    and keeps the heads a few hundred kB.
    """

    kind = "medusa"

    def __init__(self, hidden_size: int, num_heads: int):
        super().__init__()
        if not isinstance(num_heads, int) or isinstance(num_heads, bool) or num_heads < 1:
            raise ValueError(f"num_heads must be an integer >= 1 (got {num_heads!r})")
        self.hidden_size = hidden_size
        self.blocks = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(num_heads))
        for block in self.blocks:
            nn.init.zeros_(block.weight)
            nn.init.zeros_(block.bias)

    @property
    def num_heads(self) -> int:
        return len(self.blocks)

    def forward(self, features: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """Features (..., hidden) -> logits (..., num_heads, vocab); row i is head i's."""
        hidden = torch.stack([features + F.silu(block(features)) for block in self.blocks], -2)  # (..., heads, hidden)
        return lm_head(hidden)

    def _config(self):
        return {"hidden_size": self.hidden_size, "num_heads": self.num_heads}

    @classmethod
    def _from_config(cls, config, target):
        return cls(config["hidden_size"], config["num_heads"])

    @classmethod
    def from_pretrained(cls, name_or_path, target, num_heads: int | None = None):
        """Load trained heads for ``target`` (see `_Head.from_pretrained`); ``num_heads`` keeps the first few."""
        heads = super().from_pretrained(name_or_path, target)
        if num_heads is not None:
            if not isinstance(num_heads, int) or isinstance(num_heads, bool) or not 1 <= num_heads <= heads.num_heads:
                raise ValueError(f"num_heads must be in [1, {heads.num_heads}]: {heads.num_heads} heads were trained "
                                 f"(got {num_heads!r})")
            del heads.blocks[num_heads:]
        return heads


# The settings an EAGLE layer copies from its target's config: the layer has the target's width.
LAYER_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                 "hidden_act", "rms_norm_eps", "max_position_embeddings", "rope_parameters")


class EagleHead(_Head):
    """EAGLE's autoregression head (Li et al. 2024, Section 4): fc on (f_t, e(x_{t+1})), then one decoder layer.

    ``config`` is the target's config (Llama-style). The layer is a `transformers` `LlamaModel` with
    one layer, shaped like one of the target's, fed through ``inputs_embeds``: that gives rotary
    positions, causal and tree masks, a KV cache and a final norm without writing them again (its
    token embedding, of vocabulary 1, is never used). The output is f̂_{t+1}, compared with the
    target's true feature f_{t+1} in training; p = softmax(lm_head(f̂_{t+1})) drafts x_{t+2}. The
    target's embedding and LM head are passed in, frozen, and not saved. EAGLE's own layer drops
    the input norm and ends without a norm; this one keeps LlamaModel's norms (the features it
    predicts come out of the target's final norm).
    """

    kind = "eagle"

    def __init__(self, config):
        super().__init__()
        from transformers import LlamaConfig, LlamaModel

        fields = {name: getattr(config, name) for name in LAYER_FIELDS if getattr(config, name, None) is not None}
        layer_config = LlamaConfig(vocab_size=1, num_hidden_layers=1, bos_token_id=None, eos_token_id=None,
                                   pad_token_id=None, **fields)
        self.hidden_size = layer_config.hidden_size
        self.fc = nn.Linear(2 * self.hidden_size, self.hidden_size)
        self.layer = LlamaModel(layer_config)

    def forward(self, features: torch.Tensor, token_embeddings: torch.Tensor, past_key_values=None,
                **inputs) -> torch.Tensor:
        """Pairs (f_t, e(x_{t+1})), both (batch, n, hidden) -> predicted features f̂_{t+1} (batch, n, hidden).
        ``past_key_values`` (earlier pairs, `new_cache`) and ``inputs`` (a tree's mask and positions) go to the layer:
        the package's decoder runs it over a `SlotCache`, Hugging Face's forward otherwise (training, a dynamic cache).
        """
        layer = forward_over(self.layer, past_key_values)
        return layer(inputs_embeds=self.pair(features, token_embeddings), past_key_values=past_key_values,
                     use_cache=past_key_values is not None, **inputs).last_hidden_state

    def pair(self, features: torch.Tensor, token_embeddings: torch.Tensor) -> torch.Tensor:
        """The layer's input, fc on (f_t, e(x_{t+1})): (batch, n, hidden)."""
        return self.fc(torch.cat([features, token_embeddings], -1))

    def new_cache(self):
        """An empty KV cache to draft with: the decoder's growing `SlotCache` where it serves the layer, else HF's."""
        return cache_and_forward(self.layer, 256)[0]  # room for 256 pairs to start with; it grows

    def _config(self):
        config = self.layer.config
        return {name: getattr(config, name) for name in LAYER_FIELDS if getattr(config, name, None) is not None}

    @classmethod
    def _from_config(cls, config, target):
        from transformers import LlamaConfig

        return cls(LlamaConfig(**config))


def decoder_parts(model) -> tuple[str, str]:
    """The names, in ``model.get_decoder()``, of its list of decoder layers and of its final norm.

    Found by shape, the same way in every family: the one child that is a ModuleList of
    ``num_hidden_layers`` modules (Llama's ``layers``, GPT-2's ``h``) and the one child whose class is
    a norm (``LlamaRMSNorm``, GPT-2's ``ln_f``, GPT-NeoX's ``final_layer_norm``).
    """
    decoder = model.get_decoder()
    layers = [name for name, child in decoder.named_children()
              if isinstance(child, nn.ModuleList) and len(child) == model.config.num_hidden_layers]
    norms = [name for name, child in decoder.named_children() if type(child).__name__.endswith("Norm")]
    if len(layers) != 1 or len(norms) != 1:
        raise ValueError(f"cannot find the decoder layers and the final norm of {type(model).__name__}: an early exit "
                         f"needs a decoder ({type(decoder).__name__}) holding one list of its "
                         f"{model.config.num_hidden_layers} layers and one final norm (found lists {layers}, "
                         f"norms {norms})")
    return layers[0], norms[0]


class ExitHead(_Head):
    """The exit of self-speculative decoding: a final norm and an LM head read after the target's first L layers.

    The draft is the target cut after layer L = ``exit_layer``: p = softmax(lm_head(norm(h_L))), with
    h_L the hidden state after L layers, verified by the whole target's q (LayerSkip, Elhoushi et
    al. 2024; Kangaroo, Liu et al. 2024). `for_target` starts the head as copies of the target's
    final norm and LM head -- an untrained head is the target's own LM head applied early -- and
    the ``exit`` stage of `specbook.train` fits it to q. The LM head is the head's own, not the
    target's: a tied target's output embedding is its input embedding, which the draft reads
    unchanged.
    """

    kind = "exit"

    def __init__(self, norm: nn.Module, exit_layer: int, hidden_size: int, vocab_size: int, bias: bool = False):
        super().__init__()
        self.norm, self.exit_layer, self.hidden_size = norm, exit_layer, hidden_size
        self.lm_head = nn.Linear(hidden_size, vocab_size, bias=bias)

    @classmethod
    def for_target(cls, target, exit_layer: int) -> "ExitHead":
        """An untrained head for ``target``, read after its first ``exit_layer`` layers (in [1, layers - 1])."""
        output = target.get_output_embeddings()  # (vocab, hidden) weight
        head = cls(copy.deepcopy(final_norm(target)), exit_layer, *output.weight.shape[::-1], output.bias is not None)
        head.check_target(target)
        head.lm_head.load_state_dict(output.state_dict())
        return head.to(target.device, target.dtype).requires_grad_(True)  # trainable, even when the target is frozen

    def check_target(self, target) -> None:
        """Refuse a ``target`` without layers after the exit, or whose width or final norm are not the head's."""
        super().check_target(target)
        layers = target.config.num_hidden_layers
        if not isinstance(self.exit_layer, int) or isinstance(self.exit_layer, bool) or \
                not 1 <= self.exit_layer < layers:
            raise ValueError(f"exit_layer must be an integer in [1, {layers - 1}]: the draft runs that many of the "
                             f"target's {layers} layers and the target at least one more (got {self.exit_layer!r})")
        if type(self.norm) is not type(final_norm(target)):
            raise ValueError(f"the exit head's norm is a {type(self.norm).__name__} but the target's final norm is a "
                             f"{type(final_norm(target)).__name__}: a head only fits the target it was trained on")

    def _config(self):
        return {"exit_layer": self.exit_layer, "hidden_size": self.hidden_size,
                "vocab_size": self.lm_head.out_features, "bias": self.lm_head.bias is not None}

    @classmethod
    def _from_config(cls, config, target):
        return cls(copy.deepcopy(final_norm(target)), config["exit_layer"], config["hidden_size"],
                   config["vocab_size"], config["bias"])


def final_norm(model) -> nn.Module:
    """The norm ``model`` applies after its last decoder layer (see `decoder_parts`)."""
    return getattr(model.get_decoder(), decoder_parts(model)[1])


def early_exit_model(target, head: ExitHead):
    """The draft of self-speculative decoding: ``target`` cut after ``head.exit_layer`` layers, finished by ``head``.

    A causal LM of the target's own class, so whatever runs the target runs it (KV caches, sliding windows,
    Gemma 2's logit cap), `assembled` from the target's embeddings, position tables and first L decoder layers and
    the head's norm and LM head: its parameters are the target's (packed layers included) and the head's.
    """
    head.check_target(target)
    layers = getattr(target.get_decoder(), decoder_parts(target)[0])[: head.exit_layer]
    return assembled(target, layers, head.norm, head.lm_head, f"cut {type(target).__name__} at layer {head.exit_layer}")


def assembled(target, layers, norm: nn.Module, lm_head: nn.Module, purpose: str):
    """A causal LM of ``target``'s class made of modules that exist: ``target``'s embeddings and position tables,
    then ``layers`` (decoder layers, the target's or trained copies), ``norm`` and ``lm_head``.

    It is built on the meta device from a copy of the target's config with ``num_hidden_layers`` = len(layers)
    (and every per-layer list, such as ``layer_types``, cut to as many) and untied embeddings, then handed the
    modules: nothing is copied, and moving it moves them. ``purpose`` names it in the error raised when the
    target holds parameters outside its decoder's children (which the new model would lack).
    """
    layers_name, norm_name = decoder_parts(target)
    config = copy.deepcopy(target.config)
    for name, value in list(vars(config).items()):
        if isinstance(value, (list, tuple)) and len(value) == config.num_hidden_layers:  # per layer: layer_types
            setattr(config, name, value[: len(layers)])
    config.num_hidden_layers, config.tie_word_embeddings = len(layers), False
    with torch.device("meta"):
        model = type(target)(config).eval()  # its own modules are only the ones that wrap the target's
    source, decoder = target.get_decoder(), model.get_decoder()
    for name, _ in list(decoder.named_children()):
        setattr(decoder, name, getattr(source, name))
    setattr(decoder, layers_name, nn.ModuleList(layers))
    setattr(decoder, norm_name, norm)
    model.set_output_embeddings(lm_head)
    unshared = [name for name, tensor in [*model.named_parameters(), *model.named_buffers()] if tensor.is_meta]
    if unshared:
        raise ValueError(f"cannot {purpose}: {unshared} are not modules of its decoder")
    return model


# ----------------------------------------------------------------------------- teacher-forced predictions

def medusa_predictions(heads: MedusaHeads, target, input_ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per head i, its logits at every position that has a label (batch, n - i - 2, vocab) and the labels.

    ``input_ids`` (batch, n) is real text: head i at position t predicts input_ids[:, t + i + 2].
    """
    with torch.no_grad():
        features = target_features(target, input_ids)  # (batch, n, hidden)
    logits = heads(features, target.get_output_embeddings()).float()  # (batch, n, heads, vocab)
    n = input_ids.shape[1]
    return [(logits[:, : n - i - 2, i], input_ids[:, i + 2:]) for i in range(heads.num_heads)]


def eagle_predictions(head: EagleHead, target, input_ids: torch.Tensor, noise: float = 0.0,
                      generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """EAGLE run on the target's true features of ``input_ids`` (batch, n), as in training.

    The pairs (f_t, x_{t+1}), t = 0 .. n - 2, go in (with uniform noise in [-noise, noise] added to
    f_t: EAGLE's data augmentation, Section 4.2). Returns the predicted features f̂_{t+1} and the
    true ones f_{t+1}, both (batch, n - 1, hidden).
    """
    with torch.no_grad():
        features = target_features(target, input_ids)  # (batch, n, hidden)
    inputs = features[:, :-1]
    if noise:
        uniform = torch.rand(inputs.shape, generator=generator, device=inputs.device, dtype=inputs.dtype)
        inputs = inputs + noise * (2 * uniform - 1)
    predicted = head(inputs, target.get_input_embeddings()(input_ids[:, 1:]))
    return predicted, features[:, 1:]


def exit_predictions(head: ExitHead, target, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The early exit's logits and the target's, both (batch, n, vocab), on ``input_ids`` (batch, n)."""
    with torch.no_grad():
        target_logits = target(input_ids).logits
    return early_exit_model(target, head)(input_ids).logits, target_logits


@torch.no_grad()
def head_accuracy(target, head, tokens: torch.Tensor, block_size: int = 256, max_windows: int = 32, top: int = 5,
                  batch_size: int = 8) -> dict:
    """Teacher-forced accuracy of ``head`` on consecutive windows of the text ``tokens`` (1-D).

    Medusa: ``top1`` and ``top{top}`` per head, the share of positions whose token i + 2 ahead is the
    head's best guess (or among its ``top`` best). EAGLE: the same for its one step, x_{t+2} from
    (f_t, x_{t+1}) with true features -- comparable to Medusa's head 0, which sees f_t alone. Exit
    head: the same for x_{t+1} from layer L, and ``agreement``, the share of positions where its best
    guess is the target's (teacher-forced top-1 agreement). EAGLE-3: per step of its training-time test
    (`specbook.eagle3.ttt_predictions`), x_{t+j+2} after j steps on its own outputs.
    """
    windows = min(max_windows, len(tokens) // block_size)
    input_ids = tokens[: windows * block_size].view(windows, block_size).to(target.device)
    hits, agreed = [], []  # per batch, per head: (positions, top) bool; per batch: (positions,) bool
    for batch in input_ids.split(batch_size):
        if isinstance(head, MedusaHeads):
            pairs = medusa_predictions(head, target, batch)
        elif hasattr(head, "accuracy_pairs"):  # EAGLE-3: one pair per step of its training-time test
            pairs = head.accuracy_pairs(target, batch)
        elif isinstance(head, ExitHead):
            logits, target_logits = exit_predictions(head, target, batch)  # (batch, n, vocab) each
            agreed.append((logits.argmax(-1) == target_logits.argmax(-1)).flatten())
            pairs = [(logits[:, :-1].float(), batch[:, 1:])]
        else:
            predicted, _ = eagle_predictions(head, target, batch)
            pairs = [(target.get_output_embeddings()(predicted[:, :-1]).float(), batch[:, 2:])]
        hits.append([(logits.topk(top, -1).indices == labels[..., None]).flatten(0, 1) for logits, labels in pairs])
    hits = [torch.cat(per_head) for per_head in zip(*hits)]
    accuracy = {"top1": [float(hit[:, 0].float().mean()) for hit in hits],
                f"top{top}": [float(hit.any(-1).float().mean()) for hit in hits]}
    return {**accuracy, "agreement": float(torch.cat(agreed).float().mean())} if agreed else accuracy

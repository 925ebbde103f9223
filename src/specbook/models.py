"""Loading a target/draft model pair.

``load_pair("shakespeare")`` returns the built-in pair that ships inside the package (trained by
`specbook.train` on Shakespeare's plays): no network, fp32 on the CPU, a couple of seconds.
``load_pair("shakespeare-seq2seq")`` is the built-in encoder-decoder pair (BART-style, trained by
``python -m specbook.train seq2seq`` to restore verse with words cut out), whose draft decodes from
the target's encoder states. ``load_pair(target="org/name", draft="org/name")`` loads any Hugging
Face pair that shares a tokenizer, causal LMs or encoder-decoder models -- an explicit opt-in, for
a GPU on Colab.
"""

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

from .cache import attention_windows
from .decoder import serves
from .packed import can_pack, pack_linears

BUILT_IN = ("shakespeare", "shakespeare-seq2seq")
SHARED_ENCODER = ("shakespeare-seq2seq",)  # built-in pairs whose draft decodes from the target's encoder states


@dataclass
class ModelPair:
    """A target model (whose distribution q the output follows), a draft model (p) and their tokenizer."""

    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: object
    name: str

    def encode(self, text: str) -> torch.Tensor:
        """Text -> a (1, T) tensor of token ids on the target's device."""
        return self.tokenizer(text, return_tensors="pt").input_ids.to(self.target.device)

    def encode_batch(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Texts -> ``input_ids`` (B, T) padded on the left, as batched generation needs, and their
        ``attention_mask`` (B, T), 0 on the padding (whose ids, the pad or end-of-text token, are never read)."""
        rows = [self.tokenizer(text).input_ids for text in texts]
        width, pad = max(map(len, rows)), self.tokenizer.pad_token_id or self.tokenizer.eos_token_id or 0
        input_ids = torch.tensor([[pad] * (width - len(row)) + row for row in rows], device=self.target.device)
        attention_mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows],
                                      device=self.target.device)
        return input_ids, attention_mask


def assets_dir(name: str = "shakespeare") -> Path:
    """Where a built-in pair's files live inside the installed package."""
    return Path(resources.files("specbook")) / "assets" / name


def default_dtype(device) -> torch.dtype:
    """The precision a model gets on ``device`` unless ``dtype=`` says otherwise.

    float32 on the CPU. On a CUDA GPU, bfloat16 where the GPU computes it natively (compute
    capability 8.0 and up: A100, L4, H100, RTX 30xx and later), else float16: a T4 (7.5), the GPU
    most Colab sessions get, only emulates bfloat16, several times slower. float32 elsewhere.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return torch.float32
    major, _ = torch.cuda.get_device_capability(device)
    return torch.bfloat16 if major >= 8 else torch.float16


def _resolve(device, dtype):
    device = torch.device(device if device is not None else "cpu")
    return device, (dtype if dtype is not None else default_dtype(device))


def target_features(target, input_ids: torch.Tensor, **kwargs) -> torch.Tensor:
    """The target's features (batch, n, hidden) for ``input_ids`` (batch, n): its base model's output.

    That is the final hidden state after the final norm, the input of the LM head, so
    ``target.get_output_embeddings()(features)`` are the target's logits (for Llama-style models,
    which apply nothing else). ``kwargs`` (a KV cache, a tree mask) go to the base model.
    """
    return target.get_decoder()(input_ids, **kwargs).last_hidden_state


def read_features(outputs, layers) -> torch.Tensor | None:
    """What a drafter reads of a batch-one call's ``outputs``, asked for its ``hidden_states`` (Hugging Face's tuple:
    the embeddings, the output of each layer, the final norm's output last): the entries ``layers``
    (`Drafter.feature_layers`; -1 the features, the input of the LM head) side by side, (n, len(layers) * hidden).
    None when ``layers`` is None (the call was not asked: an encoder-decoder's output has no ``hidden_states``)."""
    if layers is None:
        return None
    states = [outputs.hidden_states[layer][0] for layer in layers]
    return states[0] if len(states) == 1 else torch.cat(states, -1)


def weight_bytes(model: torch.nn.Module) -> int:
    """The bytes of a model's weights, a tied matrix once: what a decoding step at batch one reads."""
    return sum(param.numel() * param.element_size() for param in model.parameters())


def embedding_rows(model: torch.nn.Module) -> int:
    """The token ids ``model`` can read: the rows of its input embedding (a padded matrix has more than its
    tokenizer's tokens)."""
    return model.get_input_embeddings().num_embeddings


def check_token_ids(input_ids: torch.Tensor, model: torch.nn.Module, name: str = "input_ids") -> None:
    """Refuse token ids that ``model`` cannot embed: each must be in [0, rows of its input embedding)."""
    if input_ids.is_floating_point() or input_ids.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer token ids (got {input_ids.dtype})")
    rows = embedding_rows(model)
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= rows:
        raise ValueError(f"{name} must be token ids in [0, {rows}), the rows of the model's embedding (got ids from "
                         f"{low} to {high}): was the text encoded with this model's tokenizer?")


def check_prompt(model: torch.nn.Module, input_ids: torch.Tensor, max_new_tokens: int) -> None:
    """Refuse prompts ``input_ids`` (B, T) that ``model`` cannot continue by ``max_new_tokens``: empty ones, ones
    that with the new tokens overflow its context, ones on another device or with ids it cannot embed."""
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids must not be empty: give a prompt of at least one token")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1 (got {max_new_tokens!r})")
    context = getattr(model.config, "max_position_embeddings", None)
    if context is not None and input_ids.shape[1] + max_new_tokens > context:
        raise ValueError(f"the prompt ({input_ids.shape[1]} tokens) plus max_new_tokens ({max_new_tokens}) must fit "
                         f"the model's context of {context} tokens")
    if input_ids.device != model.device:
        raise ValueError(f"input_ids are on {input_ids.device} but the model is on {model.device}: move them with .to()")
    check_token_ids(input_ids, model)


def vocab_size(model: torch.nn.Module) -> int:
    """The width of ``model``'s logits: the rows of its LM head, padding rows included."""
    return model.get_output_embeddings().weight.shape[0]


def attention_summary(config) -> str:
    """How a model's layers attend, in words: "full" or "sliding window W in n of L layers"."""
    windows = attention_windows(config)
    sliding = [window for window in windows if window is not None]
    return f"sliding window {sliding[0]} in {len(sliding)} of {len(windows)} layers" if sliding else "full"


def describe_pair(target: torch.nn.Module, draft: torch.nn.Module, tokenizer=None) -> dict[str, dict]:
    """What matters about a pair for speculative decoding, per model: a table for a reader's own pair.

    Checks it first (`check_pair`; `specbook.cache.attention_windows` refuses layers that cannot be
    rolled back). ``padding rows`` are embedding rows beyond the tokenizer's tokens, when it is given.
    """
    check_pair(target, draft)
    report = {}
    for role, model in (("target (q)", target), ("draft (p)", draft)):
        rows = embedding_rows(model)
        report[role] = {"family": model.config.model_type, "layers": model.config.num_hidden_layers,
                        "parameters": sum(weight.numel() for weight in model.parameters()),
                        "embedding rows": rows,
                        "padding rows": rows - len(tokenizer) if tokenizer is not None else None,
                        "attention": attention_summary(model.config),
                        "dtype": str(model.dtype).removeprefix("torch."), "device": str(model.device)}
    return report


def check_pair(target: torch.nn.Module, draft: torch.nn.Module) -> None:
    """Refuse a draft model that cannot draft for ``target``: another device or another tokenizer.

    The two must agree on the special tokens, and their vocabularies may differ only by padding
    rows: real pairs pad the embedding matrix to a multiple of 64 or 128 (Qwen2.5-0.5B has 151,936
    rows, Qwen2.5-7B 152,064, for the same 151,665 tokens), so widths closer than 128 pass.
    """
    if draft.device != target.device:
        raise ValueError(f"the draft model is on {draft.device} but the target is on {target.device}: "
                         "put both on the same device")
    same_specials = all(getattr(target.config, name, None) == getattr(draft.config, name, None)
                        for name in ("bos_token_id", "eos_token_id"))
    widths = [vocab_size(model) for model in (target, draft)]
    if not same_specials or abs(widths[0] - widths[1]) >= 128:
        raise ValueError(f"the draft must share the target's tokenizer (target vocabulary {widths[0]}, "
                         f"draft {widths[1]}; special tokens {'agree' if same_specials else 'differ'})")


def _from_pretrained(path, dtype):
    """A causal LM or, where its config says so, an encoder-decoder model (T5, BART, Marian, Whisper)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    seq2seq = getattr(AutoConfig.from_pretrained(path), "is_encoder_decoder", False)
    return (AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM).from_pretrained(path, dtype=dtype)


def load_model(name: str, part: str, device=None, dtype=None) -> torch.nn.Module:
    """One model of a built-in pair (or of a folder `specbook.train` wrote), in eval mode: ``part`` is a
    folder in it, such as ``"draft-undistilled"`` of ``"shakespeare"`` or ``"draft-own-encoder"`` of
    ``"shakespeare-seq2seq"``."""
    root = assets_dir(name) if name in BUILT_IN else Path(name)
    if not (root / part / "config.json").is_file():
        parts = sorted(path.parent.name for path in root.glob("*/config.json"))
        raise ValueError(f"part must be one of the models of {name!r}: {parts} (got {part!r})")
    device, dtype = _resolve(device, dtype)
    return _from_pretrained(root / part, dtype).to(device).eval()


def load_pair(name: str | None = None, *, target: str | None = None, draft: str | None = None,
              device=None, dtype=None, pack: bool | None = None) -> ModelPair:
    """Load a model pair in eval mode, ready for the fast path.

    Either a built-in pair by ``name`` (``"shakespeare"``, ``"shakespeare-seq2seq"``), a pair that ``python -m specbook.train
    --out DIR`` wrote (``name=DIR``: a tokenizer, ``target/`` and ``draft/``), or two Hugging Face hub
    models by id or local directory (``target=``, ``draft=``). ``device`` defaults to the CPU;
    ``dtype`` to `default_dtype` of the device (float32 on the CPU; on a GPU bfloat16 where it is
    native, else float16).

    The engine runs a model of the Llama family (Llama, Mistral, Qwen2, Qwen3) with its own forward,
    `specbook.decoder.Decoder`, wherever that reproduces Hugging Face's; other models keep Hugging Face's.
    ``pack``: the target's linear layers packed once for oneDNN (`specbook.packed`), for a faster
    verification call with Hugging Face's forward on some CPUs, at the price of a second copy of its
    linear weights; a packed target keeps Hugging Face's forward. By default a CPU target is packed only
    where it keeps Hugging Face's forward anyway: the decoder's few calls to the BLAS made packing moot
    on the machine the book measures (chapter 4, §4.9). ``pack=True`` packs it anyway (to compare);
    ``pack=False`` never. The draft stays as it is. On a GPU the engine's static caches and CUDA graphs
    are the fast path (`specbook.decoding`), and nothing is packed.
    """
    from transformers import AutoTokenizer

    device, dtype = _resolve(device, dtype)
    if (target is None) != (draft is None):
        raise ValueError("give both target= and draft= (Hugging Face model ids), or neither")
    if target is None:
        name = str(name or "shakespeare")
        trained = Path(name)
        if name not in BUILT_IN and not ((trained / "target").is_dir() and (trained / "draft").is_dir()):
            raise ValueError(f"name must be one of the built-in pairs {list(BUILT_IN)} or a directory written by "
                             f"specbook.train (got {name!r}); for a Hugging Face pair pass target= and draft=")
        root = assets_dir(name) if name in BUILT_IN else trained
        tokenizer = AutoTokenizer.from_pretrained(root)
        models = [_from_pretrained(root / part, dtype) for part in ("target", "draft")]
    else:
        if name is not None:
            raise ValueError("give either a built-in pair name or target=/draft=, not both")
        name = f"{target} / {draft}"
        try:
            tokenizer = AutoTokenizer.from_pretrained(target)
            draft_tokenizer = AutoTokenizer.from_pretrained(draft)
            models = [_from_pretrained(model_id, dtype) for model_id in (target, draft)]
        except OSError as error:
            raise OSError(f"could not load {name} from the Hugging Face hub ({error}). Loading a hub pair "
                          "needs a network connection (or a local copy in the cache) and the exact model ids.") from error
        if tokenizer.get_vocab() != draft_tokenizer.get_vocab():
            raise ValueError(f"target and draft must share a tokenizer: {target} and {draft} have different vocabularies")
    target_model, draft_model = (model.to(device).eval() for model in models)
    if pack is None:
        pack = can_pack(target_model) and serves(target_model) is not None
    if pack:
        pack_linears(target_model)
    return ModelPair(target_model, draft_model, tokenizer, name)

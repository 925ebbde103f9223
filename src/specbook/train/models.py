"""The models trained: their shapes, a new model, growing one deeper, blending two, saving and loading."""

import json
from pathlib import Path

import torch


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


def blend(before, after, mix):
    """Weight-space interpolation of two state dicts: (1 - mix) * before + mix * after (WiSE-FT,
    Wortsman et al. 2022). The copy stage ends with it: copying comes on sharply with ``mix``
    while the text statistics stay close to the model before the stage."""
    if not 0 <= mix <= 1:
        raise ValueError(f"mix must be in [0, 1], got {mix}")
    return {name: torch.lerp(before[name], weight, mix) for name, weight in after.items()}


def save_model(model, out_dir, meta):
    """Save in float16 (half the bytes; loaders upcast to float32, so the shipped weights are what is measured)."""
    model.to("cpu", torch.float16).save_pretrained(out_dir, safe_serialization=True)
    (Path(out_dir) / "training.json").write_text(json.dumps(meta, indent=2))


def load_trained(out_dir, device):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32).to(device).eval()

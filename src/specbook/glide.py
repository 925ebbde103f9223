"""GliDe: a draft model that glides on the target's KV cache (Du et al., ICML 2024, arXiv 2402.02082).

A draft model recomputes, in its own small layers, what the target has already worked out about the
context. GliDe (the paper's Figure 2) lets the draft read it instead: each draft layer is
self-attention, then a *cross-attention into the target's KV cache*, then the MLP. The cross-attention
has a query projection and an output projection only; its keys and values are the target's cached
tensors of the committed context, free at inference time. Draft layer i of L_D reads target layer
L_T - L_D + i, so a one-layer draft reads the target's last layer, the one that knows the most.

- Positions. The target caches its keys after RoPE, so only the draft's query is rotated, at its
  own absolute position, with the target's head size and RoPE base (its ``rope_parameters``, partial
  rotation included). Grouped-query targets cache fewer key heads than the query has: they are
  repeated, as the target's own attention repeats them.
- What a query sees. At inference the draft reads the target's keys of every committed position;
  the pending token and the drafts are not in the target's cache yet. A query at position t sees
  the target's keys at positions below a *limit*: its own position (`read_target_cache`, every
  committed key before it). In training the limit is the start of its block: a query in block b sees
  the target's keys of blocks 0 .. b - 1 only (`block_lag_limits`, the paper's block size is 5), so
  the draft learns to predict with target keys that lag a few tokens behind, as they do at
  inference, where they stop at the last verification (the paper's training recipe).
- A query that sees no key at all (the start of a training window, a one-token prompt) gets nothing
  from the cross-attention: its output is zero, not an average over nothing.

`GlideForCausalLM` is a `transformers` `LlamaForCausalLM` whose decoder layers are `GlideDecoderLayer`s:
its own KV cache, masks, token trees and rotary positions are Llama's, and every call takes one more
input, ``target_context`` (a `TargetContext`). Its config (`GlideConfig`, model type ``"glide"``,
registered with the ``Auto`` classes) records the target it was trained on (`target_signature`);
`GlideForCausalLM.check_target` refuses any other. The drafter is `specbook.drafters.GlideDrafter`,
CaPE's token trees included; the training recipe the ``glide`` stage of `specbook.train`.
"""

from typing import NamedTuple

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding, rotate_half

from .cache import SlotCache, attention_windows


class TargetContext(NamedTuple):
    """The target's cache as the draft's cross-attention reads it.

    ``keys`` and ``values``: per draft layer, the target's cached tensors (batch, kv_heads, S, head_dim) of
    positions 0 .. S - 1, or None when no position is committed yet. ``limits`` (batch, n): a query sees
    the keys at positions below its limit; None means below its own position (inference).
    """

    keys: list
    values: list
    limits: torch.Tensor | None = None


def read_target_cache(cache, layers: list[int], committed: int) -> TargetContext:
    """The keys and values of the target's ``layers`` at its ``committed`` positions 0 .. committed - 1.

    ``cache`` is the engine's: a dynamic cache, which holds just those positions between steps, or a static
    one or a `specbook.cache.SlotCache`, whose buffers also hold rejected drafts and stale tokens past its
    pointer: only the filled part is read.
    """
    if not committed:
        return TargetContext([None] * len(layers), [None] * len(layers))
    if isinstance(cache, SlotCache):  # (layers, kv_heads, slots, head_dim)
        return TargetContext([cache.keys[index, None, :, :committed] for index in layers],
                             [cache.values[index, None, :, :committed] for index in layers])
    cached = [cache.layers[index] for index in layers]
    return TargetContext([layer.keys[:, :, :committed] for layer in cached],  # (batch, kv_heads, committed, head_dim)
                         [layer.values[:, :, :committed] for layer in cached])


def block_lag_limits(length: int, block: int, device=None) -> torch.Tensor:
    """(1, length): the training limit of each query, the start of its block of ``block`` positions."""
    positions = torch.arange(length, device=device)
    return (positions // block * block)[None]


def target_signature(config, draft_layers: int = 1) -> dict:
    """What a GliDe draft of ``draft_layers`` layers needs of a target with ``config`` to read its cache.

    Raises ValueError for a target whose cache it cannot read: an encoder-decoder model, a model without
    rotary positions (GPT-2, OPT: positions are added to the input, its keys carry no rotation for the
    query to match) and one whose layers that the draft reads attend through a sliding window.
    """
    name = type(config).__name__
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError(f"GliDe reads the KV cache of a decoder-only target; {name} is an encoder-decoder model")
    config = config.get_text_config(decoder=True)
    rope = getattr(config, "rope_parameters", None)
    if not rope:
        raise ValueError(f"GliDe rotates its query like the target's cached keys, but {name} has no rotary position "
                         "embedding (its positions are added to the input): its cache is not one GliDe can read")
    layers = config.num_hidden_layers
    windows = attention_windows(config)[layers - draft_layers:]
    if any(window is not None for window in windows):
        raise ValueError(f"GliDe reads the target's last {draft_layers} layer(s) over the whole committed context, but "
                         f"{name} attends through a sliding window there ({windows}): draft with a draft model")
    rope = rope.get("full_attention", rope)  # Gemma 3: one RoPE per kind of layer
    heads = config.num_attention_heads
    return {"model_type": config.model_type, "hidden_size": config.hidden_size, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": getattr(config, "num_key_value_heads", None) or heads,
            "head_dim": getattr(config, "head_dim", None) or config.hidden_size // heads,
            "rope_parameters": dict(rope), "max_position_embeddings": config.max_position_embeddings}


def query_rotary(target: dict) -> LlamaRotaryEmbedding:
    """Llama's rotary embedding with the target's RoPE: cos and sin (batch, n, rotated dims) for the query.

    A partial rotation (GPT-NeoX rotates a quarter of each head) becomes a rotary embedding that many dims wide.
    """
    rope = dict(target["rope_parameters"])
    rotated = int(target["head_dim"] * rope.pop("partial_rotary_factor", 1.0))
    return LlamaRotaryEmbedding(LlamaConfig(hidden_size=rotated, num_attention_heads=1, head_dim=rotated,
                                            rope_parameters=rope,
                                            max_position_embeddings=target["max_position_embeddings"]))


class CrossAttention(nn.Module):
    """GliDe's cross-attention into the target's cache (Figure 2): a query and an output projection only.

    The query has the target's number of heads and head size; the keys and values are the target's,
    their heads repeated for grouped-query attention.
    """

    def __init__(self, hidden_size: int, target: dict):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (target["num_attention_heads"], target["num_key_value_heads"],
                                                    target["head_dim"])
        self.q_proj = nn.Linear(hidden_size, self.heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden_size, bias=False)
        self.rotary = query_rotary(target)

    def forward(self, hidden_states, position_ids, keys, values, limits=None):
        """(batch, n, hidden) at ``position_ids`` (batch, n) -> their reading of the target (batch, n, hidden)."""
        if keys is None:  # nothing committed yet: nothing to read
            return torch.zeros_like(hidden_states)
        batch, n, _ = hidden_states.shape
        query = self.q_proj(hidden_states).view(batch, n, self.heads, self.head_dim).transpose(1, 2)  # (b, h, n, d)
        cos, sin = (part[:, None] for part in self.rotary(query, position_ids))  # (b, 1, n, rotated)
        rotated = cos.shape[-1]
        query = torch.cat([query[..., :rotated] * cos + rotate_half(query[..., :rotated]) * sin,
                           query[..., rotated:]], -1)  # RoPE at the query's absolute position, as the target's keys
        keys, values = (part.to(query.dtype).repeat_interleave(self.heads // self.kv_heads, 1)
                        for part in (keys, values))  # (b, h, S, d)
        scores = query @ keys.transpose(-1, -2) * self.head_dim ** -0.5  # (b, h, n, S)
        limits = position_ids if limits is None else limits  # (b, n)
        visible = (torch.arange(keys.shape[2], device=keys.device) < limits[..., None])[:, None]  # (b, 1, n, S)
        # A row that sees no key gets all-zero weights (not NaN: a finite fill keeps the gradient finite).
        weights = scores.masked_fill(~visible, torch.finfo(scores.dtype).min).softmax(-1) * visible
        read = (weights @ values).transpose(1, 2).reshape(batch, n, self.heads * self.head_dim)
        return self.o_proj(read)


class GlideDecoderLayer(LlamaDecoderLayer):
    """A Llama decoder layer with GliDe's cross-attention between its self-attention and its MLP (Figure 2):

    h = x + SelfAttn(norm(x));  h = h + CrossAttn(norm(h), target's K, V);  out = h + MLP(norm(h)).
    """

    def __init__(self, config: "GlideConfig", layer_idx: int):
        super().__init__(config, layer_idx)
        self.cross_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.cross_attn = CrossAttention(config.hidden_size, config.target)

    def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
                position_embeddings=None, target_context: TargetContext = None, **kwargs):
        attended, _ = self.self_attn(self.input_layernorm(hidden_states), attention_mask=attention_mask,
                                     position_ids=position_ids, past_key_values=past_key_values, use_cache=use_cache,
                                     position_embeddings=position_embeddings, **kwargs)
        hidden_states = hidden_states + attended
        index = self.self_attn.layer_idx
        hidden_states = hidden_states + self.cross_attn(self.cross_layernorm(hidden_states), position_ids,
                                                        target_context.keys[index], target_context.values[index],
                                                        target_context.limits)
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class GlideConfig(LlamaConfig):
    """A Llama config and ``target``: the `target_signature` of the target whose cache the draft reads."""

    model_type = "glide"
    target: dict | None = None


class GlideForCausalLM(LlamaForCausalLM):
    """A GliDe draft: a Llama causal LM whose layers also read the target's cache (`GlideDecoderLayer`).

    Called like a Llama model plus ``target_context`` (a `TargetContext`), which every call needs.
    `from_draft` builds one from a plain draft model: its weights, and a cross-attention whose output
    projection starts at zero, so that the new model starts as exactly that draft.
    """

    config_class = GlideConfig

    def __init__(self, config: GlideConfig):
        super().__init__(config)
        if not config.target:
            raise ValueError("a GliDe config needs target: the target_signature of the target it reads")
        self.model.layers = nn.ModuleList(GlideDecoderLayer(config, index) for index in range(config.num_hidden_layers))
        self.post_init()

    @classmethod
    def from_draft(cls, draft: LlamaForCausalLM, target) -> "GlideForCausalLM":
        """A GliDe draft for ``target`` that starts as ``draft`` (a Llama causal LM): its weights, cross-attention
        added with a zero output projection. On ``draft``'s device and in its dtype."""
        if not isinstance(draft, LlamaForCausalLM) or isinstance(draft, cls):
            raise ValueError("draft must be a plain Llama causal LM, GliDe's draft layers "
                             f"(got {type(draft).__name__})")
        config = GlideConfig(**{**draft.config.to_dict(), "model_type": cls.config_class.model_type,
                                "target": target_signature(target.config, draft.config.num_hidden_layers)})
        glide = cls(config).to(draft.device, draft.dtype)
        missing, unexpected = glide.load_state_dict(draft.state_dict(), strict=False)
        assert not unexpected and all(".cross_" in name for name in missing), (missing, unexpected)
        for layer in glide.model.layers:
            nn.init.zeros_(layer.cross_attn.o_proj.weight)
        return glide.eval()

    @property
    def target_layers(self) -> list[int]:
        """The target layer each draft layer reads: L_T - L_D + i, the target's last L_D layers."""
        layers = self.config.num_hidden_layers
        return list(range(self.config.target["num_hidden_layers"] - layers, self.config.target["num_hidden_layers"]))

    def check_target(self, target) -> None:
        """Refuse a ``target`` whose cache this draft was not trained on, naming what differs."""
        found = target_signature(target.config, self.config.num_hidden_layers)
        differ = [f"{name} {self.config.target.get(name)} (trained on) vs {value} (this target)"
                  for name, value in found.items() if self.config.target.get(name) != value]
        if differ:
            raise ValueError("this GliDe draft reads the cache of the target it was trained on, and this target's "
                             f"differs: {'; '.join(differ)}")

    def forward(self, input_ids=None, target_context: TargetContext | None = None, **kwargs):
        """Llama's forward; ``target_context`` is what the cross-attention reads (`read_target_cache` at
        inference; the target's keys of a training window with `block_lag_limits` in training)."""
        if target_context is None:
            raise ValueError("GliDe reads the target's cache: pass target_context (specbook.glide.read_target_cache)")
        return super().forward(input_ids, target_context=target_context, **kwargs)


AutoConfig.register(GlideConfig.model_type, GlideConfig)
AutoModelForCausalLM.register(GlideConfig, GlideForCausalLM)

"""A decoder written for decoding: the Llama family's forward in a few kernels a layer.

At batch one a small model's decode call costs what its kernels cost to launch, not what they compute:
about 1.8 microseconds a kernel in a replayed CUDA graph on an H100, several on a CPU where every operator
goes through PyTorch's dispatcher. Hugging Face's general-purpose forward dispatches about 37 operators a
layer of a Llama model on a call on one position of a dynamic cache (`specbook.kernels.count_kernels`; its
RMSNorm alone is six, eight in half precision with its two casts, the rotary embedding about 10, seven
separate matmuls, a cache update). `Decoder` runs the same arithmetic from the same weights in 15 a layer,
fusing more than gpt-fast's ``model.py``, which fuses q, k and v and leaves the rest to ``torch.compile``
(``rms_norm`` counts as one: one fused kernel on a GPU, several operators on a CPU):

    rms_norm                                   1
    q, k and v in one matmul                   1   (the three weight matrices fused)
    rotary embedding of q and k together       3   (x * cos + roll(x) * signed sin, in place, tables by position)
    keys and values written into the cache     1   (``index_copy_`` at the call's slots: k beside v)
    attention over the cache                   1   (SDPA, with an additive mask made once a call)
    output projection, residual add            2
    rms_norm, gate and up in one matmul        2
    SiLU, times up, down projection, add       4

plus a handful a call: the embedding, the positions, the mask and rotary rows, the final norm and the LM
head. A call on one position of a growing cache needs no mask (its query sees every key), which on a CPU,
where every operator costs several microseconds, counts in a small draft model's call. The weights are not
copied: q, k and v (and gate and up) are concatenated once into one matrix, and the model's own parameters
are re-pointed at slices of it, so the Hugging Face model and this decoder read the same memory (and a later
in-place change to either shows in both).

It serves the families whose layers are Llama's: Llama (with llama3 rotary scaling), Mistral, Qwen2
(biases on q, k and v) and Qwen3 (RMSNorm on each head of q and k), sliding windows included (the mask
applies them). `serves` says why another model keeps Hugging Face's forward; float32 logits agree with it
to about 1e-5 (tested on every served family).

It runs a bare decoder stack too (``LlamaModel``, ``Qwen2Model``, ...: no LM head), fed ``inputs_embeds``
and returning the final norm's output, which is how EAGLE's and EAGLE-3's one-layer heads draft
(`specbook.heads.EagleHead`): at batch one a head's call is mostly launch overhead as well. EAGLE-3's layer
(`specbook.eagle3.Eagle3DecoderLayer`) reads [embedding; feature], twice the width, a norm for each half,
with the feature as its residual.

Its cache is `specbook.cache.SlotCache`: one buffer of keys and values for all layers and one length on
the device. A call on n tokens writes them at slots length..length + n - 1; a token tree may give its
own positions and mask (`specbook.trees`), for rows that are slots but not positions.
"""

import weakref
from contextlib import contextmanager
from types import SimpleNamespace
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .cache import SlotCache, attention_windows, new_cache

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
CLASSES = {f"{name}{kind}" for name in ("Llama", "Mistral", "Qwen2", "Qwen3")
           for kind in ("ForCausalLM", "Model", "DecoderLayer")}  # exactly these: a subclass may compute more
ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # tables that depend on the position only


class Output(NamedTuple):
    """A call's outputs, read by name as Hugging Face's model outputs are (and made in a fraction of their time,
    which counts in a small draft model's call)."""

    logits: torch.Tensor | None = None  # (1, keep, vocab); None for a bare stack
    past_key_values: SlotCache | None = None
    hidden_states: tuple | None = None  # each (1, n, hidden), when asked
    last_hidden_state: torch.Tensor | None = None  # a bare stack's features (1, n, hidden)


def _rope_type(config) -> str:
    parameters = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return parameters.get("rope_type", parameters.get("type", "default"))


def _stack(model):
    """The decoder stack of ``model``: its ``model`` (a causal LM's), or ``model`` itself (a bare stack)."""
    return getattr(model, "model", model)


LAYER_CLASSES = CLASSES | {"Eagle3DecoderLayer"}  # the families' layers, and EAGLE-3's (`specbook.eagle3`)


def serves(model) -> str | None:
    """None where `Decoder` reproduces ``model``'s forward, else why it does not (Hugging Face's runs then)."""
    if type(model).__name__ not in CLASSES or type(model).__name__.endswith("DecoderLayer"):
        return f"{type(model).__name__} (served: the causal LMs and decoder stacks of {', '.join(FAMILIES)})"
    config, stack = model.config, _stack(model)
    layers = {type(layer).__name__ for layer in stack.layers}
    if not layers <= LAYER_CLASSES:
        return f"layers of another kind ({', '.join(sorted(layers - LAYER_CLASSES))})"
    attention = stack.layers[0].self_attn
    if len({module.bias is None for module in (attention.q_proj, attention.k_proj, attention.v_proj)}) > 1:
        return "biases on some of q, k and v only"
    if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "mlp_bias", False):
        return "an MLP other than SiLU-gated without biases"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    if _rope_type(config) not in ROPE_TYPES:
        return f"{_rope_type(config)!r} rotary scaling, which depends on the sequence's length"
    if model.training:
        return "a model in training mode"
    hooked = [name or "the model" for name, module in model.named_modules() for hook in (
        *module._forward_pre_hooks.values(), *module._forward_hooks.values())
        if getattr(hook, "__name__", None) != "output_capturing_hook"]  # transformers' own, idle unless asked
    if hooked:
        return f"forward hooks on {hooked[0]}, which this forward would not call"
    others = {type(module).__name__ for layer in stack.layers for module in (
        layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
        layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj) if type(module) is not torch.nn.Linear}
    if others:
        return f"linear layers of another kind ({', '.join(sorted(others))}: packed, quantized, adapters)"
    return None


def _joined(tensors) -> torch.Tensor | None:
    """``tensors`` as one tensor along their first dimension, without a copy, where they already lie one after
    the other in one storage (fused earlier); else None."""
    first = tensors[0]
    offset = first.storage_offset()
    for tensor in tensors:
        if (not tensor.is_contiguous() or tensor.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
                or tensor.storage_offset() != offset):
            return None
        offset += tensor.numel()
    rows = sum(tensor.shape[0] for tensor in tensors)
    return first.as_strided((rows,) + first.shape[1:], first.stride())


def _fuse(modules) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weights (and biases, if they have them) of ``modules`` (linear layers reading the same input)
    concatenated along their outputs, each module's parameters re-pointed at its slice: one matrix, no second
    copy. Modules fused before give their matrix back as it is."""
    fused = []
    # the fused tensors are inference tensors where the model's are (a model made under inference mode), else
    # ordinary ones, which training can still update
    with torch.inference_mode(modules[0].weight.is_inference()), torch.no_grad():
        for parameters in ([module.weight for module in modules], [module.bias for module in modules]):
            if parameters[0] is None:  # no biases (`serves` declines layers where only some have one)
                fused.append(None)
                continue
            joined = _joined([parameter.data for parameter in parameters])
            if joined is None:
                joined = torch.cat([parameter.data for parameter in parameters])  # (sum of outputs, ...)
                start = 0
                for parameter in parameters:
                    parameter.data = joined[start:start + len(parameter)]
                    start += len(parameter)
            fused.append(joined)
    return tuple(fused)


class Decoder:
    """``model``'s forward (a served Llama-family causal LM or decoder stack) over a `SlotCache`, from the model's
    own weights.

    Called like the model: ``decoder(input_ids, past_key_values=cache, logits_to_keep=n,
    output_hidden_states=True)`` returns ``logits`` (1, keep, vocab) and, when asked, ``hidden_states`` as Hugging
    Face's model gives them, each (1, n, hidden): the embeddings, the output of each layer but the last, and
    the features, the final norm's output, the input of the LM head. A tree's
    call also passes ``position_ids`` (1, n) and ``attention_mask`` (1, 1, n, length + n), float, as for
    Hugging Face's model (`specbook.trees.tree_model_inputs`), or ``tree``, the tree's mask and depths on the
    device (`specbook.cache.SlotCache.tree_masks`), which need no host to know where it starts. A bare stack is called with ``inputs_embeds``
    (1, n, hidden) in place of ``input_ids`` and returns ``last_hidden_state``, the features (1, n, hidden).
    """

    def __init__(self, model):
        reason = serves(model)
        if reason is not None:
            raise ValueError(f"Decoder cannot run {type(model).__name__}: {reason}")
        self.model, config = model, model.config
        self.config, self.device, self.dtype = config, model.device, model.dtype
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        self.windows = attention_windows(config)
        self.layers, self.hidden = [], config.hidden_size
        stack = _stack(model)
        for layer in stack.layers:
            attention, mlp = layer.self_attn, layer.mlp
            qkv, qkv_bias = _fuse([attention.q_proj, attention.k_proj, attention.v_proj])
            gate_up, _ = _fuse([mlp.gate_proj, mlp.up_proj])
            norms = [getattr(attention, name, None) for name in ("q_norm", "k_norm")]
            self.layers.append(SimpleNamespace(
                input_norm=layer.input_layernorm.weight, qkv=qkv, qkv_bias=qkv_bias,
                hidden_norm=layer.hidden_norm.weight if hasattr(layer, "hidden_norm") else None,  # EAGLE-3's
                head_norms=[norm.weight for norm in norms] if norms[0] is not None else None,
                o=attention.o_proj.weight, o_bias=attention.o_proj.bias,
                post_norm=layer.post_attention_layernorm.weight, gate_up=gate_up, down=mlp.down_proj.weight))
        self.embedding = stack.embed_tokens.weight
        self.norm = stack.norm.weight
        self.head = model.lm_head.weight if stack is not model else None  # a bare stack returns the features
        self.pointers = self._pointers()
        self.rotary = self.embedding.new_zeros(0, 2, self.head_dim)

    def _tables(self, length: int) -> None:
        """The rotary table (positions, 2, head_dim) of cos and sin for the first ``length`` positions (at least),
        from the model's own rotary embedding: x * cos + roll(x, half) * sin is Hugging Face's x * cos +
        rotate_half(x) * sin, with rotate_half's sign folded into the sin table."""
        if self.rotary.shape[0] >= length:
            return
        length = min(max(length, 2 * self.rotary.shape[0]), self.config.max_position_embeddings)
        positions = torch.arange(length, device=self.device)[None]
        cos, sin = _stack(self.model).rotary_emb(self.embedding[:1], positions)  # (1, length, head_dim)
        half = self.head_dim // 2
        self.rotary = torch.stack([cos[0], torch.cat([-sin[0, :, :half], sin[0, :, half:]], -1)], 1)

    def _pointers(self) -> list[int]:
        """Where the model's parameters live: a change (the model moved, or reloaded) makes this decoder stale."""
        stack = _stack(self.model)
        layer = stack.layers[0]
        return [stack.embed_tokens.weight.data_ptr(), layer.self_attn.q_proj.weight.data_ptr(),
                layer.mlp.gate_proj.weight.data_ptr(), stack.norm.weight.data_ptr()]

    def current(self) -> bool:
        """Whether this decoder still reads the model's weights (not after ``model.to(...)`` or a reload)."""
        return self.model.device == self.device and self.model.dtype == self.dtype and self._pointers() == self.pointers

    def new_cache(self, max_length: int, static: bool = False) -> SlotCache:
        """An empty cache with room for ``max_length`` tokens (fixed: ``static``, for a replayed graph)."""
        self._tables(max_length)
        return SlotCache(len(self.layers), self.kv_heads, self.head_dim, max_length, self.windows,
                         self.dtype, self.device, static)

    def _rms_norm(self, x, weight):
        return F.rms_norm(x, weight.shape, weight, self.eps)

    def _input_norm(self, layer, x):
        """The attention's input: x (R n, hidden) normed; EAGLE-3's first layer reads [embedding; feature] (R n,
        2 hidden), a norm for each half."""
        if layer.hidden_norm is None:
            return self._rms_norm(x, layer.input_norm)
        return torch.cat([self._rms_norm(x[:, :self.hidden], layer.input_norm),
                          self._rms_norm(x[:, self.hidden:], layer.hidden_norm)], -1)

    def _rotate(self, x, cos, sin):  # x (n, heads, head_dim), in place; cos, sin (n, 1, head_dim)
        rolled = x.roll(self.head_dim // 2, -1)
        x.mul_(cos).addcmul_(rolled, sin)

    def _attend(self, layer, x, cache, index, cos, sin, mask):
        """One layer's attention on ``x`` (R * n, hidden), R rows of n: its keys and values written at the slots
        the cache claimed, its queries attending to the cache's first ``cache.span`` slots under ``mask``
        (R, G * n, span; None: all)."""
        rows, heads, kv_heads, head_dim = cache.rows, self.heads, self.kv_heads, self.head_dim
        n = x.shape[0] // rows
        qkv = F.linear(self._input_norm(layer, x), layer.qkv, layer.qkv_bias)  # (R n, (H + 2 KV) * d)
        qkv = qkv.view(rows * n, heads + 2 * kv_heads, head_dim)
        qk = qkv[:, :heads + kv_heads]  # (R n, H + KV, d): rotated in place, beside the values
        if layer.head_norms is not None:  # Qwen3: RMSNorm over each head of q and of k
            qk.copy_(torch.cat([self._rms_norm(qk[:, :heads], layer.head_norms[0]),
                                self._rms_norm(qk[:, heads:], layer.head_norms[1])], 1))
        self._rotate(qk, cos, sin)
        cache.write(index, qkv[:, heads:])  # keys and values (R n, 2 KV, d)
        keys, values = cache.attended(index)  # (R, KV, span, d) each
        groups = heads // kv_heads  # grouped-query attention: a group's query heads are rows of one KV head
        q = qkv[:, :heads].view(rows, n, heads, head_dim).transpose(1, 2).reshape(rows, kv_heads, groups * n, head_dim)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=None if mask is None else mask[:, None])
        out = out.view(rows, heads, n, head_dim).transpose(1, 2).reshape(rows * n, heads * head_dim)  # (R n, H d)
        return F.linear(out, layer.o, layer.o_bias)  # (R n, hidden)

    @torch.no_grad()  # decoding: no autograd, even outside the engine (its tables may be inference tensors)
    def __call__(self, input_ids=None, past_key_values=None, use_cache=True, logits_to_keep=0,
                 output_hidden_states=False, position_ids=None, attention_mask=None, inputs_embeds=None, tree=None,
                 **unused):
        cache = past_key_values
        if not isinstance(cache, SlotCache):
            raise ValueError(f"Decoder runs over a SlotCache (decoder.new_cache(length); got {type(cache).__name__})")
        inputs = input_ids if inputs_embeds is None else inputs_embeds
        rows, n = inputs.shape[:2]
        if rows != cache.rows:
            raise ValueError(f"this cache holds {cache.rows} row(s): inputs must be ({cache.rows}, n, ...) (got "
                             f"{tuple(inputs.shape)}; a batch decodes over specbook.ragged.rows_cache)")
        if rows > 1 and (tree is not None or position_ids is not None):
            raise ValueError("a batch decodes chains: a token tree's positions and mask are for one sequence")
        slots = cache.claim(n)  # (R n,)
        self._tables(cache.max_length)  # a cache that grew
        if tree is not None:  # the last n rows of a token tree, from its mask and depths on the device
            positions, masks = cache.tree_masks(slots, *tree)
        elif position_ids is None:
            positions, masks = slots, cache.causal_masks(slots)  # (R n,); per window: (R, n, span) or (n, span)
        else:
            positions, masks = position_ids[0], cache.given_masks(attention_mask, n)
        groups = self.heads // self.kv_heads  # a mask row per query row: G groups of n, in every row
        for window, mask in masks.items():
            if mask is not None:
                mask = mask.view(rows, n, -1)  # (R, n, span)
                masks[window] = mask.repeat(1, groups, 1) if groups > 1 else mask  # (R, G * n, span)
        rotary = self.rotary[positions]  # (R n, 2, d)
        cos, sin = rotary[:, :1], rotary[:, 1:]  # (R n, 1, d) each
        x = (F.embedding(input_ids.reshape(rows * n), self.embedding) if inputs_embeds is None
             else inputs_embeds.reshape(rows * n, -1))  # (R n, hidden)
        states = [x]  # the residual stream after 0, 1, ... layers: references, no copies
        for index, (layer, window) in enumerate(zip(self.layers, self.windows)):
            attended = self._attend(layer, x, cache, index, cos, sin, masks[window])
            x = (x if layer.hidden_norm is None else x[:, self.hidden:]) + attended  # EAGLE-3's residual: the feature
            gate, up = F.linear(self._rms_norm(x, layer.post_norm), layer.gate_up).chunk(2, -1)
            x = x + F.linear(F.silu(gate) * up, layer.down)
            states.append(x)
        features = self._rms_norm(x, self.norm).view(rows, n, -1)  # (R, n, hidden)
        if self.head is None:  # a bare stack
            return Output(last_hidden_state=features, past_key_values=cache)
        kept = features[:, -logits_to_keep:] if isinstance(logits_to_keep, int) else features[:, logits_to_keep]
        logits = F.linear(kept, self.head)  # (R, keep, vocab)
        hidden = tuple(state.view(rows, n, -1) for state in states[:-1]) + (features,) if output_hidden_states else None
        return Output(logits=logits, past_key_values=cache, hidden_states=hidden)


_DECODERS = weakref.WeakKeyDictionary()  # model -> its Decoder
ENABLED = True  # False: every model keeps Hugging Face's forward (to compare the two)


@contextmanager
def hugging_face_forward():
    """Within this block the engine runs every model with Hugging Face's forward, to compare the two. (A
    `specbook.graphs.StaticModel` made before keeps the forward it was made with.)"""
    global ENABLED
    saved, ENABLED = ENABLED, False
    try:
        yield
    finally:
        ENABLED = saved


def decoder_for(model) -> Decoder | None:
    """``model``'s `Decoder` (made once, remade if the model moved), or None where it keeps Hugging Face's
    forward: a model or configuration `serves` declines, or ``ENABLED`` off."""
    if not ENABLED or serves(model) is not None:
        return None
    return _decoder(model)


def _decoder(model) -> Decoder:
    """``model``'s `Decoder`, made on first use and again after the model moved."""
    decoder = _DECODERS.get(model)
    if decoder is None or not decoder.current():
        decoder = _DECODERS[model] = Decoder(model)
    return decoder


def cache_and_forward(model, max_length: int, static: bool = False):
    """A new KV cache for ``model`` with room for ``max_length`` tokens, and what to call the model with over
    it: its `Decoder` and a `SlotCache` where it has one, else the model itself and a transformers cache
    (``static``: a `StaticCache` of that length; else a `DynamicCache`, which needs no length)."""
    decoder = decoder_for(model)
    if decoder is None:
        return new_cache(model, max_length if static else None), model
    return decoder.new_cache(max_length, static), decoder


def forward_over(model, cache):
    """What runs ``model`` over ``cache``: its `Decoder` for a `SlotCache` (which only a decoder makes, so even
    inside `hugging_face_forward`), else the model."""
    return _decoder(model) if isinstance(cache, SlotCache) else model


def forward_name(model) -> str:
    """Which forward the engine runs ``model`` with, in words (for benchmark tables and results files)."""
    reason = serves(model) if ENABLED else "specbook.decoder.ENABLED is off"
    return "specbook.decoder" if reason is None else f"Hugging Face's ({reason})"

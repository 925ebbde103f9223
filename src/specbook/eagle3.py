"""EAGLE-3's draft head (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language Models
via Training-Time Test"), and the training-time test that trains it.

EAGLE (`specbook.heads.EagleHead`) predicts the target's next *feature* and reads a token off it with the
target's LM head; its loss is mostly the feature regression. EAGLE-3 changes three things:

- **No feature regression** (Section 3.1). The head predicts tokens: its output a_{t+1} goes through a
  norm and an LM head of its own, and the loss compares that distribution with the target's q alone.
  a_{t+1} is free to be whatever helps the next token most, not a copy of the target's feature.
- **Fused features** (Section 3.2). The head reads the residual stream after a low, a middle and a high
  layer of the target (``feature_layers``; by default after layers 2, L/2 and L - 3 of L, as the paper's
  code does), side by side, projected by one matrix to the target's width: g_t = W_fuse [l_t; m_t; h_t].
  The top layer's feature is fitted to the next token; the lower ones still carry what comes after it.
- **Training-time test** (Section 3.3). At test time the head drafts on its own outputs: the pair
  (g_t, x_{t+1}) gives a_{t+1}, then (a_{t+1}, d_1) gives a_{t+2}, and so on. Trained only on true
  features (step 0), its later steps read inputs it never saw. `ttt_predictions` unrolls the head
  ``steps`` times during training, each step on the outputs of the one before, with the mask it
  needs: the queries of step j at position t see step 0's keys at positions <= t and their own
  chain's keys of steps 1 .. j at t -- exactly what a chain drafted after position t sees.

Serving systems also give the head a **reduced vocabulary**: its LM head scores only the ``vocab``
token ids (the most frequent ones of the training text), and the draft's p is zero elsewhere.
Verification stays exact (a token with p = 0 is simply never drafted: the residual max(q - p, 0)
keeps all of q's mass there); only α can drop, where the target wants a token the draft cannot propose.

The layer is the paper's (its code's ``midlayer``, vLLM's ``llama_eagle3``): `Eagle3DecoderLayer`, whose q, k
and v projections read the token's embedding and g_t (or a_t) side by side, 2 x hidden wide, each through
its own RMSNorm, with g_t as the residual; EAGLE's ``fc`` before the layer is gone. It sits in a one-layer
`transformers` LlamaModel fed through ``inputs_embeds`` (rotary positions, causal and tree masks, a KV cache,
a final norm), which the package's decoder runs too. The token embedding is the target's, frozen and not
saved; `specbook.export` writes the head in the layout vLLM's and SGLang's EAGLE-3 loaders read.
"""

import copy

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from .cache import new_cache
from .heads import EagleHead
from .masks import attention_inputs

TTT_STEPS = 3  # the training-time test's unrolled steps on the built-in target (the paper's code uses 7)


def default_feature_layers(config) -> tuple[int, int, int]:
    """EAGLE-3's low, middle and high layers of a target of L layers: the residual stream after layers 2, L // 2
    and L - 3 (Hugging Face's ``hidden_states`` indices), kept inside [1, L - 1]."""
    layers = config.num_hidden_layers
    return tuple(min(max(layer, 1), layers - 1) for layer in (2, layers // 2, layers - 3))


def check_feature_layers(feature_layers, layers: int) -> tuple[int, ...]:
    """``feature_layers`` as a tuple, refused unless each is in [1, ``layers`` - 1] (the residual stream after that
    many of the target's layers) or -1 (its features: the final norm's output)."""
    if isinstance(feature_layers, int) or not len(feature_layers):
        raise ValueError(f"feature_layers must be a non-empty sequence of layer indices (got {feature_layers!r})")
    for layer in feature_layers:
        if not isinstance(layer, int) or isinstance(layer, bool) or not (1 <= layer < layers or layer == -1):
            raise ValueError(f"feature_layers must hold indices in [1, {layers - 1}] (the residual stream after that "
                             f"many of the target's {layers} layers) or -1 (its features) (got {feature_layers!r})")
    return tuple(feature_layers)


class Eagle3DecoderLayer(LlamaDecoderLayer):
    """EAGLE-3's decoder layer (Section 3.2 and the paper's code): its input is the token's embedding and the feature
    side by side, [e(x_{t+1}); g_t] (batch, n, 2 x hidden); q, k and v read both, each half through its own RMSNorm
    (``input_layernorm`` the embedding's, ``hidden_norm`` the feature's), and the feature is the residual."""

    def __init__(self, config, layer_idx: int = 0):
        super().__init__(config, layer_idx)
        for name in ("q_proj", "k_proj", "v_proj"):
            projection = getattr(self.self_attn, name)
            setattr(self.self_attn, name, nn.Linear(2 * config.hidden_size, projection.out_features,
                                                    bias=projection.bias is not None))
        self.hidden_norm = type(self.input_layernorm)(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
                position_embeddings=None, **kwargs):
        embeddings, features = hidden_states.chunk(2, -1)  # (batch, n, hidden) each
        paired = torch.cat([self.input_layernorm(embeddings), self.hidden_norm(features)], -1)  # (batch, n, 2 hidden)
        attended, _ = self.self_attn(hidden_states=paired, attention_mask=attention_mask, position_ids=position_ids,
                                     past_key_values=past_key_values, use_cache=use_cache,
                                     position_embeddings=position_embeddings, **kwargs)
        hidden = features + attended
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3Head(EagleHead):
    """EAGLE-3's head for a target with ``config`` (Llama-style): ``fuse`` g_t = W [h_l1; h_l2; h_l3], then
    `Eagle3DecoderLayer` on [e(x_{t+1}); g_t or a_t], then an LM head of its own over ``vocab``.

    ``feature_layers``: which of the target's hidden states it reads (`check_feature_layers`; default
    `default_feature_layers`). ``vocab``: the target token ids the draft can propose (default: all
    ``config.vocab_size``), in increasing order. ``token_order``, if known, ranks the target's token ids by
    their frequency in the training text, for `with_vocabulary`. `for_target` starts the LM head from the
    target's rows.
    """

    kind = "eagle3"

    def __init__(self, config, feature_layers=None, vocab=None, token_order=None):
        super().__init__(config)
        del self.fc  # the layer reads the pair itself
        self.layer.layers[0] = Eagle3DecoderLayer(self.layer.config)
        layers = check_feature_layers(default_feature_layers(config) if feature_layers is None
                                      else feature_layers, config.num_hidden_layers)
        self.feature_layers, self.target_layers = layers, config.num_hidden_layers
        self.target_vocab = config.vocab_size
        vocab = check_vocab(vocab if vocab is not None else range(self.target_vocab), self.target_vocab)
        self.register_buffer("vocab", torch.tensor(vocab), persistent=False)  # (draft vocab,): draft row -> token id
        self.token_order = list(token_order) if token_order is not None else None
        self.fuse = nn.Linear(len(layers) * self.hidden_size, self.hidden_size, bias=False)
        self.lm_head = nn.Linear(self.hidden_size, len(vocab), bias=False)

    @classmethod
    def for_target(cls, target, feature_layers=None, vocab=None, token_order=None) -> "Eagle3Head":
        """An untrained head for ``target``, its LM head the target's rows of ``vocab``."""
        head = cls(target.config, feature_layers, vocab, token_order).to(target.device, target.dtype)
        head.check_target(target)
        with torch.no_grad():
            head.lm_head.weight.copy_(target.get_output_embeddings().weight[head.vocab])
        return head.requires_grad_(True)

    def check_target(self, target) -> None:
        """Refuse a ``target`` of another width, depth or vocabulary than the one this head was built for."""
        super().check_target(target)
        config = target.config
        if (config.num_hidden_layers, config.vocab_size) != (self.target_layers, self.target_vocab):
            raise ValueError(f"the eagle3 head was built for a target of {self.target_layers} layers and "
                             f"{self.target_vocab} tokens; this target has {config.num_hidden_layers} and "
                             f"{config.vocab_size}: a head only fits the target it was trained on")

    def pair(self, features: torch.Tensor, token_embeddings: torch.Tensor) -> torch.Tensor:
        """The layer's input: [e(x_{t+1}); g_t or a_t] (batch, n, 2 x hidden), the embedding first, as the paper's."""
        return torch.cat([token_embeddings, features], -1)

    def fused(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's hidden states side by side (..., len(feature_layers) * hidden) -> g (..., hidden)."""
        return self.fuse(hidden)

    def logits(self, predicted: torch.Tensor) -> torch.Tensor:
        """The draft's logits (..., target vocab) from the head's outputs (..., hidden): its LM head's scores on
        ``vocab``, -inf on every other token (p = 0 there)."""
        scores = self.lm_head(predicted)  # (..., draft vocab)
        if len(self.vocab) == self.target_vocab:
            return scores
        full = scores.new_full((*scores.shape[:-1], self.target_vocab), float("-inf"))
        return full.index_copy_(-1, self.vocab, scores)

    def with_vocabulary(self, vocab) -> "Eagle3Head":
        """A copy that proposes only ``vocab``: an int keeps that many of the most frequent tokens of the training
        text (``token_order``), a sequence those token ids. Its LM head keeps those rows of this one's (every id must
        be in this head's vocabulary); the rest is copied unchanged."""
        if isinstance(vocab, int) and not isinstance(vocab, bool):
            if not 1 <= vocab <= len(self.vocab):
                raise ValueError(f"vocab must be in [1, {len(self.vocab)}], the tokens this head can propose "
                                 f"(got {vocab})")
            if self.token_order is None:
                raise ValueError("vocab as a number needs the token frequencies of the head's training text "
                                 "(token_order); pass the token ids instead")
            own = set(self.vocab.tolist())
            vocab = [token for token in self.token_order if token in own][:vocab]
        vocab = check_vocab(vocab, self.target_vocab)
        rows = {token: row for row, token in enumerate(self.vocab.tolist())}
        missing = [token for token in vocab if token not in rows]
        if missing:
            raise ValueError(f"vocab holds token ids this head cannot propose (e.g. {missing[:5]}): a reduced "
                             "vocabulary keeps rows of the head's own LM head")
        head = copy.deepcopy(self)
        head.vocab = torch.tensor(vocab, device=self.vocab.device)
        head.lm_head = nn.Linear(self.hidden_size, len(vocab), bias=False).to(self.lm_head.weight)
        with torch.no_grad():
            head.lm_head.weight.copy_(self.lm_head.weight[[rows[token] for token in vocab]])
        return head

    def accuracy_pairs(self, target, input_ids: torch.Tensor, steps: int = TTT_STEPS) -> list:
        """Per unrolled step j of the training-time test on ``input_ids`` (batch, n + 1), the draft's logits
        (batch, n - j - 1, vocab) and the text's tokens they score (batch, n - j - 1), for
        `specbook.heads.head_accuracy` (the last base's token lies past the text)."""
        return [(self.logits(outputs[:, : input_ids.shape[1] - step - 2]).float(), input_ids[:, step + 2:])
                for step, (outputs, _) in enumerate(ttt_predictions(self, target, input_ids, steps))]

    def _config(self):
        return {**super()._config(), "feature_layers": list(self.feature_layers), "target_layers": self.target_layers,
                "target_vocab": self.target_vocab, "vocab": self.vocab.tolist(), "token_order": self.token_order}

    @classmethod
    def _from_config(cls, config, target):
        from transformers import LlamaConfig

        fields = {name: config.pop(name) for name in ("feature_layers", "target_layers", "target_vocab", "vocab",
                                                      "token_order")}
        layer_config = LlamaConfig(**config, num_hidden_layers=fields["target_layers"],
                                   vocab_size=fields["target_vocab"])
        return cls(layer_config, fields["feature_layers"], fields["vocab"], fields["token_order"])


def check_vocab(vocab, target_vocab: int) -> list[int]:
    """``vocab`` as a sorted list of distinct token ids, refused unless each is in [0, ``target_vocab``)."""
    ids = [int(token) for token in (vocab.tolist() if torch.is_tensor(vocab) else vocab)]
    if not ids or len(set(ids)) != len(ids) or min(ids) < 0 or max(ids) >= target_vocab:
        raise ValueError(f"vocab must hold distinct token ids in [0, {target_vocab}), the target's vocabulary, at "
                         f"least one (got {len(ids)} ids" + (f" from {min(ids)} to {max(ids)})" if ids else ")"))
    return sorted(ids)


def ttt_predictions(head: Eagle3Head, target, input_ids: torch.Tensor, steps: int = TTT_STEPS):
    """The training-time test on ``input_ids`` (batch, n + 1): the head unrolled ``steps`` times on its own outputs.

    Step 0 reads the pairs (g_t, x_{t+1}), t = 0 .. n - 1, from the target's true hidden states; step j
    reads (a^{j-1}_t, x_{t+j+1}) at position t + j, a^{j-1}_t the head's output of the step before at the
    same base t, and attends to step 0's keys up to t and to its own chain's keys of steps 1 .. j (Section 3.3).
    Step j's output at base t scores x_{t+j+2}. Returns, per step, the head's outputs a^j (batch, n - j, hidden)
    and the target's logits at the positions that score the same tokens (batch, n - j, target vocab).
    """
    n = input_ids.shape[1] - 1
    with torch.no_grad():
        outputs = target(input_ids, output_hidden_states=True)
        hidden = torch.cat([outputs.hidden_states[layer] for layer in head.feature_layers], -1)  # (batch, n + 1, .)
        target_logits = outputs.logits.float()  # (batch, n + 1, target vocab)
        embeddings = target.get_input_embeddings()(input_ids)  # (batch, n + 1, hidden)
    inputs = head.fused(hidden[:, :n])  # (batch, n, hidden): g_t
    cache, predictions = new_cache(head.layer), []  # the earlier steps' keys and values, kept for autograd
    positions = _block_positions(steps, n).to(inputs.device)  # (steps n,)
    mask = ttt_mask(steps, n)  # (steps n, steps n)
    for step in range(steps):
        tokens = embeddings[:, step + 1:]  # (batch, n - step, hidden): x_{t+step+1} for t = 0 .. n - step - 1
        tokens = torch.cat([tokens, tokens.new_zeros(tokens.shape[0], step, tokens.shape[2])], 1)  # padded to n
        rows = slice(step * n, (step + 1) * n)  # this step's queries, on top of the earlier steps' keys
        inputs = head(inputs, tokens, cache, **attention_inputs(
            mask[rows, : (step + 1) * n][None], positions[None, rows], positions[None, : (step + 1) * n],
            inputs.dtype, inputs.device))  # (batch, n, hidden): a^step_t
        predictions.append((inputs[:, : n - step], target_logits[:, step + 1:]))
    return predictions


def _block_positions(blocks: int, n: int) -> torch.Tensor:
    """Position ids of ``blocks`` unrolled steps of n bases each: step j at base t sits at t + j."""
    return torch.cat([torch.arange(n) + block for block in range(blocks)])


def ttt_mask(steps: int, n: int) -> torch.Tensor:
    """The training-time test's attention mask over ``steps`` unrolled steps of n bases, (steps n, steps n) bool,
    step by step: the query of step j at base t sees step 0's keys at bases <= t and the keys of steps 1 .. j at
    base t -- its own chain, what a chain drafted after position t sees at test time."""
    base = torch.arange(n)
    causal, same = base[None] <= base[:, None], torch.eye(n, dtype=torch.bool)
    visible = torch.zeros(steps * n, steps * n, dtype=torch.bool)
    for query in range(steps):
        visible[query * n:(query + 1) * n, :n] = causal
        for key in range(1, query + 1):
            visible[query * n:(query + 1) * n, key * n:(key + 1) * n] = same
    return visible


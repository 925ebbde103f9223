"""Encoder-decoder models in the one engine: the encoder runs once, then the decoder decodes like a causal LM.

Speculative decoding of an encoder-decoder model (Whisper with distil-whisper as its draft; T5,
BART, Marian) is the same method with different bookkeeping (Gandhi et al. 2023, distil-whisper,
Section 6): the encoder reads the input once per generation, and every decoder call attends to
its states through cross-attention, whose keys and values are computed on the first call and
never change; the decoder's self-attention cache grows and rolls back as a causal LM's does.

`EncoderDecoderView` binds a model to one input's encoder states and is called like a causal
LM on decoder tokens: ``view(decoder_ids, past_key_values=cache, use_cache=True, logits_to_keep=n)``.
So the engine's loops, verifiers and rollback run unchanged on it. Its cache
(`specbook.cache.new_cache`) is an ``EncoderDecoderCache`` whose ``crop`` cuts the self-attention
half only -- the rollback the method needs. A draft model may read the target's encoder states
(distil-whisper's decoder was trained on the target's frozen encoder, so the encoder runs once for
both) or run its own encoder (`specbook.drafters.ModelDrafter`'s ``encoder``). Token trees, heads
and lookahead are refused here for now: their masks and position ids are the decoder-only ones.
"""

import torch

from .models import check_token_ids


def is_encoder_decoder(model) -> bool:
    return bool(getattr(model.config, "is_encoder_decoder", False))


def reads_tokens(model) -> bool:
    """Whether ``model``'s encoder reads token ids (T5, BART, Marian) rather than features (Whisper's
    ``input_features``, a log-mel spectrogram): its ``main_input_name``."""
    return model.main_input_name == "input_ids"


def check_encoder_inputs(model, inputs, attention_mask=None) -> None:
    """Refuse what ``model``'s encoder cannot read: token ids (1, S) with S >= 1 for a text encoder, a float
    tensor with a batch of one for an encoder of features (Whisper's); a mask of the token ids' shape."""
    shape = tuple(inputs.shape) if isinstance(inputs, torch.Tensor) else inputs
    if reads_tokens(model):
        if not isinstance(inputs, torch.Tensor) or inputs.ndim != 2 or inputs.shape[0] != 1 or not inputs.shape[1]:
            raise ValueError(f"input_ids must be the encoder's input, a (1, S) tensor of token ids with S >= 1 (got "
                             f"{shape!r})")
        check_token_ids(inputs, model.get_encoder(), "input_ids (the encoder's input)")
    elif not isinstance(inputs, torch.Tensor) or not inputs.is_floating_point() or inputs.ndim < 2 \
            or inputs.shape[0] != 1:
        raise ValueError(f"{type(model).__name__}'s encoder reads {model.main_input_name}, not token ids: pass them "
                         f"as input_ids, a float tensor with a batch of one, e.g. (1, mels, frames) (got {shape!r})")
    if attention_mask is not None and not reads_tokens(model):
        raise ValueError(f"{type(model).__name__}'s encoder reads all of its {model.main_input_name}: pass no "
                         "attention_mask (pad the features instead, as its feature extractor does)")
    if attention_mask is not None and (not isinstance(attention_mask, torch.Tensor)
                                       or attention_mask.shape != inputs.shape):
        got = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else attention_mask
        raise ValueError(f"attention_mask must have the shape of input_ids, {tuple(inputs.shape)} (got {got!r})")


def encode(model, inputs: torch.Tensor, attention_mask: torch.Tensor | None = None):
    """The encoder's output for ``inputs``: token ids (1, S), or features such as Whisper's log-mel spectrogram
    (1, mels, frames). Run once per generation."""
    masked = {"attention_mask": attention_mask} if attention_mask is not None else {}
    return model.get_encoder()(**{model.main_input_name: inputs}, **masked, return_dict=True)


def decoder_start(model, device) -> torch.Tensor:
    """(1, 1): the token a decoder starts from, ``decoder_start_token_id`` (as ``generate`` reads it)."""
    start = getattr(model.generation_config, "decoder_start_token_id", None)
    start = start if start is not None else model.config.decoder_start_token_id
    if start is None:
        raise ValueError(f"{type(model).__name__} has no decoder_start_token_id in its config or generation "
                         "config: pass decoder_input_ids to say where its decoder starts")
    return torch.tensor([[start]], device=device)


class EncoderDecoderView(torch.nn.Module):
    """``model``'s decoder with ``encoder_outputs`` bound: called like a causal LM on decoder tokens.

    ``encoder_attention_mask`` (1, S) hides padding in the encoder's input from cross-attention.
    """

    def __init__(self, model, encoder_outputs, encoder_attention_mask: torch.Tensor | None = None):
        super().__init__()
        self.model = model
        self.encoder_outputs, self.encoder_attention_mask = encoder_outputs, encoder_attention_mask
        self.config, self.generation_config = model.config, model.generation_config

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def get_input_embeddings(self):
        return self.model.get_decoder().get_input_embeddings()

    def get_output_embeddings(self):
        return self.model.get_output_embeddings()

    def forward(self, input_ids, past_key_values=None, use_cache=True, logits_to_keep: int = 0,
                output_hidden_states: bool = False):
        """Decoder tokens ``input_ids`` (1, n) after ``past_key_values``; logits (1, n or logits_to_keep, vocab)."""
        outputs = self.model(encoder_outputs=self.encoder_outputs, attention_mask=self.encoder_attention_mask,
                             decoder_input_ids=input_ids, past_key_values=past_key_values, use_cache=use_cache,
                             output_hidden_states=output_hidden_states)
        if logits_to_keep:
            outputs.logits = outputs.logits[:, -logits_to_keep:]
        return outputs

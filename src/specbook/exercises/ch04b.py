"""Checkers for the exercises of chapter 4b, encoder-decoder models: greedy decoding that runs the
encoder once, what the decoder reads when it learns by teacher forcing, how far each of the
decoder's two caches goes back after a step, and the speedup of a pair whose encoders run once
per generation.

The references are the package's where it has one: `specbook.autoregressive_generate` for the
tokens of greedy decoding (tests/test_exercises.py checks the reference against it on a tiny random
BART, one of the cases here), the rollback of `specbook.seq2seq` (the self-attention half of an
``EncoderDecoderCache`` is cropped, the cross-attention half is kept), and `specbook.theory` for
the tokens per step in the speedup, with the encoders' one pass added to both sides.
"""

from __future__ import annotations

import math

import torch

from ..theory import expected_tokens_per_step, speedup
from ..train.seq2seq import shift_right
from .ch03 import _tokens_per_step_error
from .core import Case, Check, _as_float, _as_int, _as_token_list, _same_number, _type_name

# --- Greedy decoding, the encoder once ---------------------------------------------------------------


class Encoder:
    """``encoder(source) -> states``: the rule or model behind it, with every call counted in ``calls``."""

    def __init__(self, label: str, rule):
        self.label, self._rule, self.calls = label, rule, 0

    def __call__(self, source):
        self.calls += 1
        return self._rule(list(source))

    def __repr__(self) -> str:
        return f"<encoder of {self.label}>"


class DecoderStep:
    """``decoder_step(states, tokens) -> the next token``: greedy, after the decoder's ``tokens`` so far."""

    def __init__(self, label: str, rule):
        self.label, self._rule = label, rule

    def __call__(self, states, tokens) -> int:
        tokens = [int(token) for token in tokens]
        if not tokens:
            raise ValueError("decoder_step needs at least the start token: the decoder predicts after it")
        return int(self._rule(states, tokens))

    def __repr__(self) -> str:
        return f"<decoder_step of {self.label}>"


def greedy_seq2seq_reference(encoder, decoder_step, source, start_token: int, max_new_tokens: int) -> list[int]:
    """The encoder reads the source once; the decoder starts from ``start_token`` and adds its greedy token
    ``max_new_tokens`` times. The new tokens only, as `specbook.autoregressive_generate` returns them."""
    states = encoder(source)
    tokens = [start_token]
    for _ in range(max_new_tokens):
        tokens.append(decoder_step(states, tokens))
    return tokens[1:]


def _copy_rule(states, tokens):  # copies the source, one token a step, and goes round again
    return states[(len(tokens) - 1) % len(states)]


def _mixing_rule(states, tokens):  # reads the source at a place set by the last token, adds the step
    return (states[tokens[-1] % len(states)] + len(tokens)) % 50


def tiny_seq2seq_parts(seed: int = 0):
    """A tiny random BART (32 wide, 2 layers a side, 64 tokens) as an encoder and a greedy decoder step."""
    import transformers

    config = transformers.BartConfig(vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2,
                                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                                     decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=0, eos_token_id=1,
                                     bos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = transformers.BartForConditionalGeneration(config).eval()
        head = model.get_output_embeddings()
        head.weight = torch.nn.Parameter(torch.randn(head.weight.shape) * 2)  # clear greedy choices

    def encode(source):
        with torch.inference_mode():
            return model.get_encoder()(input_ids=torch.tensor([source])).last_hidden_state

    def step(states, tokens):
        with torch.inference_mode():
            return model(encoder_outputs=(states,), decoder_input_ids=torch.tensor([tokens])).logits[0, -1].argmax()
    return model, encode, step


def _greedy_seq2seq_cases() -> list[Case]:
    _, encode, step = tiny_seq2seq_parts()
    settings = [  # (label, encoder rule, decoder rule, source, start token, max_new_tokens)
        ("a copying decoder", lambda source: source, _copy_rule, [7, 3, 9, 4], 0, 6),
        ("a decoder that reads the source where its last token points", lambda source: source[::-1], _mixing_rule,
         [11, 5, 23, 8, 2], 1, 7),
        ("one new token", lambda source: [sum(source) % 50], _mixing_rule, [4, 4, 4], 2, 1),
        ("a tiny random BART", encode, step, [5, 17, 33, 8, 21, 40], 2, 8),
    ]
    cases = []
    for label, encoder_rule, decoder_rule, source, start, new_tokens in settings:
        encoder, decoder_step = Encoder(label, encoder_rule), DecoderStep(label, decoder_rule)
        expected = greedy_seq2seq_reference(Encoder(label, encoder_rule), decoder_step, source, start, new_tokens)
        cases.append(Case(f"{label}, {new_tokens} new tokens after start token {start}",
                          (encoder, decoder_step, source, start, new_tokens), expected))
    return cases


def _compare_greedy_seq2seq(got, case: Case) -> str | None:
    encoder, decoder_step, source, start, new_tokens = case.args
    got = _as_token_list(got, "a list of token ids")
    calls, encoder.calls = encoder.calls, 0
    if calls != 1 and got == case.expected:
        return (f"the tokens are right, but the encoder ran {calls} times. Its output depends on the source only: "
                "run it once, before the loop, and hand the same states to every decoder step.")
    if got == case.expected:
        return None
    message = f"expected {case.expected}, got {got}"
    if got == [start] + case.expected[:-1] or got == [start] + case.expected:
        return f"{message}: the start token is in the answer. Return the new tokens only."
    if len(got) != len(case.expected):
        return f"{message}: {len(got)} tokens where max_new_tokens = {new_tokens}."
    states = encoder._rule(list(source))
    without_start, tokens = [], [start]
    for _ in range(new_tokens):
        without_start.append(decoder_step(states, tokens[1:] or [start]))
        tokens.append(without_start[-1])
    if got == without_start:
        return f"{message}: the decoder must see the start token first, as it did in training."
    return f"{message}. Feed the decoder the start token and every token so far, and append its answer each step."


check_greedy_seq2seq = Check("greedy_seq2seq", _greedy_seq2seq_cases, _compare_greedy_seq2seq)

# --- Teacher forcing: what the decoder reads ----------------------------------------------------------------


def _shift_cases() -> list[Case]:
    settings = [  # (label, labels, start token, pad token)
        ("one row", [[5, 9, 2, 1]], 0, 3),
        ("two rows, the second padded", [[7, 8, 9, 1], [4, 1, -100, -100]], 2, 0),
        ("a start token that is also the end token", [[11, 12, 0], [13, 0, -100]], 0, 15),
        ("one token per row", [[6], [7], [8]], 1, 0),
    ]
    return [Case(f"{label}: labels = {rows}, start_token = {start}, pad_token = {pad}",
                 (torch.tensor(rows), start, pad), shift_right(torch.tensor(rows), start, pad))
            for label, rows, start, pad in settings]


def _compare_shift(got, case: Case) -> str | None:
    labels, start, pad = case.args
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(labels.shape):
        return f"expected a tensor of shape {tuple(labels.shape)}, like labels, got {_type_name(got)}."
    if torch.equal(got.long(), case.expected):
        return None
    message = f"expected {case.expected.tolist()}, got {got.tolist()}"
    if torch.equal(got, labels):
        return f"{message}: that is the labels themselves. The decoder would read each token it must predict."
    if (got == -100).any():
        return f"{message}: -100 marks positions the loss ignores; no embedding has that row. Read them as pad_token."
    if got.shape[1] > 1 and torch.equal(got[:, :-1], labels[:, 1:].masked_fill(labels[:, 1:] == -100, pad)):
        return f"{message}: that shifts left. Position t reads the token before label t: shift right."
    if not (got[:, 0] == start).all():
        return f"{message}: every row starts with the start token, the decoder's first input at generation time too."
    return f"{message}. Row by row: the start token, then the labels but the last."


check_shift_right = Check("shift_right", _shift_cases, _compare_shift)

# --- Which cache rolls back -------------------------------------------------------------------------------------


def seq2seq_rollback_reference(self_length: int, cross_length: int, k: int, accepted: int) -> tuple[int, int]:
    """After a verification call on [pending, d_1, ..., d_K] the self-attention cache holds ``self_length``
    positions, the last K of them drafts; ``accepted`` were kept. Crop the K - accepted rejected ones; the
    cross-attention cache holds the encoder's states, which no draft changed: it keeps all of them."""
    return self_length - (k - accepted), cross_length


def _rollback_cases() -> list[Case]:
    settings = [  # (label, self_length, cross_length, k, accepted)
        ("two of four accepted", 12, 30, 4, 2),
        ("none accepted", 9, 16, 3, 0),
        ("all accepted", 20, 8, 5, 5),
        ("the first step after the prompt", 6, 25, 5, 1),
        ("a source longer than the output", 7, 120, 2, 1),
    ]
    return [Case(f"{label}: self_length = {own}, cross_length = {cross}, k = {k}, accepted = {accepted}",
                 (own, cross, k, accepted), seq2seq_rollback_reference(own, cross, k, accepted))
            for label, own, cross, k, accepted in settings]


def _compare_rollback(got, case: Case) -> str | None:
    self_length, cross_length, k, accepted = case.args
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return f"expected two lengths (self-attention, cross-attention), got {_type_name(got)}."
    got = (_as_int(got[0], "the self-attention cache's length"), _as_int(got[1], "the cross-attention cache's length"))
    if got == case.expected:
        return None
    message = f"expected {case.expected}, got {got}"
    if got[0] == case.expected[0]:
        return (f"{message}: the cross-attention cache holds the keys and values of the encoder's {cross_length} "
                "states. No draft touched them, so nothing there rolls back.")
    if got[0] == self_length - (k + 1 - accepted):
        return f"{message}: that crops the pending token too. It was verified and stays; crop the rejected drafts."
    if got[0] == self_length - accepted:
        return f"{message}: that crops the accepted drafts. Crop the k - accepted that were rejected."
    return f"{message}. The last k positions of the self-attention cache are drafts; keep the accepted ones."


check_seq2seq_rollback = Check("seq2seq_rollback", _rollback_cases, _compare_rollback)

# --- The speedup, with the encoders ----------------------------------------------------------------------------


def encoder_decoder_speedup_reference(alpha: float, k: int, cost_ratio: float, tokens: int, encoder_cost: float,
                                      draft_encoder_cost: float) -> float:
    """Time of autoregressive over speculative decoding for ``tokens`` new tokens, in target decoder calls.
    Both run the target's encoder once; the draft's own encoder runs once more (0 where the draft reads the
    target's states). Speculative decoding takes tokens / E[tokens per step] steps of c·K + 1."""
    steps = tokens / expected_tokens_per_step(alpha, k)
    return (encoder_cost + tokens) / (encoder_cost + draft_encoder_cost + steps * (cost_ratio * k + 1))


def _speedup_cases() -> list[Case]:
    settings = [  # (label, alpha, k, c, tokens, encoder, draft encoder)
        ("the draft reads the target's encoder states", 0.8, 4, 0.1, 40, 2.0, 0.0),
        ("the draft has an encoder of its own", 0.8, 4, 0.1, 40, 2.0, 0.7),
        ("a long audio clip and a short transcript: the encoder dominates", 0.7, 3, 0.15, 10, 30.0, 10.0),
        ("a long output", 0.6, 5, 0.05, 400, 3.0, 1.0),
        ("every draft accepted", 1.0, 4, 0.2, 50, 1.0, 0.5),
        ("no draft accepted", 0.0, 2, 0.1, 20, 1.0, 0.0),
    ]
    return [Case(f"{label}: alpha = {alpha}, k = {k}, cost_ratio = {c}, tokens = {tokens}, encoder_cost = {enc}, "
                 f"draft_encoder_cost = {draft_enc}", (alpha, k, c, tokens, enc, draft_enc),
                 encoder_decoder_speedup_reference(alpha, k, c, tokens, enc, draft_enc))
            for label, alpha, k, c, tokens, enc, draft_enc in settings]


def _compare_speedup(got, case: Case) -> str | None:
    alpha, k, cost_ratio, tokens, encoder_cost, draft_encoder_cost = case.args
    got = _as_float(got, "a number")
    if _same_number(got, case.expected):
        return None
    message = f"expected a speedup of {case.expected:.6g}, got {got:.6g}"
    if math.isnan(got) or math.isinf(got):
        return (f"{message}. At α = 1 the closed form is 0/0: every draft is accepted and a step emits K + 1 tokens. "
                "Use specbook.expected_tokens_per_step.")
    steps = tokens / expected_tokens_per_step(alpha, k)
    step_cost = cost_ratio * k + 1
    mistakes = [
        (speedup(alpha, k, cost_ratio), "the encoders are left out. Both methods run the target's encoder once; "
                                        "the draft's own encoder, if it has one, runs once more"),
        ((encoder_cost + tokens) / (encoder_cost + steps * step_cost),
         "the draft's own encoder is left out: it runs once per generation too"),
        (tokens * (1 + encoder_cost) / (steps * (step_cost + encoder_cost + draft_encoder_cost)),
         "the encoders run every step there. They read the source, which does not change: once per generation"),
        (tokens / (encoder_cost + draft_encoder_cost + steps * step_cost),
         "autoregressive decoding runs the target's encoder too"),
    ]
    for value, mistake in mistakes:
        if _same_number(got, value):
            return f"{message}: {mistake}."
    return (f"{message}. Autoregressive: encoder_cost + tokens. Speculative: encoder_cost + draft_encoder_cost + "
            "tokens / E[tokens per step] · (c·K + 1).")


check_encoder_decoder_speedup = Check("encoder_decoder_speedup", _speedup_cases, _compare_speedup,
                                      error_hint=_tokens_per_step_error)

"""Encoder-decoder models in the engine: greedy equals the target's own generate, sampling follows q, refusals.

Tiny random T5, BART and Marian models (two layers each side, 32 wide, a 96-token vocabulary), built
from their configs: no download. The draft is the target with noise on its LM head, so that it is
both accepted and rejected; one test drafts with a one-layer model of another width.
"""

import copy

import pytest
import torch
import transformers
from scipy.stats import chisquare

import specbook.decoding
from specbook import (LookaheadDrafter, NGramDrafter, PromptLookupDrafter, Sampler, autoregressive_generate,
                      speculative_generate)
from specbook.drafters import ModelDrafter

from support import tiny_model

VOCAB, NEW_TOKENS = 96, 20


def _config(family, layers, width, vocab):
    special = dict(pad_token_id=0, eos_token_id=1, bos_token_id=2, decoder_start_token_id=0 if family != "bart" else 2,
                   forced_eos_token_id=None, forced_bos_token_id=None)
    if family == "t5":
        return transformers.T5Config(vocab_size=vocab, d_model=width, d_kv=16, d_ff=2 * width, num_layers=layers,
                                     num_decoder_layers=layers, num_heads=2, **special)
    sizes = dict(vocab_size=vocab, d_model=width, encoder_layers=layers, decoder_layers=layers,
                 encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=2 * width,
                 decoder_ffn_dim=2 * width, max_position_embeddings=128, **special)
    return {"bart": transformers.BartConfig, "marian": transformers.MarianConfig}[family](**sizes)


def tiny_seq2seq(family, seed=0, layers=2, width=32, vocab=VOCAB):
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = transformers.AutoModelForSeq2SeqLM.from_config(_config(family, layers, width, vocab)).eval()
        head = model.get_output_embeddings()  # an LM head of its own, random: a tied one copies the input token
        head.weight = torch.nn.Parameter(torch.randn(head.weight.shape) * 2)  # peaked logits: clear greedy choices
    model.generation_config.eos_token_id = None  # generate() runs to max_new_tokens, like the engine
    return model


FAMILIES = ("t5", "bart", "marian")
_random = torch.Generator().manual_seed(0)
SOURCE = torch.randint(3, VOCAB, (1, 12), generator=_random)


def hf_greedy(model, source, new_tokens):
    output = model.generate(source, max_new_tokens=new_tokens, do_sample=False, attention_mask=torch.ones_like(source))
    return output[0, 1:].tolist()  # after the decoder's start token


def noisy_copy(model, noise=1.5, seed=1):
    """The model with noise on its LM head: a draft that agrees with it often, not always."""
    draft = copy.deepcopy(model)
    head = draft.get_output_embeddings()
    with torch.no_grad():
        head.weight.add_(noise * torch.randn(head.weight.shape, generator=torch.Generator().manual_seed(seed)))
    return draft


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    target = tiny_seq2seq(request.param)
    draft = noisy_copy(target)
    with torch.no_grad():
        reference = hf_greedy(target, SOURCE, NEW_TOKENS)
    return request.param, target, draft, reference


@pytest.mark.parametrize("method", ["autoregressive", "draft_own_encoder", "draft_target_encoder", "prompt_lookup",
                                    "nasd"])
def test_greedy_equals_the_targets_own_generate(family, method):
    name, target, draft, reference = family
    greedy = Sampler(0)
    drafters = {"draft_own_encoder": draft, "draft_target_encoder": ModelDrafter(draft, encoder="target"),
                "prompt_lookup": PromptLookupDrafter(), "nasd": NGramDrafter()}
    if method == "autoregressive":
        result = autoregressive_generate(target, SOURCE, NEW_TOKENS, greedy)
    else:
        result = speculative_generate(target, drafters[method], SOURCE, NEW_TOKENS, k=3, sampler=greedy)
    assert result.token_ids == reference, f"{name}: {method}"


def test_a_draft_rolls_back_and_accepts(family):
    """Drafts are both accepted and rejected: the self-attention cache is cropped, the cross-attention kept."""
    _, target, draft, reference = family
    result = speculative_generate(target, draft, SOURCE, NEW_TOKENS, k=3, sampler=Sampler(0))
    assert result.token_ids == reference
    rejected = [step for step in result.steps if step.accepted < len(step.drafted)]
    assert rejected and any(step.accepted for step in result.steps)


def test_prompt_lookup_reads_the_encoders_input_first():
    """The encoder's input (its unmasked tokens) is text the output may copy; read for one generation only."""
    drafter = PromptLookupDrafter()
    drafter.read_encoder(None, torch.tensor([[5, 6, 7, 0]]), torch.tensor([[1, 1, 1, 0]]))
    drafter.start(torch.tensor([[2, 5]]))
    assert drafter.tokens == [5, 6, 7, 2, 5] and drafter.propose(2, Sampler(0), None).tokens.tolist() == [6, 7]
    drafter.start(torch.tensor([[2, 5]]))
    assert drafter.tokens == [2, 5]


def test_the_encoder_runs_once_per_generation(family, monkeypatch):
    _, target, draft, reference = family
    calls = []
    encoder = target.get_encoder()
    original = encoder.forward
    monkeypatch.setattr(encoder, "forward", lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs))
    result = speculative_generate(target, ModelDrafter(draft, encoder="target"), SOURCE, NEW_TOKENS, k=3,
                                  sampler=Sampler(0))
    assert result.token_ids == reference and len(calls) == 1


def test_a_padded_encoder_input_is_masked(family):
    name, target, draft, _ = family
    padded = torch.cat([SOURCE, torch.zeros(1, 4, dtype=torch.long)], 1)
    mask = torch.cat([torch.ones_like(SOURCE), torch.zeros(1, 4, dtype=torch.long)], 1)
    output = target.generate(padded, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False)[0, 1:].tolist()
    result = speculative_generate(target, draft, padded, NEW_TOKENS, k=3, sampler=Sampler(0), attention_mask=mask)
    assert result.token_ids == output, name


# --- lossless under sampling

def _p_value(samples=600, length=3):
    """The chi-square test of tests/support.py, on a 3-token encoder-decoder target and a different draft."""
    import itertools

    target = tiny_seq2seq("bart", seed=3, width=8, vocab=3)
    draft = tiny_seq2seq("bart", seed=4, width=8, layers=1, vocab=3)
    source, sampler = torch.tensor([[0, 1, 2]]), Sampler(1.0)
    exact = {}
    with torch.no_grad():
        for sequence in itertools.product(range(3), repeat=length):
            decoder = torch.tensor([[2, *sequence]])  # after BART's decoder start token
            probs = sampler.probs(target(input_ids=source, decoder_input_ids=decoder).logits[0, :-1])
            exact[sequence] = float(probs[torch.arange(length), list(sequence)].prod())
    counts = dict.fromkeys(exact, 0)
    for seed in range(samples):
        result = speculative_generate(target, draft, source, length, k=2, sampler=sampler, seed=seed)
        counts[tuple(result.token_ids)] += 1
    big = [s for s in exact if exact[s] * samples >= 5]
    observed = [counts[s] for s in big] + [samples - sum(counts[s] for s in big)]
    expected = [exact[s] * samples for s in big] + [samples - sum(exact[s] * samples for s in big)]
    scale = sum(observed) / sum(expected)
    return chisquare(observed, [value * scale for value in expected]).pvalue


def test_sampled_output_follows_the_target():
    assert _p_value() > 1e-3


def test_chi_square_catches_a_self_attention_cache_left_unrolled(monkeypatch):
    """Rejected drafts left in the decoder's self-attention cache change what the target sees next."""
    monkeypatch.setattr(specbook.decoding, "rollback", lambda cache, num_tokens: None)
    assert _p_value(samples=400) < 1e-6


# --- bad input gets a clear error

def test_a_decoder_only_draft_is_refused():
    target = tiny_seq2seq("t5")
    with pytest.raises(ValueError, match="is decoder-only and the target is an encoder-decoder model"):
        speculative_generate(target, tiny_model(vocab_size=VOCAB), SOURCE, 4, k=2)


def test_an_encoder_decoder_draft_for_a_decoder_only_target_is_refused():
    with pytest.raises(ValueError, match="is an encoder-decoder model and the target is decoder-only"):
        speculative_generate(tiny_model(vocab_size=VOCAB), tiny_seq2seq("t5"), SOURCE, 4, k=2)


def test_encoders_of_different_widths_cannot_share_states():
    target, draft = tiny_seq2seq("bart"), tiny_seq2seq("bart", seed=1, layers=1, width=16)
    with pytest.raises(ValueError, match="32 wide, but its decoder's cross-attention reads 16"):
        speculative_generate(target, ModelDrafter(draft, encoder="target"), SOURCE, 4, k=2)
    assert speculative_generate(target, draft, SOURCE, 4, k=2, sampler=Sampler(0)).token_ids == \
        autoregressive_generate(target, SOURCE, 4, Sampler(0)).token_ids  # its own encoder is fine


@pytest.mark.parametrize("drafter, match", [(LookaheadDrafter, "cannot draft for an encoder-decoder target")])
def test_drafters_that_cannot_are_refused(drafter, match):
    with pytest.raises(ValueError, match=match):
        speculative_generate(tiny_seq2seq("t5"), drafter(), SOURCE, 4, k=2)


@pytest.mark.parametrize("options, match", [
    (dict(input_ids=torch.zeros(2, 5, dtype=torch.long)), r"encoder's input, a \(1, S\) tensor"),
    (dict(attention_mask=torch.ones(1, 3)), "attention_mask must have the shape of input_ids"),
    (dict(input_ids=torch.full((1, 4), 500)), r"input_ids \(the encoder's input\) must be token ids in \[0, 96\)"),
    (dict(cache="static"), "encoder-decoder models decode with cache='dynamic'"),
])
def test_bad_encoder_inputs(options, match):
    arguments = {"input_ids": SOURCE, **options}
    with pytest.raises(ValueError, match=match):
        autoregressive_generate(tiny_seq2seq("t5"), max_new_tokens=4, **arguments)


def test_encoder_arguments_are_refused_for_a_decoder_only_model():
    with pytest.raises(ValueError, match="decoder_input_ids are for encoder-decoder models"):
        autoregressive_generate(tiny_model(), torch.tensor([[1, 2]]), 4, decoder_input_ids=torch.tensor([[0]]))


def test_a_bad_encoder_option_is_refused():
    with pytest.raises(ValueError, match="encoder must be one of"):
        ModelDrafter(tiny_seq2seq("t5"), encoder="shared")


# --- an encoder that reads features: Whisper

def tiny_whisper(seed=0, decoder_layers=2, noise=0.0):
    """A tiny random Whisper (8 mel bins, 32 frames, 32 wide), its LM head untied and peaked like the others'."""
    config = transformers.WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=8, encoder_layers=2, decoder_layers=decoder_layers, d_model=32,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_source_positions=16, max_target_positions=64, pad_token_id=0, eos_token_id=1, bos_token_id=2,
        decoder_start_token_id=2, suppress_tokens=None, begin_suppress_tokens=None, tie_word_embeddings=False)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = transformers.WhisperForConditionalGeneration(config).eval()
        head = model.get_output_embeddings()
        head.weight = torch.nn.Parameter(torch.randn(head.weight.shape) * 2)
    model.generation_config.eos_token_id = None
    return model


FEATURES = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(3))  # (1, mels, frames)


def test_whisper_reads_features_and_decodes_exactly():
    """Whisper's encoder reads a spectrogram, not tokens: greedy decoding equals the plain generate loop (Hugging
    Face's, without Whisper's own long-form logic) with a draft on the target's encoder, with its own, and with
    prompt lookup, which finds no tokens in the encoder's input and looks up the output alone."""
    target = tiny_whisper()
    draft = noisy_copy(target, noise=1.0)
    with torch.no_grad():
        reference = transformers.GenerationMixin.generate(target, input_features=FEATURES, max_new_tokens=NEW_TOKENS,
                                                          do_sample=False)[0, 1:].tolist()
    assert autoregressive_generate(target, FEATURES, NEW_TOKENS, Sampler(0)).token_ids == reference
    for drafter in (ModelDrafter(draft, encoder="target"), ModelDrafter(draft), PromptLookupDrafter()):
        result = speculative_generate(target, drafter, FEATURES, NEW_TOKENS, k=3, sampler=Sampler(0))
        assert result.token_ids == reference, drafter
    shared = speculative_generate(target, ModelDrafter(draft, encoder="target"), FEATURES, NEW_TOKENS, 3, Sampler(0))
    assert any(step.accepted for step in shared.steps) and any(step.accepted < 3 for step in shared.steps)


@pytest.mark.parametrize("inputs, options, match", [
    (torch.tensor([[3, 4, 5]]), {}, "reads input_features, not token ids"),
    (FEATURES[0], {}, "a batch of one"),
    (FEATURES, {"attention_mask": torch.ones(1, 32)}, "pass no attention_mask"),
])
def test_whisper_refuses_token_ids_and_masks(inputs, options, match):
    with pytest.raises(ValueError, match=match):
        autoregressive_generate(tiny_whisper(), inputs, 4, Sampler(0), **options)

"""The built-in encoder-decoder pair: restore a passage of verse from which spans were cut.

The task is BART's text infilling (Lewis et al. 2020, Section 2.2): spans of a two-line passage
are cut out, each replaced by one ``<mask>`` token, and the model writes the whole passage back.
Most of the output is copied from the input and the rest must be guessed, much as a speech
recogniser's output is mostly fixed by the audio: a task on which a decoder that reads the
encoder's states can draft well. The models are Hugging Face ``MBartForConditionalGeneration``: BART
with its layer norms before each block instead of after (Liu et al. 2020), which trains from scratch
at this size where BART's own order stalled at the loss of a unigram model for hundreds of steps.

Three models, trained by ``python -m specbook.train seq2seq`` (`specbook.train.seq2seq_cli`):

1. ``target``             3 encoder and 6 decoder layers, 192 wide, on the task's cross entropy.
2. ``draft``              the target's encoder, frozen, with a one-layer decoder that reads its states,
                          started from the target's first decoder layer and embeddings and distilled from
                          the target (KL(q || p) at every position), its decoder's embedding and LM head
                          trained too: distil-whisper's recipe (Gandhi et al. 2023, Section 3), so the
                          encoder runs once for both (`ModelDrafter(encoder="target")`).
3. ``draft-own-encoder``  one encoder and one decoder layer of its own, started from the target's first
                          ones and distilled the same way: what a draft costs when it reads the input itself.
"""

import re

import torch
import torch.nn.functional as F

from .corpus import EOS
from .loop import _kl

PAD, MASK = "<pad>", "<mask>"
SHAPES = {  # the decoder's depth sets a step's cost on a CPU: the draft decodes with one layer, the target six
    "target": dict(encoder_layers=3, decoder_layers=6),
    "draft": dict(encoder_layers=3, decoder_layers=1),
    "draft-own-encoder": dict(encoder_layers=1, decoder_layers=1),
}
WIDTH = dict(d_model=192, encoder_attention_heads=3, decoder_attention_heads=3, encoder_ffn_dim=768,
             decoder_ffn_dim=768, max_position_embeddings=128)


def passages(text: str, lines: int = 2) -> list[str]:
    """Consecutive ``lines`` verse lines of one speech at a time, the speaker's name left out (plays are
    joined by a line holding the end-of-text token, which ends a speech too)."""
    found = []
    for speech in text.replace(f"\n{EOS}\n", "\n\n").split("\n\n"):
        body = speech.strip().splitlines()[1:]
        found += ["\n".join(body[start : start + lines]) for start in range(0, len(body) - lines + 1, lines)]
    return found


def mask_words(text: str, generator: torch.Generator, rate: float = 0.3, mean_span: float = 2.0) -> str:
    """Text infilling on words: cut spans of words (lengths Poisson(``mean_span``), at least one) until ``rate``
    of the words (rounded, at least one) are gone, each run of cut words replaced by one ``<mask>``. Cut in
    the text, not in token ids, so that a reader's own masked text is tokenized as the training inputs were."""
    pieces = re.split(r"(\s+)", text)  # words at even indices, the whitespace between them at odd ones
    words = len(pieces[::2])
    cut = torch.zeros(words, dtype=torch.bool)
    budget = max(1, round(rate * words))
    while int(cut.sum()) < budget:
        length = max(1, int(torch.poisson(torch.tensor(mean_span), generator=generator)))
        start = int(torch.randint(0, words, (), generator=generator))
        cut[start : start + min(length, budget - int(cut.sum()))] = True
    kept = []
    for index, piece in enumerate(pieces):
        word = index // 2
        if index % 2 == 0:
            kept.append(MASK if cut[word] and (word == 0 or not cut[word - 1]) else "" if cut[word] else piece)
        elif not (cut[word] and cut[word + 1]):  # whitespace inside a cut span goes with it
            kept.append(piece)
    return "".join(kept)


def seq2seq_tokenizer(source_dir):
    """The built-in pair's tokenizer with a padding and a mask token added, which ends every text with the
    end-of-text token, as T5's and BART's tokenizers end theirs: encoder inputs and labels alike."""
    from tokenizers import processors
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source_dir)
    tokenizer.add_special_tokens({"pad_token": PAD, "mask_token": MASK})
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", special_tokens=[(EOS, tokenizer.eos_token_id)])
    return tokenizer


def pairs_batch(sources: list[str], passages: list[str], tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """Encoder inputs (batch, S), padded with the pad id, and labels (batch, T), padded with -100 (ignored)."""
    inputs = tokenizer(sources, padding=True, return_tensors="pt").input_ids
    labels = tokenizer(passages, padding=True, return_tensors="pt").input_ids
    return inputs, labels.masked_fill(labels == tokenizer.pad_token_id, -100)


def example_batch(texts: list[str], tokenizer, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`pairs_batch` of each passage with words cut (`mask_words`) and the whole passage."""
    return pairs_batch([mask_words(text, generator) for text in texts], texts, tokenizer)


def infilling_batches(texts: list[str], tokenizer, batch_size: int):
    """``data(generator)`` for `train_model`: endless batches of random passages, freshly masked."""
    def data(generator):
        while True:
            picks = torch.randint(0, len(texts), (batch_size,), generator=generator).tolist()
            yield example_batch([texts[index] for index in picks], tokenizer, generator)
    return data


def held_out_examples(texts: list[str], count: int, seed: int = 0) -> list[dict]:
    """``count`` held-out passages (or all there are), evenly spaced, masked once with ``seed``: {"source": masked,
    "passage": whole}."""
    generator, count = torch.Generator().manual_seed(seed), min(count, len(texts))
    picks = [texts[index * len(texts) // count] for index in range(count)]
    return [{"source": mask_words(text, generator), "passage": text} for text in picks]


def held_out_batches(examples: list[dict], tokenizer, batch_size: int = 64):
    """`held_out_examples` as batches of (encoder inputs, labels), like `example_batch`'s."""
    chunks = [examples[start : start + batch_size] for start in range(0, len(examples), batch_size)]
    return [pairs_batch([row["source"] for row in rows], [row["passage"] for row in rows], tokenizer)
            for rows in chunks]


def shift_right(labels: torch.Tensor, start_token: int, pad_token: int) -> torch.Tensor:
    """What the decoder reads when it learns to write ``labels`` (batch, T) by teacher forcing: the start token,
    then the labels but the last, the ignored positions (-100, padding) read as ``pad_token``. (batch, T)"""
    inputs = labels.masked_fill(labels == -100, pad_token).roll(1, dims=1)
    inputs[:, 0] = start_token
    return inputs


def logits(model, sources, labels):
    """The decoder's logits (batch, T, vocab) for ``labels`` after the start token, teacher-forced."""
    config = model.config
    decoder_inputs = shift_right(labels, config.decoder_start_token_id, config.pad_token_id)
    return model(input_ids=sources, attention_mask=sources != config.pad_token_id,
                 decoder_input_ids=decoder_inputs).logits.float()


def infilling_loss(model, teacher, sources, labels):
    """Cross entropy on the passage, or KL(q || p) to ``teacher``'s distributions at its positions."""
    student = logits(model, sources, labels)
    if teacher is None:
        return F.cross_entropy(student.flatten(0, 1), labels.flatten(), ignore_index=-100)
    keep = labels != -100
    with torch.no_grad():
        teacher_logp = logits(teacher, sources, labels)[keep].log_softmax(-1)
    return _kl(teacher_logp, student[keep])


@torch.no_grad()
def evaluate_infilling(model, held_out, device, teacher=None) -> dict:
    """Mean cross entropy (nats per token) on the held-out batches, and KL to ``teacher`` when given."""
    was_training = model.training
    model.eval()
    losses, kls = [], []
    for sources, labels in held_out:
        sources, labels = sources.to(device), labels.to(device)
        student = logits(model, sources, labels)
        losses.append(F.cross_entropy(student.flatten(0, 1), labels.flatten(), ignore_index=-100).item())
        if teacher is not None:
            kls.append(infilling_loss(model, teacher, sources, labels).item())
    model.train(was_training)
    result = {"loss": sum(losses) / len(losses)}
    if kls:
        result["kl_to_target"] = sum(kls) / len(kls)
    return result


def new_model(kind: str, tokenizer, seed: int):
    """An mBART of ``kind``'s shape, random, for ``tokenizer`` (whose end-of-text token also starts the decoder).

    The draft that reads the target's encoder has token embeddings of its own for its decoder and its LM
    head (``tie_word_embeddings=False``): a BART shares one matrix between the encoder, the decoder and
    the LM head, and the encoder's must stay the target's (Whisper's encoder reads no tokens at all)."""
    from transformers import MBartConfig, MBartForConditionalGeneration

    eos = tokenizer.eos_token_id
    config = MBartConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, bos_token_id=eos,
                        eos_token_id=eos, decoder_start_token_id=eos, forced_bos_token_id=None,
                        forced_eos_token_id=None, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                        tie_word_embeddings=kind != "draft", **WIDTH, **SHAPES[kind])
    torch.manual_seed(seed)
    return MBartForConditionalGeneration(config)


@torch.no_grad()
def shrink(target, draft):
    """Start ``draft`` from ``target``: its embeddings and the first layers of its encoder and decoder
    (distil-whisper's "shrink and fine-tune", which keeps the first and last decoder layers of 32).
    Returns ``draft``."""
    for embedding in (draft.model.shared, draft.model.encoder.embed_tokens, draft.model.decoder.embed_tokens,
                      draft.lm_head):  # one matrix in a tied model, four in an untied one
        embedding.weight.copy_(target.model.shared.weight)
    for part in ("encoder", "decoder"):
        source, copy = getattr(target.model, part), getattr(draft.model, part)
        copy.embed_positions.load_state_dict(source.embed_positions.state_dict())
        copy.layernorm_embedding.load_state_dict(source.layernorm_embedding.state_dict())
        copy.layer_norm.load_state_dict(source.layer_norm.state_dict())  # the final norm of a pre-norm stack
        for layer, source_layer in zip(copy.layers, source.layers):
            layer.load_state_dict(source_layer.state_dict())
    return draft


def freeze_encoder(draft):
    """Train the decoder and the LM head only: the encoder (with its token embedding) stays the target's, so
    the draft can decode from the target's encoder states."""
    draft.model.encoder.requires_grad_(False)
    draft.model.shared.requires_grad_(False)
    return draft

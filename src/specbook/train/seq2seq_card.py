"""The encoder-decoder pair's model card, ``README.md``: what ships, measured (sizes, losses, exact match, α, c)."""

import difflib
import json

import torch

from .seq2seq import SHAPES, WIDTH, evaluate_infilling, logits


@torch.inference_mode()
def restorations(model, tokenizer, examples) -> list[str]:
    """The model's greedy output for each example's source, as text."""
    from ..decoding import autoregressive_generate
    from ..sampling import Sampler

    texts = []
    for example in examples:
        source = tokenizer(example["source"], return_tensors="pt").input_ids
        run = autoregressive_generate(model, source, 96, Sampler(0), eos_token_id=tokenizer.eos_token_id)
        texts.append(tokenizer.decode(run.token_ids, skip_special_tokens=True))
    return texts


@torch.inference_mode()
def sampled_alpha(target, draft, tokenizer, examples, seed=0):
    """Mean alpha = sum_x min(p(x), q(x)) over the positions of the target's outputs sampled at temperature 1
    (the acceptance rate of speculative sampling, Leviathan et al. Definition 3.1), teacher-forced."""
    from ..decoding import autoregressive_generate
    from ..rejection import acceptance_rate
    from ..sampling import Sampler

    alphas = []
    for index, example in enumerate(examples):
        source = tokenizer(example["source"], return_tensors="pt").input_ids
        output = autoregressive_generate(target, source, 96, Sampler(1.0), seed=seed + index,
                                         eos_token_id=tokenizer.eos_token_id).token_ids
        output = torch.tensor([output])  # (1, T)
        target_probs = logits(target, source, output)[0].softmax(-1)  # (T, vocab)
        draft_probs = logits(draft, source, output)[0].softmax(-1)
        alphas.append(acceptance_rate(target_probs, draft_probs))
    return float(torch.cat(alphas).mean())


def write_card(out, held_out):
    """Measure the shipped pair (on this machine) and write the model card, ``README.md``."""
    from ..bench import acceptance, decode_latency, machine
    from ..drafters import ModelDrafter, PromptLookupDrafter
    from ..models import load_model, load_pair

    pair = load_pair(str(out))
    own = load_model(str(out), "draft-own-encoder")
    models = {"target": pair.target, "draft": pair.draft, "draft-own-encoder": own}
    examples = json.loads((out / "heldout_passages.json").read_text())
    meta = {name: json.loads((out / name / "training.json").read_text()) for name in models}
    loss = {name: evaluate_infilling(model, held_out, "cpu", None if name == "target" else pair.target)
            for name, model in models.items()}
    source = pair.tokenizer(examples[0]["source"], return_tensors="pt").input_ids
    latency = {name: decode_latency(model, source, new_tokens=48, repeats=5) for name, model in models.items()}
    restored = restorations(pair.target, pair.tokenizer, examples)
    exact = sum(text == example["passage"] for text, example in zip(restored, examples)) / len(examples)

    def word_match(texts):  # the share of the play's words each text has, in order, on average
        return sum(sum(block.size for block in difflib.SequenceMatcher(None, text.split(), example["passage"].split())
                       .get_matching_blocks()) / len(example["passage"].split())
                   for text, example in zip(texts, examples)) / len(examples)
    words, source_words = word_match(restored), word_match([example["source"] for example in examples])

    drafters = {"draft (the target's encoder)": ModelDrafter(pair.draft, encoder="target"),
                "draft-own-encoder": ModelDrafter(own), "prompt lookup": PromptLookupDrafter()}
    prompts = [pair.tokenizer(example["source"], return_tensors="pt").input_ids for example in examples]
    greedy = {name: acceptance(pair.target, drafter, prompts, new_tokens=96, eos_token_id=pair.tokenizer.eos_token_id)
              for name, drafter in drafters.items()}
    sampled = {name: f"{sampled_alpha(pair.target, model, pair.tokenizer, examples[:32]):.3f}"
               for name, model in ((next(iter(drafters)), pair.draft), ("draft-own-encoder", own))}
    kl = {name: f"{loss[name]['kl_to_target']:.3f}" for name in models if name != "target"}
    rows = "\n".join(
        f"| {name} | {SHAPES[name]['encoder_layers']} | {SHAPES[name]['decoder_layers']} | "
        f"{sum(p.numel() for p in model.parameters()):,} | {meta[name]['step']} | {meta[name]['seconds'] / 60:.0f} min | "
        f"{loss[name]['loss']:.3f} | {kl.get(name, '-')} | "
        f"{1000 * latency[name]:.2f} | {latency[name] / latency['target']:.3f} |" for name, model in models.items())
    acceptance_rows = "\n".join(
        f"| {name} | {greedy[name]['acceptance_rate']:.3f} | {greedy[name]['tokens_per_step']:.2f} | "
        f"{sampled.get(name, '- (deterministic drafts)')} |" for name in drafters)
    samples = "\n\n".join(f"    {example['source']!r}\n -> {text!r}" for example, text in zip(examples[:4], restored))
    size_mb = sum(path.stat().st_size for path in out.rglob("*.safetensors")) / 1e6
    card = CARD.format(rows=rows, acceptance_rows=acceptance_rows, exact=exact, words=words, source_words=source_words,
                       count=len(examples), samples=samples, size_mb=size_mb, width=WIDTH, hardware=meta["target"]["hardware"],
                       machine=machine(), held_out=len(held_out) * held_out[0][0].shape[0])
    (out / "README.md").write_text(card)
    print(card)


CARD = """# The built-in encoder-decoder pair: restoring verse

A target and two drafts, Hugging Face `MBartForConditionalGeneration` models (BART with its layer norms
before each block) trained by
`python -m specbook.train seq2seq` on BART's text-infilling task (Lewis et al. 2020): a passage of two
verse lines from Shakespeare's plays comes in with about 30% of its words cut out, each run of cut
words replaced by one `<mask>`, and the model writes the whole passage back. The corpus and the
held-out plays are the built-in causal pair's; so is the tokenizer, with `<pad>` and `<mask>` added
and the end-of-text token appended to every text (as T5's and BART's tokenizers append theirs).
Stored in float16 ({size_mb:.1f} MB in all), loaded in float32: `load_pair("shakespeare-seq2seq")`
gives the target and `draft`; `load_model("shakespeare-seq2seq", "draft-own-encoder")` the other draft.

- `target`: 3 encoder and 6 decoder layers, trained on the task's cross entropy.
- `draft`: the target's encoder (the same weights, frozen) and a decoder of one layer, started from the
  target's first decoder layer and distilled from the target (KL(q || p) at every position), with
  token embeddings of its own for its decoder and LM head (BART's one shared matrix would tie them
  to the frozen encoder's): the distil-whisper recipe, with which the encoder runs once for both
  models (`ModelDrafter(pair.draft, encoder="target")`).
- `draft-own-encoder`: one encoder layer and one decoder layer of its own, started from the target's
  first ones and distilled the same way.

Widths: {width}. Trained on {hardware}.

| model | encoder layers | decoder layers | parameters | steps | training time | held-out loss (nats/token) | KL to the target | ms per decoded token | c |
|---|---|---|---|---|---|---|---|---|---|
{rows}

Losses over {held_out} held-out passages (the held-out plays, masked once with a fixed seed). Time per
decoded token: decoder steps only (`specbook.bench.decode_latency`: a run of 48 tokens minus a run of one,
so the encoder's one pass cancels), batch 1, greedy, on {machine}; c is the ratio to the target's.

## Restoring and drafting, {count} held-out passages (`heldout_passages.json`)

The target restores {exact:.0%} of them exactly (greedy). Its output has {words:.0%} of the play's words, in
order (`difflib.SequenceMatcher`'s matching blocks, on words), against {source_words:.0%} in its input with
the masks: it copies what is left and guesses the cut words, mostly wrong at this size. Acceptance of its greedy output, K = 4
(`specbook.bench.acceptance`), and alpha under sampling at temperature 1 (mean sum min(p, q) along the
target's sampled outputs, the first 32 passages):

| drafter | greedy acceptance rate | tokens per target call | sampled alpha |
|---|---|---|---|
{acceptance_rows}

Prompt lookup drafts from the encoder's input, which holds most of the output.

## Samples (the target, greedy)

{samples}
"""

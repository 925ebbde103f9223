"""The built-in encoder-decoder pair: its training task, its training command, and what ships.

Greedy speculative decoding on the shipped pair equals autoregressive decoding and the target's own
``generate``, with the draft on the target's encoder, with its own, and with prompt lookup; the
draft's encoder is the target's, weight for weight. The training command runs end to end on a
tiny corpus in a few steps.
"""

import json

import pytest
import torch

from specbook import PromptLookupDrafter, Sampler, autoregressive_generate, load_model, load_pair, speculative_generate
from specbook.drafters import ModelDrafter
from specbook.models import assets_dir
from specbook.train.seq2seq import MASK, example_batch, freeze_encoder, mask_words, passages, shrink

TEXT = """KING:
Now is the winter of our discontent
Made glorious summer by this sun of York;
And all the clouds that lour'd upon our house

QUEEN:
In the deep bosom of the ocean buried.
<|endoftext|>
DUKE:
If music be the food of love, play on;
Give me excess of it, that, surfeiting,
"""


def test_passages_are_two_lines_of_one_speech_without_the_speaker():
    found = passages(TEXT)
    assert found == ["Now is the winter of our discontent\nMade glorious summer by this sun of York;",
                     "If music be the food of love, play on;\nGive me excess of it, that, surfeiting,"]


@pytest.mark.parametrize("seed", range(5))
def test_mask_words_cuts_about_a_third_of_the_words_one_mask_per_run(seed):
    text = "If music be the food of love, play on;\nGive me excess of it, that, surfeiting,"
    masked = mask_words(text, torch.Generator().manual_seed(seed))
    words, kept = text.split(), masked.split()
    assert MASK not in text and MASK + " " + MASK not in masked and MASK in masked
    assert len(words) - sum(word != MASK for word in kept) == round(0.3 * len(words))  # cut words
    remaining = [word for word in kept if word != MASK]
    assert all(word in words for word in remaining)
    positions = [words.index(word) for word in remaining if words.count(word) == 1]
    assert positions == sorted(positions)  # the kept words keep their order
    assert mask_words(text, torch.Generator().manual_seed(seed)) == masked  # the seed decides


def test_mask_words_cuts_at_least_one_word():
    assert mask_words("Alas!", torch.Generator().manual_seed(0)) == MASK


@pytest.fixture(scope="module")
def pair():
    return load_pair("shakespeare-seq2seq")


@pytest.fixture(scope="module")
def held_out():
    return json.loads((assets_dir("shakespeare-seq2seq") / "heldout_passages.json").read_text())


def test_the_built_in_pair_loads_with_its_tokenizer_and_the_targets_encoder(pair):
    assert pair.target.config.is_encoder_decoder and pair.draft.config.is_encoder_decoder
    assert pair.target.config.decoder_layers == 6 and pair.draft.config.decoder_layers == 1
    for name, weight in pair.target.get_encoder().state_dict().items():
        torch.testing.assert_close(pair.draft.get_encoder().state_dict()[name], weight, rtol=0, atol=0)
    ids = pair.encode("To be, or <mask> to be")[0].tolist()
    assert ids[-1] == pair.tokenizer.eos_token_id and pair.tokenizer.mask_token_id in ids
    assert ModelDrafter.for_pair(pair).encoder == "target" and ModelDrafter.for_pair(load_pair()).encoder == "own"
    own = load_model("shakespeare-seq2seq", "draft-own-encoder")
    assert own.config.encoder_layers == 1 and own.config.d_model == pair.target.config.d_model


def test_load_model_names_the_parts_it_has():
    with pytest.raises(ValueError, match=r"part must be one of the models of 'shakespeare-seq2seq': \['draft', "):
        load_model("shakespeare-seq2seq", "drafty")


def test_greedy_speculative_equals_autoregressive_and_generate_on_the_shipped_pair(pair, held_out):
    own = load_model("shakespeare-seq2seq", "draft-own-encoder")
    eos = pair.tokenizer.eos_token_id
    drafters = {"target's encoder": ModelDrafter(pair.draft, encoder="target"), "own encoder": ModelDrafter(own),
                "prompt lookup": PromptLookupDrafter()}
    accepted = {name: 0 for name in drafters}
    for example in held_out[:6]:
        source = pair.encode(example["source"])
        reference = pair.target.generate(source, max_new_tokens=96, do_sample=False)[0, 1:].tolist()
        plain = autoregressive_generate(pair.target, source, 96, Sampler(0), eos_token_id=eos)
        assert plain.token_ids == reference and reference[-1] == eos
        for name, drafter in drafters.items():
            for k in (2, 5):
                run = speculative_generate(pair.target, drafter, source, 96, k, Sampler(0), eos_token_id=eos)
                assert run.token_ids == reference, (name, k)
                accepted[name] += sum(step.accepted for step in run.steps)
    assert all(count > 0 for count in accepted.values())  # every drafter's drafts were used


def test_the_shipped_pair_restores_text_and_the_shared_encoder_draft_is_accepted(pair, held_out):
    """Not a speed claim: the pair does its task (a sanity floor far below the model card's figures)."""
    eos = pair.tokenizer.eos_token_id
    runs = [speculative_generate(pair.target, ModelDrafter.for_pair(pair), pair.encode(example["source"]), 96, 4, Sampler(0),
                                 eos_token_id=eos, tokenizer=pair.tokenizer) for example in held_out[:8]]
    assert sum(run.stats.acceptance_rate for run in runs) / len(runs) > 0.5
    restored = [pair.tokenizer.decode(run.token_ids, skip_special_tokens=True) for run in runs]
    assert sum(text.split()[:2] == example["passage"].split()[:2] for text, example in zip(restored, held_out)) >= 4


def test_shrink_copies_the_first_layers_and_freeze_encoder_trains_the_decoder_only(pair):
    from specbook.train.seq2seq import SHAPES, new_model

    draft = freeze_encoder(shrink(pair.target, new_model("draft", pair.tokenizer, seed=1)))
    torch.testing.assert_close(draft.model.decoder.layers[0].fc1.weight, pair.target.model.decoder.layers[0].fc1.weight)
    for name, weight in pair.target.get_encoder().state_dict().items():
        torch.testing.assert_close(draft.get_encoder().state_dict()[name], weight)
    trainable = {name.rsplit(".", 1)[0] if name.startswith("lm_head") else ".".join(name.split(".")[:2])
                 for name, weight in draft.named_parameters() if weight.requires_grad}
    assert trainable == {"model.decoder", "lm_head"} and len(draft.model.decoder.layers) == SHAPES["draft"]["decoder_layers"]
    assert draft.model.decoder.embed_tokens.weight is not draft.model.encoder.embed_tokens.weight  # untied
    sources, labels = example_batch(["Now is the winter of our discontent"] * 2, pair.tokenizer,
                                    torch.Generator().manual_seed(0))
    assert (labels[:, -1] == pair.tokenizer.eos_token_id).all() and (sources == pair.tokenizer.mask_token_id).any(1).all()


def test_the_training_command_runs_every_stage_on_a_tiny_corpus(tmp_path):
    from specbook.train.seq2seq_cli import main

    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    for split in ("train", "valid"):
        (work / f"{split}.txt").write_text("\n\n".join([TEXT] * 3))
    main(["--work", str(work), "--out", str(out), "--stages", "target,draft,draft-own-encoder",
          "--target-steps", "2", "--draft-steps", "2", "--batch-size", "2", "--device", "cpu"])
    trained = load_pair(str(out))
    own = load_model(str(out), "draft-own-encoder")
    assert trained.target.config.is_encoder_decoder and own.config.encoder_layers == 1
    for name, weight in trained.target.get_encoder().state_dict().items():  # frozen through training
        torch.testing.assert_close(trained.draft.get_encoder().state_dict()[name], weight, rtol=0, atol=0)
    meta = json.loads((out / "draft" / "training.json").read_text())
    assert meta["step"] == 2 and "kl_to_target" in meta["log"][-1]
    assert len(json.loads((out / "heldout_passages.json").read_text())) == 6  # all the tiny corpus has

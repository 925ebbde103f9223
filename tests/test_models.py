import time

import pytest
import torch

from specbook import Sampler, autoregressive_generate, load_pair, speculative_generate
from specbook.decoder import forward_name
from specbook.models import assets_dir
from specbook.packed import is_packed


@pytest.fixture(scope="module")
def pair():
    return load_pair("shakespeare")


def test_loads_offline_quickly_in_eval_mode():
    started = time.perf_counter()
    pair = load_pair("shakespeare")
    assert time.perf_counter() - started < 30  # "a couple of seconds"; generous for a loaded CI machine
    for model in (pair.target, pair.draft):
        assert not model.training
        assert next(model.parameters()).dtype == torch.float32
        assert model.device.type == "cpu"
    assert pair.name == "shakespeare"


def test_the_built_in_target_runs_on_the_decoder_and_packing_is_opt_in(pair):
    """load_pair leaves the built-in target unpacked, for `specbook.decoder` to run (the fast path of the README's
    calls); pack=True packs it, which keeps Hugging Face's forward, and greedy decoding on either gives the
    target's tokens (logits agree to float32 rounding). A target the decoder does not serve is packed."""
    packed = load_pair("shakespeare", pack=True)
    assert not is_packed(pair.target) and not is_packed(pair.draft) and is_packed(packed.target)
    assert forward_name(pair.target) == "specbook.decoder" and "PackedLinear" in forward_name(packed.target)
    prompt = pair.encode("ROMEO:\n")
    reference = autoregressive_generate(packed.target, prompt, 24, Sampler(0)).token_ids
    assert autoregressive_generate(pair.target, prompt, 24, Sampler(0)).token_ids == reference
    assert speculative_generate(pair.target, pair.draft, prompt, 24, k=4, sampler=Sampler(0)).token_ids == reference
    assert speculative_generate(packed.target, packed.draft, prompt, 24, k=4, sampler=Sampler(0)).token_ids == reference
    with pytest.raises(ValueError, match="pack_linears needs a model on the CPU in float32 or bfloat16"):
        load_pair("shakespeare", dtype=torch.float16, pack=True)


def test_the_draft_is_much_smaller_and_shares_the_vocabulary(pair):
    size = {name: sum(p.numel() for p in model.parameters()) for name, model in (("t", pair.target), ("d", pair.draft))}
    assert size["d"] * 5 < size["t"]
    assert pair.target.config.vocab_size == pair.draft.config.vocab_size == len(pair.tokenizer)


def test_shipped_weights_are_small():
    """The pair, its heads and drafts fit 40 MB, the draft of each of the draft's two distillations (draft-corpus, the
    start of the PARD and GliDe drafts: 1.7 MB) 2 MB more, and the two PARD drafts the 5 MB more their issue allowed."""
    total = sum(path.stat().st_size for path in assets_dir("shakespeare").rglob("*.safetensors"))
    pard = sum(path.stat().st_size for path in assets_dir("shakespeare").glob("pard*/*.safetensors"))
    assert total - pard <= 42e6 and pard <= 5e6


@pytest.mark.parametrize("text", ["ROMEO:\nBut, soft! what light through yonder window breaks?\n",
                                  "smarter", "  odd   spacing\n\n\tand tabs; ünïcödé — too"])
def test_tokenizer_round_trip(pair, text):
    ids = pair.tokenizer(text)["input_ids"]
    assert pair.tokenizer.decode(ids) == text


def test_tokenizer_splits_a_rare_word_into_pieces(pair):
    assert len(pair.tokenizer.tokenize("smarter")) > 1


def test_return_tensors(pair):
    ids = pair.tokenizer("ROMEO:\n", return_tensors="pt").input_ids
    assert ids.shape[0] == 1 and ids.dtype == torch.long
    assert torch.equal(pair.encode("ROMEO:\n"), ids)


def test_greedy_decoding_is_deterministic_and_lossless(pair):
    prompt = pair.encode("JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n")
    first = autoregressive_generate(pair.target, prompt, 48, Sampler(0)).token_ids
    assert autoregressive_generate(pair.target, prompt, 48, Sampler(0)).token_ids == first
    reference = pair.target.generate(prompt, max_new_tokens=48, do_sample=False, attention_mask=torch.ones_like(prompt),
                                     pad_token_id=pair.tokenizer.eos_token_id)
    assert first == reference[0, prompt.shape[1]:].tolist()
    assert speculative_generate(pair.target, pair.draft, prompt, 48, k=4, sampler=Sampler(0)).token_ids == first


def test_unknown_pair_name():
    with pytest.raises(ValueError, match="name must be one of"):
        load_pair("marlowe")


def test_a_pair_written_by_train_loads_from_its_directory(pair):
    """``specbook.train --out DIR`` writes a tokenizer, target/ and draft/: load_pair(DIR) reads them back."""
    from specbook.models import assets_dir

    again = load_pair(str(assets_dir("shakespeare")))
    assert again.tokenizer.get_vocab() == pair.tokenizer.get_vocab()
    for ours, theirs in ((again.target, pair.target), (again.draft, pair.draft)):
        assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values()))


def test_half_a_hub_pair():
    with pytest.raises(ValueError, match="both target= and draft="):
        load_pair(target="org/model")


def test_hub_pair_with_mismatched_tokenizers_is_refused(pair, tmp_path):
    """load_pair(target=, draft=) takes any model ids or local folders; the two must share a tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    other = Tokenizer(models.BPE())
    other.pre_tokenizer = pre_tokenizers.ByteLevel()
    other.train_from_iterator(["to be or not to be"] * 10, trainers.BpeTrainer(vocab_size=300))
    for folder, tokenizer in (("target", pair.tokenizer), ("draft", PreTrainedTokenizerFast(tokenizer_object=other))):
        pair.draft.save_pretrained(tmp_path / folder)
        tokenizer.save_pretrained(tmp_path / folder)
    with pytest.raises(ValueError, match="share a tokenizer"):
        load_pair(target=str(tmp_path / "target"), draft=str(tmp_path / "draft"))
    same = load_pair(target=str(tmp_path / "target"), draft=str(tmp_path / "target"))
    assert same.name.endswith("target")


def test_missing_hub_model_gives_a_clear_message():
    with pytest.raises(OSError, match="needs a network connection"):
        load_pair(target="specbook-test/no-such-model", draft="specbook-test/no-such-model")


@pytest.mark.parametrize("capability, expected", [((7, 5), torch.float16), ((8, 0), torch.bfloat16),
                                                  ((9, 0), torch.bfloat16), ((6, 0), torch.float16)])
def test_a_gpu_gets_bfloat16_only_where_it_is_native(monkeypatch, capability, expected):
    """A T4 (7.5) only emulates bfloat16: float16 there; an A100 (8.0) or an H100 (9.0) computes it natively."""
    from specbook.models import _resolve, default_dtype

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert default_dtype("cuda") == expected
    assert _resolve("cuda", None) == (torch.device("cuda"), expected)
    assert _resolve("cuda", torch.float32) == (torch.device("cuda"), torch.float32)  # an explicit dtype wins
    assert default_dtype("cpu") == torch.float32

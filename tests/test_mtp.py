"""Multi-token prediction trained jointly (specbook.mtp, Gloeckle et al. 2024): the target's top layers fine-tuned with
n - 1 Medusa-shaped heads under Σ_i CE(x_{t+i}); the heads draft for the MTP model, which verifies itself."""

import json
import shutil

import pytest
import torch

import specbook.graphs
from specbook import Sampler, autoregressive_generate, load_pair, speculative_generate
from specbook.drafters import Draft, MedusaDrafter
from specbook.heads import head_accuracy
from specbook.models import assets_dir
from specbook.mtp import MultiTokenHeads, load_mtp, mtp_model, mtp_predictions
from specbook.packed import is_packed, pack_linears
from specbook.train.cli import main
from specbook.train.heads import mtp_loss, train_mtp
from specbook.train.loop import TrainConfig, _language_model_loss

from families import tiny_family_model
from support import SAMPLERS, chi_square_p_value, tiny_model

SHIPPED = (assets_dir() / "mtp" / "config.json").exists()


def randomized(target, num_tokens=3, layers=1, seed=0):
    """An MTP for ``target`` with random heads and perturbed top layers: a model and drafts unlike the target's."""
    mtp = MultiTokenHeads.for_target(target, num_tokens, layers)
    torch.manual_seed(seed)
    with torch.no_grad():
        for block in mtp.heads.blocks:
            torch.nn.init.normal_(block.weight)
        for weight in mtp.layers.parameters():
            weight.add_(0.3 * torch.randn_like(weight))
    return mtp.eval()


# --- the loss: head 1 is the next-token loss, head i is scored on x_{t+i}

def test_head_one_is_the_next_token_loss_and_head_i_is_scored_i_tokens_ahead():
    target = tiny_model(seed=0)
    mtp = randomized(target, num_tokens=4, layers=1)
    model = mtp_model(target, mtp)
    window = torch.randint(0, 64, (3, 21), generator=torch.Generator().manual_seed(0))
    inputs, targets = window[:, :-1], window[:, 1:]
    with torch.no_grad():
        terms = mtp_predictions(model, mtp.heads, window)
        features = model.model(window).last_hidden_state  # (3, 21, hidden)
        expected = [_language_model_loss(model, None, inputs, targets)]
        for i in range(2, 5):  # head i: block i - 2 on f_t, against the token i ahead
            block = mtp.heads.blocks[i - 2]
            logits = model.lm_head(features + torch.nn.functional.silu(block(features)))
            expected.append(torch.nn.functional.cross_entropy(logits[:, : 21 - i].flatten(0, 1),
                                                              window[:, i:].flatten()))
        losses = [torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()) for logits, labels in terms]
        torch.testing.assert_close(torch.stack(losses), torch.stack(expected), rtol=0, atol=1e-5)
        torch.testing.assert_close(mtp_loss(mtp.heads, model, inputs, targets), sum(expected), rtol=0, atol=1e-5)


def test_trained_heads_draft_what_the_model_then_writes(tmp_path):
    """On text that cycles through a permutation, x_{t+i} is a function of x_t: a trained MTP gets every head
    right, scored by `head_accuracy` (the drafting indexing), and its drafts are all accepted."""
    cycle = torch.randperm(64, generator=torch.Generator().manual_seed(1))
    text = cycle.repeat(60)
    target = tiny_model(seed=2).requires_grad_(False)
    target.lm_head.weight.mul_(20)  # random weights give near-uniform logits: a frozen LM head that can be sure
    mtp = MultiTokenHeads.for_target(target, 4, 2)
    config = TrainConfig(steps=120, batch_size=8, block_size=32, lr=1e-2, warmup=10, eval_every=120, ckpt_every=120)
    log = train_mtp(mtp, target, text, text, config, tmp_path, "cpu")
    model = mtp_model(target, mtp)
    assert log["step"] == 120 and log["log"][-1]["loss"] < 0.1  # the MTP model's next-token loss
    assert min(head_accuracy(model, mtp.heads, text, block_size=32)["top1"]) > 0.95
    prompt = cycle[None, :5]
    run = speculative_generate(model, MedusaDrafter(model, mtp.heads, tree=None), prompt, 24, k=3, sampler=Sampler(0))
    assert run.token_ids == autoregressive_generate(model, prompt, 24, Sampler(0)).token_ids
    assert run.stats.tokens_per_step > 3.5


@pytest.mark.parametrize("family", ["gpt2", "opt"])
def test_the_loss_trains_the_top_layers_of_other_families(family):
    """GPT-2 (``h``, ``ln_f``) and OPT (a ``decoder`` inside the model): untrained, the MTP model is the target;
    the loss reaches the heads, the top layers and the norm, and leaves the target's own weights alone."""
    target = tiny_family_model(family, layers=3).requires_grad_(False)
    mtp = MultiTokenHeads.for_target(target, 3, 1)
    model = mtp_model(target, mtp)
    window = torch.randint(0, 96, (2, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(window).logits, target(window).logits, rtol=0, atol=1e-5)
    mtp_loss(mtp.heads, model, window[:, :-1], window[:, 1:]).backward()
    assert all(weight.grad is not None for weight in mtp.parameters())
    assert all(weight.grad is None for weight in target.parameters())
    prompt = window[:1, :6]
    drafter = MedusaDrafter(model, randomized(target, 3, 1).heads, tree=(2, 2))
    assert speculative_generate(model, drafter, prompt, 16, k=2, sampler=Sampler(0)).token_ids == \
        autoregressive_generate(model, prompt, 16, Sampler(0)).token_ids


# --- greedy and sampled: the MTP model's own output, exactly

@pytest.mark.parametrize("cache", ["dynamic", "graphs"])
@pytest.mark.parametrize("tree", [None, (2, 2, 1)], ids=["chain", "tree"])
def test_greedy_equals_the_mtp_models_autoregressive_output(tree, cache, monkeypatch):
    """On the dynamic cache, and on the static cache with its calls (a tree's too) replayed as graphs."""
    monkeypatch.setattr(specbook.graphs, "CAPTURE_ON_CPU", cache == "graphs")
    target = tiny_model(seed=0)
    model_mtp = randomized(target, num_tokens=4)
    model = mtp_model(target, model_mtp)
    prompt = torch.tensor([[3, 14, 15, 9, 2, 6, 5]])
    reference = autoregressive_generate(model, prompt, 40, Sampler(0)).token_ids
    assert reference != autoregressive_generate(target, prompt, 40, Sampler(0)).token_ids  # joint training changed it
    for _ in range(2 if cache == "graphs" else 1):  # the second generation replays
        result = speculative_generate(model, MedusaDrafter(model, model_mtp.heads, tree), prompt, 40, k=3,
                                      sampler=Sampler(0), cache="static" if cache == "graphs" else "dynamic")
        assert result.token_ids == reference


@pytest.fixture(scope="module")
def sampled_mtp(tiny_pair):
    """The 3-token target with a perturbed top layer (its MTP model) and random heads."""
    target = tiny_pair[0]
    mtp = randomized(target, num_tokens=3, layers=1, seed=3)
    return mtp_model(target, mtp), mtp.heads


@pytest.mark.parametrize("tree, sampler", [(None, SAMPLERS[0]), ((2, 2), SAMPLERS[1])], ids=["chain", "tree-warped"])
def test_sampled_output_follows_the_mtp_model(sampled_mtp, tree, sampler):
    model, heads = sampled_mtp
    assert chi_square_p_value(model, MedusaDrafter(model, heads, tree), sampler) > 1e-3


class _ClaimsSampledChain(MedusaDrafter):
    """Broken on purpose: reports its chain of top choices as if drawn from the heads' softmax."""

    def propose(self, k, sampler, generator, keep_drafting=None):
        draft = super().propose(k, sampler, generator, keep_drafting)
        probs = self.heads(self.feature, self.lm_head)[: len(draft)].softmax(-1) if len(draft) else None
        return Draft(draft.tokens, probs)


def test_the_chi_square_catches_a_chain_reported_with_the_wrong_p(sampled_mtp):
    model, heads = sampled_mtp
    assert chi_square_p_value(model, _ClaimsSampledChain(model, heads, tree=None), SAMPLERS[0]) < 1e-6


# --- saving, loading, the original target untouched

def test_save_and_load_keep_only_what_changed(tmp_path):
    target = tiny_model(seed=0)
    mtp = randomized(target, num_tokens=4, layers=1)
    mtp.save(tmp_path, dtype=torch.float32)
    before = {name: weight.clone() for name, weight in target.state_dict().items()}
    model, heads = load_mtp(tmp_path, target)
    assert json.loads((tmp_path / "config.json").read_text()) == {"kind": "mtp", "hidden_size": 32, "num_tokens": 4,
                                                                  "layers": 1, "target_layers": 2}
    assert {name.split(".")[0] for name in mtp.state_dict()} == {"layers", "norm", "heads"} and heads.num_heads == 3
    window = torch.randint(0, 64, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(model(window).logits, mtp_model(target, mtp)(window).logits, rtol=0, atol=0)
    assert all(torch.equal(weight, before[name]) for name, weight in target.state_dict().items())
    assert model.model.layers[0] is target.model.layers[0] and model.model.layers[1] is not target.model.layers[1]


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="PyTorch built without oneDNN")
def test_a_packed_target_gets_packed_mtp_layers(tmp_path):
    """Packed weights cannot be copied: the fine-tuned layers load into plain copies, then are packed in turn."""
    target = tiny_model(seed=0)
    mtp = randomized(target, num_tokens=4, layers=1)
    mtp.save(tmp_path, dtype=torch.float32)
    packed = pack_linears(tiny_model(seed=0))
    model, heads = load_mtp(tmp_path, packed)
    assert is_packed(model.model.layers[1]) and model.model.layers[0] is packed.model.layers[0]
    prompt = torch.tensor([[3, 14, 15, 9, 2, 6, 5]])
    with torch.no_grad():
        torch.testing.assert_close(model(prompt).logits, mtp_model(target, mtp)(prompt).logits, rtol=0, atol=1e-4)
    result = speculative_generate(model, MedusaDrafter(model, heads, (2, 2, 1)), prompt, 30, k=3, sampler=Sampler(0))
    assert result.token_ids == autoregressive_generate(model, prompt, 30, Sampler(0)).token_ids


def test_a_target_of_another_width_or_depth_is_refused(tmp_path):
    MultiTokenHeads.for_target(tiny_model(seed=0), 3, 1).save(tmp_path)
    with pytest.raises(ValueError, match="the mtp head has hidden size 32 but the target's hidden size is 16"):
        load_mtp(tmp_path, tiny_model(hidden_size=16))
    with pytest.raises(ValueError, match="trained on a target of 2 layers ending in a LlamaRMSNorm; this one has 3"):
        load_mtp(tmp_path, tiny_model(num_layers=3))
    with pytest.raises(ValueError, match=r"name_or_path must be a built-in name \['shakespeare'\] or a directory"):
        load_mtp("hamlet", tiny_model())


@pytest.mark.parametrize("options, match", [
    (dict(num_tokens=1), r"num_tokens must be an integer in \[2, 4\]: the next token and 1 to 3 more \(got 1\)"),
    (dict(num_tokens=5), r"num_tokens must be an integer in \[2, 4\]"),
    (dict(layers=0), r"layers must be an integer in \[1, 2\]: the target's top layers to fine-tune, of its 2"),
    (dict(layers=3), r"layers must be an integer in \[1, 2\]"),
])
def test_bad_options(options, match):
    with pytest.raises(ValueError, match=match):
        MultiTokenHeads.for_target(tiny_model(), **options)


# --- the training stage, end to end on a tiny target

def _tiny_out(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "heldout_prompts.json"):
        shutil.copy(assets_dir() / name, out / name)
    tiny_model(vocab_size=2048, seed=2, max_positions=512).save_pretrained(out / "target")
    text = "\n\n".join(json.loads((assets_dir() / "heldout_prompts.json").read_text()))
    for split in ("train", "valid"):
        (work / f"{split}.txt").write_text(text)
    return out, work


def test_mtp_stage_adds_only_its_folder(tmp_path):
    out, work = _tiny_out(tmp_path)
    before = sorted(path.relative_to(out) for path in out.rglob("*"))
    main(["--work", str(work), "--out", str(out), "--stages", "mtp", "--mtp-steps", "2", "--mtp-heads", "3",
          "--mtp-layers", "1", "--device", "cpu"])
    after = sorted(path.relative_to(out) for path in out.rglob("*") if "mtp" not in path.parts)
    assert after == before
    meta = json.loads((out / "mtp" / "training.json").read_text())
    assert meta["step"] == 2 and (work / "ckpt-mtp-3-1" / "checkpoint.pt").exists()
    assert set(meta["final"]["next_token_loss"]) == {"target", "mtp"} and len(meta["final"]["top1"]["mtp"]) == 2
    assert set(meta["final"]["tokens_per_call"]) == {"mtp_chain", "mtp_tree"}  # no Medusa heads to compare with
    assert MultiTokenHeads.from_pretrained(out / "mtp", tiny_model(vocab_size=2048, seed=2)).num_tokens == 3


@pytest.mark.parametrize("option, value, message", [
    ("--mtp-heads", "1", "--mtp-heads must be in [2, 4]: the next-token head and 1 to 3 more, got 1"),
    ("--mtp-heads", "5", "--mtp-heads must be in [2, 4]"),
    ("--mtp-layers", "3", "--mtp-layers: layers must be an integer in [1, 2]"),
])
def test_stage_options_out_of_range_are_usage_errors(tmp_path, capsys, option, value, message):
    out, work = _tiny_out(tmp_path)
    with pytest.raises(SystemExit):
        main(["--work", str(work), "--out", str(out), "--stages", "mtp", option, value, "--device", "cpu"])
    assert message in capsys.readouterr().err
    assert not (out / "mtp").exists()


# --- the built-in MTP model

@pytest.fixture(scope="module")
def built_in():
    pair = load_pair("shakespeare")
    before = {name: weight.clone() for name, weight in pair.target.state_dict().items()}
    model, heads = load_mtp("shakespeare", pair.target)
    prompts = [pair.encode(text) for text in json.loads((assets_dir() / "heldout_prompts.json").read_text())[:3]]
    return pair, before, model, heads, prompts


@pytest.fixture(scope="module")
def mtp_references(built_in):
    """The MTP model's own greedy 32 tokens after each prompt."""
    _, _, model, _, prompts = built_in
    return [autoregressive_generate(model, prompt, 32, Sampler(0)).token_ids for prompt in prompts]


@pytest.mark.skipif(not SHIPPED, reason="the built-in MTP model is not trained yet")
@pytest.mark.parametrize("tree", [None, (3, 2, 1)], ids=["chain", "tree"])
def test_the_built_in_mtp_model_drafts_for_itself(built_in, mtp_references, tree):
    pair, _, model, heads, prompts = built_in
    drafter = MedusaDrafter(model, heads, tree)
    results = [speculative_generate(model, drafter, prompt, 32, k=3, sampler=Sampler(0)) for prompt in prompts]
    assert [result.token_ids for result in results] == mtp_references
    steps = sum(result.stats.target_calls for result in results)
    assert sum(len(result.token_ids) for result in results) / steps > 1.1  # drafts are accepted


@pytest.mark.skipif(not SHIPPED, reason="the built-in MTP model is not trained yet")
def test_loading_leaves_the_built_in_target_as_it_was(built_in):
    pair, before, model, _, prompts = built_in
    assert is_packed(model.model.layers[-1]) == is_packed(pair.target)  # the fine-tuned layers packed like the rest
    assert all(torch.equal(weight, before[name]) for name, weight in pair.target.state_dict().items())
    with torch.no_grad():
        assert not torch.allclose(model(prompts[0]).logits, pair.target(prompts[0]).logits)
        torch.testing.assert_close(pair.target(prompts[0]).logits,
                                   load_pair("shakespeare", pack=False).target(prompts[0]).logits, rtol=0, atol=1e-4)

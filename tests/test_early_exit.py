"""Self-speculative decoding (specbook.heads.ExitHead, specbook.drafters.early_exit): the target's first L layers
and an exit head draft for the whole target. Lossless on every family, packed or not; no weight copied."""

import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from transformers import OPTConfig, OPTForCausalLM

from specbook import Sampler, autoregressive_generate, load_pair, speculative_generate
from specbook.bench import acceptance
from specbook.drafters import Draft
from specbook.drafters.early_exit import SelfSpeculativeDrafter
from specbook.heads import ExitHead, decoder_parts, early_exit_model, final_norm
from specbook.models import assets_dir
from specbook.packed import pack_linears
from specbook.train.card import exit_section
from specbook.train.cli import main
from specbook.train.heads import exit_loss, train_head
from specbook.train.loop import TrainConfig

from families import FAMILIES, VOCAB, hf_greedy, tiny_family_model
from support import SAMPLERS, VOCAB as SAMPLED_VOCAB, chi_square_p_value, tiny_model

PROMPT = torch.randint(3, VOCAB, (1, 12), generator=torch.Generator().manual_seed(0))


# --- greedy: token for token the target's own output, on every family, packed or not

@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_self_speculative_equals_autoregressive_and_generate(family):
    target = tiny_family_model(family, layers=4)
    with torch.no_grad():
        reference = hf_greedy(target, PROMPT, 20)
    assert autoregressive_generate(target, PROMPT, 20, Sampler(0)).token_ids == reference
    for exit_layer in (1, 2, 3):
        drafter = SelfSpeculativeDrafter(target, ExitHead.for_target(target, exit_layer))
        assert speculative_generate(target, drafter, PROMPT, 20, k=3, sampler=Sampler(0)).token_ids == reference


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="PyTorch built without oneDNN")
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_with_a_packed_target(family):
    target = pack_linears(tiny_family_model(family, layers=4))
    reference = autoregressive_generate(target, PROMPT, 20, Sampler(0)).token_ids
    drafter = SelfSpeculativeDrafter(target, ExitHead.for_target(target, 2))
    assert speculative_generate(target, drafter, PROMPT, 20, k=3, sampler=Sampler(0)).token_ids == reference


def test_the_early_exit_is_sometimes_right_and_sometimes_wrong():
    """Otherwise the equalities above would not exercise partial acceptance and rollback."""
    target = tiny_family_model("llama", layers=4)
    result = speculative_generate(target, SelfSpeculativeDrafter(target, ExitHead.for_target(target, 2)), PROMPT, 40,
                                  k=3, sampler=Sampler(0))
    assert any(step.accepted for step in result.steps)
    assert any(step.accepted < len(step.drafted) for step in result.steps)


# --- the draft is the target's own layers: shared, not copied

@pytest.mark.parametrize("family", ["llama", "gemma3", "olmo2", "gpt2", "opt", "gpt_neox"])
def test_the_draft_is_the_targets_own_layers_shared_not_copied(family):
    """Every weight of the draft is the target's (the same memory) or the head's; an untrained head is the target's
    final norm and LM head applied to its hidden state after layer L."""
    target = tiny_family_model(family, layers=4)
    head = ExitHead.for_target(target, 2)
    model = early_exit_model(target, head)
    target_pointers = {param.data_ptr() for param in target.parameters()}
    head_pointers = {param.data_ptr() for param in head.parameters()}
    draft_pointers = {param.data_ptr() for param in model.parameters()}
    assert draft_pointers <= target_pointers | head_pointers and head_pointers <= draft_pointers
    assert not head_pointers & target_pointers  # the head's norm and LM head are its own, to be trained
    assert target.get_input_embeddings().weight.data_ptr() in draft_pointers
    layers_name, _ = decoder_parts(target)
    draft_layers, target_layers = getattr(model.get_decoder(), layers_name), getattr(target.get_decoder(), layers_name)
    assert len(draft_layers) == 2 and all(mine is theirs for mine, theirs in zip(draft_layers, target_layers))
    with torch.no_grad():
        hidden = target(PROMPT, output_hidden_states=True).hidden_states[2]  # (1, T, hidden): after 2 layers
        expected = target.get_output_embeddings()(final_norm(target)(hidden))
        torch.testing.assert_close(model(PROMPT).logits, expected)
    assert model.config.num_hidden_layers == 2 and target.config.num_hidden_layers == 4


# --- bad input: clear errors that name the argument and the allowed range

@pytest.mark.parametrize("exit_layer", [0, 4, -1, 2.0, True, None])
def test_exit_layers_outside_the_target_are_refused(exit_layer):
    target = tiny_family_model("llama", layers=4)
    with pytest.raises(ValueError, match=r"exit_layer must be an integer in \[1, 3\]"):
        ExitHead.for_target(target, exit_layer)


def test_a_head_for_another_target_is_refused(tmp_path):
    target = tiny_family_model("llama", layers=4)
    head = ExitHead.for_target(target, 3)
    with pytest.raises(ValueError, match=r"exit_layer must be an integer in \[1, 1\]"):
        SelfSpeculativeDrafter(tiny_family_model("llama", layers=2), head)
    with pytest.raises(ValueError, match="hidden size 32 but the target's hidden size is 16"):
        SelfSpeculativeDrafter(tiny_family_model("llama", layers=4, hidden=16), head)
    with pytest.raises(ValueError, match="norm is a LlamaRMSNorm but the target's final norm is a LayerNorm"):
        SelfSpeculativeDrafter(tiny_family_model("gpt_neox", layers=4), head)
    head.save(tmp_path)
    with pytest.raises(ValueError, match=r"exit_layer must be an integer in \[1, 2\]"):
        ExitHead.from_pretrained(tmp_path, tiny_family_model("llama", layers=3))
    (tmp_path / "config.json").write_text(json.dumps({"kind": "eagle"}))
    with pytest.raises(ValueError, match="holds no exit head"):
        ExitHead.from_pretrained(tmp_path, target)


def test_a_model_without_a_final_norm_is_refused():
    """OPT-350m's layers normalise after attention, and its decoder has no final norm to copy."""
    config = OPTConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=4, num_attention_heads=2, ffn_dim=64,
                       word_embed_proj_dim=32, do_layer_norm_before=False)
    with pytest.raises(ValueError, match="cannot find the decoder layers and the final norm of OPTForCausalLM"):
        ExitHead.for_target(OPTForCausalLM(config), 2)


def test_save_and_load_round_trip(tmp_path):
    target = tiny_family_model("gpt2", layers=4)
    head = ExitHead.for_target(target, 3)
    with torch.no_grad():
        head.lm_head.weight.add_(torch.randn_like(head.lm_head.weight))
    head.save(tmp_path)
    loaded = ExitHead.from_pretrained(tmp_path, target)
    assert loaded.exit_layer == 3 and not loaded.training
    for name, tensor in head.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor.half().float())


# --- lossless under sampling, and a broken variant that the test catches

@pytest.fixture(scope="module")
def shallow_pair():
    """A 2-layer target over a 3-token vocabulary with peaked q, and its exit after layer 1, off from q."""
    target = tiny_model(vocab_size=SAMPLED_VOCAB, hidden_size=8, num_layers=2, seed=5)
    with torch.no_grad():
        target.lm_head.weight.mul_(30)
    head = ExitHead.for_target(target, 1)
    with torch.no_grad():
        head.lm_head.weight.copy_(torch.randn(head.lm_head.weight.shape, generator=torch.Generator().manual_seed(1)))
    return target, head


@pytest.mark.parametrize("sampler", SAMPLERS, ids=["plain", "warped"])
def test_sampled_output_follows_the_target(shallow_pair, sampler):
    target, head = shallow_pair
    assert chi_square_p_value(target, SelfSpeculativeDrafter(target, head), sampler) > 1e-3


class UniformClaiming(SelfSpeculativeDrafter):
    """Samples its drafts from p but claims they came from the uniform distribution."""

    def propose(self, *args, **kwargs):
        draft = super().propose(*args, **kwargs)
        return Draft(draft.tokens, torch.full_like(draft.probs, 1 / draft.probs.shape[-1]))


def test_chi_square_catches_a_drafter_reporting_the_wrong_p(shallow_pair):
    target, head = shallow_pair
    assert chi_square_p_value(target, UniformClaiming(target, head), SAMPLERS[0], samples=400) < 1e-6


# --- training: the exit stage, and a loss that training lowers

def test_training_lowers_the_kl_to_the_target(tmp_path):
    target = tiny_model(seed=0).requires_grad_(False)
    text = torch.randint(0, 64, (2000,), generator=torch.Generator().manual_seed(0))
    head, fresh = ExitHead.for_target(target, 1), ExitHead.for_target(target, 1)
    config = TrainConfig(steps=40, batch_size=8, block_size=32, lr=1e-2, warmup=5, eval_every=40, ckpt_every=40)
    log = train_head(head, exit_loss, target, text, text, config, tmp_path, "cpu", "exit")
    window = text[:33 * 8].view(8, 33)
    with torch.no_grad():
        assert exit_loss(head, target, window[:, :-1], window[:, 1:]) < exit_loss(fresh, target, window[:, :-1],
                                                                                   window[:, 1:])
    assert log["step"] == 40 and 0 <= log["log"][-1]["agreement"] <= 1


def test_exit_stage_and_card_section(tmp_path, capsys):
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(assets_dir() / name, out / name)
    tiny_model(vocab_size=2048, seed=2).save_pretrained(out / "target")
    text = "\n\n".join(json.loads((assets_dir() / "heldout_prompts.json").read_text()))
    for split in ("train", "valid"):
        (work / f"{split}.txt").write_text(text)
    assert "Not trained yet" in exit_section(out, None, [], None)
    with pytest.raises(SystemExit):
        main(["--work", str(work), "--out", str(out), "--stages", "exit", "--exit-layer", "2", "--device", "cpu"])
    assert "--exit-layer: exit_layer must be an integer in [1, 1]" in capsys.readouterr().err
    main(["--work", str(work), "--out", str(out), "--stages", "exit", "--exit-layer", "1", "--exit-steps", "2",
          "--device", "cpu"])
    assert json.loads((out / "exit" / "training.json").read_text())["step"] == 2
    assert (work / "ckpt-exit-1" / "checkpoint.pt").exists()
    target = tiny_model(vocab_size=2048, seed=2)
    assert ExitHead.from_pretrained(out / "exit", target).exit_layer == 1
    section = exit_section(out, SimpleNamespace(target=target), [PROMPT], torch.randint(0, 2048, (600,)))
    assert "the first 1 of its 2 layers" in section and "| trained |" in section and "| untrained |" in section


# --- the built-in head on the built-in target

def test_the_built_in_exit_head_drafts_for_the_built_in_target():
    pair = load_pair("shakespeare")
    drafter = SelfSpeculativeDrafter.from_pretrained("shakespeare", pair.target)
    prompts = [pair.encode(text) for text in json.loads((assets_dir() / "heldout_prompts.json").read_text())[:2]]
    for prompt in prompts:
        result = speculative_generate(pair.target, drafter, prompt, 32, k=4, sampler=Sampler(0))
        assert result.token_ids == autoregressive_generate(pair.target, prompt, 32, Sampler(0)).token_ids
    measured = acceptance(pair.target, drafter, prompts, new_tokens=32)
    print(f"built-in exit head: {measured['acceptance_rate']:.3f} acceptance rate, "
          f"{measured['tokens_per_step']:.2f} tokens per target call")

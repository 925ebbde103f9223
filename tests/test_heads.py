import json
import shutil
from types import SimpleNamespace

import pytest
import torch

from specbook.cache import SlotCache, new_cache
from specbook.decoding import autoregressive_generate, speculative_generate
from specbook.drafters import Draft, EagleDrafter, MedusaDrafter, ModelDrafter, TopKTreeDrafter
from specbook.bench import acceptance
from specbook.heads import EagleHead, MedusaHeads, head_accuracy
from specbook.models import target_features
from specbook.models import assets_dir
from specbook.policies import ConfidenceStop, HeuristicK
from specbook.sampling import Sampler
from specbook.eagle3 import Eagle3Head
from specbook.train.card import eagle3_section, heads_section
from specbook.trees import DynamicTree
from specbook.train.cli import main
from specbook.train.heads import eagle_loss, medusa_loss, train_head
from specbook.train.loop import TrainConfig

from support import SAMPLERS, cached_layers, chi_square_p_value, tiny_model

PROMPT = torch.tensor([[3, 14, 15, 9, 2, 6, 5]])
KINDS = ["medusa-chain", "medusa-tree", "eagle-chain", "eagle-tree", "eagle-dynamic"]


# --- tiny heads trained on the tiny target's own text, so that their drafts are sometimes right

@pytest.fixture(scope="module")
def heads(target, tmp_path_factory):
    torch.manual_seed(0)
    with torch.no_grad():
        text = target.generate(torch.randint(0, 64, (64, 4)), do_sample=True, temperature=0.2, max_new_tokens=60,
                               pad_token_id=0).flatten()  # (64 * 64,)
    config = TrainConfig(steps=150, batch_size=8, block_size=32, lr=1e-2, warmup=10, eval_every=150, ckpt_every=150)
    frozen = tiny_model(seed=0).requires_grad_(False)  # the target's weights, frozen, without touching the fixture
    medusa, eagle = MedusaHeads(32, 3), EagleHead(target.config)
    logs = {}
    for name, head, loss in (("medusa", medusa, medusa_loss), ("eagle", eagle, eagle_loss)):
        logs[name] = train_head(head, loss, frozen, text, text, config, tmp_path_factory.mktemp(name), "cpu", name)
    return SimpleNamespace(medusa=medusa, eagle=eagle, text=text, logs=logs)


def make_drafter(kind, target, heads):
    return {"medusa-chain": lambda: MedusaDrafter(target, heads.medusa, tree=None),
            "medusa-tree": lambda: MedusaDrafter(target, heads.medusa, tree=(3, 2, 2)),
            "eagle-chain": lambda: EagleDrafter(target, heads.eagle),
            "eagle-tree": lambda: EagleDrafter(target, heads.eagle, tree=(3, 2, 1)),
            "eagle-dynamic": lambda: EagleDrafter(target, heads.eagle, tree=DynamicTree(4, 3, nodes=8))}[kind]()


@pytest.fixture(scope="module")
def reference(target):
    return autoregressive_generate(target, PROMPT, 40, Sampler(0)).token_ids


def test_training_lowers_the_losses_and_the_heads_learn(target, heads):
    for name, loss in (("medusa", medusa_loss), ("eagle", eagle_loss)):
        head = getattr(heads, name)
        fresh = MedusaHeads(32, 3) if name == "medusa" else EagleHead(target.config)
        inputs, targets = heads.text[:33 * 8].view(8, 33)[:, :-1], heads.text[:33 * 8].view(8, 33)[:, 1:]
        with torch.no_grad():
            assert loss(head, target, inputs, targets) < loss(fresh, target, inputs, targets)
    assert heads.logs["medusa"]["step"] == heads.logs["eagle"]["step"] == 150
    accuracy = head_accuracy(target, heads.medusa, heads.text, block_size=32)
    assert len(accuracy["top1"]) == len(accuracy["top5"]) == 3
    assert all(0 < top1 <= top5 for top1, top5 in zip(accuracy["top1"], accuracy["top5"]))


def test_a_fresh_medusa_head_is_the_targets_own_next_token_prediction(target):
    """W_i starts at zero: every head repeats the target's LM head, the point Medusa trains from."""
    with torch.no_grad():
        features = target_features(target, PROMPT)  # (1, T, hidden)
        logits = MedusaHeads(32, 3)(features, target.get_output_embeddings())  # (1, T, 3, vocab)
        expected = target(PROMPT).logits
    for head in range(3):
        torch.testing.assert_close(logits[:, :, head], expected, rtol=0, atol=1e-6)


# --- greedy: token for token the target's own output

@pytest.mark.parametrize("k", [1, 2, 4, HeuristicK(2, 1, 5)], ids=["k1", "k2", "k4", "heuristic"])
@pytest.mark.parametrize("kind", KINDS)
def test_greedy_speculative_equals_autoregressive(target, heads, reference, kind, k):
    result = speculative_generate(target, make_drafter(kind, target, heads), PROMPT, 40, k=k, sampler=Sampler(0))
    assert result.token_ids == reference


@pytest.mark.parametrize("kind", KINDS)
def test_the_tiny_heads_are_sometimes_right_and_sometimes_wrong(target, heads, kind):
    """Otherwise the equality above would not exercise partial acceptance and rollback."""
    result = speculative_generate(target, make_drafter(kind, target, heads), PROMPT, 40, k=3, sampler=Sampler(0))
    assert any(step.accepted for step in result.steps)
    assert any(step.accepted < len(step.drafted) for step in result.steps)
    assert result.stats.draft_calls > 0


@pytest.mark.parametrize("kind", ["medusa-chain", "eagle-chain"])
def test_a_chain_stops_where_the_head_is_unsure(target, heads, reference, kind):
    """The tiny heads are never 99% sure: ConfidenceStop cuts every chain after its first token."""
    result = speculative_generate(target, make_drafter(kind, target, heads), PROMPT, 40, k=ConfidenceStop(0.99, 4),
                                  sampler=Sampler(0))
    assert result.token_ids == reference
    drafting = [step for step in result.steps if step.drafted]  # (the last step may have no budget left)
    assert len(drafting) >= len(result.steps) - 1 and all(len(step.drafted) == 1 for step in drafting)
    assert result.stats.draft_calls == len(drafting)  # one head call a step


@pytest.mark.parametrize("kind", KINDS)
def test_one_token_prompt(target, heads, kind):
    """No feature before the first target call: the first step drafts nothing, the rest as usual."""
    prompt = PROMPT[:, :1]
    result = speculative_generate(target, make_drafter(kind, target, heads), prompt, 20, k=3, sampler=Sampler(0))
    assert result.token_ids == autoregressive_generate(target, prompt, 20, Sampler(0)).token_ids
    assert result.steps[0].drafted == [] and any(step.drafted for step in result.steps)


def test_greedy_acceptance_is_measured_on_the_targets_continuations(target, heads, reference):
    measured = acceptance(target, make_drafter("medusa-tree", target, heads), [PROMPT], new_tokens=40, k=3)
    run = speculative_generate(target, make_drafter("medusa-tree", target, heads), PROMPT, 40, k=3, sampler=Sampler(0))
    assert measured == {"tokens_per_step": run.stats.tokens_per_step, "acceptance_rate": run.stats.acceptance_rate}


# --- the engine hands over the right features

class Recording:
    """Mixin: a drafter that asks for the target's features and keeps every block it is given."""

    uses_features = True

    def start(self, input_ids):
        super().start(input_ids)
        self.seen = []

    def observe_features(self, features):
        self.seen.append(features)


class RecordingChain(Recording, ModelDrafter):
    pass


class RecordingTree(Recording, TopKTreeDrafter):
    pass


@pytest.mark.parametrize("sampler", [Sampler(0), Sampler(0.8)], ids=["greedy", "sampled"])
@pytest.mark.parametrize("drafter", [RecordingChain, RecordingTree])
def test_observed_features_are_the_targets_hidden_states_at_the_committed_positions(target, draft, reference, drafter,
                                                                                   sampler):
    recording = drafter(draft)
    result = speculative_generate(target, recording, PROMPT, 40, k=3, sampler=sampler, seed=0)
    if sampler.greedy:
        assert result.token_ids == reference  # the features path changes nothing
    sequence = torch.cat([PROMPT[0], torch.tensor(result.token_ids)])
    with torch.no_grad():
        expected = target_features(target, sequence[None, :-1])[0]  # every position but the last, pending one
    assert [len(block) for block in recording.seen] == [PROMPT.shape[1] - 1] + [step.accepted + 1
                                                                                for step in result.steps]
    torch.testing.assert_close(torch.cat(recording.seen), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("tree", [None, (3, 2, 1)], ids=["chain", "tree"])
def test_the_eagle_cache_holds_the_true_features_of_the_committed_tokens(target, heads, tree):
    """Pairs built on predicted features are rolled back and the committed ones re-fed with the target's."""
    drafter = EagleDrafter(target, heads.eagle, tree)
    for seed in range(20):  # a generation in which some step accepted part of its draft, not all or nothing
        result = speculative_generate(target, drafter, PROMPT, 30, k=3, sampler=Sampler(0.8), seed=seed)
        if any(0 < step.accepted < len(step.drafted) for step in result.steps):
            break
    else:
        pytest.fail("no seed gave a partly accepted draft")
    sequence = torch.cat([PROMPT[0], torch.tensor(result.token_ids)])[None]
    length = drafter.cache.get_seq_length()  # pairs (f_t, x_{t+1}) for t < length; the rest wait to be fed
    assert length + len(drafter.tokens) == sequence.shape[1] - 1 == length + len(torch.cat(drafter.features))
    fresh = new_cache(heads.eagle.layer)
    with torch.no_grad():
        features = target_features(target, sequence)
        heads.eagle(features[:, :length], target.get_input_embeddings()(sequence[:, 1:length + 1]), fresh)
    assert isinstance(drafter.cache, SlotCache)  # the head drafts on the package's decoder; the reference is HF's
    for (keys, values), (expected_keys, expected_values) in zip(cached_layers(drafter.cache), cached_layers(fresh)):
        torch.testing.assert_close(keys, expected_keys, atol=1e-5, rtol=0)
        torch.testing.assert_close(values, expected_values, atol=1e-5, rtol=0)


# --- lossless under sampling, and a broken variant that the test catches

@pytest.fixture(scope="module")
def tiny_heads(tiny_pair):
    """Random heads for the 3-token target: their drafts differ from the target's choices."""
    target = tiny_pair[0]
    torch.manual_seed(5)
    eagle, medusa = EagleHead(target.config), MedusaHeads(8, 2)
    with torch.no_grad():
        for block in medusa.blocks:
            torch.nn.init.normal_(block.weight)
    return SimpleNamespace(eagle=eagle, medusa=medusa)


@pytest.mark.parametrize("kind, sampler", [("eagle-chain", SAMPLERS[1]), ("eagle-tree", SAMPLERS[0]),
                                           ("medusa-tree", SAMPLERS[1]), ("eagle-dynamic", SAMPLERS[1])],
                         ids=["eagle-chain-warped", "eagle-tree-plain", "medusa-tree-warped", "eagle-dynamic-warped"])
def test_sampled_output_follows_the_target(tiny_pair, tiny_heads, kind, sampler):
    target = tiny_pair[0]
    drafter = {"eagle-chain": lambda: EagleDrafter(target, tiny_heads.eagle),
               "eagle-tree": lambda: EagleDrafter(target, tiny_heads.eagle, tree=(2, 2)),
               "medusa-tree": lambda: MedusaDrafter(target, tiny_heads.medusa, tree=(2, 2)),
               "eagle-dynamic": lambda: EagleDrafter(target, tiny_heads.eagle, tree=DynamicTree(2, 2, 3))}[kind]()
    assert chi_square_p_value(target, drafter, sampler) > 1e-3


class UniformClaimingEagle(EagleDrafter):
    """Samples its drafts from p but claims they came from the uniform distribution."""

    def _chain(self, *args):
        draft = super()._chain(*args)
        return Draft(draft.tokens, torch.full_like(draft.probs, 1 / draft.probs.shape[-1]))


def test_chi_square_catches_an_eagle_chain_reporting_the_wrong_p(tiny_pair, tiny_heads):
    target = tiny_pair[0]
    assert chi_square_p_value(target, UniformClaimingEagle(target, tiny_heads.eagle), SAMPLERS[0], samples=400) < 1e-6


# --- saving and loading

@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_save_and_load_round_trip(target, heads, tmp_path, kind):
    head, cls = (heads.medusa, MedusaHeads) if kind == "medusa" else (heads.eagle, EagleHead)
    head.save(tmp_path / "exact", dtype=torch.float32)
    loaded = cls.from_pretrained(tmp_path / "exact", target)
    assert loaded.state_dict().keys() == head.state_dict().keys()
    assert all(torch.equal(loaded.state_dict()[name], tensor) for name, tensor in head.state_dict().items())
    head.save(tmp_path / "half")  # the default: float16 on disk, the target's dtype once loaded
    assert json.loads((tmp_path / "half" / "config.json").read_text())["kind"] == kind
    assert all(tensor.dtype == torch.float32 for tensor in cls.from_pretrained(tmp_path / "half", target).state_dict()
               .values())


def test_medusa_keeps_the_first_heads_when_asked(target, heads, tmp_path):
    heads.medusa.save(tmp_path, dtype=torch.float32)
    two = MedusaHeads.from_pretrained(tmp_path, target, num_heads=2)
    assert two.num_heads == 2
    features = torch.randn(5, 32)
    with torch.no_grad():
        torch.testing.assert_close(two(features, target.lm_head), heads.medusa(features, target.lm_head)[:, :2])


@pytest.mark.skipif(not (assets_dir() / "medusa").exists() or not (assets_dir() / "eagle").exists(),
                    reason="the built-in heads are not trained yet")
@pytest.mark.parametrize("drafter", [MedusaDrafter, EagleDrafter])
def test_built_in_heads_plug_into_the_engine(drafter):
    from specbook.models import load_pair

    pair = load_pair("shakespeare")
    prompt = pair.encode("ROMEO:\nBut, soft! what light")
    reference = autoregressive_generate(pair.target, prompt, 24, Sampler(0)).token_ids
    result = speculative_generate(pair.target, drafter.from_pretrained("shakespeare", pair.target), prompt, 24,
                                  sampler=Sampler(0))
    assert result.token_ids == reference


# --- bad input gets a clear error naming the argument

def test_more_heads_than_trained(target, heads, tmp_path):
    heads.medusa.save(tmp_path)
    for num_heads in (4, 0):
        with pytest.raises(ValueError, match=r"num_heads must be in \[1, 3\]: 3 heads were trained"):
            MedusaDrafter.from_pretrained(tmp_path, target, num_heads=num_heads)


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_heads_of_another_hidden_size(heads, tmp_path, kind):
    other = tiny_model(hidden_size=16)
    head = getattr(heads, kind)
    head.save(tmp_path)
    drafter = MedusaDrafter if kind == "medusa" else EagleDrafter
    match = f"the {kind} head has hidden size 32 but the target's hidden size is 16"
    with pytest.raises(ValueError, match=match):
        drafter.from_pretrained(tmp_path, other)
    with pytest.raises(ValueError, match=match):
        drafter(other, head)


def test_unknown_name_and_wrong_kind(target, heads, tmp_path):
    with pytest.raises(ValueError, match=r"name_or_path must be a built-in name \['shakespeare'\] or a directory"):
        MedusaDrafter.from_pretrained("hamlet", target)
    heads.medusa.save(tmp_path)
    with pytest.raises(ValueError, match="holds no eagle head"):
        EagleDrafter.from_pretrained(tmp_path, target)


def test_a_tree_deeper_than_the_heads(target, heads):
    with pytest.raises(ValueError, match=r"tree has depth 4 but there are 3 heads: give a tree of depth in \[1, 3\]"):
        MedusaDrafter(target, heads.medusa, tree=(2, 2, 1, 1))


def test_a_drafter_built_on_another_target_is_refused(target, heads):
    other = tiny_model(seed=7)
    with pytest.raises(ValueError, match="reads the features of another model than this target"):
        speculative_generate(other, MedusaDrafter(target, heads.medusa), PROMPT, 5)


# --- the training stages and the model card's section, end to end on a tiny target

def test_train_stages_and_card_section(tmp_path, capsys):
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    shipped = assets_dir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(shipped / name, out / name)
    tiny_model(vocab_size=2048, seed=2).save_pretrained(out / "target")
    text = "\n\n".join(json.loads((shipped / "heldout_prompts.json").read_text()))
    for split in ("train", "valid"):
        (work / f"{split}.txt").write_text(text)
    assert "Not trained yet" in heads_section(out, None, [], None)
    main(["--work", str(work), "--out", str(out), "--stages", "medusa,eagle", "--medusa-steps", "2",
          "--eagle-steps", "2", "--medusa-heads", "2", "--device", "cpu"])
    for kind, cls in (("medusa", MedusaHeads), ("eagle", EagleHead)):
        assert json.loads((out / kind / "training.json").read_text())["step"] == 2
        assert (work / f"ckpt-{kind}" / "checkpoint.pt").exists()
    target = tiny_model(vocab_size=2048, seed=2)
    assert MedusaHeads.from_pretrained(out / "medusa", target).num_heads == 2
    valid = torch.randint(0, 2048, (600,))
    section = heads_section(out, SimpleNamespace(target=target, draft=target), [PROMPT], valid)
    assert "| Medusa head 1 | token t + 3 from f_t |" in section and "| EAGLE, 16-node tree |" in section
    assert "Not trained yet" in eagle3_section(out, None, [], None)
    main(["--work", str(work), "--out", str(out), "--stages", "eagle3", "--eagle3-steps", "2", "--eagle3-ttt", "2",
          "--eagle3-layers", "1,-1", "--device", "cpu"])
    record = json.loads((out / "eagle3" / "training.json").read_text())
    assert record["step"] == 2 and record["ttt_steps"] == 2 and len(record["log"][-1]["top1"]) == 3
    head = Eagle3Head.from_pretrained(out / "eagle3", target)
    assert head.feature_layers == (1, -1) and len(head.token_order) == 2048
    section = eagle3_section(out, SimpleNamespace(target=target), [PROMPT], valid)
    assert "| 2 | token t + 4 |" in section and "| EAGLE-3, dynamic 16-node tree |" in section
    for bad, message in ((["--eagle3-ttt", "0"], "--eagle3-ttt must be >= 1"),
                         (["--eagle3-layers", "1,x"], "comma-separated integers"),
                         (["--eagle3-layers", "5"], "feature_layers must hold indices in")):
        with pytest.raises(SystemExit):
            main(["--work", str(work), "--out", str(out), "--stages", "eagle3", *bad])
        assert message in capsys.readouterr().err

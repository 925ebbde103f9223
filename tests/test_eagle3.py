"""EAGLE-3 (`specbook.eagle3`, `specbook.drafters.eagle3`): the training-time test unrolls what drafting does,
the engine hands over the fused layers' states, output is exact (greedy, sampled, a reduced vocabulary), and bad
input is refused."""

import copy
import json

import pytest
import torch

from specbook import DynamicTree, Sampler, autoregressive_generate, speculative_generate
from specbook.cache import SlotCache, new_cache
from specbook.drafters import Draft, Eagle3Drafter
from specbook.eagle3 import Eagle3Head, check_vocab, default_feature_layers, ttt_predictions
from specbook.heads import head_accuracy
from specbook.train.heads import eagle3_loss, train_head
from specbook.train.loop import TrainConfig

from support import SAMPLERS, chi_square_p_value, tiny_model

PROMPT = torch.tensor([[3, 14, 15, 9, 2, 6, 5]])
SHAPES = {"chain": None, "tree": (3, 2, 1), "dynamic": DynamicTree(4, 3, nodes=8)}


@pytest.fixture(scope="module")
def deep_target():
    return tiny_model(num_layers=4, seed=0)


@pytest.fixture(scope="module")
def head(deep_target, tmp_path_factory):
    """A head trained briefly on the target's own text, so that its drafts are sometimes right."""
    torch.manual_seed(0)
    with torch.no_grad():
        text = deep_target.generate(torch.randint(0, 64, (32, 4)), do_sample=True, temperature=0.2,
                                    max_new_tokens=60, pad_token_id=0).flatten()
    head = Eagle3Head.for_target(deep_target, feature_layers=(1, 2, 3))
    frozen = tiny_model(num_layers=4, seed=0).requires_grad_(False)
    config = TrainConfig(steps=80, batch_size=8, block_size=32, lr=1e-2, warmup=10, eval_every=80, ckpt_every=80)
    head.log = train_head(head, eagle3_loss, frozen, text, text, config, tmp_path_factory.mktemp("eagle3"), "cpu",
                          "eagle3")
    head.text = text
    return head.eval()


@pytest.fixture(scope="module")
def reference(deep_target):
    return autoregressive_generate(deep_target, PROMPT, 40, Sampler(0)).token_ids


def test_default_layers_are_low_middle_and_high(deep_target):
    assert default_feature_layers(tiny_model(num_layers=12).config) == (2, 6, 9)
    assert default_feature_layers(deep_target.config) == (2, 2, 1)


def test_the_training_time_test_unrolls_what_drafting_computes(deep_target, head):
    """Step j of `ttt_predictions` at base t is the head fed the true pairs up to t and then its own outputs
    with the text's next tokens, one position at a time over its KV cache, as a drafted chain is."""
    text = head.text[:20][None]
    with torch.no_grad():
        unrolled = ttt_predictions(head, deep_target, text, steps=3)
        states = deep_target(text, output_hidden_states=True).hidden_states
        fused = head.fused(torch.cat([states[layer] for layer in head.feature_layers], -1))  # (1, 20, hidden)
        embed = deep_target.get_input_embeddings()
        for base in (0, 5, 12):
            cache = new_cache(head.layer)
            out = head(fused[:, : base + 1], embed(text[:, 1: base + 2]), cache)[:, -1:]  # a^0 at base
            torch.testing.assert_close(out, unrolled[0][0][:, base: base + 1], atol=1e-5, rtol=0)
            for step in (1, 2):
                out = head(out, embed(text[:, base + step + 1: base + step + 2]), cache)
                torch.testing.assert_close(out, unrolled[step][0][:, base: base + 1], atol=1e-5, rtol=0)


def test_the_decoder_runs_the_papers_layer_as_hugging_face_does(deep_target, head):
    """EAGLE-3's layer reads [e(x); g], each half through its own norm, g the residual: the package's decoder (a
    `SlotCache`) gives what Hugging Face's forward over the same layer gives, and both read each half's norm."""
    mixed = copy.deepcopy(head)
    layer = mixed.layer.layers[0]
    with torch.no_grad():
        for norm in (layer.input_layernorm, layer.hidden_norm, layer.post_attention_layernorm):
            norm.weight.uniform_(0.5, 1.5)  # the norms told apart
    generator = torch.Generator().manual_seed(0)
    features, tokens = (torch.randn(1, 6, mixed.hidden_size, generator=generator) for _ in range(2))
    assert isinstance(mixed.new_cache(), SlotCache)  # the decoder serves the head's layer
    with torch.no_grad():
        ours = mixed(features, tokens, mixed.new_cache())
        theirs = mixed(features, tokens, new_cache(mixed.layer))
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)
        for norm in (layer.input_layernorm, layer.hidden_norm):
            norm.weight.mul_(2)
            assert not torch.allclose(mixed(features, tokens, mixed.new_cache()), ours, atol=1e-3)
            assert not torch.allclose(mixed(features, tokens, new_cache(mixed.layer)), ours, atol=1e-3)
            norm.weight.div_(2)


def test_a_reduced_vocabulary_is_trained_where_the_targets_choice_lies_in_it(deep_target, head):
    """The paper's loss for a draft vocabulary V: q renormalised over V, positions whose target argmax is outside V
    left out. A head whose V holds none of the target's choices on a window has nothing to learn there (a loss that
    scored those positions would not be 0); one whose V holds them all is scored."""
    window = head.text[: 33 * 4].view(4, 33)
    with torch.no_grad():
        choices = set(deep_target(window).logits.argmax(-1).flatten().tolist())
        others = [token for token in range(deep_target.config.vocab_size) if token not in choices]
        blind = Eagle3Head.for_target(deep_target, feature_layers=(1, 2, 3), vocab=others)
        assert eagle3_loss(blind, deep_target, window[:, :-1], window[:, 1:]) == 0
        sighted = Eagle3Head.for_target(deep_target, feature_layers=(1, 2, 3), vocab=sorted(choices))
        assert eagle3_loss(sighted, deep_target, window[:, :-1], window[:, 1:]) > 0


def test_training_lowers_the_loss_and_later_steps_learn(deep_target, head):
    fresh = Eagle3Head.for_target(deep_target, feature_layers=(1, 2, 3))
    window = head.text[: 33 * 8].view(8, 33)
    with torch.no_grad():
        assert eagle3_loss(head, deep_target, window[:, :-1], window[:, 1:]) < \
            eagle3_loss(fresh, deep_target, window[:, :-1], window[:, 1:])
    accuracy = head_accuracy(deep_target, head, head.text, block_size=32)
    untrained = head_accuracy(deep_target, fresh, head.text, block_size=32)
    assert len(accuracy["top1"]) == 3  # one per unrolled step
    assert all(top1 > max(before, 1 / 64) for top1, before in zip(accuracy["top1"], untrained["top1"]))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_greedy_speculative_equals_autoregressive(deep_target, head, reference, shape, cache):
    drafter = Eagle3Drafter(deep_target, head, tree=SHAPES[shape])
    result = speculative_generate(deep_target, drafter, PROMPT, 40, k=4, sampler=Sampler(0), cache=cache)
    assert result.token_ids == reference
    assert 0 < result.stats.acceptance_rate < 1  # sometimes right, sometimes wrong: the test can fail


def test_the_engine_hands_over_the_fused_layers_at_the_committed_positions(deep_target, head, reference):
    seen = []

    class Recording(Eagle3Drafter):
        def observe_features(self, features):
            seen.append(features)
            super().observe_features(features)

    result = speculative_generate(deep_target, Recording(deep_target, head), PROMPT, 40, k=3, sampler=Sampler(0))
    sequence = torch.cat([PROMPT[0], torch.tensor(result.token_ids)])[None, :-1]
    with torch.no_grad():
        states = deep_target(sequence, output_hidden_states=True).hidden_states
    expected = torch.cat([states[layer][0] for layer in head.feature_layers], -1)  # (positions, 3 hidden)
    torch.testing.assert_close(torch.cat(seen), expected, atol=1e-5, rtol=0)


def test_a_reduced_vocabulary_stays_exact_without_the_targets_tokens(deep_target, head, reference):
    """The draft cannot propose most of what the target wants: fewer drafts accepted, the same tokens."""
    wanted = set(reference)
    vocab = [token for token in range(64) if token not in wanted or token % 3 == 0]
    reduced = head.with_vocabulary(vocab)
    assert reduced.lm_head.weight.shape[0] == len(vocab) and head.lm_head.weight.shape[0] == 64
    for shape in SHAPES:
        drafter = Eagle3Drafter(deep_target, reduced, tree=SHAPES[shape])
        result = speculative_generate(deep_target, drafter, PROMPT, 40, k=4, sampler=Sampler(0))
        assert result.token_ids == reference
        assert all(token in vocab for step in result.steps for token in step.drafted)
    logits = reduced.logits(torch.randn(5, 32))
    assert logits.shape == (5, 64) and torch.isinf(logits[:, [t for t in range(64) if t not in vocab]]).all()


# --- lossless under sampling, and a broken variant that the test catches

@pytest.fixture(scope="module")
def sharp_target():
    """A 3-token target of two layers with peaked distributions."""
    target = tiny_model(vocab_size=3, hidden_size=8, num_layers=2, seed=3)
    with torch.no_grad():
        target.lm_head.weight.mul_(10)  # peaked, and spread enough for the chi-square's cells
    return target


def _random_head(target, vocab=None):
    torch.manual_seed(5)
    head = Eagle3Head(target.config, feature_layers=(1, -1)).eval()
    return head if vocab is None else head.with_vocabulary(vocab)


@pytest.mark.parametrize("shape, vocab, sampler", [("chain", None, SAMPLERS[1]), ("dynamic", None, SAMPLERS[0]),
                                                   ("chain", [0, 2], SAMPLERS[0]), ("tree", [0, 2], SAMPLERS[1])],
                         ids=["chain-warped", "dynamic-plain", "chain-reduced-plain", "tree-reduced-warped"])
def test_sampled_output_follows_the_target(sharp_target, shape, vocab, sampler):
    tree = {"chain": None, "tree": (2, 2), "dynamic": DynamicTree(2, 2, 3)}[shape]
    drafter = Eagle3Drafter(sharp_target, _random_head(sharp_target, vocab), tree=tree)
    assert chi_square_p_value(sharp_target, drafter, sampler) > 1e-3


class UniformClaimingEagle3(Eagle3Drafter):
    """Drafts from its reduced vocabulary but claims its drafts came from the uniform distribution over all."""

    def _chain(self, *args):
        draft = super()._chain(*args)
        return Draft(draft.tokens, torch.full_like(draft.probs, 1 / draft.probs.shape[-1]))


def test_chi_square_catches_a_chain_reporting_the_wrong_p(sharp_target):
    drafter = UniformClaimingEagle3(sharp_target, _random_head(sharp_target, [0, 2]))
    assert chi_square_p_value(sharp_target, drafter, SAMPLERS[0], samples=400) < 1e-6


# --- saving, loading and bad input

def test_save_and_load_round_trip(deep_target, head, tmp_path):
    head = copy.deepcopy(head)
    head.token_order = list(range(63, -1, -1))
    head.save(tmp_path / "exact", dtype=torch.float32)
    config = json.loads((tmp_path / "exact" / "config.json").read_text())
    assert config["kind"] == "eagle3" and config["feature_layers"] == [1, 2, 3]
    drafter = Eagle3Drafter.from_pretrained(tmp_path / "exact", deep_target)
    assert all(torch.equal(drafter.head.state_dict()[name], tensor) for name, tensor in head.state_dict().items())
    assert drafter.feature_layers == (1, 2, 3)
    small = Eagle3Drafter.from_pretrained(tmp_path / "exact", deep_target, vocab=10)
    assert small.head.vocab.tolist() == list(range(54, 64))  # the 10 most frequent, by token_order
    small.head.save(tmp_path / "small")
    assert Eagle3Head.from_pretrained(tmp_path / "small", deep_target).vocab.tolist() == list(range(54, 64))


def test_a_layer_outside_the_target_is_refused(deep_target):
    for layers in [(0, 2), (1, 4), (-2,), (), 2, (1.5,), (True,)]:
        with pytest.raises(ValueError, match="feature_layers must"):
            Eagle3Head(deep_target.config, feature_layers=layers)


def test_a_head_for_another_target_is_refused(deep_target, head, tmp_path):
    head.save(tmp_path / "head")
    for other in (tiny_model(num_layers=2), tiny_model(num_layers=4, vocab_size=80),
                  tiny_model(num_layers=4, hidden_size=16)):
        with pytest.raises(ValueError, match="only fits the target it was trained on"):
            Eagle3Drafter(other, head)
        with pytest.raises(ValueError, match="only fits the target it was trained on"):
            Eagle3Head.from_pretrained(tmp_path / "head", other)


def test_a_vocabulary_map_that_does_not_fit_is_refused(deep_target, head):
    for vocab in ([], [1, 1, 2], [0, 64], [-1, 3]):
        with pytest.raises(ValueError, match=r"vocab must hold distinct token ids in \[0, 64\)"):
            head.with_vocabulary(vocab)
    small = head.with_vocabulary([1, 2, 3])
    with pytest.raises(ValueError, match="cannot propose"):
        small.with_vocabulary([1, 4])
    with pytest.raises(ValueError, match=r"vocab must be in \[1, 3\]"):
        small.with_vocabulary(4)
    with pytest.raises(ValueError, match="token_order"):
        Eagle3Head(deep_target.config).with_vocabulary(8)
    assert check_vocab(torch.tensor([5, 1]), 64) == [1, 5]

"""The architecture matrix: every method greedy-exact on every family a reader may bring, or refused.

For each family of `families` (tiny random models from Hugging Face configs), greedy decoding by
every method equals the target's own ``generate(do_sample=False)`` token for token: autoregressive
decoding, a draft model's chain, a draft model's token tree, prompt lookup, lookahead decoding, Ouroboros, the
static cache (and its calls replayed as graphs, trees included where the package's decoder runs the target),
EAGLE, EAGLE-3 and Medusa heads freshly initialised on the target (exactness does not need trained heads; EAGLE-3
reads a middle layer and the features, on the static cache and its graphs too).
The sliding-window families have a window of 8: prompts of 5 tokens (the window is crossed while
generating) and of 26 (longer than the window to begin with). Every draft model's embedding is
padded with 32 unused rows, as real pairs that share a tokenizer often are.
"""

import pytest
import torch

import specbook.graphs
from specbook import DynamicTree, Sampler, autoregressive_generate, speculative_generate
from specbook.cache import attention_windows
from specbook.decoder import decoder_for
from specbook.drafters import (Eagle3Drafter, EagleDrafter, LookaheadDrafter, MedusaDrafter, OuroborosDrafter,
                               PromptLookupDrafter, TopKTreeDrafter)
from specbook.eagle3 import Eagle3Head
from specbook.heads import EagleHead, MedusaHeads
from specbook.models import target_features

from families import FAMILIES, SLIDING, VOCAB, WINDOW, hf_greedy, tiny_family_model

NEW_TOKENS = 24
_random = torch.Generator().manual_seed(0)
_long = torch.randint(3, VOCAB, (1, 20), generator=_random)
PROMPTS = {"short": torch.randint(3, VOCAB, (1, 5), generator=_random),
           "long": torch.cat([_long, _long[:, :6]], 1)}  # 26 tokens, ending in a repeat for prompt lookup


def _graphs(method):
    """``method`` with the static cache's calls recorded and replayed as CUDA graphs are (on the CPU too)."""
    def replayed(*args):
        specbook.graphs.CAPTURE_ON_CPU = True
        try:
            return method(*args)
        finally:
            specbook.graphs.CAPTURE_ON_CPU = False
    return replayed


def _methods():
    """Each method as a function (target, draft, prompt) -> greedy tokens."""
    greedy = dict(sampler=Sampler(0))
    return {
        "autoregressive": lambda t, d, x: autoregressive_generate(t, x, NEW_TOKENS, **greedy).token_ids,
        "chain": lambda t, d, x: speculative_generate(t, d, x, NEW_TOKENS, k=3, **greedy).token_ids,
        "tree": lambda t, d, x: speculative_generate(t, TopKTreeDrafter(d, (2, 2, 1)), x, NEW_TOKENS, k=3,
                                                     **greedy).token_ids,
        "prompt_lookup": lambda t, d, x: speculative_generate(t, PromptLookupDrafter(), x, NEW_TOKENS, k=3,
                                                              **greedy).token_ids,
        "static_autoregressive": lambda t, d, x: autoregressive_generate(t, x, NEW_TOKENS, cache="static",
                                                                         **greedy).token_ids,
        "static_chain": lambda t, d, x: speculative_generate(t, d, x, NEW_TOKENS, k=3, cache="static",
                                                             **greedy).token_ids,
        "graphs_autoregressive": _graphs(lambda t, d, x: autoregressive_generate(t, x, NEW_TOKENS, cache="static",
                                                                                 **greedy).token_ids),
        "graphs_chain": _graphs(lambda t, d, x: speculative_generate(t, d, x, NEW_TOKENS, k=3, cache="static",
                                                                     **greedy).token_ids),
        "eagle_chain": lambda t, d, x: speculative_generate(t, EagleDrafter(t, EagleHead(t.config)), x, NEW_TOKENS,
                                                            k=3, **greedy).token_ids,
        "eagle_tree": lambda t, d, x: speculative_generate(t, EagleDrafter(t, EagleHead(t.config), tree=(2, 2)), x,
                                                           NEW_TOKENS, k=3, **greedy).token_ids,
        "eagle_dynamic_tree": lambda t, d, x: speculative_generate(
            t, EagleDrafter(t, EagleHead(t.config), tree=DynamicTree(3, 2, 5)), x, NEW_TOKENS, k=3, **greedy).token_ids,
        "eagle3_chain": lambda t, d, x: speculative_generate(t, Eagle3Drafter(t, Eagle3Head(t.config, (1, -1))), x,
                                                             NEW_TOKENS, k=3, **greedy).token_ids,
        "eagle3_dynamic_tree": lambda t, d, x: speculative_generate(
            t, Eagle3Drafter(t, Eagle3Head(t.config, (1, -1)), tree=DynamicTree(3, 2, 5)), x, NEW_TOKENS, k=3,
            **greedy).token_ids,
        "graphs_eagle3_chain": _graphs(lambda t, d, x: speculative_generate(
            t, Eagle3Drafter(t, Eagle3Head(t.config, (1, -1))), x, NEW_TOKENS, k=3, cache="static",
            **greedy).token_ids),
        "dynamic_tree": lambda t, d, x: speculative_generate(t, TopKTreeDrafter(d, DynamicTree(3, 3, 6)), x, NEW_TOKENS,
                                                             k=3, **greedy).token_ids,
        "lookahead": lambda t, d, x: speculative_generate(t, LookaheadDrafter(4, 3, 4), x, NEW_TOKENS, k=2,
                                                          **greedy).token_ids,
        "ouroboros": lambda t, d, x: speculative_generate(t, OuroborosDrafter(d, phrase_length=2), x, NEW_TOKENS,
                                                          k=4, **greedy).token_ids,
        "medusa_tree": lambda t, d, x: speculative_generate(t, MedusaDrafter(t, MedusaHeads(t.config.hidden_size, 3)),
                                                            x, NEW_TOKENS, k=3, **greedy).token_ids,
    }


METHODS = _methods()
# Trees on the static cache, their calls replayed as graphs: where the package's decoder runs the target.
GRAPH_TREES = {
    "tree": lambda t, d: TopKTreeDrafter(d, (2, 2, 1)),
    "dynamic_tree": lambda t, d: TopKTreeDrafter(d, DynamicTree(3, 3, 6)),
    "eagle_tree": lambda t, d: EagleDrafter(t, EagleHead(t.config), tree=(2, 2)),
    "eagle_dynamic_tree": lambda t, d: EagleDrafter(t, EagleHead(t.config).eval(), tree=DynamicTree(3, 2, 5)),
    "eagle3_dynamic_tree": lambda t, d: Eagle3Drafter(t, Eagle3Head(t.config, (1, -1)).eval(),
                                                      tree=DynamicTree(3, 2, 5)),
    "medusa_tree": lambda t, d: MedusaDrafter(t, MedusaHeads(t.config.hidden_size, 3)),
    "ouroboros": lambda t, d: OuroborosDrafter(d, phrase_length=2),
}


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    """(name, target, draft with a padded embedding, {prompt name: HF's greedy tokens})."""
    target = tiny_family_model(request.param)
    draft = tiny_family_model(request.param, seed=1, layers=1, vocab=VOCAB + 32)
    with torch.no_grad():
        references = {name: hf_greedy(target, prompt, NEW_TOKENS) for name, prompt in PROMPTS.items()}
    return request.param, target, draft, references


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("method", METHODS)
def test_greedy_equals_the_targets_own_generate(family, method, prompt):
    name, target, draft, references = family
    torch.manual_seed(0)  # fresh heads start from the same random weights
    assert METHODS[method](target, draft, PROMPTS[prompt]) == references[prompt], f"{name}: {method}"


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("method", GRAPH_TREES)
def test_trees_on_the_graphs_equal_generate_or_are_refused(family, method, prompt):
    """Where the decoder runs the target, a tree's call replays its graph and its path is kept on the device;
    elsewhere (Hugging Face's static cache keeps a prefix only) the drafter is refused before the first token."""
    name, target, draft, references = family
    torch.manual_seed(0)
    run = _graphs(lambda: speculative_generate(target, GRAPH_TREES[method](target, draft), PROMPTS[prompt], NEW_TOKENS,
                                               k=3, sampler=Sampler(0), cache="static").token_ids)
    if decoder_for(target) is None:
        with pytest.raises(ValueError, match="tree drafts need cache='dynamic'"):
            run()
    else:
        assert run() == references[prompt], f"{name}: {method}"


def test_the_sliding_families_really_slide():
    """The window is shorter than what the tests generate, and ignoring it changes the tokens: the matrix can fail."""
    for name in SLIDING:
        target = tiny_family_model(name)
        assert WINDOW in attention_windows(target.config)
        prompt = PROMPTS["long"]
        windowed = hf_greedy(target, prompt, NEW_TOKENS)
        for config in (target.config, *([target.config.get_text_config()] if name == "gemma3" else [])):
            config.sliding_window, saved = 10_000, config.sliding_window
        try:
            assert hf_greedy(target, prompt, NEW_TOKENS) != windowed, name
        finally:
            target.config.sliding_window = saved


def test_heads_read_the_features_they_were_trained_on(family):
    """The engine hands heads the last layer's hidden states: the base model's output, what training reads."""
    name, target, _, _ = family
    prompt = PROMPTS["long"]
    with torch.no_grad():
        outputs = target(prompt, output_hidden_states=True)
        torch.testing.assert_close(outputs.hidden_states[-1], target_features(target, prompt))


def test_a_target_wider_than_its_draft():
    """Qwen2.5-7B has 152,064 embedding rows, its 0.5B draft 151,936: q keeps the target's whole vocabulary."""
    target = tiny_family_model("qwen2", vocab=VOCAB + 64)
    with torch.no_grad():
        target.get_output_embeddings().weight[VOCAB:] = 0  # unused rows, as training leaves them: never the argmax
    draft = tiny_family_model("qwen2", seed=1, layers=1)
    prompt = PROMPTS["long"]
    reference = hf_greedy(target, prompt, NEW_TOKENS)
    for drafter in (draft, TopKTreeDrafter(draft)):
        assert speculative_generate(target, drafter, prompt, NEW_TOKENS, k=3, sampler=Sampler(0)).token_ids == reference


def test_a_target_token_the_draft_cannot_read_is_refused():
    target = tiny_family_model("llama", vocab=VOCAB + 64)
    prompt = PROMPTS["short"]
    with torch.no_grad():
        feature = target_features(target, prompt)[0, -1]  # (hidden,): what the first new token is read from
        target.get_output_embeddings().weight[VOCAB + 5] = 100 * feature  # the target's favourite: a padding row
    assert autoregressive_generate(target, prompt, 1, Sampler(0)).token_ids == [VOCAB + 5]
    draft = tiny_family_model("llama", seed=1, layers=1)
    with pytest.raises(ValueError, match="padding row .* cannot read"):
        speculative_generate(target, draft, prompt, 4, k=2, sampler=Sampler(0))
    replayed = _graphs(lambda: speculative_generate(target, draft, prompt, 12, k=2, sampler=Sampler(0), cache="static"))
    for _ in range(2):  # the second replays, the next chain drafted ahead of the host's check (on a clamped token)
        with pytest.raises(ValueError, match="padding row .* cannot read"):
            replayed()


@pytest.mark.parametrize("config", ["Llama4TextConfig", "Qwen3NextConfig"])
def test_layers_that_cannot_be_rolled_back_are_refused(config):
    """Chunked attention, linear attention: no method may run on them, and the error says why."""
    import transformers

    with pytest.raises(ValueError, match="layers .* the only state it can roll back"):
        attention_windows(getattr(transformers, config)())


def test_describe_pair_reports_padding_and_windows():
    from specbook.models import describe_pair

    target, draft = tiny_family_model("gemma3"), tiny_family_model("gemma3", seed=1, layers=1, vocab=VOCAB + 32)
    report = describe_pair(target, draft)
    assert report["target (q)"]["attention"] == f"sliding window {WINDOW} in 1 of 2 layers"
    assert report["draft (p)"]["embedding rows"] == VOCAB + 32
    with pytest.raises(ValueError, match="share the target's tokenizer"):
        describe_pair(target, tiny_family_model("gemma3", vocab=VOCAB + 500))

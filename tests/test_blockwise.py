"""Blockwise parallel decoding: greedy-exact, the combined step saving a call per block, greedy only."""

import pytest
import torch

from specbook import Sampler, autoregressive_generate, load_pair, speculative_generate
from specbook.bench import INPUT_GROUNDED, OPEN_ENDED
from specbook.drafters import BlockwiseDrafter
from specbook.heads import MedusaHeads

from support import tiny_model

NEW_TOKENS = 40


@pytest.fixture(scope="module")
def pair():
    return load_pair("shakespeare")


@pytest.fixture(scope="module")
def references(pair):
    """An open-ended and an input-grounded prompt, each with the target's greedy NEW_TOKENS tokens after it."""
    prompts = [pair.encode(text) for text in (OPEN_ENDED[0], INPUT_GROUNDED[0])]
    return [(prompt, autoregressive_generate(pair.target, prompt, NEW_TOKENS, Sampler(0)).token_ids)
            for prompt in prompts]


@pytest.mark.parametrize("combined, block_size", [(True, 1), (True, 3), (True, 5), (False, 5)])
def test_greedy_equals_autoregressive_on_the_built_in_pair(pair, references, block_size, combined):
    for prompt, reference in references:
        drafter = BlockwiseDrafter.from_pretrained("shakespeare", pair.target, block_size, combined)
        result = speculative_generate(pair.target, drafter, prompt, NEW_TOKENS, k=8, sampler=Sampler(0))
        assert result.token_ids == reference
        assert all(len(step.drafted) <= block_size - 1 for step in result.steps)  # a block: pending + k - 1 heads
        if block_size > 1:
            assert result.stats.tokens_per_step > 1  # the trained heads guess some tokens right
        assert drafter.predict_calls == (0 if combined else sum(1 for step in result.steps if step.drafted))


def test_the_combined_step_halves_the_calls(pair):
    """Stern et al.'s Section 4: 2m / k̂ calls become m / k̂ + 1 -- the same tokens in the same blocks, without the
    predict substep's calls."""
    prompt, calls, runs = pair.encode(OPEN_ENDED[1]), {}, {}
    for combined in (True, False):
        drafter = BlockwiseDrafter.from_pretrained("shakespeare", pair.target, combined=combined)
        runs[combined] = speculative_generate(pair.target, drafter, prompt, NEW_TOKENS, k=8, sampler=Sampler(0))
        calls[combined] = runs[combined].stats.target_calls + drafter.predict_calls
    assert runs[True].token_ids == runs[False].token_ids
    assert [step.accepted for step in runs[True].steps] == [step.accepted for step in runs[False].steps]
    assert calls[False] == 2 * calls[True] - 1  # the last step, one token long, drafts nothing


def test_greedy_on_a_tiny_model_with_fresh_heads():
    target = tiny_model(seed=0)
    heads = MedusaHeads(target.config.hidden_size, 3)
    torch.nn.init.normal_(heads.blocks[0].weight, std=0.5)  # heads that disagree with the target now and then
    prompt = torch.tensor([[3, 14, 15, 9, 2, 6, 5, 3]])
    reference = autoregressive_generate(target, prompt, NEW_TOKENS, Sampler(0)).token_ids
    for combined in (True, False):
        drafter = BlockwiseDrafter(target, heads, combined=combined)
        assert speculative_generate(target, drafter, prompt, NEW_TOKENS, k=3, sampler=Sampler(0)).token_ids == reference


def test_sampling_is_refused():
    target = tiny_model(seed=0)
    drafter = BlockwiseDrafter(target, MedusaHeads(target.config.hidden_size, 2))
    with pytest.raises(ValueError, match="greedy"):
        speculative_generate(target, drafter, torch.tensor([[1, 2, 3]]), 8, k=2, sampler=Sampler(1.0))


@pytest.mark.parametrize("block_size", [0, -1, 4, 2.0, True])
def test_bad_block_sizes_are_refused(block_size):
    target = tiny_model(seed=0)
    with pytest.raises(ValueError, match=r"block_size must be an integer in \[1, 3\]"):
        BlockwiseDrafter(target, MedusaHeads(target.config.hidden_size, 2), block_size=block_size)

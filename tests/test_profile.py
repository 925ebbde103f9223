import pytest
import torch

from specbook import decoding
from specbook.drafters import ModelDrafter, TopKTreeDrafter
from specbook.profile import PARTS, step_profile
from specbook.sampling import Sampler

from support import tiny_model

PROMPTS = [torch.tensor([[3, 14, 15, 9, 2, 6, 5]]), torch.tensor([[1, 2, 3]])]


@pytest.fixture(scope="module")
def pair():
    return tiny_model(seed=0), tiny_model(hidden_size=16, num_layers=1, seed=1)


@pytest.mark.parametrize("tree", [False, True])
def test_a_step_splits_into_its_parts_and_the_engine(pair, tree):
    target, draft = pair
    drafter = TopKTreeDrafter(draft) if tree else ModelDrafter(draft)
    profile = step_profile(target, drafter, PROMPTS, k=3, max_new_tokens=12)
    parts = profile["ms_per_step"]
    assert set(parts) == set(PARTS) - {"prefill"} | {"engine"}
    assert profile["steps"] > 0 and 1 <= profile["tokens_per_step"] <= 4
    for part in ("draft", "target call", "probabilities", "verification", "rollback"):
        assert parts[part] > 0, part
    assert parts["engine"] >= 0  # what the parts leave of the wall time


def test_the_profile_leaves_the_engine_as_it_found_it(pair):
    target, draft = pair
    forward, drafter = decoding._target_forward, ModelDrafter(draft)
    greedy = Sampler(0)
    before = decoding.speculative_generate(target, ModelDrafter(draft), PROMPTS[0], 12, k=3, sampler=greedy).token_ids
    step_profile(target, drafter, PROMPTS, k=3, max_new_tokens=12)
    assert decoding._target_forward is forward and "propose" not in vars(drafter)
    assert decoding.speculative_generate(target, drafter, PROMPTS[0], 12, k=3, sampler=greedy).token_ids == before

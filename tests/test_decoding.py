import copy

import pytest
import torch

import specbook.batch
import specbook.rejection
from specbook.decoding import autoregressive_generate, speculative_generate
from specbook.drafters import ModelDrafter
from specbook.rejection import verify_chain
from specbook.sampling import Sampler

from support import BATCH, SAMPLERS, chi_square_p_value, tiny_model

PROMPT = torch.tensor([[3, 14, 15, 9, 2, 6, 5]])


def test_autoregressive_greedy_equals_hugging_face_generate(target):
    ours = autoregressive_generate(target, PROMPT, 40, Sampler(0))
    theirs = target.generate(PROMPT, max_new_tokens=40, do_sample=False, pad_token_id=0)
    assert ours.token_ids == theirs[0, PROMPT.shape[1]:].tolist()


@pytest.mark.parametrize("k", range(1, 9))
@pytest.mark.parametrize("which", ["small", "identical", "useless"])
def test_greedy_speculative_equals_autoregressive(target, draft, k, which):
    drafter_model = {"small": draft, "identical": target, "useless": tiny_model(seed=99)}[which]
    reference = autoregressive_generate(target, PROMPT, 40, Sampler(0)).token_ids
    result = speculative_generate(target, ModelDrafter(drafter_model), PROMPT, 40, k=k, sampler=Sampler(0))
    assert result.token_ids == reference
    if which == "identical":
        assert result.stats.acceptance_rate == 1.0
        assert all(step.bonus for step in result.steps[:-1])


def test_steps_account_for_every_token(target, draft):
    result = speculative_generate(target, draft, PROMPT, 37, k=5, sampler=Sampler(0))
    rebuilt = [token for step in result.steps for token in step.drafted[: step.accepted] + [step.next_token]]
    assert rebuilt == result.token_ids
    assert len(result.token_ids) == 37
    assert result.stats.target_calls == len(result.steps)
    assert result.stats.tokens_per_step == pytest.approx(37 / len(result.steps))
    rejected = sum(step.accepted < len(step.drafted) for step in result.steps)
    accepted = sum(step.accepted for step in result.steps)
    assert result.stats.acceptance_rate == pytest.approx(accepted / (accepted + rejected))


@pytest.mark.parametrize("max_new_tokens", [1, 2, 5, 11])
def test_never_exceeds_max_new_tokens(target, max_new_tokens):
    result = speculative_generate(target, target, PROMPT, max_new_tokens, k=8, sampler=Sampler(0))
    assert len(result.token_ids) == max_new_tokens


def test_stops_at_eos_inside_an_accepted_run(target):
    reference = autoregressive_generate(target, PROMPT, 30, Sampler(0)).token_ids
    eos = reference[12]  # a token the target emits greedily; with an identical draft it lands inside a run
    first = reference.index(eos)
    for result in (autoregressive_generate(target, PROMPT, 30, Sampler(0), eos_token_id=eos),
                   speculative_generate(target, target, PROMPT, 30, k=8, sampler=Sampler(0), eos_token_id=eos)):
        assert result.token_ids == reference[: first + 1]


def test_single_token_prompt(target, draft):
    prompt = PROMPT[:, :1]
    reference = autoregressive_generate(target, prompt, 20, Sampler(0)).token_ids
    assert speculative_generate(target, draft, prompt, 20, k=3, sampler=Sampler(0)).token_ids == reference


def test_same_seed_same_sample(target, draft):
    sampler = Sampler(0.9, top_k=30, top_p=0.95)
    first = speculative_generate(target, draft, PROMPT, 30, k=4, sampler=sampler, seed=7)
    again = speculative_generate(target, draft, PROMPT, 30, k=4, sampler=sampler, seed=7)
    assert first.token_ids == again.token_ids


# --- lossless under sampling: the whole output sequence follows the target's exact distribution

@pytest.mark.parametrize("sampler", SAMPLERS, ids=["plain", "warped"])
def test_sampled_output_follows_the_target(tiny_pair, sampler):
    assert chi_square_p_value(*tiny_pair, sampler) > 1e-3


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sampled_output_follows_the_target_in_half_precision(tiny_pair, dtype, monkeypatch):
    """Models in half precision: p and q become float32 probabilities at once, and the draft reports the very
    p its tokens were drawn from, so the output still follows the (half-precision) target exactly."""
    half = tuple(copy.deepcopy(model).to(dtype) for model in tiny_pair)
    seen = []

    def spy(draft_tokens, draft_probs, target_probs, *args, **kwargs):
        seen.append((draft_probs.dtype, target_probs.dtype))
        return verify_chain(draft_tokens, draft_probs, target_probs, *args, **kwargs)

    monkeypatch.setattr(specbook.batch, "verify_chain", spy)
    assert chi_square_p_value(*half, SAMPLERS[1], batch=BATCH) > 1e-3
    assert set(seen) == {(torch.float32, torch.float32)}
    monkeypatch.setattr(specbook.rejection, "residual_distribution", lambda target_probs, draft_probs, **_: target_probs)
    assert chi_square_p_value(*half, SAMPLERS[0], batch=BATCH) < 1e-6  # and a broken verifier is still caught


def test_chi_square_catches_a_broken_verifier(tiny_pair, monkeypatch):
    """Drawing the correction from q instead of the residual (q - p)+ biases the output: the test must see it."""
    monkeypatch.setattr(specbook.rejection, "residual_distribution", lambda target_probs, draft_probs, **_: target_probs)
    assert chi_square_p_value(*tiny_pair, SAMPLERS[0]) < 1e-6


# --- bad input gets a clear error naming the argument

@pytest.mark.parametrize("kwargs, match", [
    (dict(k=0), "k must"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(input_ids=torch.empty(1, 0, dtype=torch.long)), "input_ids must not be empty"),
    (dict(input_ids=torch.zeros(1, 2, 3, dtype=torch.long)), r"a \(1, T\) tensor of token ids, or \(B, T\)"),
    (dict(max_new_tokens=300), "context"),
    (dict(input_ids=torch.tensor([[1, 2, 64]])), r"input_ids must be token ids in \[0, 64\)"),
    (dict(input_ids=torch.tensor([[1, -1, 2]])), r"input_ids must be token ids in \[0, 64\)"),
    (dict(input_ids=torch.tensor([[1.0, 2.0]])), "integer token ids"),
])
def test_bad_input(target, draft, kwargs, match):
    arguments = dict(input_ids=PROMPT, max_new_tokens=10, k=4) | kwargs
    with pytest.raises(ValueError, match=match):
        speculative_generate(target, draft, **arguments)


def test_draft_with_another_vocabulary_is_refused(target):
    with pytest.raises(ValueError, match="tokenizer"):
        speculative_generate(target, tiny_model(vocab_size=1000), PROMPT, 5)


def test_padding_rows_are_tolerated(target):
    padded = tiny_model(vocab_size=128, seed=5)  # same tokens, embedding padded to a multiple of 64
    reference = autoregressive_generate(target, PROMPT, 20, Sampler(0)).token_ids
    assert speculative_generate(target, padded, PROMPT, 20, sampler=Sampler(0)).token_ids == reference

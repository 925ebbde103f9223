import pytest
import torch
from hypothesis import given, settings, strategies as st
from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

from specbook.sampling import Sampler, one_hot


def hugging_face_probs(logits, temperature, top_k, top_p):
    """The distribution `generate(do_sample=True, ...)` samples from, built from its own warpers in its order."""
    warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
    if top_k is not None:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p is not None:
        warpers.append(TopPLogitsWarper(top_p))
    return warpers(None, logits.clone()).softmax(-1)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), vocab=st.integers(2, 50), temperature=st.floats(0.1, 3.0),
       top_k=st.one_of(st.none(), st.integers(1, 60)), top_p=st.one_of(st.none(), st.floats(0.05, 1.0)))
def test_same_distribution_as_hugging_face(seed, vocab, temperature, top_k, top_p):
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(seed)) * 3
    ours = Sampler(temperature, top_k, top_p).probs(logits)
    torch.testing.assert_close(ours, hugging_face_probs(logits, temperature, top_k, top_p))


def test_greedy_is_one_hot_on_the_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]])
    probs = Sampler(0).probs(logits)
    assert probs.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    assert Sampler(0).sample(probs).tolist() == [1, 0]


def test_one_hot_is_torchs():
    tokens = torch.tensor([[3, 0], [4, 4]])
    assert torch.equal(one_hot(tokens, 5), torch.nn.functional.one_hot(tokens, 5).float())
    assert one_hot(tokens[0, 0], 5).shape == (5,)


def test_pick_draws_as_sample_does_and_leaves_a_greedy_p_implicit():
    """A drafted token and its p: greedily the argmax and None (a deterministic draft's one-hot p); sampled, the
    warped p and the token `sample` draws from it with the same stream."""
    logits = torch.randn(2, 7, generator=torch.Generator().manual_seed(0))
    token, probs = Sampler(0).pick(logits)
    assert torch.equal(token, logits.argmax(-1)) and probs is None
    sampler = Sampler(0.8, top_k=5)
    token, probs = sampler.pick(logits, torch.Generator().manual_seed(1))
    torch.testing.assert_close(probs, sampler.probs(logits))
    assert torch.equal(token, sampler.sample(probs, torch.Generator().manual_seed(1)))


def test_top_k_keeps_ties_and_top_p_keeps_the_top_token():
    probs = Sampler(1.0, top_k=2).probs(torch.tensor([1.0, 2.0, 2.0, 2.0]))
    assert (probs > 0).tolist() == [False, True, True, True]  # the k-th largest value is kept with its ties
    assert Sampler(1.0, top_p=1e-9).probs(torch.tensor([0.0, 5.0, 1.0])).tolist() == [0.0, 1.0, 0.0]


def test_samples_follow_the_warped_distribution():
    sampler = Sampler(0.8, top_k=3)
    probs = sampler.probs(torch.tensor([0.0, 1.0, 2.0, -5.0]))
    draws = sampler.sample(probs.expand(20_000, -1), torch.Generator().manual_seed(0))
    empirical = torch.bincount(draws, minlength=4) / 20_000
    torch.testing.assert_close(empirical, probs, atol=0.015, rtol=0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(temperature=-1), "temperature"), (dict(temperature="hot"), "temperature"),
    (dict(top_k=0), "top_k"), (dict(top_k=2.5), "top_k"), (dict(top_p=0), "top_p"), (dict(top_p=1.01), "top_p"),
])
def test_bad_settings_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Sampler(**kwargs)


@pytest.mark.parametrize("race", [False, True], ids=["multinomial", "exponential race"])
def test_draw_follows_the_probabilities(race):
    """Both ways of drawing (the exponential race is what a GPU uses) follow p in a chi-square test; a race
    that multiplies by the noise instead of dividing (the classic slip) does not."""
    from scipy.stats import chisquare

    from specbook.sampling import draw

    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    generator = torch.Generator().manual_seed(0)
    samples = draw(probs.expand(20000, 5), generator, race=race)
    counts = torch.bincount(samples, minlength=5).double()
    assert counts[4] == 0  # a zero probability is never drawn
    assert chisquare(counts[:4].numpy(), (probs[:4] * 20000).double().numpy()).pvalue > 1e-3
    noise = torch.empty(20000, 5).exponential_(generator=generator)
    broken = torch.bincount((probs * noise).argmax(-1), minlength=5).double()
    assert chisquare(broken[:4].numpy(), (probs[:4] * 20000).double().numpy()).pvalue < 1e-6

"""Tiny random models (a few thousand parameters) so the engine's tests run in seconds, and the
chi-square test that every lossless method must pass and every broken variant must fail."""

import itertools
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing downloads in tests; set before transformers is imported

import pytest  # noqa: E402
import torch  # noqa: E402
from scipy.stats import chisquare  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from specbook.decoding import speculative_generate  # noqa: E402
from specbook.sampling import Sampler  # noqa: E402

# Tiny tensors: one thread is fastest, and it keeps parallel test runs from oversubscribing the cores.
torch.set_num_threads(1)


def tiny_model(vocab_size=64, hidden_size=32, num_layers=2, seed=0, max_positions=256, eos_token_id=None):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
                         num_attention_heads=2, num_key_value_heads=2, intermediate_size=2 * hidden_size,
                         max_position_embeddings=max_positions, eos_token_id=eos_token_id, bos_token_id=None)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def target():
    return tiny_model(seed=0)


@pytest.fixture(scope="session")
def draft():
    return tiny_model(hidden_size=16, num_layers=1, seed=1)


# --- lossless under sampling: the whole output sequence follows the target's exact distribution

VOCAB, NEW_TOKENS, SAMPLES = 3, 3, 1500
SAMPLERS = [Sampler(1.0), Sampler(0.7, top_k=3, top_p=0.9)]


@pytest.fixture(scope="module")
def tiny_pair():
    """A target and a deliberately different draft over a 3-token vocabulary, with peaked distributions."""
    pair = tiny_model(vocab_size=VOCAB, hidden_size=8, num_layers=1, seed=3), \
        tiny_model(vocab_size=VOCAB, hidden_size=8, num_layers=1, seed=4)
    with torch.no_grad():
        for model in pair:  # random init gives near-uniform logits; sharpen them so p and q really differ
            model.lm_head.weight.mul_(30)
    return pair


def sequence_distribution(target, prompt, sampler):
    """Exact probability of every length-NEW_TOKENS continuation under the warped target."""
    exact = {}
    for sequence in itertools.product(range(VOCAB), repeat=NEW_TOKENS):
        ids = torch.cat([prompt, torch.tensor([sequence])], dim=1)
        probs = sampler.probs(target(ids).logits[0, prompt.shape[1] - 1: -1])  # (NEW_TOKENS, vocab)
        exact[sequence] = float(probs[torch.arange(NEW_TOKENS), list(sequence)].prod())
    return exact


def chi_square_p_value(target, drafter, sampler, samples=SAMPLES, prompt=(0, 1, 2), k=2):
    """Generate NEW_TOKENS tokens ``samples`` times (seeds 0, 1, ...) and test them against the exact distribution."""
    prompt = torch.tensor([prompt])
    with torch.no_grad():
        exact = sequence_distribution(target, prompt, sampler)
    counts = dict.fromkeys(exact, 0)
    for seed in range(samples):
        result = speculative_generate(target, drafter, prompt, NEW_TOKENS, k=k, sampler=sampler, seed=seed)
        counts[tuple(result.token_ids)] += 1
    outside = sum(count for sequence, count in counts.items() if exact[sequence] == 0)
    assert outside == 0  # nothing outside the support
    # Cells expected fewer than 5 times are pooled into one, as the chi-square approximation needs.
    expected = {sequence: probability * samples for sequence, probability in exact.items()}
    big = [sequence for sequence in exact if expected[sequence] >= 5]
    observed = [counts[s] for s in big] + [samples - sum(counts[s] for s in big)]
    predicted = [expected[s] for s in big] + [samples - sum(expected[s] for s in big)]
    if predicted[-1] < 1e-9:
        observed, predicted = observed[:-1], predicted[:-1]
    scale = sum(observed) / sum(predicted)  # removes float rounding of the exact probabilities
    return chisquare(observed, [value * scale for value in predicted]).pvalue

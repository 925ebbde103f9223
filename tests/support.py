"""Shared test helpers: tiny random models (a few thousand parameters) so the engine's tests run in
seconds, and the chi-square test that every lossless method must pass and every broken variant must
fail. (A module of its own, not conftest.py, so that `from support import ...` is unambiguous.)"""

import itertools
import json
import shutil

import torch
from scipy.stats import chisquare
from transformers import LlamaConfig, LlamaForCausalLM

from specbook.cache import SlotCache
from specbook.decoding import speculative_generate
from specbook.models import assets_dir
from specbook.profile import host_reads
from specbook.sampling import Sampler


def tiny_model(vocab_size=64, hidden_size=32, num_layers=2, seed=0, max_positions=256, eos_token_id=None):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
                         num_attention_heads=2, num_key_value_heads=2, intermediate_size=2 * hidden_size,
                         max_position_embeddings=max_positions, eos_token_id=eos_token_id, bos_token_id=None)
    return LlamaForCausalLM(config).eval()


def training_folders(tmp_path):
    """``specbook.train``'s folders for a stage's test: ``out`` with the built-in tokenizer, ``work`` with the held-out
    prompts as its train and valid text. Returns (out, work)."""
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(assets_dir() / name, out / name)
    text = "\n\n".join(json.loads((assets_dir() / "heldout_prompts.json").read_text()))
    for split in ("train", "valid"):
        (work / f"{split}.txt").write_text(text)
    return out, work


# --- lossless under sampling: the whole output sequence follows the target's exact distribution

# 600 samples: most broken variants here fail with 400; the two subtlest (a fresh draw from q after a prompt
# lookup's mismatch, phrases reported with a wrong p) pass 600 and ask for 1000 themselves.
VOCAB, NEW_TOKENS, SAMPLES = 3, 3, 600
BATCH = 500  # rows a batched chi-square test draws at once
SAMPLERS = [Sampler(1.0), Sampler(0.7, top_k=3, top_p=0.9)]


def sequence_distribution(target, prompt, sampler):
    """Exact probability of every length-NEW_TOKENS continuation under the warped target."""
    exact = {}
    for sequence in itertools.product(range(VOCAB), repeat=NEW_TOKENS):
        ids = torch.cat([prompt, torch.tensor([sequence], device=prompt.device)], dim=1)
        probs = sampler.probs(target(ids).logits[0, prompt.shape[1] - 1: -1])  # (NEW_TOKENS, vocab)
        exact[sequence] = float(probs[torch.arange(NEW_TOKENS), list(sequence)].prod())
    return exact


def chi_square_p_value(target, drafter, sampler, samples=SAMPLES, prompt=(0, 1, 2), k=2, batch=None, **options):
    """Generate NEW_TOKENS tokens ``samples`` times (seeds 0, 1, ...) and test them against the exact distribution.

    One generation at a time, or ``batch`` at a time: a batch of copies of the prompt, row b drawing from its own
    seed (`specbook.batch`), which gives each row what the batch of one gives with that seed, several times faster.
    ``options`` go to `speculative_generate` (the GPU path's ``cache`` and ``compile``)."""
    prompt = torch.tensor([prompt], device=target.device)
    with torch.no_grad():
        exact = sequence_distribution(target, prompt, sampler)
    counts = dict.fromkeys(exact, 0)
    for start in range(0, samples, batch or 1):
        seeds = list(range(start, min(start + (batch or 1), samples)))
        rows = prompt.expand(len(seeds), -1)
        result = speculative_generate(target, drafter, rows, NEW_TOKENS, k=k, sampler=sampler,
                                      seed=seeds if batch else start, **options)
        for token_ids in result.token_ids if batch else [result.token_ids]:
            counts[tuple(token_ids)] += 1
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


def cached_layers(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's committed keys and values (kv_heads, length, head_dim) of a transformers cache or a
    `specbook.cache.SlotCache`, to compare caches of either kind."""
    if isinstance(cache, SlotCache):
        length = cache.get_seq_length()
        return [(keys[:, :length], values[:, :length]) for keys, values in zip(cache.keys, cache.values)]
    return [(layer.keys[0, :, :cache.get_seq_length()], layer.values[0, :, :cache.get_seq_length()])
            for layer in cache.layers]


def reads_per_step(run, warm: bool = False) -> float:
    """Conversions of tensors to Python values (`specbook.profile.host_reads`) per extra step of ``run(new_tokens)``,
    a function returning a `Generation`: a 10- and a 40-token generation, the difference over the difference in
    steps (what a generation does once, such as checking the prompt's token ids, cancels out). ``warm``: each
    length runs once uncounted first (graphs captured, tree shapes sent to the device)."""
    counts = []
    for new_tokens in (10, 40):
        if warm:
            run(new_tokens)
        with host_reads() as reads:
            generation = run(new_tokens)
        counts.append((sum(reads.values()), len(generation.steps)))
    (short, short_steps), (long, long_steps) = counts
    assert long_steps > short_steps
    return (long - short) / (long_steps - short_steps)

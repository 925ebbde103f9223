"""Tiny random language models for the hidden cases of the decoding exercises (chapters 1 and 4).

The checkers run a learner's decoding loop on Llama-style models with a few thousand parameters,
built from fixed seeds: every check takes milliseconds, and what it prints does not depend on the
book's trained pair (which may be retrained at any time). A draft close to the target is the
target with noise added to its weights, so its greedy choices agree with the target's often but
not always: drafts get accepted, rejected and completed by a bonus token.
"""

from __future__ import annotations

import copy
from functools import lru_cache

import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 48  # token ids 0..47
MIN_MARGIN = 1e-3  # a case's greedy path keeps its top two logits at least this far apart


@lru_cache(maxsize=None)
def tiny_model(seed: int, hidden_size: int = 32, num_layers: int = 2, noise: float = 0.0,
               noise_seed: int = 0) -> LlamaForCausalLM:
    """A random causal LM over VOCAB tokens (eval mode, fp32), from ``seed``; the global RNG is left alone.

    Random initialisation gives nearly uniform logits, so the output layer is scaled up: greedy
    choices are then clear-cut. With ``noise`` > 0 every weight gets Gaussian noise of ``noise``
    times its tensor's standard deviation (seeded by ``noise_seed``): a draft that resembles the
    target of the same ``seed``. Cached: do not change the model, hand out `recorded` copies.
    """
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden_size, num_hidden_layers=num_layers,
                             num_attention_heads=2, num_key_value_heads=2, intermediate_size=2 * hidden_size,
                             max_position_embeddings=128, bos_token_id=None, eos_token_id=None)
        model = LlamaForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(noise_seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(30)
        for weight in model.parameters():
            if noise and weight.numel() > 1:
                weight.add_(noise * weight.std() * torch.randn(weight.shape, generator=generator))
    return model


def recorded(model):
    """A copy of ``model`` that appends the number of positions of every forward call to a list.

    Returns (copy, calls). A call with a KV cache feeds only the new positions, so ``calls`` shows
    whether a decoding loop uses its cache, and how many times it called the model.
    """
    model = copy.deepcopy(model)
    calls: list[int] = []

    def count(module, args, kwargs):
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        calls.append(int(input_ids.shape[-1]) if input_ids is not None else 0)

    model.register_forward_pre_hook(count, with_kwargs=True)
    return model, calls


@torch.inference_mode()
def greedy_margin(model, input_ids: torch.Tensor, new_tokens: list[int]) -> float:
    """The smallest gap between the top two logits along a greedy continuation (one uncached pass).

    Cases keep it above MIN_MARGIN, so that a learner's loop, which may batch positions differently
    from the reference and so round differently, still has only one right answer.
    """
    ids = torch.cat([input_ids[0], torch.tensor(new_tokens, dtype=torch.long)])[None]  # (1, T + n)
    logits = model(ids).logits[0, input_ids.shape[1] - 1:]  # (n + 1, vocab): the last one is spare
    top_two = logits[:-1].topk(2, dim=-1).values  # (n, 2)
    return float((top_two[:, 0] - top_two[:, 1]).min())


def random_prompt(seed: int, length: int) -> torch.Tensor:
    """A (1, length) prompt of random token ids."""
    return torch.randint(VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))

"""Tiny random models (a few thousand parameters) so the engine's tests run in seconds."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM


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

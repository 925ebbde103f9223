"""Test setup: offline, one thread, and the tiny models as fixtures (the helpers live in support.py)."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing downloads in tests; set before transformers is imported
# One thread for the kernels the exercise tests start too (they inherit the environment): two xdist workers,
# each with a kernel of two threads, would oversubscribe two cores. `make unit` sets these already.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from support import VOCAB, tiny_model  # noqa: E402

# Tiny tensors: one thread is fastest, and it keeps parallel test runs from oversubscribing the cores.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _every_round(monkeypatch):
    """Benchmarks in the tests run all their rounds on all their prompts: `make test` asks the notebooks'
    timing cells for one round on one prompt (SPECBOOK_QUICK_TIMING, `specbook.bench.run_benchmark`), in the
    same session."""
    monkeypatch.delenv("SPECBOOK_QUICK_TIMING", raising=False)


@pytest.fixture(scope="session")
def target():
    return tiny_model(seed=0)


@pytest.fixture(scope="session")
def draft():
    return tiny_model(hidden_size=16, num_layers=1, seed=1)


@pytest.fixture(scope="module")
def tiny_pair():
    """A target and a deliberately different draft over a 3-token vocabulary, with peaked distributions."""
    pair = tiny_model(vocab_size=VOCAB, hidden_size=8, num_layers=1, seed=3), \
        tiny_model(vocab_size=VOCAB, hidden_size=8, num_layers=1, seed=4)
    with torch.no_grad():
        for model in pair:  # random init gives near-uniform logits; sharpen them so p and q really differ
            model.lm_head.weight.mul_(30)
    return pair

"""Chapter 6's benchmark suite (`specbook.suites.heads_and_trees`) on tiny models: every method writes
the target's own greedy text, and every speculative row really drafted, accepted and rejected."""

from types import SimpleNamespace

import torch

from specbook.bench import run_benchmark
from specbook.sampling import Sampler
from specbook.suites import heads_and_trees

from test_heads import heads  # noqa: F401  (the fixture: tiny Medusa and EAGLE heads trained on the tiny target)
from test_trees import noisy_copy

PROMPTS = [torch.tensor([[3, 14, 15, 9, 2, 6, 5]]), torch.tensor([[7, 1, 8, 2, 8, 1, 8]])]


def suite(target, heads, sampler):  # noqa: F811
    pair = SimpleNamespace(target=target, draft=noisy_copy(target, noise=0.01))
    return heads_and_trees(pair, heads.medusa, heads.eagle, sampler, 24, k=3, stop_threshold=0.02)


def test_the_suite_lists_chapter_6s_methods(target, heads):  # noqa: F811
    assert [method.name for method in suite(target, heads, Sampler(0))] == [
        "autoregressive", "draft model, chain k=3", "draft model, 14-node tree", "draft model, tree, adaptive depth",
        "draft model, tree, early stop", "Medusa, chain k=3", "Medusa, 14-node tree", "EAGLE, chain k=3",
        "EAGLE, 14-node tree"]


def test_every_method_writes_the_targets_greedy_text(target, heads):  # noqa: F811
    rows = run_benchmark(suite(target, heads, Sampler(0)), PROMPTS, repeats=1, progress=False)
    assert all(row["same_tokens"] for row in rows), [row["method"] for row in rows if not row["same_tokens"]]
    for row in rows[1:]:  # partial acceptance and rollback were exercised, not only all-or-nothing steps
        assert 0 < row["acceptance_rate"] < 1 and row["tokens_per_call"] > 1, row


def test_every_method_samples_too(target, heads):  # noqa: F811
    """Sampled, each method writes its full length (that it follows q is the chi-square tests' job)."""
    rows = run_benchmark(suite(target, heads, Sampler(0.8)), PROMPTS, repeats=1, progress=False)
    assert all(row["tokens"] == 24 * len(PROMPTS) for row in rows)
    assert all(row["tokens_per_call"] > 1 for row in rows[1:5])  # the draft model's rows sample their drafts

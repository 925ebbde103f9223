"""vLLM serves the exported pair (`specbook.export`) and agrees with the book's engine token for token.

Runs in the environment `make vllm-env` builds (``make test-vllm``); elsewhere it is skipped. Each engine starts
without compilation (``eager``: about 25 s on two cores), on six prompts of the book's three kinds of text and
its held-out verse: autoregressive decoding, the draft model, PARD and the EAGLE-3 head's chain (with the whole
vocabulary and with a reduced one, mapped to the target's ids by ``d2t``) give the package's greedy tokens,
through the offline engine and through the server under concurrent requests, and their tokens per target call
are within 5% of the package's at the same K.
"""

import json

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM runs in its own environment: make test-vllm")

from specbook import (Eagle3Drafter, Eagle3Head, PardDrafter, Sampler, autoregressive_generate, load_pair,  # noqa: E402
                      speculative_generate)
from specbook.bench import HELD_OUT, INPUT_GROUNDED, OPEN_ENDED  # noqa: E402
from specbook.export import export_pair, write_eagle3  # noqa: E402
from specbook.models import load_model  # noqa: E402
from specbook.vllm_runs import (concurrent_requests, counts_between, llm_generate, offline, serve,  # noqa: E402
                                server_counts, spec_counts)

NEW_TOKENS, K = 48, 4
GREEDY = Sampler(0)


@pytest.fixture(scope="module")
def pair():
    return load_pair("shakespeare")


@pytest.fixture(scope="module")
def prompts(pair):
    texts = OPEN_ENDED[:2] + INPUT_GROUNDED[:2] + HELD_OUT[:2]
    return [pair.encode(text)[0].tolist() for text in texts]


@pytest.fixture(scope="module")
def reference(pair, prompts):
    """The package's greedy continuations: autoregressive decoding."""
    return [autoregressive_generate(pair.target, torch.tensor([ids]), NEW_TOKENS, GREEDY).token_ids
            for ids in prompts]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return export_pair(tmp_path_factory.mktemp("served"))


def package_tokens_per_call(pair, prompts, drafter) -> float:
    """1 + accepted drafts per verification of K drafts, over all ``prompts``: what vLLM's counters give (vLLM
    drafts K tokens at every step; the package drafts no more than the tokens still to write, and its last
    steps, shorter, are left out)."""
    steps = [step for ids in prompts for step in speculative_generate(
        pair.target, drafter, torch.tensor([ids]), NEW_TOKENS, k=K, sampler=GREEDY).steps if len(step.drafted) == K]
    return 1 + sum(step.accepted for step in steps) / len(steps)


@pytest.mark.parametrize("method", ["autoregressive", "draft", "pard", "eagle3"])
def test_offline_engine_gives_the_package_greedy_tokens(method, pair, prompts, reference, folders):
    with offline(folders, method, K, eager=True) as llm:
        before = spec_counts(llm)
        tokens, _ = llm_generate(llm, prompts, NEW_TOKENS)
        counts = counts_between(before, spec_counts(llm))
    assert tokens == reference
    if method == "draft":  # the same drafts verified the same way: the same acceptance, within 5%
        ours = package_tokens_per_call(pair, prompts, pair.draft)
        assert counts["tokens_per_call"] == pytest.approx(ours, rel=0.05)
    if method in ("pard", "eagle3"):  # one pass for K drafts; the EAGLE-3 head's chain
        drafter = (PardDrafter(load_model("shakespeare", "pard")) if method == "pard"
                   else Eagle3Drafter.from_pretrained("shakespeare", pair.target))
        assert counts["tokens_per_call"] == pytest.approx(package_tokens_per_call(pair, prompts, drafter), rel=0.05)


def test_a_reduced_vocabulary_head_drafts_as_the_package_does(pair, prompts, reference, folders, tmp_path):
    """The EAGLE-3 head with a 512-token draft vocabulary: vLLM maps its LM head's rows to the target's ids with the
    exported ``d2t``; a wrong map would draft other tokens, still exact but with fewer accepted."""
    head = Eagle3Head.from_pretrained("shakespeare", pair.target).with_vocabulary(512)
    head.save(tmp_path / "head")
    write_eagle3(tmp_path / "head", tmp_path / "eagle3", folders["target"])
    with offline({**folders, "eagle3": tmp_path / "eagle3"}, "eagle3", K, eager=True) as llm:
        before = spec_counts(llm)
        tokens, _ = llm_generate(llm, prompts, NEW_TOKENS)
        counts = counts_between(before, spec_counts(llm))
    assert tokens == reference
    ours = package_tokens_per_call(pair, prompts, Eagle3Drafter(pair.target, head))
    assert counts["tokens_per_call"] == pytest.approx(ours, rel=0.05)


def test_server_under_concurrent_requests_gives_the_same_tokens(prompts, reference, folders, tmp_path):
    with serve(folders, "draft", K, port=8771, eager=True, log=tmp_path / "server.log") as url:
        tokens, _ = concurrent_requests(url, prompts, NEW_TOKENS, concurrency=4)
        counts = server_counts(url)
    assert tokens == reference
    assert counts["drafts"] > 0 and len(counts["accepted_by_position"]) == K


def test_a_model_vllm_cannot_load_is_refused_before_it_starts(folders, tmp_path):
    broken = export_pair(tmp_path / "broken", models=["target"])
    config = json.loads((broken["target"] / "config.json").read_text())
    (broken["target"] / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchForCausalLM"]}))
    with pytest.raises(Exception, match="NoSuchForCausalLM"):
        with offline(broken, "autoregressive", eager=True):
            pass

"""The GPU path: static KV caches rolled back by a pointer, compiled decode steps, one sync per step.

Every test runs on the CPU (what CI has) and again on a GPU when there is one; the GPU-only
checks (no host-device sync while drafting, half precision) skip without CUDA.
"""

import re

import pytest
import torch

import specbook.graphs
import specbook.rejection
from specbook import decoding
from specbook.cache import new_cache, rollback
from specbook.decoding import STATIC_BLOCK, autoregressive_generate, gpu_path, speculative_generate
from specbook.drafters import EagleDrafter, ModelDrafter, NGramDrafter, TopKTreeDrafter
from specbook.graphs import static_model
from specbook.heads import EagleHead
from specbook.profile import host_profile
from specbook.sampling import Sampler

from support import SAMPLERS, chi_square_p_value, reads_per_step, tiny_model

PROMPT = [3, 14, 15, 9, 2, 6, 5]
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]


@pytest.fixture(scope="module", params=DEVICES)
def device(request):
    return torch.device(request.param)


@pytest.fixture(scope="module")
def models(device):
    return tiny_model(seed=0).to(device), tiny_model(hidden_size=16, num_layers=1, seed=1).to(device)


@pytest.fixture
def replayed(monkeypatch):
    """The static cache's calls recorded and replayed as CUDA graphs are, on the CPU too (on a GPU they are)."""
    monkeypatch.setattr(specbook.graphs, "CAPTURE_ON_CPU", True)


@pytest.fixture
def eager_compile(monkeypatch):
    """Trace and functionalise the decode steps as torch.compile does, without Inductor's minute of C++ building."""
    monkeypatch.setattr(specbook.graphs, "OPTIONS", specbook.graphs.OPTIONS | {"backend": "aot_eager"})
    monkeypatch.setattr(specbook.graphs, "_COMPILED", {})


def prompt_on(device):
    return torch.tensor([PROMPT], device=device)


def test_static_rollback_moves_the_pointer_and_later_tokens_overwrite(models, device):
    target, _ = models
    ids = torch.tensor([[3, 14, 15, 9, 2, 6, 5, 7, 8]], device=device)
    with torch.no_grad():
        full = target(ids).logits[0]
        cache = new_cache(target, 32)
        target(ids[:, :5], past_key_values=cache, use_cache=True)
        target(torch.tensor([[1, 2, 3]], device=device), past_key_values=cache, use_cache=True)  # three drafts
        keys = cache.layers[0].keys
        rollback(cache, 3)
        assert int(cache.get_seq_length()) == 5 and cache.layers[0].keys is keys  # same buffer, pointer moved
        rest = target(ids[:, 5:], past_key_values=cache, use_cache=True).logits[0]
    torch.testing.assert_close(rest, full[5:], atol=1e-5, rtol=0)


def test_static_autoregressive_equals_dynamic(models, device):
    target, _ = models
    reference = autoregressive_generate(target, prompt_on(device), 40, Sampler(0)).token_ids
    assert autoregressive_generate(target, prompt_on(device), 40, Sampler(0), cache="static").token_ids == reference


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("which", ["small", "identical"])
def test_static_greedy_speculative_equals_autoregressive(models, device, k, which):
    target, draft = models
    reference = autoregressive_generate(target, prompt_on(device), 40, Sampler(0)).token_ids
    result = speculative_generate(target, {"small": draft, "identical": target}[which], prompt_on(device), 40, k=k,
                                  sampler=Sampler(0), cache="static")
    assert result.token_ids == reference
    assert which == "small" or result.stats.acceptance_rate == 1.0


def test_static_target_with_other_drafters(models, device, monkeypatch):
    """The static target cache under a model-free drafter and a feature-reading one (EAGLE, as a chain), its
    calls replayed or not: the same drafts either way (EAGLE's read the prompt's features, from the prompt's
    padded graph when replayed), and autoregressive decoding's tokens."""
    target, _ = models
    torch.manual_seed(0)
    eagle = EagleHead(target.config).to(device)
    reference = autoregressive_generate(target, prompt_on(device), 30, Sampler(0)).token_ids
    for drafter in (NGramDrafter(), EagleDrafter(target, eagle)):
        steps = []
        for replayed in (False, True, True):  # the first replayed run may fill a new cache eagerly
            monkeypatch.setattr(specbook.graphs, "CAPTURE_ON_CPU", replayed)
            result = speculative_generate(target, drafter, prompt_on(device), 30, k=3, sampler=Sampler(0),
                                          cache="static")
            assert result.token_ids == reference, type(drafter).__name__
            steps.append(result.steps)
        assert steps[0] == steps[-1], type(drafter).__name__


def test_compiled_greedy_equals_autoregressive(models, device, eager_compile):
    target, draft = models
    reference = autoregressive_generate(target, prompt_on(device), 30, Sampler(0)).token_ids
    options = dict(sampler=Sampler(0), cache="static", compile=True)
    assert autoregressive_generate(target, prompt_on(device), 30, **options).token_ids == reference
    for k in (2, 4):  # each input length is compiled once; the second generation replays them
        assert speculative_generate(target, draft, prompt_on(device), 30, k=k, **options).token_ids == reference
    assert speculative_generate(target, draft, prompt_on(device), 30, k=4, **options).token_ids == reference


@pytest.mark.parametrize("sampler", SAMPLERS, ids=["plain", "warped"])
def test_static_sampled_output_follows_the_target(tiny_pair, sampler, device):
    pair = [model.to(device) for model in tiny_pair]
    assert chi_square_p_value(*pair, sampler, cache="static") > 1e-3


def test_compiled_sampled_output_follows_the_target(tiny_pair, device, eager_compile):
    pair = [model.to(device) for model in tiny_pair]
    assert chi_square_p_value(*pair, SAMPLERS[0], samples=600, cache="static", compile=True) > 1e-3


@pytest.mark.parametrize("kwargs, match", [
    (dict(cache="paged"), "cache must be one of"),
    (dict(cache="dynamic", compile=True), "compile=True needs cache='static'"),  # a GPU's default cache is static
])
def test_bad_options(models, device, kwargs, match):
    target, draft = models
    with pytest.raises(ValueError, match=match):
        speculative_generate(target, draft, prompt_on(device), 10, **kwargs)
    with pytest.raises(ValueError, match=match):
        autoregressive_generate(target, prompt_on(device), 10, **kwargs)
    with pytest.raises(ValueError, match=match):
        ModelDrafter(draft, **kwargs)


def test_trees_run_on_the_static_cache(models, device):
    """The decoder's static cache verifies a tree eagerly and keeps its accepted path; the chain graphs go on."""
    target, draft = models
    reference = autoregressive_generate(target, prompt_on(device), 10, Sampler(0), cache="static").token_ids
    result = speculative_generate(target, TopKTreeDrafter(draft), prompt_on(device), 10, k=3, sampler=Sampler(0),
                                  cache="static")
    assert result.token_ids == reference and any(step.tree_nodes for step in result.steps)


def test_prompts_of_different_lengths_share_the_compiled_steps(models, device, monkeypatch):
    """The static cache is sized in blocks, so a new prompt length compiles nothing new (each compilation
    of a real model takes seconds). A speculative run's last step may verify fewer drafts, a shape of its
    own: one untimed run on every prompt with the timed runs' seed (`run_benchmark`'s ``warm_every_prompt``)
    meets them all. (Another seed accepts other drafts and may end on another shape.)"""
    graphs = []

    def counting_backend(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    monkeypatch.setattr(specbook.graphs, "OPTIONS", specbook.graphs.OPTIONS | {"backend": counting_backend})
    monkeypatch.setattr(specbook.graphs, "_COMPILED", {})
    target, draft = models
    prompts = [torch.tensor([prompt], device=device) for prompt in (PROMPT, PROMPT[:3], PROMPT * 3)]
    for ids in prompts:
        autoregressive_generate(target, ids, 6, seed=0, cache="static", compile=True)
        first = first if ids is not prompts[0] else len(graphs)
        assert len(graphs) == first
    for sweep in range(2):
        for ids in prompts:
            speculative_generate(target, draft, ids, 6, k=2, seed=0, cache="static", compile=True)
        if sweep == 0:
            warmed = len(graphs)
    assert len(graphs) == warmed


@CUDA
def test_drafting_never_waits_for_the_gpu():
    """K draft steps with a static cache are queued without one host-device synchronisation."""
    drafter = ModelDrafter(tiny_model(hidden_size=16, num_layers=1, seed=1).cuda(), cache="static")
    drafter.start(prompt_on("cuda"))
    generator = torch.Generator("cuda").manual_seed(0)
    drafter.propose(5, Sampler(1.0), generator)  # the first calls capture the graphs (a warm-up may wait)
    drafter.update(5, 7)
    drafter.propose(5, Sampler(1.0), generator)  # a pending pair of tokens: its graph too
    drafter.update(2, 7)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        draft_out = drafter.propose(5, Sampler(1.0), generator)
        drafter.update(2, 7)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(draft_out) == 5


@CUDA
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_greedy_agrees_with_autoregressive(dtype):
    """In half precision a (K + 1)-token verification may round differently from one-token steps: allow a
    near-tie to flip late in the sequence, but the first tokens must agree."""
    target = tiny_model(seed=0).to("cuda", dtype)
    draft = tiny_model(hidden_size=16, num_layers=1, seed=1).to("cuda", dtype)
    reference = autoregressive_generate(target, prompt_on("cuda"), 30, Sampler(0), cache="static").token_ids
    result = speculative_generate(target, draft, prompt_on("cuda"), 30, k=4, sampler=Sampler(0), cache="static")
    assert result.token_ids[:10] == reference[:10]


def test_gpu_benchmark_writes_a_complete_results_file(models, device, tmp_path, monkeypatch):
    """The benchmark's results file, on tiny models (on a CPU its numbers mean nothing; its shape is checked)."""
    from types import SimpleNamespace

    from specbook.bench import RECORDED_BY, read_recorded
    from specbook.gpu import gpu_benchmark, write_results

    target, draft = models
    pair = SimpleNamespace(name="tiny", target=target, draft=draft)
    results = gpu_benchmark(pair, [prompt_on(device)], ks=(1, 3), max_new_tokens=12, repeats=1, compile=False,
                            progress=False)
    for key in ("device", "driver", "torch", "transformers", "date", "models", "settings", "best", "results"):
        assert key in results
    assert set(results["best"]) == {"greedy", "temperature 1"}
    assert {"alpha", "c", "target", "draft", "copy_bandwidth_gb_s", "host_profile"} <= set(results["models"])
    assert results["models"]["host_profile"]["syncs_per_step"] > 0
    assert set(results["settings"]["warmup_seconds"]) == {"greedy", "temperature 1"}
    assert results["models"]["copy_bandwidth_gb_s"] > 0
    greedy = [row for row in results["results"] if row["sampling"] == "greedy"]
    assert [row["method"] for row in greedy] == ["autoregressive", "autoregressive, eager",
                                                 "autoregressive, Hugging Face's forward", "speculative k=1",
                                                 "speculative k=3", "HF assisted (its schedule)", "HF assisted k=1",
                                                 "HF assisted k=3"]
    assert results["models"]["target_forward"] == "specbook.decoder"  # both forwards timed: the fastest is named
    assert results["best"]["greedy"]["fastest_ar"].startswith("autoregressive")
    assert all(row["same_tokens_as_ar"] for row in greedy)  # lossless, and Hugging Face agrees
    assert all(row["bandwidth_gb_s"] > 0 for row in greedy)
    assert all(row["speedup_vs_hf"] > 0 for row in greedy if row["method"].startswith("speculative"))
    for row in greedy:  # the spread of the rounds, in order (one round here: a point)
        for key in ("ms_per_token", "speedup_vs_ar") + (("speedup_vs_hf",) if row["speedup_vs_hf"] else ()):
            assert row[f"{key}_min"] <= row[key] <= row[f"{key}_max"], key
    for best in results["best"].values():
        assert best["speedup_vs_ar_min"] <= best["speedup_vs_ar"] <= best["speedup_vs_ar_max"]
        assert set(best["tied_ks"]) <= {1, 3} - {best["k"]} and best["distinguishable"] is False  # one round
        assert best["fastest_hf"] not in best["fastest_hf_tied"]
    write_results(results, tmp_path / "results" / "gpu.json")
    monkeypatch.setattr("specbook.bench.RESULTS", tmp_path / "results")  # where the package ships results/
    monkeypatch.chdir(tmp_path)  # any folder: a chapter's, or Colab's
    assert read_recorded("gpu.json") == results
    assert read_recorded("missing.json", required=False) is None
    with pytest.raises(FileNotFoundError, match=re.escape(RECORDED_BY["family.json"])):
        read_recorded("family.json")  # says how to record it


def test_graphs_replay_what_the_model_computes(models, device, replayed):
    """Every decode call a replayed graph: greedy equal to autoregressive decoding, the prompt's length
    whatever it is, K changing from one generation to the next."""
    target, draft = models
    for prompt in (prompt_on(device), prompt_on(device)[:, :1]):
        reference = autoregressive_generate(target, prompt, 30, Sampler(0)).token_ids
        assert autoregressive_generate(target, prompt, 30, Sampler(0), cache="static").token_ids == reference
        for k in (3, 1, 5):
            result = speculative_generate(target, draft, prompt, 30, k=k, sampler=Sampler(0), cache="static")
            assert result.token_ids == reference, k


def _replays(monkeypatch) -> list:
    """The graphs replayed from now on, in order: CUDA graphs on a GPU, their CPU stand-ins on a CPU."""
    replays = []
    for graphs in (specbook.graphs._Recorded, torch.cuda.CUDAGraph):
        monkeypatch.setattr(graphs, "replay", lambda graph, replay=graphs.replay: (replays.append(graph),
                                                                                  replay(graph)))
    return replays


@pytest.mark.parametrize("sampler", [Sampler(0), Sampler(0.8, top_k=20, top_p=0.9)], ids=["greedy", "warped"])
def test_a_draft_models_k_steps_are_one_replay(models, device, replayed, sampler, monkeypatch):
    """`StaticModel.chain` drafts K tokens in one replayed graph, the same tokens and distributions as K calls
    (sampled: the same race on the same noise), and a generation replays one graph per drafting step."""
    _, draft = models
    runner = static_model(draft, STATIC_BLOCK, "draft")
    with torch.inference_mode():  # as the engine runs (the runner may hold a cache made there)
        runner.start()
        runner.eager(prompt_on(device), past_key_values=runner.cache, use_cache=True)
        pending, noise = prompt_on(device)[0, -2:], torch.rand(4, 64, device=device) + 0.01
        with monkeypatch.context() as patch:
            patch.setattr(torch.Tensor, "exponential_", lambda tensor, generator=None: tensor.copy_(noise))
            tokens, probs = runner.chain(pending, 4, sampler, 64)
        rollback(runner.cache, 5)
        inputs = pending[None]
        for i in range(4):
            expected = sampler.probs(runner.eager(inputs, past_key_values=runner.cache, use_cache=True).logits[0, -1])
            torch.testing.assert_close(probs[i], expected)
            assert tokens[i] == (expected.argmax() if sampler.greedy else (expected / noise[i]).argmax())
            inputs = tokens[i].view(1, 1)
    target, _ = models
    replays = _replays(monkeypatch)
    drafter = ModelDrafter(draft, cache="static")
    generation = speculative_generate(target, drafter, prompt_on(device), 30, k=4, sampler=sampler, cache="static")
    chains = [graph for key, (graph, *_) in drafter.forward.graphs.items() if key[0] == "chain"]
    assert sum(graph in chains for graph in replays) == sum(bool(step.drafted) for step in generation.steps)
    assert all(isinstance(key[0], str) for key in drafter.forward.graphs)  # no call of its own


def test_a_generations_first_call_replays_a_padded_graph(models, device, replayed, monkeypatch):
    """The prompt (with the first drafts) is padded to the next bucket and replayed: the model's own logits
    and the same tokens as eager decoding, on both sides of a bucket's edge; a prompt longer than every
    bucket runs eagerly; the padding is forgotten."""
    target, draft = models
    monkeypatch.setattr(specbook.graphs, "PROMPT_BUCKETS", (8, 16))
    replays = _replays(monkeypatch)
    random = torch.Generator().manual_seed(0)
    runner = static_model(target, STATIC_BLOCK, "target")
    for length in (1, 3, 8, 9, 20):
        prompt = torch.randint(3, 64, (1, length), generator=random).to(device)
        reference = autoregressive_generate(target, prompt, 12, Sampler(0)).token_ids
        for _ in range(2):  # a model's first generation fills its new cache eagerly
            assert autoregressive_generate(target, prompt, 12, Sampler(0), cache="static").token_ids == reference
            generation = speculative_generate(target, draft, prompt, 12, k=3, sampler=Sampler(0), cache="static")
            assert generation.token_ids == reference, length
        with torch.inference_mode():
            runner.start()
            logits, _ = runner(prompt, keep=2)
            torch.testing.assert_close(logits, target(prompt).logits[0, -2:])
            assert runner.cache.get_seq_length() == length  # the padding's positions forgotten
    replayed_buckets = {key[1] for key, (graph, *_) in runner.graphs.items() if key[0] == "prompt" and graph in replays}
    assert replayed_buckets == {8, 16}


@pytest.mark.parametrize("sampler", [Sampler(0), Sampler(1.0)], ids=["greedy", "sampled"])
def test_the_next_chain_is_drafted_before_the_outcome_is_read(models, device, replayed, sampler, monkeypatch):
    """With a fixed K the draft model queues the next step's chain before the host reads the outcome
    (`ModelDrafter.draft_ahead`), at every step but the last: the same drafts, acceptances and tokens as
    drafting after the read, seed for seed (the random stream is drawn in the same order), and greedily
    autoregressive decoding's tokens. Two drafts: one that is mostly rejected, and the target itself,
    mostly accepted (the next chain then starts from the last draft)."""
    target, draft = models
    calls, original = [], ModelDrafter.draft_ahead
    monkeypatch.setattr(ModelDrafter, "draft_ahead", lambda self, *args, **options: calls.append(
        original(self, *args, **options)) or calls[-1])
    reference = autoregressive_generate(target, prompt_on(device), 40, Sampler(0)).token_ids
    for drafter, seed in [(draft, 0), (draft, 1), (target, 2)]:
        options = dict(k=3, sampler=sampler, seed=seed, cache="static")
        speculative_generate(target, drafter, prompt_on(device), 40, **options)  # every graph captured
        calls.clear()
        ahead = speculative_generate(target, drafter, prompt_on(device), 40, **options)
        assert sum(calls) >= len(ahead.steps) // 2 and all(calls)  # not near the end: K might not fit there
        with monkeypatch.context() as patch:
            patch.setattr(ModelDrafter, "draft_ahead", lambda *args, **options: False)
            after = speculative_generate(target, drafter, prompt_on(device), 40, **options)
        assert ahead.steps == after.steps and ahead.token_ids == after.token_ids
        assert ahead.token_ids == reference or not sampler.greedy


def test_padding_refused_where_the_rotary_embedding_reads_the_largest_position():
    from types import SimpleNamespace

    from specbook.graphs import pads_safely

    assert pads_safely(tiny_model().config)
    assert not pads_safely(SimpleNamespace(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4}))
    assert not pads_safely(SimpleNamespace(rope_parameters={"full_attention": {"rope_type": "default"},
                                                            "sliding_attention": {"rope_type": "dynamic"}}))


def test_replayed_sampled_output_follows_the_target(tiny_pair, device, replayed):
    pair = [model.to(device) for model in tiny_pair]
    assert chi_square_p_value(*pair, SAMPLERS[0], samples=600, cache="static") > 1e-3


def test_a_broken_decision_inside_the_verification_graph_is_caught(tiny_pair, replayed, monkeypatch):
    """The chain's decision replays inside the target's graph (`StaticModel.verify`): drawing the correction from
    q instead of the residual there biases the output, and the test sees it (on the CPU: the GPU's run of the
    suite keeps its minutes for the device's own cases)."""
    monkeypatch.setattr(specbook.rejection, "residual_distribution",
                        lambda target_probs, draft_probs, **_: target_probs)
    assert chi_square_p_value(*tiny_pair, SAMPLERS[0], samples=600, cache="static") < 1e-6


def test_a_static_cache_and_its_graphs_outlive_a_generation(models, device, replayed):
    """The next generation empties the same cache in place and replays the graphs an earlier one captured:
    their addresses stay valid. (A model's first generation reads its prompt eagerly, filling the new cache:
    the second captures the prompt's graph.)"""
    target, draft = models
    for _ in range(2):
        first = speculative_generate(target, draft, prompt_on(device), 20, k=3, sampler=Sampler(0), cache="static")
    runner = static_model(target, STATIC_BLOCK, "target")
    keys, graphs = runner.cache.keys, dict(runner.graphs)
    again = speculative_generate(target, draft, prompt_on(device), 20, k=3, sampler=Sampler(0), cache="static")
    assert again.token_ids == first.token_ids
    assert runner.cache.keys is keys and runner.graphs == graphs and len(graphs) >= 2


def _reads_per_step(target, draft, device, sampler, **path):
    return reads_per_step(lambda new_tokens: speculative_generate(target, draft, prompt_on(device), new_tokens, k=3,
                                                                  sampler=sampler, seed=0, **path))


@pytest.mark.parametrize("sampler", [Sampler(0), Sampler(1.0)], ids=["greedy", "sampled"])
def test_one_host_sync_per_speculative_step(models, device, sampler, eager_compile):
    """The engine reads the device once a step: the number accepted, the next token and the drafts in one
    copy (the compiled steps keep Hugging Face's own mask code, which reads its cache's length, out of it)."""
    target, draft = models
    assert _reads_per_step(target, draft, device, sampler, cache="static", compile=True) <= 1


def test_a_host_sync_in_the_loop_is_caught(models, device, eager_compile, monkeypatch):
    """The count catches one more read per step (here: the drafts read again when logging a step)."""
    target, draft = models
    original = decoding._chain_step

    def chatty(target, cache, pending, draft, *args, **options):
        if draft is not None:
            draft.tokens.tolist()
        return original(target, cache, pending, draft, *args, **options)

    monkeypatch.setattr(decoding, "_chain_step", chatty)
    assert _reads_per_step(target, draft, device, Sampler(0), cache="static", compile=True) > 1


@CUDA
@pytest.mark.parametrize("make", [lambda draft: draft, lambda draft: TopKTreeDrafter(draft, (2, 2, 1))],
                         ids=["chain", "tree"])
@pytest.mark.parametrize("sampler", [Sampler(0), Sampler(1.0)], ids=["greedy", "sampled"])
def test_the_gpu_waits_once_per_step(sampler, make):
    """On a GPU, torch's sync debug mode counts every wait for the device, torch's own included (copies from the
    host too: a tree's shape goes to the device once, its path's rows stay there)."""
    import warnings

    target, draft = tiny_model(seed=0).cuda(), tiny_model(hidden_size=16, num_layers=1, seed=1).cuda()
    counts = []
    for new_tokens in (10, 40):
        speculative_generate(target, make(draft), prompt_on("cuda"), new_tokens, k=3, sampler=sampler,
                             seed=0)  # capture
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                generation = speculative_generate(target, make(draft), prompt_on("cuda"), new_tokens, k=3,
                                                  sampler=sampler, seed=0)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        counts.append((sum("synchroniz" in str(w.message) for w in caught), len(generation.steps)))
    (short, short_steps), (long, long_steps) = counts
    assert (long - short) / (long_steps - short_steps) <= 1


def test_the_host_profile_counts_calls_operators_and_syncs(models, device, eager_compile):
    target, draft = models
    eager = host_profile(target, draft, prompt_on(device), k=3, max_new_tokens=20, cache="dynamic")
    compiled = host_profile(target, draft, prompt_on(device), k=3, max_new_tokens=20, cache="static", compile=True)
    for profile in (eager, compiled):
        assert profile["steps"] > 0 and profile["draft_calls"] > 0
        assert profile["target_host_us_per_call"] > 0 and profile["draft_host_us_per_call"] > 0
        assert profile["operators_per_step_outside_calls"] > 0
    assert eager["operators_per_target_call"] > 20 and compiled["operators_per_target_call"] is None  # two layers
    assert compiled["syncs_per_step"] <= 1 + 8 / compiled["steps"]  # + once a generation: the prompt checked, read


def test_the_default_path_follows_the_device(models, device):
    """cache=None: the static cache (its calls replayed as graphs) on a GPU, the dynamic cache on a CPU."""
    target, _ = models
    assert gpu_path(target) == (("static", False) if device.type == "cuda" else ("dynamic", False))
    assert gpu_path(target, "dynamic") == ("dynamic", False)
    with pytest.raises(ValueError, match="compile=True needs cache='static'"):
        gpu_path(target, "dynamic", True)

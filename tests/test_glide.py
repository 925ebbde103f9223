"""GliDe with CaPE: a draft that reads the target's KV cache, and token trees shaped by the draft's confidence."""

import copy
import json

import pytest
import torch
import transformers

import specbook.graphs
from specbook import Sampler, autoregressive_generate, load_pair, speculative_generate
from specbook.drafters import CaPE, Draft, GlideDrafter
from specbook.glide import GlideForCausalLM, TargetContext, block_lag_limits, read_target_cache, target_signature
from specbook.models import assets_dir, load_model
from specbook.train.glide import glide_loss, target_context

from families import FAMILIES, VOCAB, hf_greedy, tiny_family_model
from support import SAMPLERS, chi_square_p_value, reads_per_step, tiny_model

SERVED = ("llama", "qwen3", "gemma2", "gemma3", "olmo2", "gpt_neox")  # RoPE caches, a full-attention last layer
REFUSED = {"qwen2": "sliding window", "mistral": "sliding window", "phi3": "sliding window",
           "gpt2": "no rotary position embedding", "opt": "no rotary position embedding"}
NEW_TOKENS = 24


def _glide(target, draft, scale=1.0, seed=0):
    """An untrained GliDe for ``target`` on ``draft``, its cross-attention's output projection random (not zero),
    so that what it reads moves its p."""
    glide = GlideForCausalLM.from_draft(draft, target)
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(seed)
        for layer in glide.model.layers:
            layer.cross_attn.o_proj.weight.normal_(0, scale)
    return glide


def _generate(target, drafter, prompt, cache="dynamic", k=4, new_tokens=NEW_TOKENS):
    return speculative_generate(target, drafter, prompt, new_tokens, k=k, sampler=Sampler(0), cache=cache)


# ----------------------------------------------------------------------------- the built-in pair, trained GliDe

@pytest.fixture(scope="module")
def built_in():
    """The built-in pair, its trained GliDe draft, two held-out prompts and the target's greedy 40 tokens after each."""
    pair = load_pair("shakespeare")
    texts = json.loads((assets_dir() / "heldout_prompts.json").read_text())
    prompts = [pair.encode(text) for text in texts[:2]]
    references = [autoregressive_generate(pair.target, prompt, 40, Sampler(0)).token_ids for prompt in prompts]
    return pair, load_model("shakespeare", "glide"), prompts, references


@pytest.mark.parametrize("cache, cape", [("dynamic", None), ("dynamic", CaPE()), ("static", None), ("graphs", None)])
def test_greedy_equals_autoregressive_on_the_built_in_pair(built_in, cache, cape):
    pair, glide, prompts, references = built_in
    for prompt, reference in zip(prompts, references):
        specbook.graphs.CAPTURE_ON_CPU = cache == "graphs"  # the static cache's calls recorded and replayed
        try:
            result = _generate(pair.target, GlideDrafter(glide, cape), prompt, "static" if cache == "graphs" else cache,
                               new_tokens=40)
        finally:
            specbook.graphs.CAPTURE_ON_CPU = False
        assert result.token_ids == reference
        assert result.stats.acceptance_rate > 0.3  # the trained draft is accepted, not merely corrected


def test_the_reference_is_the_targets_own_generate(built_in):
    pair, _, prompts, references = built_in
    assert references[0] == hf_greedy(pair.target, prompts[0], 40)


def test_cape_trees_run_on_the_static_cache(built_in):
    """CaPE's trees on the target's static cache (the decoder's): the same tokens as on the dynamic one."""
    pair, glide, prompts, _ = built_in
    assert _generate(pair.target, GlideDrafter(glide, CaPE()), prompts[0], "static").token_ids == \
        _generate(pair.target, GlideDrafter(glide, CaPE()), prompts[0], "dynamic").token_ids


def test_the_trained_glide_starts_as_its_draft_and_ships_with_its_control(built_in):
    """``from_draft`` adds the cross-attention with a zero output projection: the same logits as the draft. The
    shipped pair: GliDe (model type glide, fp16 on disk) and its control, a plain Llama draft."""
    pair, glide, prompts, _ = built_in
    fresh = GlideForCausalLM.from_draft(pair.draft, pair.target)
    context = read_target_cache(pair.target(prompts[0], use_cache=True).past_key_values, fresh.target_layers,
                                prompts[0].shape[1])
    with torch.no_grad():
        torch.testing.assert_close(fresh(prompts[0], target_context=context).logits, pair.draft(prompts[0]).logits)
    assert isinstance(glide, GlideForCausalLM) and glide.target_layers == [pair.target.config.num_hidden_layers - 1]
    control = load_model("shakespeare", "glide-control")
    assert type(control) is transformers.LlamaForCausalLM
    meta = {name: json.loads((assets_dir() / name / "training.json").read_text())
            for name in ("glide", "glide-control")}
    assert meta["glide"]["config"] == meta["glide-control"]["config"] and meta["glide"]["block"] == 5


# ----------------------------------------------------------------------------- the architecture matrix

@pytest.fixture(scope="module", params=SERVED)
def family(request):
    target = tiny_family_model(request.param)
    glide = _glide(target, tiny_family_model("llama", seed=1, layers=1, vocab=VOCAB + 32), scale=0.3)
    return request.param, target, glide


@pytest.mark.parametrize("prompt_length", [1, 5, 26])
def test_greedy_equals_the_targets_own_generate_on_every_family_it_serves(family, prompt_length):
    name, target, glide = family
    prompt = torch.randint(3, VOCAB, (1, prompt_length), generator=torch.Generator().manual_seed(prompt_length))
    reference = hf_greedy(target, prompt, NEW_TOKENS)
    for cache, cape in (("dynamic", None), ("static", None), ("dynamic", CaPE(budget=8))):
        assert _generate(target, GlideDrafter(glide, cape), prompt, cache, k=3).token_ids == reference, (name, cache)


def test_every_family_is_served_or_refused():
    assert sorted(SERVED + tuple(REFUSED)) == sorted(FAMILIES)


@pytest.mark.parametrize("name", REFUSED)
def test_families_whose_cache_glide_cannot_read_are_refused(name):
    with pytest.raises(ValueError, match=REFUSED[name]):
        GlideForCausalLM.from_draft(tiny_family_model("llama", seed=1, layers=1), tiny_family_model(name))


def test_an_encoder_decoder_target_is_refused():
    with pytest.raises(ValueError, match="BartConfig is an encoder-decoder model"):
        target_signature(transformers.BartConfig())


@pytest.mark.parametrize("other, differs", [
    (lambda: tiny_family_model("qwen3"), "model_type llama \\(trained on\\) vs qwen3"),
    (lambda: tiny_family_model("llama", layers=3), "num_hidden_layers 2 \\(trained on\\) vs 3"),
    (lambda: tiny_family_model("llama", hidden=64), "hidden_size 32 \\(trained on\\) vs 64"),
])
def test_a_target_it_was_not_trained_on_is_refused_naming_what_differs(other, differs):
    target = tiny_family_model("llama")
    glide = _glide(target, tiny_family_model("llama", seed=1, layers=1))
    with pytest.raises(ValueError, match=f"trained on, and this target's differs: .*({differs})"):
        _generate(other(), GlideDrafter(glide), torch.tensor([[3, 4, 5]]))


def test_a_grouped_query_target_of_other_kv_heads_is_refused():
    target = tiny_family_model("llama")  # one key-value head
    config = copy.deepcopy(target.config)
    config.num_key_value_heads = 2
    glide = _glide(target, tiny_family_model("llama", seed=1, layers=1))
    with pytest.raises(ValueError, match="num_key_value_heads 1 \\(trained on\\) vs 2"):
        glide.check_target(transformers.LlamaForCausalLM(config))


@pytest.mark.parametrize("options, match", [
    (dict(budget=0), "budget must be an integer >= 1"),
    (dict(bins=()), "bins must be a non-empty sequence of integers >= 1"),
    (dict(bins=(3, 0, 1)), "bins must be a non-empty sequence of integers >= 1"),
    (dict(bins=(2.5,)), "bins must be a non-empty sequence of integers >= 1"),
])
def test_bad_cape_options(options, match):
    with pytest.raises(ValueError, match=match):
        CaPE(**options)


def test_a_cape_budget_below_the_chain_length_is_refused():
    target = tiny_family_model("llama")
    drafter = GlideDrafter(_glide(target, tiny_family_model("llama", seed=1, layers=1)), CaPE(budget=3))
    with pytest.raises(ValueError, match="budget=3\\) is smaller than the chain of k=4"):
        _generate(target, drafter, torch.tensor([[3, 4, 5]]), k=4)


def test_only_a_glide_model_drafts_with_glide():
    with pytest.raises(ValueError, match="glide must be a GlideForCausalLM"):
        GlideDrafter(tiny_model())
    with pytest.raises(ValueError, match="draft must be a plain Llama causal LM"):
        GlideForCausalLM.from_draft(tiny_family_model("gpt2", layers=1), tiny_family_model("llama"))


# ----------------------------------------------------------------------------- what the cross-attention reads

def test_cape_adds_siblings_where_the_draft_is_unsure():
    """Bins by floor(10 p): a confident depth keeps its chain token alone, an unsure one gets its next ranks as
    siblings (children of the chain token's parent), shallowest first, within the budget."""
    probs = torch.tensor([[0.15, 0.05, 0.7, 0.1],  # p = 0.7: bin 7, 2 candidates
                          [0.35, 0.25, 0.3, 0.1],  # p = 0.35: bin 3, 3 candidates
                          [0.05, 0.95, 0.0, 0.0]])  # p = 0.95: bin 9, the chain token alone
    chain = probs.argmax(-1)
    draft = CaPE(budget=5, bins=(3, 3, 3, 3, 2, 2, 2, 2, 1, 1)).expand(chain, probs)
    assert draft.tokens.tolist() == [2, 0, 1, 0, 2] and draft.parents == [-1, 0, 1, -1, 0] and draft.probs is None
    assert CaPE(budget=4, bins=(3,)).expand(chain, probs).tokens.tolist() == [2, 0, 1, 0]  # the budget ran out
    with pytest.raises(ValueError, match="budget=2\\) is smaller than the chain of 3 drafts"):
        CaPE(budget=2).expand(chain, probs)  # no room even for the chain: refused, not sliced from the end


def test_the_cross_attention_sees_only_keys_below_each_querys_limit():
    """Keys at or past a query's limit cannot move its output; one below can; a query that sees no key reads zero."""
    target = tiny_family_model("llama")
    layer = _glide(target, tiny_family_model("llama", seed=1, layers=1)).model.layers[0].cross_attn
    generator = torch.Generator().manual_seed(0)
    hidden, keys, values = (torch.randn(shape, generator=generator) for shape in
                            ((1, 4, 32), (1, 1, 6, 16), (1, 1, 6, 16)))  # 4 queries, 6 target positions
    positions, limits = torch.arange(10, 14)[None], torch.tensor([[0, 2, 4, 6]])
    read = layer(hidden, positions, keys, values, limits)  # (1, 4, 32)
    assert read[0, 0].abs().max() == 0  # nothing visible: nothing read
    moved = keys.clone()
    moved[:, :, 4:] += 1  # positions 4 and 5: only the last query sees them
    changed = (layer(hidden, positions, moved, values, limits) - read).abs().amax(-1)[0]
    assert changed[:3].max() == 0 and changed[3] > 0


def test_the_block_lag_mask():
    """A query in block b sees the target's keys of blocks 0 .. b - 1: the training mask. Block 1 is inference's."""
    assert block_lag_limits(12, 5).tolist() == [[0, 0, 0, 0, 0, 5, 5, 5, 5, 5, 10, 10]]
    target = tiny_family_model("llama")
    glide = _glide(target, tiny_family_model("llama", seed=1, layers=1))
    tokens = torch.randint(3, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, lagged = target_context(target, glide.target_layers, 5, tokens)
        _, every = target_context(target, glide.target_layers, 1, tokens)
        logits = glide(tokens, target_context=lagged).logits  # (2, 12, vocab)
        assert torch.equal(glide(tokens, target_context=every).logits,
                           glide(tokens, target_context=lagged._replace(limits=None)).logits)
        noise = torch.Generator().manual_seed(1)
        for moved, first in ((slice(0, 5), 5), (slice(5, 10), 10)):  # block 0's keys, then block 1's
            later = lagged._replace(keys=[keys.clone() for keys in lagged.keys])
            # Random, not constant: a query whose visible keys all shift by one vector keeps its softmax.
            later.keys[0][:, :, moved] += torch.randn(later.keys[0][:, :, moved].shape, generator=noise)
            changed = (glide(tokens, target_context=later).logits - logits).abs().amax((0, 2))  # (12,)
            assert changed[:first].max() == 0 and changed[first:].min() > 1e-3  # only the later blocks' queries see them
    assert glide_loss(glide, lambda inputs: target_context(target, glide.target_layers, 5, inputs), tokens[:, :-1],
                      tokens[:, 1:]) > 0


class _Spy(GlideDrafter):
    """GliDe that keeps, at every step, the target keys its cross-attention reads."""

    def start(self, input_ids):
        self.read = []
        super().start(input_ids)

    def propose(self, k, sampler, generator, keep_drafting=None):
        keys = read_target_cache(self.model.cache, self.glide.target_layers, self.model.committed).keys[0]
        self.read.append(keys.clone())  # (1, kv_heads, committed, head_dim)
        return super().propose(k, sampler, generator, keep_drafting)


class _ReadsPastThePointer(_Spy):
    """Broken on purpose: reads one position more than the target has committed, which a static cache's buffer
    holds (a rejected draft's keys, or nothing yet)."""

    def propose(self, k, sampler, generator, keep_drafting=None):
        self.model.committed += 1
        try:
            return super().propose(k, sampler, generator, keep_drafting)
        finally:
            self.model.committed -= 1


@pytest.mark.parametrize("cache, spy, reads_committed", [("dynamic", _Spy, True), ("static", _Spy, True),
                                                         ("static", _ReadsPastThePointer, False)])
def test_the_draft_reads_the_committed_positions_only(cache, spy, reads_committed):
    """At every step GliDe reads the keys the target computes for the committed text, everything but the pending
    token, not a rejected draft left in the static cache's buffer: as a fresh target pass on that text gives them."""
    target = tiny_family_model("llama")
    drafter = spy(_glide(target, tiny_family_model("llama", seed=1, layers=1)))
    prompt = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(1))
    result = _generate(target, drafter, prompt, cache, k=3)
    text = torch.cat([prompt[0], torch.tensor(result.token_ids)])[None]
    with torch.no_grad():
        fresh = target(text, use_cache=True).past_key_values.layers[-1].keys  # (1, kv, length, head_dim)
    committed = prompt.shape[1] - 1
    matches = []
    for step, read in zip(result.steps, drafter.read):
        matches.append(read.shape[2] == committed and torch.allclose(read, fresh[:, :, :committed], atol=1e-5))
        committed += step.accepted + 1
    assert any(step.accepted < len(step.drafted) for step in result.steps)  # rejections happened
    assert all(matches) if reads_committed else not all(matches)


# ----------------------------------------------------------------------------- lossless under sampling

@pytest.fixture(scope="module")
def glide_pair(tiny_pair):
    target, draft = tiny_pair
    return target, _glide(target, draft, scale=3.0)


@pytest.mark.parametrize("sampler", SAMPLERS, ids=["plain", "warped"])
@pytest.mark.parametrize("cape", [None, CaPE(budget=4, bins=(3,))], ids=["chain", "cape"])
def test_sampled_output_follows_the_target(glide_pair, sampler, cape):
    target, glide = glide_pair
    assert chi_square_p_value(target, GlideDrafter(glide, cape), sampler, k=2) > 1e-3


def test_cape_on_the_graphs_follows_the_target(glide_pair, monkeypatch):
    """On the static cache CaPE's trees are shaped on the device, their slots left out holding a repeated token."""
    monkeypatch.setattr(specbook.graphs, "CAPTURE_ON_CPU", True)
    target, glide = glide_pair
    assert chi_square_p_value(target, GlideDrafter(glide, CaPE(budget=3, bins=(3, 1))), SAMPLERS[1], k=2,
                              cache="static") > 1e-3


def test_cape_on_the_device_keeps_the_hosts_nodes():
    """The same siblings as `CaPE.expand` (parent, token), the slots left out repeating the chain's token."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        probs = (4 * torch.randn(4, 6, generator=generator)).softmax(-1)
        chain, cape = probs.argmax(-1), CaPE(budget=int(torch.randint(4, 12, (), generator=generator)))
        host, device = cape.expand(chain, probs), cape.expand_on_device(chain, probs)
        parents = device.parents.tolist()
        nodes = list(zip(parents, device.tokens.tolist()))
        live = [node for index, node in enumerate(nodes)
                if index < len(chain) or node[1] != chain[node[0] + 1].item()]  # a repeat of its depth's chain token
        assert live == list(zip(host.parents, host.tokens.tolist()))


def test_one_host_read_per_cape_step_on_the_static_cache(monkeypatch):
    monkeypatch.setattr(specbook.graphs, "CAPTURE_ON_CPU", True)
    target = tiny_family_model("llama")
    glide = _glide(target, tiny_family_model("llama", seed=1, layers=1))
    prompt = torch.randint(3, 90, (1, 7), generator=torch.Generator().manual_seed(0))
    assert reads_per_step(lambda new_tokens: _generate(target, GlideDrafter(glide, CaPE()), prompt, "static",
                                                       new_tokens=new_tokens), warm=True) <= 1


class _ReportsPWithoutCrossAttention(GlideDrafter):
    """Broken on purpose: samples its drafts from GliDe's p, but reports the p its layers give without reading the
    target (the cross-attention's contribution left out)."""

    def propose(self, k, sampler, generator, keep_drafting=None):
        cache, pending = copy.deepcopy(self.cache), self.pending
        draft = super().propose(k, sampler, generator, keep_drafting)
        blind = TargetContext([None], [None])  # reads nothing
        logits = self.glide(torch.cat([pending, draft.tokens[:-1]])[None], past_key_values=cache,
                            target_context=blind).logits[0, -len(draft):, : self.vocab_size]
        return Draft(draft.tokens, sampler.probs(logits))


def test_the_chi_square_catches_p_reported_without_the_cross_attention(glide_pair):
    target, glide = glide_pair
    assert chi_square_p_value(target, _ReportsPWithoutCrossAttention(glide), SAMPLERS[0], k=2) < 1e-6

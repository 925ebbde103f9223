import itertools

import pytest
import torch

import support

import specbook.decoding
import specbook.tree_verification
from specbook.cache import keep_positions, new_cache
from specbook.decoder import cache_and_forward
from specbook.decoding import autoregressive_generate, speculative_generate
from specbook.drafters import Draft, Drafter, ModelDrafter, SampledTreeDrafter, TopKTreeDrafter
from specbook.policies import ConfidenceStop, FixedK, HeuristicK
from specbook.sampling import Sampler
from specbook.tree_verification import verify_tree, verify_tree_greedy
from specbook.trees import DynamicTree, TreeSpec, grow_dynamic_tree, tree_attention_mask, tree_forward, tree_positions

from support import SAMPLERS, cached_layers, chi_square_p_value, tiny_model

PROMPT = torch.tensor([[3, 14, 15, 9, 2, 6, 5]])
#        root
#       /    \
#      0      1
#     / \      \
#    2   3      4
#    |
#    5
PARENTS = [-1, -1, 0, 0, 1, 2]


# --- the tree: mask, positions, spec

def test_mask_and_positions_of_a_hand_drawn_tree():
    expected = torch.tensor([[1, 0, 0, 0, 0, 0, 0],  # root
                             [1, 1, 0, 0, 0, 0, 0],  # 0
                             [1, 0, 1, 0, 0, 0, 0],  # 1
                             [1, 1, 0, 1, 0, 0, 0],  # 2: root, 0, itself
                             [1, 1, 0, 0, 1, 0, 0],  # 3
                             [1, 0, 1, 0, 0, 1, 0],  # 4
                             [1, 1, 0, 1, 0, 0, 1]], dtype=torch.bool)  # 5: root, 0, 2, itself
    assert torch.equal(tree_attention_mask(PARENTS), expected)
    assert tree_positions(PARENTS, offset=10).tolist() == [10, 11, 11, 12, 12, 12, 13]
    chain = [-1, 0, 1]
    assert torch.equal(tree_attention_mask(chain), torch.ones(4, 4, dtype=torch.bool).tril())
    assert tree_positions(chain).tolist() == [0, 1, 2, 3]


def test_tree_spec_sorts_paths_and_finds_parents():
    spec = TreeSpec([(1, 0), (0,), (0, 1), (1,), (0, 0), (0, 0, 0)])
    assert spec.paths == [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
    assert spec.parents == [-1, -1, 0, 0, 1, 2] == PARENTS
    assert spec.ranks == [0, 1, 0, 1, 0, 0] and spec.depth == 3
    assert TreeSpec.from_branching((2, 2, 1)).paths == TreeSpec.from_branching((2, 2, 1)).truncated(3).paths
    assert len(TreeSpec.from_branching((2, 2, 1))) == 2 + 4 + 4
    assert spec.truncated(1).paths == [(0,), (1,)]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_tree_pass_logits_equal_each_path_run_as_a_plain_sequence(attention):
    model = tiny_model(seed=0)
    model.set_attn_implementation(attention)
    tokens = torch.tensor([5, 7, 9, 11, 13, 2])
    with torch.no_grad():
        cache = new_cache(model)
        model(PROMPT[:, :-1], past_key_values=cache, use_cache=True)  # the prefix, then the root (PROMPT's last)
        logits = tree_forward(model, cache, torch.cat([PROMPT[0, -1:], tokens]), PARENTS)  # (n + 1, vocab)
        assert cache.get_seq_length() == PROMPT.shape[1] + len(PARENTS)
        for node in range(-1, len(PARENTS)):
            path, ancestor = [], node
            while ancestor != -1:
                path.insert(0, ancestor)
                ancestor = PARENTS[ancestor]
            plain = model(torch.cat([PROMPT[0], tokens[path]])[None]).logits[0, -1]
            torch.testing.assert_close(logits[node + 1], plain, atol=1e-5, rtol=0)


# --- verification

def test_greedy_verification_of_a_hand_drawn_tree():
    tokens = torch.tensor([5, 7, 9, 11, 13, 2])
    # the target says 7 after the root, 13 after node 1 (a leaf follows): path root -> 1 -> 4, then 8
    target_tokens = torch.tensor([7, 0, 13, 0, 0, 8, 0])
    assert verify_tree_greedy(tokens, PARENTS, target_tokens) == ([1, 4], 8, True)
    # 5 then 9 then 2, then 6 after the deepest node
    assert verify_tree_greedy(tokens, PARENTS, torch.tensor([5, 9, 0, 2, 0, 0, 6])) == ([0, 2, 5], 6, True)
    # 5, then the target wants 4, which is not a child of node 0
    assert verify_tree_greedy(tokens, PARENTS, torch.tensor([5, 4, 0, 0, 0, 0, 0])) == ([0], 4, False)


def test_sampled_verification_equals_greedy_on_one_hot_targets():
    generator = torch.Generator().manual_seed(0)
    vocab = 4
    for _ in range(50):
        tokens = torch.randint(vocab, (len(PARENTS),), generator=generator)
        target_tokens = torch.randint(vocab, (len(PARENTS) + 1,), generator=generator)
        draft_probs = torch.rand(len(PARENTS), vocab, generator=generator) + 0.1
        outcome = verify_tree(tokens, PARENTS, draft_probs / draft_probs.sum(-1, keepdim=True),
                              torch.nn.functional.one_hot(target_tokens, vocab).float(), generator)
        assert outcome == verify_tree_greedy(tokens, PARENTS, target_tokens)


# --- the engine: greedy trees equal autoregressive decoding

def noisy_copy(model, noise=0.005, seed=1):
    """The target with its weights jittered: its top candidates usually include the target's choice."""
    copy = tiny_model(seed=0)
    copy.load_state_dict(model.state_dict())
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in copy.parameters():
            parameter.add_(noise * torch.randn_like(parameter))
    return copy


class DecoyTreeDrafter(Drafter):
    """A tree holding the target's own greedy continuation, each true token behind a wrong sibling."""

    def __init__(self, continuation, vocab):
        self.continuation, self.vocab = continuation, vocab

    def start(self, input_ids):
        self.position = 0  # tokens committed so far

    def propose(self, k, sampler, generator, keep_drafting=None):
        tokens, parents, parent = [], [], -1
        for truth in self.continuation[self.position: self.position + k]:
            tokens += [(truth + 1) % self.vocab, truth]
            parents += [parent, parent]
            parent = len(tokens) - 1
        return Draft(torch.tensor(tokens), parents=parents)

    def update(self, num_accepted, next_token, path=None):
        self.position += num_accepted + 1


@pytest.fixture(scope="module")
def reference(target):
    return autoregressive_generate(target, PROMPT, 40, Sampler(0)).token_ids


@pytest.fixture(scope="module")
def noisy(target):
    return noisy_copy(target)


@pytest.mark.parametrize("kind", ["top-k", "sampled"])
@pytest.mark.parametrize("k", [1, 3, HeuristicK(2, 1, 5)], ids=["k1", "k3", "heuristic"])
def test_greedy_tree_speculative_equals_autoregressive(target, draft, noisy, reference, kind, k):
    drafter = {"top-k": TopKTreeDrafter, "sampled": SampledTreeDrafter}[kind]
    for model in (draft, noisy):
        assert speculative_generate(target, drafter(model, (3, 2, 1, 1, 1)), PROMPT, 40, k=k,
                                    sampler=Sampler(0)).token_ids == reference


def test_a_tree_accepts_more_than_a_chain_from_the_same_draft(target, noisy, reference):
    chain = speculative_generate(target, ModelDrafter(noisy), PROMPT, 40, k=3, sampler=Sampler(0))
    tree = speculative_generate(target, TopKTreeDrafter(noisy, (3, 2, 1)), PROMPT, 40, k=3, sampler=Sampler(0))
    assert tree.token_ids == chain.token_ids == reference
    assert tree.stats.tokens_per_step > chain.stats.tokens_per_step + 0.5


def test_the_target_path_behind_decoys_is_accepted_whole(target, reference):
    result = speculative_generate(target, DecoyTreeDrafter(reference, 64), PROMPT, 40, k=4, sampler=Sampler(0))
    assert result.token_ids == reference
    assert [step.accepted for step in result.steps] == [4] * 8  # 8 steps of 4 accepted + 1 bonus
    assert result.stats.tokens_per_step == 5 and result.stats.acceptance_rate == 1.0
    # the trace: the accepted path's tokens, the next token, the tree's size
    rebuilt = [token for step in result.steps for token in step.drafted[: step.accepted] + [step.next_token]]
    assert rebuilt == result.token_ids
    assert all(step.tree_nodes == 8 and step.bonus for step in result.steps)


def test_steps_of_a_tree_generation_account_for_every_token(target, draft):
    result = speculative_generate(target, SampledTreeDrafter(draft, (3, 2)), PROMPT, 30, k=2,
                                  sampler=Sampler(0.9, top_k=20), seed=0)
    rebuilt = [token for step in result.steps for token in step.drafted[: step.accepted] + [step.next_token]]
    assert rebuilt == result.token_ids and len(rebuilt) == 30
    assert all(len(step.drafted) - step.accepted in (0, 1) for step in result.steps)
    # a full tree, a depth-1 tree when the budget allows one more token, none (a plain target step) at the very end
    assert all(step.tree_nodes in (3, 9) or (step.tree_nodes is None and not step.drafted) for step in result.steps)


def test_caches_keep_only_the_accepted_paths(target, monkeypatch):
    caches = []
    monkeypatch.setattr(specbook.decoding, "cache_and_forward", lambda model, max_length, static=False: caches.append(
        cache_and_forward(model, max_length, static)) or caches[-1])
    noisy = noisy_copy(target, noise=0.01)
    drafter = TopKTreeDrafter(noisy, (3, 2, 2))
    result = speculative_generate(target, drafter, PROMPT, 30, k=3, sampler=Sampler(0.8), seed=1)
    assert any(0 < step.accepted < len(step.drafted) for step in result.steps)  # partial paths were kept
    sequence = torch.cat([PROMPT[0], torch.tensor(result.token_ids)])
    for model, cache, length in ((target, caches[0][0], len(sequence) - 1),
                                 (noisy, drafter.cache, len(sequence) - len(drafter.pending))):
        assert cache.get_seq_length() == length
        fresh = new_cache(model)
        with torch.no_grad():
            model(sequence[None, :length], past_key_values=fresh, use_cache=True)
        for kept, expected in zip(cached_layers(cache), cached_layers(fresh)):
            torch.testing.assert_close(kept, expected, atol=1e-5, rtol=0)


# --- lossless under sampling: both verification rules, and a broken one that the test catches

@pytest.mark.parametrize("drafter, sampler", [(TopKTreeDrafter, SAMPLERS[1]), (SampledTreeDrafter, SAMPLERS[0])],
                         ids=["top-k-warped", "sampled-plain"])
def test_sampled_tree_output_follows_the_target(tiny_pair, drafter, sampler):
    target, draft = tiny_pair
    assert chi_square_p_value(target, drafter(draft, (2, 2) if drafter is TopKTreeDrafter else (3, 2)), sampler) > 1e-3


@pytest.mark.parametrize("drafter", [TopKTreeDrafter, SampledTreeDrafter])
def test_chi_square_catches_siblings_checked_against_the_original_target(tiny_pair, drafter, monkeypatch):
    """Keeping the original q after a rejected candidate (for the next sibling and the final draw) biases the output."""
    monkeypatch.setattr(specbook.tree_verification, "residual_distribution",
                        lambda target_probs, draft_probs, **_: target_probs)
    target, draft = tiny_pair
    assert chi_square_p_value(target, drafter(draft, (2, 2)), SAMPLERS[0], samples=400) < 1e-6


# --- bad input gets a clear error naming the argument

@pytest.mark.parametrize("parents, match", [
    ([-1, 0, 7], "node 2 has parent 7, which does not exist"),
    ([-1, -2], "node 1 has parent -2, which does not exist"),
    ([-1, 2, 0], "parents must be in topological order: node 1 has parent 2"),
    ([-1, 0.5], "integer node indices"),
])
def test_bad_parents(parents, match):
    with pytest.raises(ValueError, match=match):
        tree_attention_mask(parents)
    with pytest.raises(ValueError, match=match):
        verify_tree(torch.zeros(len(parents), dtype=torch.long), parents, torch.full((len(parents), 2), 0.5),
                    torch.full((len(parents) + 1, 2), 0.5))


@pytest.mark.parametrize("paths, match", [
    ([(0,), (1,), (0, 1, 0)], r"node \(0, 1, 0\) has no parent: \(0, 1\) is not in the spec"),
    ([(0,), (0,)], "distinct"),
    ([(0,), ()], "non-empty"),
    ([(0,), (-1,)], "ranks >= 0"),
])
def test_bad_tree_spec(paths, match):
    with pytest.raises(ValueError, match=match):
        TreeSpec(paths)


def test_bad_branching():
    with pytest.raises(ValueError, match="branching"):
        TreeSpec.from_branching((2, 0))


@pytest.mark.parametrize("tokens, draft_rows, target_rows, match", [
    ([0, 1], 3, 4, "tokens and parents must have the same length"),
    ([0, 1, 1], 3, 3, r"target_probs must have n \+ 1 = 4 rows"),
    ([0, 1, 1], 2, 4, r"draft_probs must have shape \(n, vocab\) = \(3, 2\)"),
    ([0, 1, 5], 3, 4, "tokens must be token ids"),
])
def test_bad_verification_input(tokens, draft_rows, target_rows, match):
    with pytest.raises(ValueError, match=match):
        verify_tree(torch.tensor(tokens), [-1, 0, 0], torch.full((draft_rows, 2), 0.5),
                    torch.full((target_rows, 2), 0.5))


def test_bad_keep_positions(target):
    cache = new_cache(target)
    with torch.no_grad():
        target(PROMPT, past_key_values=cache, use_cache=True)
    for positions in ([0, 2, 1], [0, 7], [-1, 3]):
        with pytest.raises(ValueError, match="positions must be increasing indices in"):
            keep_positions(cache, positions)
    keep_positions(cache, [0, 2, 6])
    assert cache.get_seq_length() == 3


# --- a tree whose depth adapts, and early stopping (Lu et al. 2024)

def sharpened(model, factor=20.0):
    """``model`` with its logits scaled by ``factor``: the same argmax, a spread of confidences."""
    with torch.no_grad():
        model.lm_head.weight.mul_(factor)
    return model


class RecordingStop(ConfidenceStop):
    """ConfidenceStop that remembers every confidence it was shown."""

    def start(self):
        self.shown = []

    def keep_drafting(self, draft_probs):
        self.shown.append(float(draft_probs.max()))
        return super().keep_drafting(draft_probs)


def test_the_depth_k_tree_is_a_prefix_with_the_corner_of_the_full_mask():
    """Nodes sorted by depth: a shallower tree needs no mask of its own (Lu et al.'s sliced mask)."""
    spec = TreeSpec.from_branching((3, 2, 1, 1))
    full = tree_attention_mask(spec.parents)
    for depth in range(1, spec.depth + 1):
        cut = spec.truncated(depth)
        assert cut.parents == spec.parents[: len(cut)]
        assert torch.equal(tree_attention_mask(cut.parents), full[: len(cut) + 1, : len(cut) + 1])


def test_the_policy_sets_the_trees_depth_step_by_step(target, noisy, reference):
    class RecordingHeuristicK(HeuristicK):
        def start(self):
            super().start()
            self.chosen = []

        def next_k(self):
            self.chosen.append(self.k)
            return self.k

    spec, policy = TreeSpec.from_branching((2, 2, 1, 1, 1, 1)), RecordingHeuristicK(2, 1, 6)
    result = speculative_generate(target, TopKTreeDrafter(noisy, spec), PROMPT, 40, k=policy, sampler=Sampler(0))
    assert result.token_ids == reference
    budgets = [min(k, 40 - written - 1) for k, written in
               zip(policy.chosen, [0] + list(itertools.accumulate(step.accepted + 1 for step in result.steps)))]
    assert [step.tree_nodes or 0 for step in result.steps] == [len(spec.truncated(b)) if b else 0 for b in budgets]
    assert len(set(policy.chosen)) > 2  # the depth really moved


def test_a_one_wide_tree_stops_where_a_chain_stops(target, reference):
    """With ConfidenceStop a tree of one candidate per depth drafts what the chain drafter drafts."""
    model = sharpened(noisy_copy(target, noise=0.01))
    runs = [speculative_generate(target, drafter, PROMPT, 40, k=RecordingStop(0.25, 4), sampler=Sampler(0))
            for drafter in (ModelDrafter(model), TopKTreeDrafter(model, (1, 1, 1, 1)))]
    chain, tree = runs
    assert chain.token_ids == tree.token_ids == reference
    # a tree step records the path it walked (the accepted nodes and the first rejected one) and its size
    assert [(s.drafted[: s.accepted + 1], s.accepted, len(s.drafted)) for s in chain.steps] == \
        [(s.drafted, s.accepted, s.tree_nodes or 0) for s in tree.steps]
    assert chain.stats.draft_calls == tree.stats.draft_calls
    lengths = [len(step.drafted) for step in chain.steps[:-2]]  # (the last steps may run out of token budget)
    assert 1 in lengths and max(lengths) > 1  # some drafts stopped early, some did not


@pytest.mark.parametrize("kind", ["top-k", "sampled"])
def test_early_stopping_cuts_trees_and_keeps_the_greedy_text(target, reference, kind):
    model = sharpened(noisy_copy(target, noise=0.01))
    drafter = {"top-k": TopKTreeDrafter, "sampled": SampledTreeDrafter}[kind](model, (3, 2, 1, 1))
    policy = RecordingStop(0.25, 4)
    result = speculative_generate(target, drafter, PROMPT, 40, k=policy, sampler=Sampler(0))
    assert result.token_ids == reference
    full = TreeSpec.from_branching((3, 2, 1, 1))
    sizes = {step.tree_nodes for step in result.steps if step.tree_nodes}
    assert {len(full.truncated(1)), len(full)} <= sizes  # some trees stopped at depth 1, some grew to the end
    assert min(policy.shown) < 0.25 <= max(policy.shown)


class ArgmaxStop(FixedK):
    """Stop growing the tree where the draft's best guess is token 0: an arbitrary rule on the draft's p."""

    def keep_drafting(self, draft_probs):
        return int(draft_probs.argmax()) != 0


@pytest.mark.parametrize("drafter", [TopKTreeDrafter, SampledTreeDrafter])
def test_sampled_output_follows_the_target_when_trees_stop_early(tiny_pair, drafter, monkeypatch):
    """Four new tokens with K = 3, so the stop after depth 2 depends on which sampled candidate is best."""
    monkeypatch.setattr(support, "NEW_TOKENS", 4)
    target, draft = tiny_pair
    spec, cut, whole = TreeSpec.from_branching((2, 2, 1)), 0, 0  # trees cut short / grown as deep as allowed
    for seed in range(20):
        written = 0
        for step in speculative_generate(target, drafter(draft, spec), torch.tensor([[0, 1, 2]]), 4,
                                         k=ArgmaxStop(3), sampler=SAMPLERS[0], seed=seed).steps:
            allowed = len(spec.truncated(min(3, 4 - written - 1))) if written < 3 else 0
            cut, whole = cut + ((step.tree_nodes or 0) < allowed), whole + ((step.tree_nodes or 0) == allowed)
            written += step.accepted + 1
    assert cut and whole
    assert chi_square_p_value(target, drafter(draft, (2, 2, 1)), SAMPLERS[0], samples=800, k=ArgmaxStop(3)) > 1e-3


# --- EAGLE-2's dynamic tree: grown where the draft is sure, the most likely nodes kept


def test_a_dynamic_tree_keeps_the_most_likely_paths():
    """Against brute force on a toy draft whose next-token log p depends on the last token only."""
    vocab, tree = 6, DynamicTree(depth=3, width=2, nodes=5)
    table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0)).log_softmax(-1)  # (last, next)
    fed_calls = []

    def feed(tokens, fed_parents):
        fed_calls.append((tokens.tolist(), fed_parents.tolist()))
        return table[tokens]

    root = table[0]
    tokens, parents, rows = grow_dynamic_tree(root, feed, tree, depth=3)  # on the device
    parents, rows = parents.tolist(), rows.tolist()
    assert [len(call[0]) for call in fed_calls] == [2, 2]  # the width best of depths 1 and 2 were expanded
    # brute force: expand exactly as the rule says, score every drafted node by its path log p, keep the best 5
    def score(path):
        previous, total = 0, 0.0
        for token in path:
            total, previous = total + float(table[previous, token]), token
        return total
    level, drafted, expanded = [()], [], []
    for depth in range(3):
        children = [path + (int(t),) for path in level for t in table[path[-1] if path else 0].topk(2).indices]
        drafted += children
        level = sorted(children, key=score, reverse=True)[:2]
        expanded += level if depth < 2 else []
    best = sorted(drafted, key=score, reverse=True)[:5]
    paths = []
    for node, token in enumerate(tokens.tolist()):  # rebuild each kept node's path from parents
        paths.append((paths[parents[node]] if parents[node] >= 0 else ()) + (token,))
    assert sorted(paths) == sorted(best)
    assert all(parent < node for node, parent in enumerate(parents))  # topological, ancestors kept
    assert {paths[node] for node, row in enumerate(rows) if row >= 0} == set(expanded) & set(best)
    first, second = fed_calls[1][1][:2], fed_calls[1][1][2:]  # the fed rows' parents: the root's, then rows 0, 1
    assert first == [-1, -1] and set(second) <= {0, 1}


@pytest.mark.parametrize("depth, width, nodes, match", [(0, 2, 4, "depth"), (2, 0, 4, "width"),
                                                        (4, 2, 3, "at least the depth"), (2, 2.0, 4, "width")])
def test_a_dynamic_tree_refuses_bad_sizes(depth, width, nodes, match):
    with pytest.raises(ValueError, match=match):
        DynamicTree(depth, width, nodes)


def test_a_sampled_tree_refuses_a_dynamic_shape(draft):
    with pytest.raises(ValueError, match="TopKTreeDrafter"):
        SampledTreeDrafter(draft, DynamicTree())


@pytest.mark.parametrize("k", [1, 3, HeuristicK(2, 1, 5)], ids=["k1", "k3", "heuristic"])
def test_greedy_dynamic_tree_equals_autoregressive(target, draft, noisy, reference, k):
    for model in (draft, noisy):
        drafter = TopKTreeDrafter(model, DynamicTree(depth=4, width=3, nodes=10))
        assert speculative_generate(target, drafter, PROMPT, 40, k=k, sampler=Sampler(0)).token_ids == reference


def test_sampled_dynamic_tree_output_follows_the_target(tiny_pair):
    target, draft = tiny_pair
    drafter = TopKTreeDrafter(draft, DynamicTree(depth=2, width=2, nodes=3))
    assert chi_square_p_value(target, drafter, SAMPLERS[1]) > 1e-3

import pytest
import torch

import specbook.decoding
import specbook.trees
from specbook.cache import keep_positions, new_cache
from specbook.decoding import autoregressive_generate, speculative_generate
from specbook.drafters import Draft, Drafter, ModelDrafter, SampledTreeDrafter, TopKTreeDrafter
from specbook.policies import HeuristicK
from specbook.sampling import Sampler
from specbook.trees import (TreeSpec, tree_attention_mask, tree_forward, tree_positions, verify_tree,
                            verify_tree_greedy)

from support import SAMPLERS, chi_square_p_value, tiny_model

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
    monkeypatch.setattr(specbook.decoding, "new_cache", lambda model: caches.append(new_cache(model)) or caches[-1])
    noisy = noisy_copy(target, noise=0.01)
    drafter = TopKTreeDrafter(noisy, (3, 2, 2))
    result = speculative_generate(target, drafter, PROMPT, 30, k=3, sampler=Sampler(0.8), seed=1)
    assert any(0 < step.accepted < len(step.drafted) for step in result.steps)  # partial paths were kept
    sequence = torch.cat([PROMPT[0], torch.tensor(result.token_ids)])
    for model, cache, length in ((target, caches[0], len(sequence) - 1),
                                 (noisy, drafter.cache, len(sequence) - len(drafter.pending))):
        assert cache.get_seq_length() == length
        fresh = new_cache(model)
        with torch.no_grad():
            model(sequence[None, :length], past_key_values=fresh, use_cache=True)
        for kept, expected in zip(cache.layers, fresh.layers):
            torch.testing.assert_close(kept.keys, expected.keys, atol=1e-5, rtol=0)
            torch.testing.assert_close(kept.values, expected.values, atol=1e-5, rtol=0)


# --- lossless under sampling: both verification rules, and a broken one that the test catches

@pytest.mark.parametrize("drafter, sampler", [(TopKTreeDrafter, SAMPLERS[1]), (SampledTreeDrafter, SAMPLERS[0])],
                         ids=["top-k-warped", "sampled-plain"])
def test_sampled_tree_output_follows_the_target(tiny_pair, drafter, sampler):
    target, draft = tiny_pair
    assert chi_square_p_value(target, drafter(draft, (2, 2) if drafter is TopKTreeDrafter else (3, 2)), sampler) > 1e-3


@pytest.mark.parametrize("drafter", [TopKTreeDrafter, SampledTreeDrafter])
def test_chi_square_catches_siblings_checked_against_the_original_target(tiny_pair, drafter, monkeypatch):
    """Keeping the original q after a rejected candidate (for the next sibling and the final draw) biases the output."""
    monkeypatch.setattr(specbook.trees, "residual_distribution", lambda target_probs, draft_probs, **_: target_probs)
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

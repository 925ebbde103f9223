"""Parallel drafting (PARD): K drafts from one call, exact through the verifier, and its training layout.

The layout that trains every depth of every context in one forward must give each row exactly what the
drafting call gives that mask: checked against the call itself. The drafter is exact greedily (equal to
autoregressive decoding, on every cache and on the architecture matrix) and sampled (chi-square, which a
drafter reporting the wrong p fails); bad drafts and bad K are refused before the first token.
"""

import pytest
import torch

import specbook.graphs
import specbook.train.pard
from specbook import PardDrafter, Sampler, autoregressive_generate, speculative_generate
from specbook.drafters import Draft
from specbook.train.pard import (agreement_by_depth, kept_positions, layout, pard_loss, pard_predictions,
                                 predecessors, reach, text_windows, unused_token)

from families import FAMILIES, VOCAB, hf_greedy, tiny_family_model
from support import SAMPLERS, chi_square_p_value, tiny_model

GREEDY = Sampler(0)
PROMPT = [3, 14, 15, 9, 2, 6, 5]


def with_mask(model, token, max_k=6):
    """``model`` made a PARD draft: ``token`` its mask (as the pard stage writes the config)."""
    model.config.update({"pard_token": token, "pard_max_k": max_k})
    return model


@pytest.fixture(scope="module")
def pair():
    """A target and a PARD draft over the same 64 tokens, its mask the last id of a 65-row embedding."""
    target = tiny_model(seed=0)
    draft = with_mask(tiny_model(vocab_size=65, hidden_size=16, num_layers=1, seed=1), 64)
    with torch.no_grad():
        draft.lm_head.weight[:64].copy_(target.lm_head.weight[:, :16] * 4)  # some agreement: ragged acceptance
    return target, draft


def test_cod_keeps_chains():
    """Every kept mask's chain is kept: depth c at p needs depth c - 1 at p - 1, and no context is empty."""
    kept = kept_positions(64, 6, generator=torch.Generator().manual_seed(0))
    assert kept[0].tolist() == list(range(64))
    for depth in range(1, 6):
        previous = set(kept[depth - 1].tolist())
        assert all(p - 1 in previous and p >= depth for p in kept[depth].tolist())
        assert len(kept[depth]) == min(int(64 * max(0.7 ** depth, 0.2)), len(kept[depth]))
    assert sum(map(len, kept)) < 0.6 * 6 * 64  # the drop: about half the rows of the full layout here
    assert [len(positions) for positions in kept_positions(8, 3, ratio=1.0)] == [8, 7, 6]  # no drop


def rows_match_calls(seed=2) -> bool:
    """Whether every third row of a layout (depth c at position p) has the logits of the c-th mask of the drafting
    call [x_0 .. x_{p-c}, m x c], and the teacher's rows the target's log-probabilities."""
    model = with_mask(tiny_model(vocab_size=65, seed=seed), 64)
    inputs = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(3))
    kept = kept_positions(12, 4, ratio=0.8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, teacher, depth = pard_predictions(model, model, inputs, kept, 64)
        positions = torch.cat(kept)
        calls = [model(torch.cat([inputs[:, : p - c + 1], torch.full((2, c), 64)], 1)).logits[:, -1]
                 for c, p in zip(depth.tolist()[::3], positions.tolist()[::3])]
        own = model(inputs).logits.log_softmax(-1)
    return torch.allclose(logits[:, ::3], torch.stack(calls, 1), atol=1e-5) and torch.allclose(teacher[:, :12], own,
                                                                                                atol=1e-5)


def test_each_layout_row_is_its_drafting_call():
    assert rows_match_calls()


def test_a_layout_that_lets_masks_see_ahead_fails(monkeypatch):
    """The broken variant: every mask also sees the text up to its own position, the answer's context."""
    def leaky(kept):
        depth, position, visible = layout(kept)
        return depth, position, visible | ((depth[None] == 0) & (position[None] <= position[:, None]))
    monkeypatch.setattr(specbook.train.pard, "layout", leaky)
    assert not rows_match_calls()


def test_the_loss_and_held_out_agreement_run():
    target, draft = tiny_model(seed=0), with_mask(tiny_model(vocab_size=65, hidden_size=16, num_layers=1, seed=1), 64)
    inputs = torch.randint(0, 64, (2, 16))
    loss = pard_loss(draft, target, 64, torch.Generator().manual_seed(0), 4, 0.7, inputs, None)
    loss.backward()
    assert loss.item() > 0 and draft.model.embed_tokens.weight.grad[64].abs().sum() > 0  # the mask learns
    report = agreement_by_depth(draft, target, text_windows(torch.randint(0, 64, (200,)), 32, 4), 64, depths=3)
    assert len(report["agreement"]) == 3 and all(0 <= a <= 1 for a in report["agreement"])
    assert unused_token(torch.tensor([0, 1, 2, 4, 5]), 8) == 3


def test_each_row_is_weighted_by_the_chance_that_its_call_reaches_it():
    """`predecessors` finds the rows of the drafts before a row in its drafting call (under COD's drop too);
    `reach` multiplies their acceptance probabilities sum_x min(p, q); a row after a draft that is never accepted
    gets no weight, and the loss with ``reached`` is the weighted mean of the rows' KL."""
    kept = kept_positions(12, 4, 0.7, 0.2, torch.Generator().manual_seed(0))
    depth, position, _ = layout(kept)
    before = predecessors(depth, position)
    for row, (d, p) in enumerate(zip(depth.tolist(), position.tolist())):
        chain = [(int(depth[i]), int(position[i])) for i in before[row].tolist() if i < len(depth)]
        assert chain == [(c, p - d + c) for c in range(d)]
    vocab = 5
    logits = torch.zeros(1, len(depth), vocab)  # p uniform: each row accepted with sum min(p, q)
    teacher = torch.full((1, len(depth), vocab), 0.2).log()
    first = (depth == 0).nonzero()[0, 0]
    teacher[0, first] = torch.tensor([1.0, 1e-9, 1e-9, 1e-9, 1e-9]).log()  # this row's acceptance: 0.2
    weights = reach(logits, teacher, before)
    assert torch.allclose(weights[0, depth == 0], torch.ones(int((depth == 0).sum())))
    followers = [row for row in range(len(depth)) if int(first) in before[row].tolist()]
    assert followers and torch.allclose(weights[0, followers], torch.full((len(followers),), 0.2), atol=1e-5)
    target, draft = tiny_model(seed=0), with_mask(tiny_model(vocab_size=65, hidden_size=16, num_layers=1, seed=1), 64)
    inputs = torch.randint(0, 64, (2, 16))
    weighted = pard_loss(draft, target, 64, torch.Generator().manual_seed(0), 4, 0.7, inputs, None, reached=True)
    plain = pard_loss(draft, target, 64, torch.Generator().manual_seed(0), 4, 0.7, inputs, None)
    assert weighted.item() > 0 and weighted.item() != plain.item()


@pytest.mark.parametrize("cache", ["dynamic", "static", "graphs"])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_equals_autoregressive(pair, cache, k, monkeypatch):
    target, draft = pair
    monkeypatch.setattr(specbook.graphs, "CAPTURE_ON_CPU", cache == "graphs")
    options = {} if cache == "dynamic" else dict(cache="static")
    reference = autoregressive_generate(target, torch.tensor([PROMPT]), 40, GREEDY).token_ids
    drafter = PardDrafter(draft, **options)
    result = speculative_generate(target, drafter, torch.tensor([PROMPT]), 40, k=k, sampler=GREEDY, **options)
    assert result.token_ids == reference
    assert result.stats.draft_calls == result.stats.target_calls - 1 or k == 1  # one draft call a step
    if k > 1:
        assert 0 < result.stats.acceptance_rate < 1  # drafts really verified, some rejected


def test_one_call_drafts_what_k_masks_predict(pair):
    """The drafts are the argmaxes of one call on the context and k - 1 masks."""
    target, draft = pair
    drafter = PardDrafter(draft)
    drafter.start(torch.tensor([PROMPT]))
    proposal = drafter.propose(4, GREEDY, None)
    with torch.no_grad():
        logits = draft(torch.tensor([PROMPT + [64] * 3])).logits[0, -4:, :64]
    assert proposal.tokens.tolist() == logits.argmax(-1).tolist() and drafter.calls == 1


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_sampled_output_follows_the_target(tiny_pair, sampler):
    target, draft = tiny_pair
    pard = with_mask(tiny_model(vocab_size=4, hidden_size=8, num_layers=1, seed=4), 3)
    with torch.no_grad():
        pard.lm_head.weight.mul_(30)
    assert chi_square_p_value(target, PardDrafter(pard), sampler, k=3) > 1e-3


class UniformClaimingPard(PardDrafter):
    """Reports every draft as drawn from the uniform distribution, whatever it was drawn from."""

    def propose(self, k, sampler, generator, keep_drafting=None):
        draft = super().propose(k, sampler, generator, keep_drafting)
        return Draft(draft.tokens, torch.full_like(draft.probs, 1 / draft.probs.shape[-1]))


def test_chi_square_catches_the_wrong_p(tiny_pair):
    target, _ = tiny_pair
    pard = with_mask(tiny_model(vocab_size=4, hidden_size=8, num_layers=1, seed=4), 3)
    with torch.no_grad():
        pard.lm_head.weight.mul_(30)
    assert chi_square_p_value(target, UniformClaimingPard(pard), SAMPLERS[0], k=3, samples=400) < 1e-6


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family(family):
    """A tiny PARD draft of each family (its mask an extra embedding row) drafts for its target: HF's greedy tokens."""
    target = tiny_family_model(family)
    draft = with_mask(tiny_family_model(family, seed=1, layers=1, vocab=VOCAB + 32), VOCAB + 1)
    prompt = torch.tensor([[5, 17, 3, 88, 41, 9, 60, 2, 33, 70]])
    with torch.no_grad():
        reference = hf_greedy(target, prompt, 24)
    assert speculative_generate(target, PardDrafter(draft), prompt, 24, k=4, sampler=GREEDY).token_ids == reference


def test_bad_drafts_and_k_are_refused(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="has no pard_token in its config"):
        PardDrafter(tiny_model(seed=1))
    with pytest.raises(ValueError, match="pard_token \\(99\\) is not a row of its embedding \\(65 rows\\)"):
        PardDrafter(with_mask(tiny_model(vocab_size=65, seed=1), 99))
    with pytest.raises(ValueError, match="k must be at most 6 for this PARD draft"):
        speculative_generate(target, PardDrafter(draft), torch.tensor([PROMPT]), 8, k=7, sampler=GREEDY)
    with pytest.raises(ValueError, match="drafts for one sequence at a time"):
        speculative_generate(target, PardDrafter(draft), torch.tensor([[1, 2], [3, 4]]), 4, sampler=GREEDY)


def test_keep_drafting_is_asked_in_order_until_it_stops(pair):
    """As a drafting loop asks a policy: after each draft, and no more once it says stop."""
    _, draft = pair
    drafter, asked = PardDrafter(draft), []
    drafter.start(torch.tensor([PROMPT]))
    proposal = drafter.propose(5, GREEDY, None, lambda probs: asked.append(probs) or len(asked) < 2)
    assert len(asked) == 2 and len(proposal) == 2 and drafter.calls == 1

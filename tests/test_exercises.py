"""The exercises and their checkers (specbook.exercises).

- Every checker passes the reference answer and rejects plausible wrong ones: each wrong answer
  here is a mistake a first-time reader makes (the correction drawn from q, alpha as sum max,
  tokens per step off by one, the optimal K searched from 0, a decoding loop without its KV cache,
  `[:, :, :-0]`, no bonus token, the earliest match, ...). A checker that passed them would teach
  nothing.
- The decoding checkers run on tiny random models whose greedy choices are clear-cut, agree with
  the package's own engine, and leave the learner's random state alone.
- A checker never raises: an exception or a None from the learner's code is one line of output.
- Each stub notebook runs top to bottom without error, and every check in it prints a failure
  (the page the book publishes shows what a learner sees before starting); the committed
  solutions show every check passing (nbval re-runs them); stubs and solutions ask the same
  questions with the same checks.
"""

from __future__ import annotations

import contextlib
import io
import math
import re
from collections import Counter
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch
from IPython.core.inputtransformer2 import TransformerManager
from transformers import DynamicCache, LlamaConfig

from specbook import Sampler, autoregressive_generate, exercises, speculative_generate
from specbook.exercises import CHECKS, FAIL, PASS, Outcome, tiny
from specbook.exercises.ch01 import _warp
from specbook.exercises.ch04 import speculative_greedy_reference
from specbook.exercises.ch05 import _lookup_variant
from specbook.drafters import BlockwiseDrafter, LookaheadDrafter, OuroborosDrafter
from specbook.drafters.ouroboros import PhrasePool
from specbook.drafters.medusa import DEFAULT_TREE
from specbook.heads import MedusaHeads
from specbook.mtp import MultiTokenHeads, mtp_model, mtp_predictions
from specbook.exercises.ch06_verification import greedy_walk, siblings_output, tree_tokens_per_call_reference
from specbook.exercises.ch04b import (encoder_decoder_speedup_reference, greedy_seq2seq_reference,
                                     seq2seq_rollback_reference, tiny_seq2seq_parts)
from specbook.exercises.ch06b import collect_ngrams_reference, greedy_continuation, jacobi_reference
from specbook.exercises.ch06c import (blockwise_accept_reference, confidence_rows, multi_token_loss_reference,
                                     phrases_after_reference)
from specbook.rejection import acceptance_rate, output_distribution, residual_distribution, verify_chain
from specbook.theory import expected_tokens_per_step, optimal_k, speedup
from specbook.train.heads import mtp_loss
from specbook.tree_verification import verify_tree_greedy
from specbook.trees import tree_positions

ROOT = Path(__file__).resolve().parents[1]
STUBS = sorted((ROOT / "exercises").glob("*.ipynb"))
SOLUTIONS = [ROOT / "exercises" / "solutions" / path.name for path in STUBS]
CHECK_CELL = re.compile(r"^check_\w+\(\w+\)\s*$")


# --- References (from the package where it has one) and wrong answers ---------------------------


def _accept_prob(draft_token, target_probs, draft_probs):
    return min(1.0, float(target_probs[draft_token] / draft_probs[draft_token]))


def _reference_chain(draft_tokens, draft_probs, target_probs, uniforms, *, correction="residual",
                     leading_run=True, bonus_row=None):
    """verify_chain with given uniforms, and with switches that turn it into a wrong answer."""
    k = len(draft_tokens)
    passed = [float(uniforms[t]) < _accept_prob(int(draft_tokens[t]), target_probs[t], draft_probs[t])
              for t in range(k)]
    if leading_run:
        num_accepted = next((t for t in range(k) if not passed[t]), k)
    else:  # counts every draft that passed its test
        num_accepted = sum(passed)
    if num_accepted < k:
        t = num_accepted
        if correction == "residual":
            return num_accepted, residual_distribution(target_probs[t], draft_probs[t])
        return num_accepted, target_probs[t]
    return num_accepted, target_probs[k if bonus_row is None else bonus_row]


def _naive_residual(target_probs, draft_probs):
    excess = (target_probs - draft_probs).clamp(min=0)
    return excess / excess.sum()  # NaN when q == p


def _shortcut(target_probs, draft_probs):
    return output_distribution(target_probs, draft_probs, correction="target")


def _searched_k(start, stop_offset=1, index=False):
    def search(alpha, cost_ratio, k_max=64):
        ks = np.arange(start, k_max + stop_offset)
        with np.errstate(divide="ignore", invalid="ignore"):
            gains = (1 - alpha ** (ks + 1)) / (1 - alpha) / (cost_ratio * ks + 1)
        best = int(np.argmax(gains))
        return best if index else int(ks[best])
    return search


def _estimate_alpha(num_accepted, k):
    return num_accepted.sum() / np.minimum(num_accepted + 1, k).sum()


# Chapter 1


def _warped_probs(logits, temperature=1.0, top_k=None, top_p=None, **mistake):
    return _warp(logits, temperature, top_k, top_p, **mistake)


def _unnormalised(logits, temperature=1.0, top_k=None, top_p=None):
    if temperature == 0:
        return Sampler(0).probs(logits)
    kept = torch.isfinite(Sampler(temperature, top_k, top_p).warp(logits))
    return torch.where(kept, (logits / temperature).softmax(-1), 0.0)


@torch.inference_mode()
def _greedy_by_hand(model, input_ids, max_new_tokens, cache=True, row=-1, with_prompt=False, steps_short=0):
    """Greedy decoding, and with switches the usual mistakes: no cache, the wrong row, ..."""
    kv_cache, tokens, new_tokens = DynamicCache() if cache else None, input_ids[0].tolist(), []
    feed = input_ids
    for step in range(max_new_tokens - steps_short):
        logits = model(feed, past_key_values=kv_cache, use_cache=cache).logits[0]  # (positions, vocab)
        new_tokens.append(int(logits[row if step == 0 else -1].argmax()))
        tokens.append(new_tokens[-1])
        feed = torch.tensor([[new_tokens[-1]]]) if cache else torch.tensor([tokens])
    return tokens if with_prompt else new_tokens


@torch.inference_mode()
def _greedy_last_token_only(model, input_ids, max_new_tokens):
    """Feeds only the newest token, but forgets to pass the cache: the model sees one token."""
    new_tokens, feed = [], input_ids
    for _ in range(max_new_tokens):
        new_tokens.append(int(model(feed).logits[0, -1].argmax()))
        feed = torch.tensor([[new_tokens[-1]]])
    return new_tokens


def _step_cost(parameters, layers, width, kv_width, context, tokens=1, bytes_per_parameter=2, *, cache=True,
               weights_per_token=False, flops_per_weight=2, kv_factor=2, one_token=False, cache_width=None):
    cache_bytes = kv_factor * layers * (cache_width or kv_width) * context * bytes_per_parameter if cache else 0
    weight_reads = tokens if weights_per_token else 1
    flops = (1 if one_token else tokens) * (flops_per_weight * parameters + 4 * layers * width * context)
    return flops, weight_reads * parameters * bytes_per_parameter + cache_bytes


# Chapter 4


def _crop(cache, num_tokens, keys_only=False):
    keep = cache[0][0].shape[2] - num_tokens
    return [(keys[:, :, :keep], values if keys_only else values[:, :, :keep]) for keys, values in cache]


@torch.inference_mode()
def _speculative_by_hand(target, draft, input_ids, max_new_tokens, k, *, bonus=True, correct_with_draft=False,
                         every_match=False, shift=0, cut=True):
    """Greedy speculative decoding without a cache, and with switches the usual mistakes."""
    context, new_tokens = input_ids[0].tolist(), []
    while len(new_tokens) < max_new_tokens:
        drafted = []
        for _ in range(k):
            drafted.append(int(draft(torch.tensor([context + drafted])).logits[0, -1].argmax()))
        choices = target(torch.tensor([context + drafted])).logits[0, -(k + 1):].argmax(-1).tolist()
        verdicts = [d == c for d, c in zip(drafted, choices[shift:])] + [False] * shift
        accepted = sum(verdicts) if every_match else next((i for i, ok in enumerate(verdicts) if not ok), k)
        if accepted < k:
            emitted = drafted[:accepted] + [drafted[accepted] if correct_with_draft else choices[accepted]]
        else:
            emitted = drafted + ([choices[k]] if bonus else [])
        context += emitted
        new_tokens += emitted
    return new_tokens[:max_new_tokens] if cut else new_tokens


@torch.inference_mode()
def _one_call_per_token(target, draft, input_ids, max_new_tokens, k):
    return autoregressive_generate(target, input_ids, max_new_tokens, Sampler(0)).token_ids


def _alpha_from_steps(steps):
    accepted = sum(step.accepted for step in steps)
    return accepted / (accepted + sum(step.accepted < len(step.drafted) for step in steps))


# Chapter 5


def _prompt_lookup(tokens, k, max_ngram=3, min_ngram=1):
    return _lookup_variant(tokens, k, max_ngram, min_ngram)


def _lookup_including_the_end(tokens, k, max_ngram=3, min_ngram=1):
    """Searches from the end itself, so the suffix always matches itself and nothing follows it."""
    end = len(tokens)
    for n in range(min(max_ngram, end), min_ngram - 1, -1):
        for start in range(end - n, -1, -1):
            if tokens[start:start + n] == tokens[end - n:]:
                return tokens[start + n:start + n + k]
    return []


def _ngram_by_hand(tokens, k, n=3, *, levels=None, guess=False, shortest_first=False, chain=True):
    """The multi-level n-gram drafter, and with switches the usual mistakes."""
    lengths = list(levels(n) if levels else range(n - 1, 0, -1))
    if shortest_first:
        lengths.reverse()
    counts = {}
    for position, token in enumerate(tokens):
        for length in lengths:
            if length <= position:
                counts.setdefault(tuple(tokens[position - length:position]), Counter())[token] += 1
    overall = Counter(tokens).most_common(1)[0][0]
    context, draft = list(tokens), []
    while len(draft) < (k if chain else 1):
        known = [counts[key] for length in lengths if length <= len(context)
                 and (key := tuple(context[len(context) - length:])) in counts]
        if not known and not guess:
            break
        best = max(known[0].items(), key=lambda item: item[1])[0] if known else overall
        draft.append(best)
        context.append(best)
    return draft


def _heuristic_next_k(k, drafted, accepted, k_min=1, k_max=16, *, success=None, grow=2, shrink=None,
                      clamp=True, skip_empty=True):
    if drafted == 0 and skip_empty:
        return k
    succeeded = accepted == drafted if success is None else success(k, drafted, accepted)
    new_k = k + grow if succeeded else (shrink(k, k_min) if shrink else k - 1)
    return min(max(new_k, k_min), k_max) if clamp else new_k


# Chapter 6


def _tree_mask(parents, *, ancestors=True, diagonal=True, root=True, with_root_row=True):
    """The tree attention mask by hand, and with switches the usual mistakes."""
    mask = torch.zeros(len(parents) + 1, len(parents) + 1, dtype=torch.bool)
    mask[0, 0] = True
    for node, parent in enumerate(parents):
        mask[node + 1, node + 1] = diagonal
        while parent != -1:
            mask[node + 1, parent + 1] = True
            parent = parents[parent] if ancestors else -1
        mask[node + 1, 0] = root
    return mask if with_root_row else mask[1:, 1:]


def _tree_position_ids(parents, context_length, *, root_at=0, with_root=True):
    depths = [0]
    for parent in parents:
        depths.append(depths[parent + 1] + 1)
    positions = [context_length + root_at + depth for depth in depths]
    return positions if with_root else positions[1:]


def _medusa_tree(head_logits, choices, *, order=lambda path: (len(path), path), head=lambda depth: depth - 1,
                 rank=lambda path: path[-1], tokens_only=False):
    """Medusa's tree of the heads' top guesses by hand, and with switches the usual mistakes."""
    paths = sorted(choices, key=order) if order else list(choices)
    ranked = head_logits.argsort(-1, descending=True)  # (heads, vocab): each head's tokens, best first
    index = {path: node for node, path in enumerate(paths)}
    tokens = [int(ranked[head(len(path)), rank(path)]) for path in paths]
    parents = [index[path[:-1]] if len(path) > 1 else -1 for path in paths]
    return tokens if tokens_only else (tokens, parents)


def _verify_tree_greedily(tokens, parents, target_tokens, *, as_tokens=False, next_from_root=False):
    path, row = [], 0
    while True:
        match = next((node for node, parent in enumerate(parents)
                      if parent == row - 1 and tokens[node] == target_tokens[row]), None)
        if match is None:
            next_token = target_tokens[0] if next_from_root else target_tokens[row]
            return ([tokens[node] for node in path] if as_tokens else path), next_token
        path.append(match)
        row = match + 1


def _no_residual_output(q, candidates, *, final_draw="q", chained=True):
    emitted, untried = torch.zeros_like(q), 1.0
    for token in candidates:
        emitted[token] += (untried if chained else 1.0) * q[token]
        untried *= 1 - float(q[token])
    if final_draw == "q":
        return emitted + untried * q
    if final_draw == "without the candidates":
        rest = q.clone()
        rest[candidates] = 0
        return emitted + untried * rest / rest.sum()
    return emitted


def _tree_tokens_per_call(paths, accuracy, *, step=lambda depth, rank, accuracy: accuracy[depth][rank], one=1):
    return one + sum(np.prod([step(depth, rank, accuracy) for depth, rank in enumerate(path)]) for path in paths)


# Chapter 6b


def _jacobi_step(next_tokens, prompt, guesses, *, shift=0, sequential=False, per_guess=False, all_rows=False):
    """One Jacobi iteration by hand, and with switches the usual mistakes."""
    if sequential:  # each guess from the ones just updated: greedy decoding
        new = []
        for _ in guesses:
            new.append(next_tokens(prompt + new)[-1])
        return new
    if per_guess:  # the right tokens, one call each
        return [next_tokens(prompt + guesses[:i])[-1] for i in range(len(guesses))]
    rows = next_tokens(prompt + guesses)  # (len(prompt) + m,)
    start = len(prompt) - 1 + shift
    return rows if all_rows else rows[start: start + len(guesses)]


def _window_parents(window, levels, *, column_major=False, chain_levels=False):
    """The lookahead window's parents by hand, and with switches the usual mistakes."""
    def node(j, i):
        return i * levels + j if column_major else j * window + i

    def parent(j, i):
        if j == 0 or chain_levels:  # a chain along the level
            return -1 if i == 0 else node(j, i - 1)
        return node(j - 1, i)  # the token below it in its column

    tokens = sorted(((j, i) for j in range(levels) for i in range(window)), key=lambda token: node(*token))
    return [parent(j, i) for j, i in tokens]


def _collect_ngrams(levels, new, *, flat=False, without_new=False, newest_first=False, across=False, unique=False):
    """The N-grams a full window leaves behind, by hand, and with switches the usual mistakes."""
    if across:
        return [(level[0], tuple(level[1:])) for level in levels + [new]]
    columns = [[level[i] for level in levels] + ([] if without_new else [new[i]]) for i in range(len(new))]
    if newest_first:
        columns = [column[::-1] for column in columns]
    ngrams = [tuple(column) if flat else (column[0], tuple(column[1:])) for column in columns]
    return list(dict.fromkeys(ngrams)) if unique else ngrams


def _self_speculative_speedup(alpha, k, layers, exit_layer, overhead, *, with_overhead=True, inverted=False,
                              overhead_per_step=False, draft_calls=0):
    """Chapter 3's speedup with c = exit_layer / layers + overhead, and with switches the usual mistakes."""
    share = layers / exit_layer if inverted else exit_layer / layers
    cost_ratio = share + (overhead if with_overhead and not overhead_per_step else 0)
    step_cost = cost_ratio * (k + draft_calls) + 1 + (overhead if overhead_per_step else 0)
    return expected_tokens_per_step(alpha, k) / step_cost


def _greedy_seq2seq(encoder, decoder_step, source, start, new_tokens, *, encoder_every_step=False,
                    keep_start=False, without_start=False):
    """Greedy decoding of an encoder-decoder model by hand, and with switches the usual mistakes."""
    states, tokens = encoder(source), [start]
    for _ in range(new_tokens):
        states = encoder(source) if encoder_every_step else states
        tokens.append(decoder_step(states, tokens[1:] or [start] if without_start else tokens))
    return tokens if keep_start else tokens[1:]


def _encoder_decoder_speedup(alpha, k, c, tokens, encoder, draft_encoder, *, encoders=True, draft_encoder_on=True,
                             per_step=False, ar_encoder=True):
    """The speedup with the encoders' one pass, and with switches the usual mistakes."""
    steps = tokens / expected_tokens_per_step(alpha, k)
    if not encoders:
        encoder = draft_encoder = 0
    draft_encoder = draft_encoder if draft_encoder_on else 0
    if per_step:
        return tokens * (1 + encoder) / (steps * (c * k + 1 + encoder + draft_encoder))
    return ((encoder if ar_encoder else 0) + tokens) / (encoder + draft_encoder + steps * (c * k + 1))


REFERENCES = {
    "accept_draft": lambda x, q, p, u: u < _accept_prob(x, q, p),
    "residual": residual_distribution,
    "verify_chain_by_hand": _reference_chain,
    "acceptance_rate_by_hand": acceptance_rate,
    "shortcut_output": _shortcut,
    "shortcut_bias": lambda q, p: 0.5 * (_shortcut(q, p) - q).abs().sum(),
    "tokens_per_step": expected_tokens_per_step,
    "speedup_by_hand": speedup,
    "optimal_k_by_hand": lambda alpha, c, k_max=64: optimal_k(alpha, c, k_max),
    "estimate_alpha": _estimate_alpha,
    "tokens_per_step_by_index": lambda alphas: 1 + np.cumprod(alphas).sum(),
    "softmax": lambda logits: torch.softmax(logits, -1),
    "warped_probs": _warped_probs,
    "greedy_generate": _greedy_by_hand,
    "step_cost": _step_cost,
    "rollback_cache": _crop,
    "rollback_counts": lambda k, accepted: (k - accepted, k - 1 - min(accepted, k - 1)),
    "speculative_greedy": _speculative_by_hand,
    "acceptance_from_steps": _alpha_from_steps,
    "fresh_draw_output": lambda q, x: output_distribution(q, torch.nn.functional.one_hot(torch.tensor(x), len(q)).to(q),
                                                          correction="target"),
    "prompt_lookup": _prompt_lookup,
    "ngram_draft": _ngram_by_hand,
    "heuristic_next_k": _heuristic_next_k,
    "tree_mask": _tree_mask,
    "tree_position_ids": _tree_position_ids,
    "medusa_tree": _medusa_tree,
    "verify_tree_greedily": _verify_tree_greedily,
    "no_residual_output": _no_residual_output,
    "tree_tokens_per_call": _tree_tokens_per_call,
    "jacobi_step": _jacobi_step,
    "window_parents": _window_parents,
    "collect_ngrams": _collect_ngrams,
    "self_speculative_speedup": _self_speculative_speedup,
    "greedy_seq2seq": _greedy_seq2seq,
    "seq2seq_rollback": seq2seq_rollback_reference,
    "shift_right": lambda labels, start, pad: torch.cat([torch.full_like(labels[:, :1], start),
                                                         labels[:, :-1].masked_fill(labels[:, :-1] == -100, pad)], 1),
    "encoder_decoder_speedup": _encoder_decoder_speedup,
}

WRONG = {
    "accept_draft": {
        "accept when q(x) >= p(x), ignoring the uniform": lambda x, q, p, u: bool(q[x] >= p[x]),
        "accept with probability q(x)": lambda x, q, p, u: u < float(q[x]),
        "the ratio upside down, min(1, p/q)": lambda x, q, p, u: u < min(1.0, float(p[x] / q[x])),
        "the comparison reversed": lambda x, q, p, u: u >= _accept_prob(x, q, p),
        "returns the probability, not the verdict": lambda x, q, p, u: _accept_prob(x, q, p),
    },
    "residual": {
        "not normalised": lambda q, p: (q - p).clamp(min=0),
        "letters swapped, norm((p - q)+)": lambda q, p: residual_distribution(p, q),
        "q itself": lambda q, p: q,
        "normalised |q - p|": lambda q, p: (q - p).abs() / (q - p).abs().sum(),
        "NaN when q == p": _naive_residual,
    },
    "verify_chain_by_hand": {
        "correction sampled from q instead of the residual":
            lambda *args: _reference_chain(*args, correction="target"),
        "counts every passing draft, not the leading run":
            lambda *args: _reference_chain(*args, leading_run=False),
        "bonus from q_K instead of q_{K+1}": lambda *args: _reference_chain(*args, bonus_row=-2),
        "returns a sampled token, not a distribution":
            lambda *args: (_reference_chain(*args)[0], int(_reference_chain(*args)[1].argmax())),
        "returns a triple": lambda *args: (*_reference_chain(*args), False),
    },
    "acceptance_rate_by_hand": {
        "sum of max": lambda q, p: torch.maximum(q, p).sum(-1),
        "1 - sum |p - q| (TV without the 1/2)": lambda q, p: 1 - (q - p).abs().sum(-1),
        "sum over every dimension": lambda q, p: torch.minimum(q, p).sum(),
        "mean of min(1, q/p) over the vocabulary":
            lambda q, p: torch.where(p > 0, q / p, 1.0).clamp(max=1).mean(-1),
    },
    "shortcut_output": {
        "q (the correct algorithm's output)": lambda q, p: q,
        "the accepted part only": lambda q, p: torch.minimum(q, p),
        "alpha instead of 1 - alpha": lambda q, p: torch.minimum(q, p) + acceptance_rate(q, p) * q,
    },
    "shortcut_bias": {
        "without the 1/2": lambda q, p: (_shortcut(q, p) - q).abs().sum(),
        "TV(p, q) instead of TV(shortcut, q)": lambda q, p: 1 - acceptance_rate(q, p),
        "zero": lambda q, p: 0.0,
    },
    "tokens_per_step": {
        "alpha^K instead of alpha^(K+1)": lambda a, k: (1 - a**k) / (1 - a) if a < 1 else k,
        "closed form, 0/0 at alpha = 1": lambda a, k: (1 - a ** (k + 1)) / (1 - a),
        "accepted drafts only": lambda a, k: sum(a**i for i in range(1, k + 1)),
        "the limit 1/(1 - alpha)": lambda a, k: 1 / (1 - a) if a < 1 else float("inf"),
        "linear, 1 + K alpha": lambda a, k: 1 + k * a,
    },
    "speedup_by_hand": {
        "K + 1 draft calls": lambda a, k, c: expected_tokens_per_step(a, k) / (c * (k + 1) + 1),
        "no target call in the cost": lambda a, k, c: expected_tokens_per_step(a, k) / (c * k) if c else 0.0,
        "tokens per step, not divided": lambda a, k, c: expected_tokens_per_step(a, k),
        "off-by-one tokens": lambda a, k, c: expected_tokens_per_step(a, k) - a**k,
    },
    "optimal_k_by_hand": {
        "searched from K = 0": _searched_k(0),
        "range(1, k_max), missing k_max": _searched_k(1, stop_offset=0),
        "the argmax index, not K": _searched_k(1, index=True),
        "always the largest K": lambda alpha, c, k_max=64: k_max,
    },
    "estimate_alpha": {
        "accepted / (K x steps)": lambda n, k: n.mean() / k,
        "N + 1 tested in every step": lambda n, k: n.sum() / (n + 1).sum(),
        "mean of N / (N + 1)": lambda n, k: np.mean(n / (n + 1)),
    },
    "tokens_per_step_by_index": {
        "without the 1": lambda a: np.cumprod(a).sum(),
        "1 + sum of alpha_i": lambda a: 1 + a.sum(),
        "i.i.d. formula at the mean": lambda a: expected_tokens_per_step(float(a.mean()), len(a)),
        "off by one in the products": lambda a: 1 + np.cumprod(np.r_[1.0, a[:-1]]).sum(),
    },
    "softmax": {
        "exp without subtracting the maximum": lambda z: z.exp() / z.exp().sum(-1, keepdim=True),
        "subtracts the minimum": lambda z: (z - z.min()).exp() / (z - z.min()).exp().sum(-1, keepdim=True),
        "one maximum for the whole batch": lambda z: (z - z.max()).exp() / (z - z.max()).exp().sum(-1, keepdim=True),
        "normalised over the whole batch": lambda z: (z - z.max(-1, keepdim=True).values).exp()
        / (z - z.max(-1, keepdim=True).values).exp().sum(),
        "log-probabilities": lambda z: torch.log_softmax(z, -1),
    },
    "warped_probs": {
        "the temperature left out": lambda l, t=1.0, k=None, p=None: _warp(l, 1.0 if t else 0.0, k, p),
        "top-p before top-k": lambda *args: _warped_probs(*args, top_p_first=True),
        "the temperature after top-p": lambda *args: _warped_probs(*args, temperature_last=True),
        "top-p without the token that crosses p": lambda *args: _warped_probs(*args, keep_crossing=False),
        "top-k breaks ties": lambda *args: _warped_probs(*args, keep_ties=False),
        "divides by T = 0": lambda l, t=1.0, k=None, p=None: (l / t).softmax(-1) if not t else _warp(l, t, k, p),
        "not renormalised": _unnormalised,
        "returns the warped logits": lambda l, t=1.0, k=None, p=None: Sampler(t or 1.0, k, p).warp(l),
    },
    "greedy_generate": {
        "no KV cache: the whole text at every step": lambda *args: _greedy_by_hand(*args, cache=False),
        "the prompt returned too": lambda *args: _greedy_by_hand(*args, with_prompt=True),
        "the first token from the first position's logits": lambda *args: _greedy_by_hand(*args, row=0),
        "one token short": lambda *args: _greedy_by_hand(*args, steps_short=1),
        "feeds only the newest token, without the cache": _greedy_last_token_only,
    },
    "step_cost": {
        "no KV cache in the bytes": lambda *args: _step_cost(*args, cache=False),
        "the weights read once per token": lambda *args: _step_cost(*args, weights_per_token=True),
        "one FLOP per weight": lambda *args: _step_cost(*args, flops_per_weight=1),
        "keys without values": lambda *args: _step_cost(*args, kv_factor=1),
        "one token's FLOPs": lambda *args: _step_cost(*args, one_token=True),
        "the cache with the query width": lambda p, l, w, kv, *rest: _step_cost(p, l, w, kv, *rest, cache_width=w),
        "returns the intensity": lambda *args: _step_cost(*args)[0] / _step_cost(*args)[1],
    },
    "rollback_cache": {
        "[:, :, :-n], empty when n = 0": lambda cache, n: [(k[:, :, :-n], v[:, :, :-n]) for k, v in cache],
        "the heads cropped": lambda cache, n: [(k[:, :k.shape[1] - n], v[:, :v.shape[1] - n]) for k, v in cache],
        "keeps the last n positions": lambda cache, n: [(k[:, :, k.shape[2] - n:], v[:, :, v.shape[2] - n:])
                                                        for k, v in cache],
        "the keys only": lambda cache, n: _crop(cache, n, keys_only=True),
        "drops the first n positions": lambda cache, n: [(k[:, :, n:], v[:, :, n:]) for k, v in cache],
        "unchanged": lambda cache, n: cache,
        "keys and values swapped": lambda cache, n: [(v, k) for k, v in _crop(cache, n)],
    },
    "rollback_counts": {
        "the draft drops K - accepted": lambda k, a: (k - a, k - a),
        "the target drops the pending token too": lambda k, a: (k - a + 1, k - 1 - min(a, k - 1)),
        "the target keeps the next token": lambda k, a: (k - a - 1, k - 1 - min(a, k - 1)),
        "returns a single number": lambda k, a: k - a,
    },
    "speculative_greedy": {
        "no bonus token": lambda *args: _speculative_by_hand(*args, bonus=False),
        "one target call per token": _one_call_per_token,
        "the draft's token at a mismatch": lambda *args: _speculative_by_hand(*args, correct_with_draft=True),
        "every matching draft accepted, not the leading run":
            lambda *args: _speculative_by_hand(*args, every_match=True),
        "the verdict on d_i from the row after it": lambda *args: _speculative_by_hand(*args, shift=1),
        "not cut at max_new_tokens": lambda *args: _speculative_by_hand(*args, cut=False),
    },
    "acceptance_from_steps": {
        "accepted / drafted": lambda steps: sum(s.accepted for s in steps) / sum(len(s.drafted) for s in steps),
        "a rejection in every step": lambda steps: sum(s.accepted for s in steps) / (
            sum(s.accepted for s in steps) + len(steps)),
        "a rejection in every step without a bonus": lambda steps: sum(s.accepted for s in steps) / (
            sum(s.accepted for s in steps) + sum(not s.bonus for s in steps)),
        "the mean of accepted / drafted per step": lambda steps: np.mean([s.accepted / len(s.drafted) for s in steps]),
        "tokens per step": lambda steps: np.mean([s.accepted + 1 for s in steps]),
    },
    "fresh_draw_output": {
        "q (the correct verifier's output)": lambda q, x: q,
        "without the accepted draft": lambda q, x: (1 - q[x]) * q,
        "the residual, q without x": lambda q, x: torch.where(torch.arange(len(q)) == x, 0.0, q) / (1 - q[x]),
        "the draft with probability q(x) squared": lambda q, x: q[x] ** 2 * torch.eye(len(q), dtype=q.dtype)[x]
        + (1 - q[x] ** 2) * q,
    },
    "prompt_lookup": {
        "the earliest occurrence": lambda *args: _lookup_variant(*args, most_recent=False),
        "stops at the end of the context": lambda *args: _lookup_variant(*args, extend=False),
        "the shortest n first": lambda *args: _lookup_variant(*args, longest_first=False),
        "matches the suffix with itself": _lookup_including_the_end,
        "min_ngram ignored": lambda tokens, k, max_ngram=3, min_ngram=1: _lookup_variant(tokens, k, max_ngram, 1),
    },
    "ngram_draft": {
        "one level only": lambda *args: _ngram_by_hand(*args, levels=lambda n: [n - 1]),
        "never the 1-token level": lambda *args: _ngram_by_hand(*args, levels=lambda n: range(n - 1, 1, -1)),
        "guesses the most frequent token at an unknown context": lambda *args: _ngram_by_hand(*args, guess=True),
        "the shortest context first": lambda *args: _ngram_by_hand(*args, shortest_first=True),
        "one token, no chain": lambda *args: _ngram_by_hand(*args, chain=False),
    },
    "heuristic_next_k": {
        "success means accepted == k":
            lambda *args, **kw: _heuristic_next_k(*args, **kw, success=lambda k, d, a: a == k),
        "shrinks after a step that drafted nothing":
            lambda *args, **kw: _heuristic_next_k(*args, **kw, skip_empty=False),
        "not clamped": lambda *args, **kw: _heuristic_next_k(*args, **kw, clamp=False),
        "grows by 1": lambda *args, **kw: _heuristic_next_k(*args, **kw, grow=1),
        "back to k_min after a rejection":
            lambda *args, **kw: _heuristic_next_k(*args, **kw, shrink=lambda k, k_min: k_min),
    },
    "tree_mask": {
        "only the parent visible, not the ancestors": lambda parents: _tree_mask(parents, ancestors=False),
        "the diagonal forgotten": lambda parents: _tree_mask(parents, diagonal=False),
        "the root column forgotten": lambda parents: _tree_mask(parents, root=False),
        "transposed": lambda parents: _tree_mask(parents).T,
        "a chain's causal mask": lambda parents: torch.ones(len(parents) + 1, len(parents) + 1).tril().bool(),
        "without the root's row and column": lambda parents: _tree_mask(parents, with_root_row=False),
        "an additive float mask": lambda parents: torch.zeros(len(parents) + 1, len(parents) + 1).masked_fill(
            ~_tree_mask(parents), float("-inf")),
    },
    "tree_position_ids": {
        "rows numbered in order, as for a chain":
            lambda parents, length: list(range(length, length + len(parents) + 1)),
        "depths without the cached tokens": lambda parents, length: _tree_position_ids(parents, 0),
        "the root one position too far": lambda parents, length: _tree_position_ids(parents, length, root_at=1),
        "the nodes only, no root": lambda parents, length: _tree_position_ids(parents, length, with_root=False),
        "the parent's index for its depth":
            lambda parents, length: [length] + [length + parent + 2 for parent in parents],
    },
    "medusa_tree": {
        "the nodes in the order of choices": lambda *args: _medusa_tree(*args, order=None),
        "sorted by path alone, depth first": lambda *args: _medusa_tree(*args, order=lambda path: path),
        "head d for depth d, one head too far": lambda *args: _medusa_tree(*args, head=lambda depth: depth),
        "the rank of the path's first step": lambda *args: _medusa_tree(*args, rank=lambda path: path[0]),
        "every depth from head 0": lambda *args: _medusa_tree(*args, head=lambda depth: 0),
        "each head's best guess, the rank ignored": lambda *args: _medusa_tree(*args, rank=lambda path: 0),
        "the tokens only": lambda *args: _medusa_tree(*args, tokens_only=True),
    },
    "verify_tree_greedily": {
        "any node one level deeper, not only children": lambda *args: greedy_walk(*args, any_depth=True),
        "a child checked against its own row": lambda *args: greedy_walk(*args, own_row=True),
        "first children only, a chain": lambda *args: greedy_walk(*args, first_child_only=True),
        "the accepted tokens, not the nodes": lambda *args: _verify_tree_greedily(*args, as_tokens=True),
        "the next token from the root's row": lambda *args: _verify_tree_greedily(*args, next_from_root=True),
        "the path only": lambda *args: _verify_tree_greedily(*args)[0],
    },
    "no_residual_output": {
        "q (the residual rule's output)": lambda q, candidates: q,
        "no final draw": lambda *args: _no_residual_output(*args, final_draw=None),
        "the final draw without the candidates": lambda *args: _no_residual_output(*args,
                                                                                  final_draw="without the candidates"),
        "every candidate accepted with q(x), earlier rejections ignored":
            lambda *args: _no_residual_output(*args, chained=False),
    },
    "tree_tokens_per_call": {
        "without the 1": lambda *args: _tree_tokens_per_call(*args, one=0),
        "each node's own accuracy, not the product along its path":
            lambda paths, accuracy: 1 + sum(accuracy[len(path) - 1][path[-1]] for path in paths),
        "the first depth's accuracies all along the path":
            lambda *args: _tree_tokens_per_call(*args, step=lambda depth, rank, accuracy: accuracy[0][rank]),
        "chapter 3's chain formula at the top accuracy":
            lambda paths, accuracy: expected_tokens_per_step(accuracy[0][0], max(len(path) for path in paths)),
    },
    "jacobi_step": {
        "sequential updates, each from the new guesses (Gauss-Seidel)": lambda *args: _jacobi_step(*args,
                                                                                                   sequential=True),
        "the right guesses from one call per guess": lambda *args: _jacobi_step(*args, per_guess=True),
        "each guess from its own row, one too far": lambda *args: _jacobi_step(*args, shift=1),
        "the prompt left out": lambda next_tokens, prompt, guesses: next_tokens(guesses),
        "every row returned": lambda *args: _jacobi_step(*args, all_rows=True),
        "the first guess kept": lambda next_tokens, prompt, guesses: guesses[:1] + _jacobi_step(
            next_tokens, prompt, guesses)[1:],
        "the old guesses returned": lambda next_tokens, prompt, guesses: guesses,
    },
    "window_parents": {
        "numbered column by column": lambda *args: _window_parents(*args, column_major=True),
        "every level a chain of its own": lambda *args: _window_parents(*args, chain_levels=True),
        "level 0 all children of the pending token": lambda w, l: [-1 if j == 0 else (j - 1) * w + i
                                                                   for j in range(l) for i in range(w)],
        "the pending token as node 0, every parent one too high": lambda *args: [
            parent + 1 for parent in _window_parents(*args)],
        "a level continues the column to its left": lambda w, l: [
            (i - 1 if j == 0 else (j - 1) * w + max(i - 1, 0)) for j in range(l) for i in range(w)],
        "level 0 only": lambda w, l: _window_parents(w, 1),
    },
    "collect_ngrams": {
        "flat N-tuples, not (first, rest)": lambda *args: _collect_ngrams(*args, flat=True),
        "the new token left out": lambda *args: _collect_ngrams(*args, without_new=True),
        "newest first": lambda *args: _collect_ngrams(*args, newest_first=True),
        "the levels read across": lambda *args: _collect_ngrams(*args, across=True),
        "duplicates removed": lambda *args: _collect_ngrams(*args, unique=True),
        "the window's next levels instead": lambda levels, new: levels[1:] + [new],
    },
    "self_speculative_speedup": {
        "no overhead": lambda *args: _self_speculative_speedup(*args, with_overhead=False),
        "c upside down, layers / exit_layer": lambda *args: _self_speculative_speedup(*args, inverted=True),
        "the overhead once per step": lambda *args: _self_speculative_speedup(*args, overhead_per_step=True),
        "K + 1 draft calls": lambda *args: _self_speculative_speedup(*args, draft_calls=1),
        "tokens per step only": lambda alpha, k, *rest: expected_tokens_per_step(alpha, k),
        "the closed form, 0/0 at alpha = 1": lambda alpha, k, layers, exit_layer, overhead: (
            (1 - alpha ** (k + 1)) / (1 - alpha) / ((exit_layer / layers + overhead) * k + 1)),
    },
}


WRONG.update({
    "greedy_seq2seq": {
        "the encoder every step": lambda *args: _greedy_seq2seq(*args, encoder_every_step=True),
        "the start token returned": lambda *args: _greedy_seq2seq(*args, keep_start=True),
        "the decoder without its start token": lambda *args: _greedy_seq2seq(*args, without_start=True),
        "one token short": lambda *args: _greedy_seq2seq(*args)[:-1],
    },
    "shift_right": {
        "the labels themselves": lambda labels, start, pad: labels,
        "-100 left in": lambda labels, start, pad: torch.cat([torch.full_like(labels[:, :1], start), labels[:, :-1]], 1),
        "shifted left": lambda labels, start, pad: torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], pad)], 1),
        "rolled, no start token": lambda labels, start, pad: labels.masked_fill(labels == -100, pad).roll(1, dims=1),
    },
    "seq2seq_rollback": {
        "the cross-attention cache cropped too": lambda own, cross, k, accepted: (own - (k - accepted),
                                                                                  cross - (k - accepted)),
        "the cross-attention cache emptied": lambda own, cross, k, accepted: (own - (k - accepted), 0),
        "the pending token cropped too": lambda own, cross, k, accepted: (own - (k + 1 - accepted), cross),
        "the accepted drafts cropped": lambda own, cross, k, accepted: (own - accepted, cross),
    },
    "encoder_decoder_speedup": {
        "no encoders": lambda *args: _encoder_decoder_speedup(*args, encoders=False),
        "the draft's encoder left out": lambda *args: _encoder_decoder_speedup(*args, draft_encoder_on=False),
        "the encoders every step": lambda *args: _encoder_decoder_speedup(*args, per_step=True),
        "no encoder for autoregressive decoding": lambda *args: _encoder_decoder_speedup(*args, ar_encoder=False),
        "the closed form, 0/0 at alpha = 1": lambda alpha, k, c, tokens, encoder, draft_encoder: (
            (encoder + tokens) / (encoder + draft_encoder + tokens * (1 - alpha) / (1 - alpha ** (k + 1))
                                  * (c * k + 1))),
    },
})

def _left_pad(rows, pad_id, side="left", inverted=False):
    width = max(map(len, rows))
    pads = [[pad_id] * (width - len(row)) for row in rows]
    ids = [p + row if side == "left" else row + p for row, p in zip(rows, pads)]
    mask = [[0] * len(p) + [1] * len(row) if side == "left" else [1] * len(row) + [0] * len(p)
            for row, p in zip(rows, pads)]
    return torch.tensor(ids), torch.tensor([[1 - x for x in row] for row in mask] if inverted else mask)


def _row_positions(visible, shift=0):
    positions = torch.zeros(visible.shape, dtype=torch.long)
    for b, row in enumerate(visible.tolist()):
        seen = 0
        for j, shown in enumerate(row):
            positions[b, j] = seen + shift
            seen += shown
    return positions


def _accept_rows(drafts, lengths, target, shared=False, ignore_lengths=False):
    accepted = []
    for row, n in enumerate(lengths):
        n = drafts.shape[1] if ignore_lengths else n
        a = 0
        while a < n and int(drafts[row, a]) == int(target[row, a]):
            a += 1
        accepted.append(a)
    if shared:
        accepted = [min(accepted)] * len(accepted)
    return accepted, [int(target[row, a]) for row, a in enumerate(accepted)]


def _batch_k(alpha, cost_ratio, ratios, with_ratio=True, allow_zero=True):
    best, best_gain = 0, 1.0 if allow_zero else 0.0
    for k in range(1, len(ratios)):
        gain = sum(alpha ** i for i in range(k + 1)) / (cost_ratio * k + (ratios[k] if with_ratio else 1))
        if gain > best_gain:
            best, best_gain = k, gain
    return best


REFERENCES.update({
    "left_pad": _left_pad,
    "row_positions": _row_positions,
    "accept_rows": _accept_rows,
    "batch_k": _batch_k,
})

WRONG.update({
    "left_pad": {
        "padded on the right": lambda rows, pad: _left_pad(rows, pad, side="right"),
        "the mask inverted": lambda rows, pad: _left_pad(rows, pad, inverted=True),
    },
    "row_positions": {
        "the column numbers": lambda visible: torch.arange(visible.shape[1]).expand(visible.shape).clone(),
        "counted from 1": lambda visible: _row_positions(visible, shift=1),
    },
    "accept_rows": {
        "one count for every row": lambda *args: _accept_rows(*args, shared=True),
        "the filler counted": lambda *args: _accept_rows(*args, ignore_lengths=True),
    },
    "batch_k": {
        "chapter 3's K, the call free to widen": lambda *args: _batch_k(*args, with_ratio=False),
        "never K = 0": lambda *args: _batch_k(*args, allow_zero=False),
    },
})

# Chapter 6c


def _blockwise_accept(block, base_choices, *, every_match=False, unchecked=0, bonus=0, first_taken=False):
    """k̂ by hand, and with switches the usual mistakes."""
    if first_taken:  # ŷ_1 counted without a look: an empty block accepts one
        return 1 + _blockwise_accept(block[1:], base_choices[1:])
    matches = [guess == choice for guess, choice in zip(block, base_choices)]
    if every_match:
        return sum(matches)
    checked = matches[: len(matches) - unchecked]
    return next((i for i, match in enumerate(checked) if not match), len(checked)) + bonus


def _multi_token_loss(logits, tokens, *, shift=1, same_target=False, wrap=False, pad=None, heads_mean=False,
                      pooled=False, summed=False):
    """The multi-token loss by hand (log_softmax and gather), and with switches the usual mistakes."""
    heads, length, _ = logits.shape
    log_probs = logits.log_softmax(-1)  # (n, T, vocab)
    per_head = []
    for i in range(heads):
        offset = shift if same_target else shift + i
        if wrap:
            rows, labels = log_probs[i], tokens.roll(-offset)
        elif pad is not None:
            rows, labels = log_probs[i], torch.cat([tokens[offset:], tokens.new_full((offset,), pad)])
        else:
            rows, labels = log_probs[i, : length - offset], tokens[offset:]
        per_head.append(-rows.gather(-1, labels[:, None])[:, 0])  # (positions,)
    if pooled:
        return torch.cat(per_head).mean()
    total = sum(losses.sum() if summed else losses.mean() for losses in per_head)
    return total / heads if heads_mean else total


def _cape_siblings(top1_probs, bins, budget, *, greedy_counted=True, shared=True, limited=True,
                   deepest_first=False, bin_of=lambda p: math.floor(10 * p), capped=True):
    """CaPE's siblings per depth by hand, and with switches the usual mistakes."""
    room = (budget - len(top1_probs) if shared else budget) if limited else math.inf
    siblings = [0] * len(top1_probs)
    for depth in sorted(range(len(top1_probs)), reverse=deepest_first):
        index = bin_of(top1_probs[depth])
        candidates = bins[min(index, len(bins) - 1) if capped else index]
        siblings[depth] = int(min(candidates - (1 if greedy_counted else 0), room))
        room -= siblings[depth]
    return siblings


def _phrases_after(tokens, key, phrase_length, count, *, newest_first=True, unique=True, with_key=False,
                   whole=True, first_seen=False, limited=True):
    """The pool's phrases after ``key`` by hand, and with switches the usual mistakes."""
    found = []  # oldest first
    for i, token in enumerate(tokens):
        if token == key:
            phrase = tuple(tokens[i: i + phrase_length]) if with_key else tuple(tokens[i + 1: i + 1 + phrase_length])
            if len(phrase) == phrase_length or not whole:
                found.append(phrase)
    if unique:  # each phrase once, at its newest place (or, by mistake, at its first)
        found = list(dict.fromkeys(found)) if first_seen else list(dict.fromkeys(found[::-1]))[::-1]
    ordered = found[::-1] if newest_first else found
    return ordered[:count] if limited else ordered


def _ttt_mask(steps, n, *, causal=True, own_chain=True, base_limit=True, flat=False):
    """The training-time test's mask by hand, or with one of a reader's mistakes."""
    if flat:
        return torch.ones(steps * n, steps * n).tril().bool()
    mask = torch.zeros(steps * n, steps * n, dtype=torch.bool)
    for query in range(steps):
        for base in range(n):
            row = query * n + base
            if causal:
                mask[row, : (base + 1 if base_limit or query == 0 else n)] = True
            mask[row, row] = True
            if own_chain:
                for key in range(1, query + 1):
                    mask[row, key * n + base] = True
    return mask


def _draft_distribution(scores, vocab, target_vocab, *, scatter=True, zeros_outside=True, softmax=True):
    scores = torch.as_tensor(scores, dtype=torch.float64)
    probs = scores.softmax(-1) if softmax else scores
    if not zeros_outside:
        full = torch.zeros(target_vocab, dtype=torch.float64)
        full[torch.tensor(vocab)] = scores
        return full.softmax(-1)
    out = torch.zeros(target_vocab, dtype=torch.float64)
    out[torch.tensor(vocab) if scatter else torch.arange(len(vocab))] = probs
    return out


def _pard_mask(depths, n, *, flat=False, own_position=False, chain=True):
    """PARD's training mask by hand (rows depth after depth, depth c at positions c .. n - 1), or with a reader's
    mistake: causal over the whole layout, masks that see the text up to their own position, masks blind to their
    chain."""
    rows = [(depth, position) for depth in range(depths) for position in range(depth, n)]
    if flat:
        return torch.ones(len(rows), len(rows)).tril().bool()
    mask = torch.zeros(len(rows), len(rows), dtype=torch.bool)
    for i, (depth, position) in enumerate(rows):
        for j, (key_depth, key_position) in enumerate(rows):
            end = position if own_position else position - depth  # the row's context ends here
            text = key_depth == 0 and key_position <= end
            own = key_depth >= 1 and key_position - key_depth == position - depth and key_depth <= depth
            mask[i, j] = text or (own if chain else i == j)
    return mask


REFERENCES.update({
    "pard_mask": _pard_mask,
    "ttt_mask": _ttt_mask,
    "draft_distribution": _draft_distribution,
})

WRONG.update({
    "pard_mask": {
        "causal over the whole layout": lambda depths, n: _pard_mask(depths, n, flat=True),
        "masks see the text up to their own position": lambda depths, n: _pard_mask(depths, n, own_position=True),
        "masks blind to their chain": lambda depths, n: _pard_mask(depths, n, chain=False),
        "transposed": lambda depths, n: _pard_mask(depths, n).T,
    },
    "ttt_mask": {
        "causal over the unrolled sequence": lambda steps, n: _ttt_mask(steps, n, flat=True),
        "later steps blind to step 0": lambda steps, n: _ttt_mask(steps, n, causal=False) | torch.block_diag(
            torch.ones(n, n).tril().bool(), *[torch.zeros(n, n, dtype=torch.bool)] * (steps - 1)),
        "later steps see all of step 0": lambda steps, n: _ttt_mask(steps, n, base_limit=False),
        "only the diagonal of the own chain's blocks": lambda steps, n: _ttt_mask(steps, n, own_chain=False),
        "transposed": lambda steps, n: _ttt_mask(steps, n).T,
    },
    "draft_distribution": {
        "score 0 outside the vocabulary": lambda *args: _draft_distribution(*args, zeros_outside=False),
        "row i put at token i": lambda *args: _draft_distribution(*args, scatter=False),
        "the scores, not their softmax": lambda *args: _draft_distribution(*args, softmax=False),
        "p over the draft's rows only": lambda scores, vocab, target_vocab: torch.as_tensor(scores).softmax(-1),
    },
})

REFERENCES.update({
    "blockwise_accept": _blockwise_accept,
    "multi_token_loss": _multi_token_loss,
    "cape_siblings": _cape_siblings,
    "phrases_after": _phrases_after,
})

WRONG.update({
    "blockwise_accept": {
        "every match counted, not the leading run": lambda *args: _blockwise_accept(*args, every_match=True),
        "the last token never checked": lambda *args: _blockwise_accept(*args, unchecked=1),
        "a bonus token added, k̂ + 1": lambda *args: _blockwise_accept(*args, bonus=1),
        "ŷ_1 taken without a look: an empty block accepts one": lambda *args: _blockwise_accept(*args,
                                                                                                first_taken=True),
        "the drafts only, ŷ_1 not counted": lambda *args: max(_blockwise_accept(*args) - 1, 0),
        "the verdicts, not k̂": lambda block, choices: [guess == choice for guess, choice in zip(block, choices)],
    },
    "multi_token_loss": {
        "the same target for every head, no shift by i": lambda *args: _multi_token_loss(*args, same_target=True),
        "the mean over the heads": lambda *args: _multi_token_loss(*args, heads_mean=True),
        "the targets wrapped past the end": lambda *args: _multi_token_loss(*args, wrap=True),
        "the targets padded past the end with token 0": lambda *args: _multi_token_loss(*args, pad=0),
        "off by one: head i on tokens[t + i]": lambda *args: _multi_token_loss(*args, shift=0),
        "off by one: head i on tokens[t + 2 + i]": lambda *args: _multi_token_loss(*args, shift=2),
        "one mean over every head's positions": lambda *args: _multi_token_loss(*args, pooled=True),
        "summed over the positions (Eq. 2 read literally)": lambda *args: _multi_token_loss(*args, summed=True),
        "the log-likelihood, not its negative": lambda *args: -_multi_token_loss(*args),
        "the per-head losses, not their sum": lambda logits, tokens: [
            _multi_token_loss(logits[i:i + 1], tokens[i:]) for i in range(len(logits))],
    },
    "cape_siblings": {
        "the greedy token not subtracted": lambda *args: _cape_siblings(*args, greedy_counted=False),
        "the budget ignored": lambda *args: _cape_siblings(*args, limited=False),
        "the chain left out of the budget": lambda *args: _cape_siblings(*args, shared=False),
        "the deepest depths first": lambda *args: _cape_siblings(*args, deepest_first=True),
        "the bin from round(10 p)": lambda *args: _cape_siblings(*args, bin_of=lambda p: round(10 * p)),
        "floor(10 p) not capped: p = 1.0 overflows the bins": lambda *args: _cape_siblings(*args, capped=False),
        "the total, not per depth": lambda *args: sum(_cape_siblings(*args)),
    },
    "phrases_after": {
        "oldest first": lambda *args: _phrases_after(*args, newest_first=False),
        "duplicates kept": lambda *args: _phrases_after(*args, unique=False),
        "the key included in each phrase": lambda *args: _phrases_after(*args, with_key=True),
        "phrases cut off by the end kept": lambda *args: _phrases_after(*args, whole=False),
        "each phrase at its first place, not its newest": lambda *args: _phrases_after(*args, first_seen=True),
        "count ignored": lambda *args: _phrases_after(*args, limited=False),
    },
})


CHAPTER_7_MESSAGES = [  # (checker, wrong answer, what its message must say)
    ("left_pad", "padded on the right", "pads on the right"),
    ("left_pad", "the mask inverted", "inverted"),
    ("row_positions", "the column numbers", "column numbers"),
    ("row_positions", "counted from 1", "off by one"),
    ("accept_rows", "one count for every row", "its own run of matches"),
    ("accept_rows", "the filler counted", "filler"),
    ("batch_k", "chapter 3's K, the call free to widen", "chapter 3's best K"),
    ("batch_k", "never K = 0", "should not speculate"),
]


CHAPTER_4B_MESSAGES = [  # (checker, wrong answer, what its message must say)
    ("greedy_seq2seq", "the encoder every step", "the encoder ran"),
    ("greedy_seq2seq", "the start token returned", "the start token is in the answer"),
    ("greedy_seq2seq", "the decoder without its start token", "must see the start token first"),
    ("greedy_seq2seq", "one token short", "where max_new_tokens"),
    ("shift_right", "the labels themselves", "the labels themselves"),
    ("shift_right", "-100 left in", "Read them as pad_token"),
    ("shift_right", "shifted left", "shifts left"),
    ("shift_right", "rolled, no start token", "starts with the start token"),
    ("seq2seq_rollback", "the cross-attention cache cropped too", "nothing there rolls back"),
    ("seq2seq_rollback", "the cross-attention cache emptied", "nothing there rolls back"),
    ("seq2seq_rollback", "the pending token cropped too", "crops the pending token"),
    ("seq2seq_rollback", "the accepted drafts cropped", "crops the accepted drafts"),
    ("encoder_decoder_speedup", "no encoders", "the encoders are left out"),
    ("encoder_decoder_speedup", "the draft's encoder left out", "the draft's own encoder is left out"),
    ("encoder_decoder_speedup", "the encoders every step", "once per generation"),
    ("encoder_decoder_speedup", "no encoder for autoregressive decoding", "autoregressive decoding runs"),
    ("encoder_decoder_speedup", "the closed form, 0/0 at alpha = 1", "0/0"),
]


def test_greedy_seq2seq_reference_is_the_engines_greedy_decoding():
    """On the tiny random BART of the checks, decoding by hand equals specbook.autoregressive_generate."""
    model, encode, step = tiny_seq2seq_parts()
    source = [5, 17, 33, 8, 21, 40]
    by_hand = greedy_seq2seq_reference(encode, step, source, model.config.decoder_start_token_id, 8)
    assert by_hand == autoregressive_generate(model, torch.tensor([source]), 8, Sampler(0)).token_ids


def test_seq2seq_rollback_reference_is_what_the_engine_keeps():
    """After a verification call and its rollback, the decoder's EncoderDecoderCache has cropped the rejected
    drafts off its self-attention half and kept its cross-attention half whole."""
    from transformers import DynamicCache, EncoderDecoderCache

    from specbook.cache import rollback

    model, _, _ = tiny_seq2seq_parts()
    source, decoder = torch.tensor([[5, 17, 33, 8, 21, 40, 9]]), torch.tensor([[2, 11, 12, 13, 14, 15, 16]])
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    with torch.inference_mode():
        model(input_ids=source, decoder_input_ids=decoder, past_key_values=cache, use_cache=True)
    k, accepted = 4, 1
    rollback(cache, k - accepted)
    expected = seq2seq_rollback_reference(decoder.shape[1], source.shape[1], k, accepted)
    assert (cache.self_attention_cache.get_seq_length(), cache.cross_attention_cache.get_seq_length()) == expected


def test_every_checker_has_a_reference_and_wrong_answers():
    assert set(REFERENCES) == set(CHECKS) == set(WRONG)
    for name in CHECKS:
        assert getattr(exercises, CHECKS[name].__name__) is CHECKS[name]
        assert CHECKS[name].__name__ in exercises.__all__


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_reference_passes(name):
    outcome = CHECKS[name].outcome(REFERENCES[name])
    assert outcome == Outcome(True, outcome.message) and outcome.message.startswith(PASS), outcome.message


WRONG_CASES = [(name, label) for name in sorted(WRONG) for label in WRONG[name]]


@pytest.mark.parametrize("name, label", WRONG_CASES, ids=[f"{n}: {w}" for n, w in WRONG_CASES])
def test_wrong_answer_is_rejected(name, label):
    outcome = CHECKS[name].outcome(WRONG[name][label])
    assert not outcome.passed, f"{label!r} passed the check of {name}"
    assert outcome.message.startswith(FAIL) and "\n" not in outcome.message, outcome.message
    assert re.search(r"case \d+ of \d+", outcome.message), f"the message names no case: {outcome.message}"


def test_messages_say_what_was_expected_and_what_came_back():
    """The failure names the case, the expected value and the answer, and the likely mistake."""
    message = CHECKS["verify_chain_by_hand"].outcome(WRONG["verify_chain_by_hand"][
        "correction sampled from q instead of the residual"]).message
    assert "residual" in message and "should be [" in message and "got [" in message
    message = CHECKS["tokens_per_step"].outcome(WRONG["tokens_per_step"]["alpha^K instead of alpha^(K+1)"]).message
    assert "expected 3.3616" in message and "(1 − α^K)/(1 − α)" in message
    message = CHECKS["tokens_per_step"].outcome(WRONG["tokens_per_step"]["closed form, 0/0 at alpha = 1"]).message
    assert "ZeroDivisionError" in message and "alpha = 1.0" in message
    message = CHECKS["optimal_k_by_hand"].outcome(WRONG["optimal_k_by_hand"]["searched from K = 0"]).message
    assert "expected K = 1, got 0" in message
    message = CHECKS["residual"].outcome(WRONG["residual"]["NaN when q == p"]).message
    assert "q == p" in message and "NaN" in message


def test_verify_chain_cases_agree_with_the_package_and_cover_every_path():
    """The hidden chains are decided exactly as verify_chain decides them, and exercise a
    rejection of the first draft, a rejection later in the chain, and the bonus token."""
    paths = set()
    for case in CHECKS["verify_chain_by_hand"].cases():
        draft_tokens, draft_probs, target_probs, uniforms = case.args
        num_accepted, next_probs = _reference_chain(*case.args)
        assert num_accepted == case.expected[0]
        torch.testing.assert_close(next_probs, case.expected[1])
        k = len(draft_tokens)
        paths.add("first" if num_accepted == 0 else "bonus" if num_accepted == k else "middle")
    assert paths == {"first", "middle", "bonus"}
    # The seeded uniforms are verify_chain's own: same seed, same first K numbers.
    generator = torch.Generator().manual_seed(0)
    assert verify_chain(torch.tensor([0]), torch.tensor([[0.5, 0.5]]), torch.tensor([[0.5, 0.5]] * 2),
                        generator=generator).num_accepted == 1


def test_messages_name_the_mistakes_of_the_later_chapters():
    def message(name, label):
        return CHECKS[name].outcome(WRONG[name][label]).message

    assert "`[:, :, :-0]` keeps nothing" in message("rollback_cache", "[:, :, :-n], empty when n = 0")
    assert "positions" in message("greedy_generate", "no KV cache: the whole text at every step") \
        and "past_key_values" in message("greedy_generate", "no KV cache: the whole text at every step")
    assert "Return only the new tokens" in message("greedy_generate", "the prompt returned too")
    assert "bonus token" in message("speculative_greedy", "no bonus token")
    assert "a call per token" in message("speculative_greedy", "one target call per token")
    assert "never saw d_K" in message("rollback_counts", "the draft drops K - accepted")
    assert "overflows float32" in message("softmax", "exp without subtracting the maximum")
    assert "top-p applied before top-k" in message("warped_probs", "top-p before top-k")
    assert "Temperature 0 means greedy" in message("warped_probs", "divides by T = 0")
    assert "the KV cache" in message("step_cost", "no KV cache in the bytes")
    assert "untested" in message("acceptance_from_steps", "accepted / drafted")
    assert "the earliest occurrence" in message("prompt_lookup", "the earliest occurrence")
    assert "Stop rather than guess" in message("ngram_draft", "guesses the most frequent token at an unknown context")
    assert "Compare accepted with drafted" in message("heuristic_next_k", "success means accepted == k")


CHAPTER_6_MESSAGES = [  # (checker, wrong answer, what its message must say)
    ("tree_mask", "only the parent visible, not the ancestors", "not every ancestor"),
    ("tree_mask", "the diagonal forgotten", "diagonal is missing"),
    ("tree_mask", "transposed", "transposed"),
    ("tree_mask", "a chain's causal mask", "cousins"),
    ("tree_mask", "without the root's row and column", "the root (the pending token) is row and column 0"),
    ("tree_mask", "an additive float mask", "additive form"),
    ("tree_position_ids", "rows numbered in order, as for a chain", "share a position"),
    ("tree_position_ids", "depths without the cached tokens", "add context_length"),
    ("medusa_tree", "the nodes in the order of choices", "as TreeSpec does"),
    ("medusa_tree", "sorted by path alone, depth first", "by depth and then by path"),
    ("medusa_tree", "head d for depth d, one head too far", "head d - 1"),
    ("medusa_tree", "the rank of the path's first step", "last entry of its path"),
    ("verify_tree_greedily", "any node one level deeper, not only children", "not a child of the last accepted node"),
    ("verify_tree_greedily", "a child checked against its own row", "at its parent"),
    ("verify_tree_greedily", "first children only, a chain", "a chain"),
    ("verify_tree_greedily", "the accepted tokens, not the nodes", "Return the nodes' indices"),
    ("no_residual_output", "q (the residual rule's output)", "what the rule with the residual emits"),
    ("no_residual_output", "no final draw", "the final draw is missing"),
    ("no_residual_output", "the final draw without the candidates", "candidates included"),
    ("tree_tokens_per_call", "without the 1", "one more token"),
    ("tree_tokens_per_call", "each node's own accuracy, not the product along its path", "multiply the accuracies"),
]


def test_the_eagle3_references_are_the_packages():
    """The mask training uses, `ttt_mask`, is the mask written by hand here, and the draft distribution is the
    softmax of `Eagle3Head.logits`."""
    from specbook.eagle3 import Eagle3Head, ttt_mask
    from specbook.exercises.ch06b_eagle3 import draft_distribution_reference

    for case in CHECKS["ttt_mask"].cases():
        steps, n = case.args
        assert torch.equal(_ttt_mask(steps, n), ttt_mask(steps, n))
    head = Eagle3Head(LlamaConfig(vocab_size=12, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=16), (1,)).with_vocabulary([7, 2, 9])
    hidden = torch.randn(8)
    scores = head.lm_head(hidden).double()
    torch.testing.assert_close(head.logits(hidden).double().softmax(-1),
                               draft_distribution_reference(scores, head.vocab.tolist(), 12))


@pytest.mark.parametrize("name, label, phrase", CHAPTER_6_MESSAGES, ids=[f"{n}: {w}" for n, w, _ in CHAPTER_6_MESSAGES])
def test_messages_name_the_mistakes_of_chapter_6(name, label, phrase):
    message = CHECKS[name].outcome(WRONG[name][label]).message
    assert phrase in message, message


def test_tree_cases_agree_with_the_package_and_cover_every_path():
    """Walking one-hot candidates with the residual gives q exactly (what verify_tree relies on), and
    the shortcut's output differs from q wherever q is not one-hot; the greedy cases accept nothing,
    part of a branch, and a branch down to its leaf, and agree with the hand-written walk."""
    for case in CHECKS["no_residual_output"].cases():
        target_probs, candidates = case.args
        torch.testing.assert_close(siblings_output(target_probs, candidates), target_probs)
        assert (not np.allclose(case.expected, target_probs.numpy())) == bool((target_probs < 1).all()), case.label
    outcomes = set()
    for case in CHECKS["verify_tree_greedily"].cases():
        tokens, parents, target_tokens = case.args
        outcome = verify_tree_greedy(torch.tensor(tokens), parents, torch.tensor(target_tokens))
        assert (outcome.path, outcome.next_token) == case.expected == greedy_walk(*case.args)
        outcomes.add("none" if not outcome.path else "leaf" if outcome.bonus else "part")
    assert outcomes == {"none", "part", "leaf"}


def test_medusa_cases_have_clear_ranks_and_heads_that_differ():
    """No near-tie decides a rank the tree uses, and the heads' rankings differ, so that a learner's
    mix-up of heads or ranks cannot pass by accident."""
    for case in CHECKS["medusa_tree"].cases():
        head_logits, choices = case.args
        used = max(path[-1] for path in choices) + 1
        top = head_logits.sort(-1, descending=True).values[:, :used + 1]  # (heads, used + 1)
        assert float((top[:, :-1] - top[:, 1:]).min()) > 1e-3, case.label
        ranked = head_logits.argsort(-1, descending=True)[:, :used]
        assert len({tuple(row) for row in ranked.tolist()}) == len(ranked), case.label


def test_tree_tokens_per_call_matches_greedy_verification_by_simulation():
    """The formula against Monte Carlo: at every node the target's token is the rank-r candidate with
    probability accuracy[depth][r] (or none of them), and verify_tree_greedy walks the tree."""
    accuracy = [[0.6, 0.15, 0.08, 0.05], [0.45, 0.15, 0.08, 0.05], [0.35, 0.12, 0.06, 0.04], [0.3, 0.1, 0.05, 0.03]]
    spec = DEFAULT_TREE
    depths, tokens = tree_positions(spec.parents).tolist(), torch.tensor(spec.ranks)  # a node's token: its rank
    rng, runs, emitted = np.random.default_rng(0), 4000, []
    for _ in range(runs):
        target_tokens = [int(rng.choice(5, p=accuracy[depth] + [1 - sum(accuracy[depth])]))
                         if depth < spec.depth else 4 for depth in depths]  # 4: no candidate's token
        emitted.append(len(verify_tree_greedy(tokens, spec.parents, torch.tensor(target_tokens)).path) + 1)
    expected = tree_tokens_per_call_reference(spec.paths, accuracy)
    assert abs(np.mean(emitted) - expected) < 4 * np.std(emitted) / np.sqrt(runs), (np.mean(emitted), expected)


CHAPTER_6B_MESSAGES = [  # (checker, wrong answer, what its message must say)
    ("jacobi_step", "sequential updates, each from the new guesses (Gauss-Seidel)", "that is greedy decoding"),
    ("jacobi_step", "the right guesses from one call per guess", "One Jacobi iteration is one call"),
    ("jacobi_step", "each guess from its own row, one too far", "the row before it"),
    ("jacobi_step", "the prompt left out", "the prompt is left out"),
    ("jacobi_step", "every row returned", "Keep the"),
    ("window_parents", "numbered column by column", "column by column"),
    ("window_parents", "every level a chain of its own", "continues the token below it in its column"),
    ("window_parents", "level 0 all children of the pending token", "Level 0 is a chain"),
    ("window_parents", "the pending token as node 0, every parent one too high", "one too high"),
    ("collect_ngrams", "flat N-tuples, not (first, rest)", "pair (first, rest)"),
    ("collect_ngrams", "the new token left out", "the new token is missing"),
    ("collect_ngrams", "newest first", "newest first"),
    ("collect_ngrams", "the levels read across", "reads the levels across"),
    ("collect_ngrams", "duplicates removed", "duplicates included"),
    ("self_speculative_speedup", "no overhead", "the overhead is left out"),
    ("self_speculative_speedup", "c upside down, layers / exit_layer", "upside down"),
    ("self_speculative_speedup", "the overhead once per step", "once per step"),
    ("self_speculative_speedup", "K + 1 draft calls", "K + 1 draft calls"),
    ("self_speculative_speedup", "the closed form, 0/0 at alpha = 1", "0/0"),
    ("ttt_mask", "causal over the unrolled sequence", "chains of other bases"),
    ("ttt_mask", "later steps blind to step 0", "must see step 0's keys"),
    ("ttt_mask", "later steps see all of step 0", "the future at test time"),
    ("ttt_mask", "transposed", "transposed"),
    ("draft_distribution", "score 0 outside the vocabulary", "-inf"),
    ("draft_distribution", "row i put at token i", "vocab[i]"),
    ("draft_distribution", "the scores, not their softmax", "Take the softmax"),
]


CHAPTER_6C_MESSAGES = [  # (checker, wrong answer, what its message must say)
    ("pard_mask", "causal over the whole layout", "causal mask over the whole layout"),
    ("pard_mask", "masks see the text up to their own position", "the text after it is what the draft must guess"),
    ("pard_mask", "masks blind to their chain", "the masks of depths 1"),
    ("pard_mask", "transposed", "transposed"),
    ("blockwise_accept", "every match counted, not the leading run", "not the leading run"),
    ("blockwise_accept", "the last token never checked", "last token is never compared"),
    ("blockwise_accept", "a bonus token added, k̂ + 1", "bonus token"),
    ("blockwise_accept", "ŷ_1 taken without a look: an empty block accepts one", "an empty block has no token"),
    ("blockwise_accept", "the drafts only, ŷ_1 not counted", "counts ŷ_1 too"),
    ("multi_token_loss", "the same target for every head, no shift by i", "every head is scored on the next token"),
    ("multi_token_loss", "the mean over the heads", "the mean over the heads"),
    ("multi_token_loss", "the targets wrapped past the end", "wrap around the end"),
    ("multi_token_loss", "the targets padded past the end with token 0", "padded past the end"),
    ("multi_token_loss", "off by one: head i on tokens[t + i]", "one short"),
    ("multi_token_loss", "off by one: head i on tokens[t + 2 + i]", "one too far"),
    ("multi_token_loss", "one mean over every head's positions", "pools every head's positions"),
    ("multi_token_loss", "summed over the positions (Eq. 2 read literally)", "sums over the positions"),
    ("multi_token_loss", "the log-likelihood, not its negative", "negative log-likelihood"),
    ("cape_siblings", "the greedy token not subtracted", "the chain's greedy token included"),
    ("cape_siblings", "the budget ignored", "the budget is ignored"),
    ("cape_siblings", "the chain left out of the budget", "counts the chain's nodes too"),
    ("cape_siblings", "the deepest depths first", "The shallowest come first"),
    ("cape_siblings", "the bin from round(10 p)", "floor(10 p)"),
    ("cape_siblings", "floor(10 p) not capped: p = 1.0 overflows the bins", "the last bin takes the rest"),
    ("phrases_after", "oldest first", "oldest first"),
    ("phrases_after", "duplicates kept", "Offer each once"),
    ("phrases_after", "the key included in each phrase", "start with the key"),
    ("phrases_after", "phrases cut off by the end kept", "cut off by the end"),
    ("phrases_after", "each phrase at its first place, not its newest", "the newest place each occurred"),
    ("phrases_after", "count ignored", "at most count"),
]


LATER_MESSAGES = CHAPTER_4B_MESSAGES + CHAPTER_6B_MESSAGES + CHAPTER_6C_MESSAGES + CHAPTER_7_MESSAGES


@pytest.mark.parametrize("name, label, phrase", LATER_MESSAGES, ids=[f"{n}: {w}" for n, w, _ in LATER_MESSAGES])
def test_messages_name_the_mistakes_of_chapters_4b_6b_6c_and_7(name, label, phrase):
    message = CHECKS[name].outcome(WRONG[name][label]).message
    assert phrase in message, message


def test_jacobi_cases_reach_the_greedy_output_and_have_clear_greedy_choices():
    """From every case's guesses, Jacobi iteration reaches the greedy output in at most m iterations, the
    first t tokens right after t of them; on the tiny models that output is the engine's, and no near-tie
    decides a row (a learner may call the model on prompt + guesses[:-1] and round differently)."""
    fixed_point = False
    for case in CHECKS["jacobi_step"].cases():
        next_tokens, prompt, guesses = case.args
        greedy = greedy_continuation(next_tokens.rows, prompt, len(guesses))
        fixed_point |= guesses == greedy
        for t in range(1, len(guesses) + 1):
            guesses = jacobi_reference(next_tokens.rows, prompt, guesses)
            assert guesses[:t] == greedy[:t], (case.label, t)
        assert guesses == greedy, case.label
        model = next_tokens._model
        if model is not None:
            input_ids = torch.tensor([prompt])
            assert autoregressive_generate(model, input_ids, len(greedy), Sampler(0)).token_ids == greedy
            with torch.no_grad():
                logits = model(torch.tensor([prompt + case.args[2]])).logits[0]  # (len(prompt) + m, vocab)
            top_two = logits.topk(2, dim=-1).values
            assert float((top_two[:, 0] - top_two[:, 1]).min()) >= tiny.MIN_MARGIN, case.label
    assert fixed_point


def test_collect_ngrams_cases_agree_with_the_lookahead_drafter():
    """The reference is what LookaheadDrafter.observe_side files in its pool from a full window, and the
    window then drops its oldest level and gains the new one."""
    for case in CHECKS["collect_ngrams"].cases():
        levels, new = case.args
        drafter = LookaheadDrafter(window=len(new), ngram=len(levels) + 1, candidates=len(new))
        drafter.start(torch.tensor([[0, 1, 2]]))
        drafter.levels = [list(level) for level in levels]
        logits = torch.nn.functional.one_hot(torch.tensor(new), 16).float()  # (W, vocab): the last level's rows
        drafter.observe_side(torch.cat([torch.zeros(len(new) * (len(levels) - 1), 16), logits]))
        pool = {(first, rest) for first, rests in drafter.pool.items() for rest in rests}
        assert pool == set(collect_ngrams_reference(levels, new)) == set(case.expected), case.label
        assert drafter.levels == levels[1:] + [list(new)], case.label


def test_blockwise_accept_reference_is_what_the_engine_accepts():
    """On a tiny random target with random heads, every step of a BlockwiseDrafter's greedy generation keeps k̂ - 1
    drafts, with k̂ the reference's on the block (the pending token, then the drafts) and the target's choices."""
    target = tiny.tiny_model(1)
    heads = MedusaHeads(target.config.hidden_size, 3)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for block in heads.blocks:
            block.weight.normal_(0, 0.05, generator=generator)  # heads that are right now and then
    prompt = tiny.random_prompt(5, 6)
    run = speculative_generate(target, BlockwiseDrafter(target, heads), prompt, 40, k=3, sampler=Sampler(0))
    assert run.token_ids == autoregressive_generate(target, prompt, 40, Sampler(0)).token_ids
    text, accepted = prompt[0].tolist() + run.token_ids, []
    done = len(run.steps[0].drafted[: run.steps[0].accepted]) + 1
    for step in run.steps[1:]:  # the first step's pending token is the prompt's, not the target's choice
        before = len(prompt[0]) + done - 1  # the text before the pending token
        block = [text[before]] + step.drafted
        with torch.no_grad():
            rows = target(torch.tensor([text[:before] + block])).logits[0, before - 1:]  # (k + 1, vocab)
        choices = rows.argmax(-1).tolist()[: len(block)]
        assert choices[0] == block[0]  # ŷ_1 is the base model's own choice
        assert blockwise_accept_reference(block, choices) == step.accepted + 1
        accepted.append(step.accepted + 1)
        done += step.accepted + 1
    assert {1, 2, 4} <= set(accepted), accepted  # blocks cut at once, cut later, and taken whole


def test_multi_token_loss_reference_is_mtp_loss():
    """The package's training loss on one text equals the reference on the heads' logits stacked (n, T, vocab),
    whatever the logits at the positions without a target (here noise)."""
    target = tiny.tiny_model(1)
    mtp = MultiTokenHeads.for_target(target, num_tokens=3, layers=1)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for block in mtp.heads.blocks:
            block.weight.normal_(0, 0.3, generator=generator)
    model, window = mtp_model(target, mtp), tiny.random_prompt(7, 12)  # (1, T)
    with torch.no_grad():
        loss = float(mtp_loss(mtp.heads, model, window[:, :-1], window[:, 1:]))
        predictions = mtp_predictions(model, mtp.heads, window)  # head i: (1, T - i, vocab), labels window[:, i:]
    length, vocab = window.shape[1], tiny.VOCAB
    stacked = torch.randn(len(predictions), length, vocab, generator=generator)  # (n, T, vocab)
    for i, (logits, labels) in enumerate(predictions):
        assert torch.equal(labels[0], window[0, 1 + i:])
        stacked[i, : length - 1 - i] = logits[0]
    assert math.isclose(multi_token_loss_reference(stacked, window[0]), loss, rel_tol=1e-5)


def test_cape_cases_are_clear_cut_and_cover_every_rule():
    """Every top-1 probability is the strict largest of its row and far from a bin's edge (so floor(10 p), p * 10
    and p / 0.1 agree); the cases run out of budget, pass a short table's last bin, and tell floor from round."""
    covered = set()
    for case in CHECKS["cape_siblings"].cases():
        top1_probs, bins, budget = case.args
        for p in top1_probs:
            assert math.floor(10 * p) == math.floor(p / 0.1) == int(p * 10), (case.label, p)
        covered.add("budget" * (sum(case.expected) == budget - len(top1_probs) > 0))
        covered.add("capped" * any(int(10 * p) >= len(bins) for p in top1_probs))
        covered.add("floor" * any(bins[min(round(10 * p), len(bins) - 1)] != bins[min(int(10 * p), len(bins) - 1)]
                                  for p in top1_probs))
    assert {"budget", "capped", "floor"} <= covered
    rows = confidence_rows([0.05, 0.5, 1.0], seed=0)
    top_two = rows.topk(2, -1).values
    assert torch.equal(top_two[:, 0], torch.tensor([0.05, 0.5, 1.0], dtype=torch.float64))
    assert (top_two[:, 0] > top_two[:, 1]).all() and torch.allclose(rows.sum(-1), torch.ones(3, dtype=torch.float64))


def test_phrases_cases_agree_with_the_ouroboros_drafter():
    """The reference does not depend on the pool's per_key (any per_key >= count), and is what an
    OuroborosDrafter's pool offers after it has read the same text as a prompt."""
    for case in CHECKS["phrases_after"].cases():
        tokens, key, length, count = case.args
        for per_key in (count, count + 3, 50):
            pool = PhrasePool(length, per_key)
            pool.add(tokens)
            assert [tuple(phrase) for phrase in pool.after(key, count)] == case.expected, (case.label, per_key)
        drafter = OuroborosDrafter(tiny.tiny_model(0), phrase_length=length)
        drafter.start(torch.tensor([tokens]))
        assert drafter.pool.after(key, count) == phrases_after_reference(tokens, key, length, count) == case.expected


def test_decoding_cases_have_clear_greedy_choices_and_agree_with_the_engine():
    """A near-tie could make a right loop disagree with the reference; the allowed target calls
    are the engine's own; and some case needs fewer calls than tokens (else a plain loop passes)."""
    for case in CHECKS["greedy_generate"].cases():
        model, prompt, max_new_tokens = case.args
        assert tiny.greedy_margin(model, prompt, case.expected) >= tiny.MIN_MARGIN, case.label
    fewer_calls = []
    for case in CHECKS["speculative_greedy"].cases():
        target, draft, prompt, max_new_tokens, k = case.args
        assert tiny.greedy_margin(target, prompt, case.expected) >= tiny.MIN_MARGIN, case.label
        engine = speculative_generate(target, draft, prompt, max_new_tokens, k, Sampler(0))
        tokens, calls = speculative_greedy_reference(target, draft, prompt, max_new_tokens, k)
        assert engine.token_ids == tokens == case.expected
        assert calls == engine.stats.target_calls <= case.extra["allowed"]
        fewer_calls.append(case.extra["allowed"] < max_new_tokens)
    assert sum(fewer_calls) >= 3


def test_top_p_cases_are_not_on_a_knife_edge():
    """Float rounding must not decide which tokens top-p keeps: no cumulative mass lies near top_p."""
    for case in CHECKS["warped_probs"].cases():
        logits, temperature, top_k, top_p = case.args
        if temperature and top_p is not None and top_p < 1:
            warped = Sampler(temperature, top_k).warp(logits).double()
            mass = warped.softmax(-1).sort(descending=True).values.cumsum(0)
            assert (mass - top_p).abs().min() > 1e-3, case.label


def test_checkers_leave_the_global_random_state_alone():
    tiny.tiny_model.cache_clear()
    state = torch.random.get_rng_state()
    for name in CHECKS:
        CHECKS[name].cases()
    assert torch.equal(state, torch.random.get_rng_state())


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_checker_reports_exceptions_and_none_in_one_line(name, capsys):
    def not_written(*args, **kwargs):
        raise NotImplementedError

    def buggy(*args, **kwargs):
        raise IndexError("index 7 is out of bounds\nfor dimension 0 with size 5")

    def forgot_return(*args, **kwargs):
        pass

    for function, expected in ((not_written, "not written yet"), (buggy, "raised IndexError: index 7"),
                               (forgot_return, "returned None"), (42, "expected a function")):
        outcome = CHECKS[name].outcome(function)
        assert not outcome.passed and outcome.message.startswith(FAIL), outcome.message
        assert expected in outcome.message and "\n" not in outcome.message, outcome.message
        assert "Traceback" not in outcome.message
    assert CHECKS[name](not_written) is None
    printed = capsys.readouterr().out
    assert printed.count("\n") == 1 and printed.startswith(FAIL)


def test_checker_cases_cannot_be_changed_by_the_learner():
    def vandal(target_probs, draft_probs):
        target_probs.zero_()
        return torch.minimum(target_probs, draft_probs).sum(-1)

    CHECKS["acceptance_rate_by_hand"].outcome(vandal)
    assert CHECKS["acceptance_rate_by_hand"].outcome(REFERENCES["acceptance_rate_by_hand"]).passed


# --- Notebooks -----------------------------------------------------------------------------------


def _no_ipython():
    raise RuntimeError("this cell needs IPython (a magic ran): run_in_process runs plain Python only")


def run_in_process(notebook, directory: Path):
    """Runs ``notebook``'s code cells here, top to bottom in one namespace, as a kernel would, and returns it
    with each cell's outputs: what it printed (a stream) or raised (an error). IPython's transformer turns
    magics into calls first (the setup cell's ``%pip`` sits under an ``if`` that is false here). A kernel per
    stub would cost seconds of start-up and imports for the same checks. Torch's grad mode and random state
    are restored afterwards: a stub's cells may change them."""
    transform, namespace = TransformerManager().transform_cell, {"__name__": "__main__", "get_ipython": _no_ipython}
    with torch.random.fork_rng(), torch.set_grad_enabled(torch.is_grad_enabled()), contextlib.chdir(directory):
        for index, cell in enumerate(cell for cell in notebook.cells if cell.cell_type == "code"):
            out = io.StringIO()
            try:
                with contextlib.redirect_stdout(out):
                    exec(compile(transform(cell.source), f"<cell {index}>", "exec"), namespace)
            except Exception as error:  # noqa: BLE001  (a kernel records any exception as the cell's error)
                cell.outputs = [nbformat.v4.new_output("error", ename=type(error).__name__, evalue=str(error),
                                                       traceback=[])]
            else:
                cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=out.getvalue())] \
                    if out.getvalue() else []
    return notebook


def check_cells(notebook) -> list:
    return [cell for cell in notebook.cells if cell.cell_type == "code" and CHECK_CELL.match(cell.source)]


def printed(cell) -> str:
    return "".join(output.get("text", "") for output in cell.get("outputs", [])
                   if output.output_type == "stream")


def test_every_stub_has_its_solution():
    assert len(STUBS) >= 2, STUBS
    missing = [path.relative_to(ROOT).as_posix() for path in SOLUTIONS if not path.exists()]
    assert not missing, f"exercise notebooks without solutions: {missing}"


@pytest.mark.parametrize("stub, solution", list(zip(STUBS, SOLUTIONS)), ids=[p.name for p in STUBS])
def test_stub_and_solution_ask_the_same_questions(stub, solution):
    stub_nb, solution_nb = nbformat.read(stub, as_version=4), nbformat.read(solution, as_version=4)

    def exercises_of(notebook):
        return [cell.source for cell in notebook.cells if cell.cell_type == "markdown"
                and cell.source.startswith("## Exercise")]

    assert exercises_of(stub_nb) == exercises_of(solution_nb)
    assert 4 <= len(exercises_of(stub_nb)) <= 8
    assert [c.source for c in check_cells(stub_nb)] == [c.source for c in check_cells(solution_nb)]
    assert all("TODO" in cell.source for cell in stub_nb.cells if cell.cell_type == "code"
               and "NotImplementedError" in cell.source)


@pytest.mark.parametrize("solution", SOLUTIONS, ids=[p.name for p in SOLUTIONS])
def test_committed_solutions_pass_every_check(solution):
    cells = check_cells(nbformat.read(solution, as_version=4))
    assert cells
    failing = [(cell.source, printed(cell)) for cell in cells if not printed(cell).startswith(PASS)]
    assert not failing, failing


@pytest.mark.parametrize("stub", STUBS, ids=[p.name for p in STUBS])
def test_stub_runs_top_to_bottom_and_every_check_fails_helpfully(stub):
    notebook = run_in_process(nbformat.read(stub, as_version=4), stub.parent)
    errors = [cell.source for cell in notebook.cells if cell.cell_type == "code"
              and any(output.output_type == "error" for output in cell.outputs)]
    assert not errors, f"cells raised: {errors}"
    cells = check_cells(notebook)
    assert len(cells) >= 4
    for cell in cells:
        lines = printed(cell).splitlines()
        assert len(lines) == 1 and lines[0].startswith(FAIL), (cell.source, printed(cell))
        assert "not written yet" in lines[0], lines[0]

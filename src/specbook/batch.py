"""Speculative decoding for a batch of prompts: every row verified at once, each at its own pace.

A server decodes many sequences together, and one target call then scores every row's pending
token and drafts. The rule per row is chapter 2's, unchanged: row b's drafts are verified against
row b's target distributions by `specbook.rejection.verify_chain` (or the greedy comparison), so
every row follows the target exactly and, greedily, equals its own batch-of-one output. What is
new is the bookkeeping of *ragged acceptance*: row b keeps a_b drafts and row c keeps a_c, so the
rows' caches no longer end together (`specbook.ragged.RaggedCache` hides what a row did not keep),
each row carries its own position, its own random stream and its own draft-length policy, and a
row that reaches its end-of-sequence token or its length leaves the batch, so it stops costing
target work.

Random streams: ``seed`` s gives row b the stream s + b (a list gives each row its own), and every
random draw of row b -- its drafts, its uniforms, its residual -- comes from its stream, in the
order the batch-of-one loop draws them. So a row's output does not depend on what else is in the
batch, and row 0 of a batch equals the batch-of-one run with the same seed. (On a GPU the per-row
draws are a loop of small kernels; a server draws them in one.)

Draft length: each row gets its own copy of the policy (`specbook.policies`), told the batch's
size before every step (`DraftLength.observe_batch`): `BatchSizeK` drafts less as the batch grows,
down to K = 0, plain decoding, where verification is no longer nearly free (chapter 7).

The engine calls this for a decoder-only target when the prompts come as a batch: B > 1, or an
``attention_mask`` (`specbook.decoding.speculative_generate`). Trees and heads decode one sequence at
a time and are refused here with a clear error. On a GPU a batch decodes over static caches by
default, each call one replayed graph per batch bucket (`specbook.row_graphs`), as a batch of one
does over its own (`specbook.graphs`).
"""

import copy
import time

import torch

from .drafters import Draft, as_drafter
from .drafters.rows import for_batch
from .models import check_prompt, vocab_size
from .policies import DraftLength, as_policy
from .ragged import check_batch
from .row_graphs import batch_cache
from .records import BatchGeneration, BatchStats, Generation, Step, finish, step_stats
from .rejection import verify_chain
from .sampling import make_generator


def row_seeds(seed, rows: int) -> list[int | None]:
    """Each row's seed: None (the global stream), seed + b for an int, or a list of one seed per row."""
    if seed is None or isinstance(seed, int) and not isinstance(seed, bool):
        return [None if seed is None else seed + row for row in range(rows)]
    if isinstance(seed, (list, tuple)) and len(seed) == rows and all(isinstance(s, int) for s in seed):
        return list(seed)
    raise ValueError(f"seed must be None, an int, or a list of {rows} ints, one per row (got {seed!r})")


def verify_rows(drafts: torch.Tensor, lengths: list[int], draft_probs: torch.Tensor | None, logits: torch.Tensor,
                sampler, generators: list) -> tuple[list[int], list[int]]:
    """Verify every row's chain: row b's first ``lengths[b]`` drafts (B, K) against its target ``logits``
    (B, K + 1, vocab). Returns how many drafts each row accepted and the token it emits next.

    Greedily one comparison for the whole batch; sampled, `verify_chain` row by row with the row's own
    stream (``draft_probs`` (B, K, vocab), or None for a deterministic drafter: one-hot p)."""
    width = drafts.shape[1]
    if sampler.greedy:
        target_tokens = logits.argmax(-1)  # (B, K + 1)
        matches = (drafts == target_tokens[:, :width]) & (torch.arange(width, device=drafts.device)
                                                          < torch.tensor(lengths, device=drafts.device)[:, None])
        accepted = matches.long().cumprod(1).sum(1)  # (B,): each row's leading run of matches
        next_tokens = target_tokens.gather(1, accepted[:, None])[:, 0]  # (B,)
        return accepted.tolist(), next_tokens.tolist()
    accepted, next_tokens = [], []
    for row, (n, generator) in enumerate(zip(lengths, generators)):
        target_probs = sampler.probs(logits[row, : n + 1])  # (n + 1, vocab)
        if n:
            draft = Draft(drafts[row, :n], draft_probs[row, :n] if draft_probs is not None else None)
            a, token, _ = verify_chain(draft.tokens, draft.over(logits.shape[-1]), target_probs, generator,
                                       validate=False)
        else:
            a, token = 0, int(sampler.sample(target_probs[0], generator))
        accepted.append(a)
        next_tokens.append(token)
    return accepted, next_tokens


@torch.inference_mode()
def generate_batch(target, drafter, input_ids, max_new_tokens, k, sampler, seed=None, eos_token_id=None,
                   tokenizer=None, attention_mask=None, alone=None, static_length=None) -> BatchGeneration:
    """Speculative decoding (``drafter`` a `Drafter` or draft model) or, with ``drafter`` None, autoregressive
    decoding of a (B, T) batch of left-padded prompts; ``k`` an int or a `DraftLength` policy (a copy per row).
    Returns one `Generation` per row, in order. ``alone(input_ids, seed)``, when given, decodes a batch of one
    instead, its (1, T) prompt without padding: the batch-of-one loop, whose calls need no custom mask.
    ``static_length``: decode over static caches of that many slots a row, the calls replayed as graphs on a GPU
    (`specbook.row_graphs`); None: dynamic caches."""
    visible = check_batch(input_ids, attention_mask)  # (B, T)
    if input_ids.shape[0] == 1 and alone is not None:
        return BatchGeneration.of_one(alone(input_ids[:, visible[0].to(input_ids.device)], row_seeds(seed, 1)[0]))
    check_prompt(target, input_ids, max_new_tokens)
    started, batch = time.perf_counter(), input_ids.shape[0]
    generators = [make_generator(s, target.device) for s in row_seeds(seed, batch)]
    if drafter is not None:
        drafter = for_batch(as_drafter(drafter, target), input_ids, visible, static_length)
        policies = [copy.deepcopy(as_policy(k)) for _ in range(batch)]
    else:
        policies = [_Plain() for _ in range(batch)]
    for policy in policies:
        policy.start()
    watch = [policy.keep_drafting if type(policy).keep_drafting is not DraftLength.keep_drafting else None
             for policy in policies]  # only a policy that reads the draft's confidence is asked per token
    cache = batch_cache(target, batch, static_length or input_ids.shape[1] + max_new_tokens,
                        "dynamic" if static_length is None else "static")
    vocab = vocab_size(target)
    pending, pending_visible = input_ids, visible  # the first call reads the prompts
    rows = list(range(batch))  # the rows still decoding, by their index in the batch
    tokens, steps = [[] for _ in rows], [[] for _ in rows]
    finished = [0.0] * batch
    row_draft_calls, calls, fed, wasted, rows_fed = [0] * batch, 0, 0, 0, 0
    while rows:
        for row in rows:
            policies[row].observe_batch(len(rows))
        ks = [max(min(policies[row].next_k(), max_new_tokens - len(tokens[row]) - 1), 0) for row in rows]
        if drafter is not None and max(ks):
            before = drafter.calls
            drafts, draft_probs, ks = drafter.propose(ks, sampler, [generators[row] for row in rows],
                                                      [watch[row] for row in rows])
            for row in rows:  # the draft model's calls this step, each row in every one of them
                row_draft_calls[row] += drafter.calls - before
        else:
            drafts, draft_probs, ks = pending[:, :0], None, [0] * len(rows)
        width = drafts.shape[1]
        new_visible = torch.cat([pending_visible, torch.arange(width)[None] < torch.tensor(ks)[:, None]], 1)
        logits = cache(torch.cat([pending, drafts.to(pending.device)], 1), new_visible,
                       logits_to_keep=width + 1).logits[..., :vocab]  # (rows, K + 1, vocab)
        accepted, next_tokens = verify_rows(drafts, ks, draft_probs, logits, sampler,
                                            [generators[row] for row in rows])
        cache.forget(pending.shape[1] + width, [pending.shape[1] + a for a in accepted])
        if drafter is not None:
            drafter.update(accepted, next_tokens)
        drafted = drafts.tolist()
        calls, rows_fed = calls + 1, rows_fed + len(rows)
        if calls > 1:  # the prompt's call is not a decoding step's
            fed, wasted = fed + len(rows) * (1 + width), wasted + sum(width - a for a in accepted)
        keep = []
        for i, (row, n, a, token) in enumerate(zip(rows, ks, accepted, next_tokens)):
            if drafter is not None:
                if drafter.observes_target:  # NASD's filler reads the target's distributions
                    drafter.observe_target(i, sampler.probs(logits[i, : a + 1]))
                policies[row].update(n, a, draft_probs[i, :n] if draft_probs is not None else None)
            steps[row].append(Step(drafted[i][:n], a, token, bonus=bool(n) and a == n))
            tokens[row] += drafted[i][:a] + [token]
            if len(tokens[row]) < max_new_tokens and eos_token_id not in tokens[row][-a - 1:]:
                keep.append(i)
            else:
                finished[row] = time.perf_counter() - started
        if len(keep) < len(rows):  # finished rows leave the batch
            cache.select(keep)
            if drafter is not None:
                drafter.select(keep)
            rows = [rows[i] for i in keep]
        pending = torch.tensor([[next_tokens[i]] for i in keep], dtype=input_ids.dtype, device=input_ids.device)
        pending_visible = torch.ones(len(keep), 1, dtype=torch.bool)
    generations = [_generation(tokens[row], steps[row], finished[row], row_draft_calls[row], drafter is not None,
                               eos_token_id, tokenizer) for row in range(batch)]
    stats = BatchStats(target_calls=calls, draft_calls=getattr(drafter, "calls", 0),
                       seconds=time.perf_counter() - started, new_tokens=sum(len(row.token_ids) for row in generations),
                       rows_per_call=rows_fed / calls, positions_per_call=fed / max(rows_fed - batch, 1), wasted=wasted / fed if fed else 0.0)
    return BatchGeneration(generations, stats)


class _Plain(DraftLength):
    """K = 0 at every step: autoregressive decoding through the same loop."""

    def next_k(self) -> int:
        return 0


def _generation(token_ids, steps, seconds, draft_calls, speculative, eos_token_id, tokenizer) -> Generation:
    """One row's record, in the terms of a batch-of-one `Generation` (``seconds``: until the row finished)."""
    token_ids, text = finish(token_ids, eos_token_id, tokenizer)
    return Generation(token_ids, step_stats(token_ids, steps, draft_calls, seconds), steps if speculative else [], text)

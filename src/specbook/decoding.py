"""Autoregressive and speculative generation with rolled-back KV caches.

`autoregressive_generate` is Algorithm 1 of the book: one target call per token.
`speculative_generate` is speculative sampling (Leviathan et al. 2023, Algorithm 1; Chen et al.
2023, Algorithm 2): a drafter proposes up to K tokens, one target call scores all of them, and
`specbook.rejection.verify_chain` keeps the longest accepted prefix plus one corrected or bonus
token -- so every step emits between 1 and K + 1 tokens, and the output follows the target's
(warped) distribution exactly. Greedily (temperature 0) the same rule is a comparison with the
target's argmax, `verify_chain_greedy`, with no residuals to build. A drafter may propose a token tree
instead (a `Draft` with ``parents``, `specbook.trees`): one target call with a tree attention mask scores
every branch, and `specbook.tree_verification.verify_tree`'s rule keeps the longest accepted path,
decided on the device (`specbook.tree_verification.tree_outcome`) and read once, like a chain's. On the
static cache of a target the package's decoder runs (`specbook.decoder`), the tree's call is a replayed
graph per padded tree size (`specbook.graphs.StaticModel.tree`) over the same buffer, and its accepted
path is moved into place by index on the device (`specbook.cache.SlotCache.keep_tail`); a target that
keeps Hugging Face's forward verifies trees on the dynamic cache only.

Both loops keep the same bookkeeping: the target's KV cache holds every committed token except
the last one, which is "pending" and is fed first in the next call. Verification feeds
[pending, d_1, ..., d_K] (K + 1 positions) and gets q_1 ... q_{K+1} back; rollback then crops the
rejected drafts off the cache, so the prefix is never recomputed. At the start the whole prompt is
pending: the first call reads it together with the first drafts (or, autoregressively, makes the
first token from it), as Hugging Face's ``generate`` does, rather than spending a call of its own on
it -- except before a tree draft, whose mask follows one pending token, and for a drafter that
reads the target's features or cache of the prompt before it drafts. A tree step feeds [pending,
node 0, ..., node n-1] and keeps the prefix, the pending token and the accepted path.

A drafter that reads the target's hidden states (``Drafter.uses_features``: Medusa, EAGLE) gets
them from the same target calls: the engine asks the target for its hidden states too, and hands
the last layer's (its features) at the committed positions to the drafter. The logits stay the
model's own, whatever it does after its LM head (Gemma 2 caps them with a tanh). A drafter that
reads the target's KV cache (``Drafter.uses_target_cache``: GliDe) is handed the cache after the
prompt's prefill, and reads its committed positions whenever it drafts.

An encoder-decoder target (T5, BART, Marian) runs its encoder once per generation; the loops then
decode with a view of its decoder that is called like a causal LM (`specbook.seq2seq`), and only
the decoder's self-attention cache rolls back.

The target's distribution is never cut: q spans the target's whole vocabulary. A draft model
whose embedding has fewer rows (real pairs pad their embedding matrices to different multiples)
reports a p that is zero on the rows it lacks, which the accept rule handles like any other p.

The same loops are the GPU path, the default on a GPU. ``cache="static"`` pre-allocates both models'
KV caches, keeps them between generations and rolls back by moving a length pointer on the device
(`specbook.cache`); on a GPU every decode call is then one replayed CUDA graph (`specbook.graphs`), and
``compile=True`` fuses the kernels inside it. Drafts stay on the device, a chain's accept/reject
decision is made there, inside the target call's graph (`specbook.rejection.chain_decision`,
`specbook.graphs.StaticModel.verify`), and the next pending token is fed from there: the host waits
for the device once per step, to read the number accepted, the next token and the drafts in one copy.
With a fixed K, a draft model queues the next step's chain before that wait (`Drafter.draft_ahead`), so
the device goes on to the next step while the host does the bookkeeping of this one.
"""

import time
from functools import partial

import torch

from .batch import generate_batch
from .cache import SlotCache, check_cache_options, is_static, keep_tail, rollback
from .decoder import cache_and_forward
from .drafters import as_drafter
from .models import check_prompt, read_features, vocab_size
from .policies import DraftLength, FixedK, as_policy
from .records import BatchGeneration, Generation, Stats, Step, finish, step_stats
from .graphs import StaticModel, prefill, static_model
from .row_graphs import batch_cache_option
from .rejection import chain_decision
from .sampling import Sampler, make_generator
from .seq2seq import EncoderDecoderView, check_encoder_inputs, decoder_start, encode, is_encoder_decoder
from .tree_verification import Path, tree_outcome, tree_outcome_greedy
from .trees import on_device, tree_depths, tree_inputs, tree_shape


def gpu_path(model, cache=None, compile=None) -> tuple[str, bool]:
    """The engine's ``cache`` and ``compile`` options, None meaning the default for ``model``'s device: the
    static cache (its decode calls replayed as CUDA graphs) on a GPU, the dynamic cache elsewhere; compiled
    kernels only when asked for (a compilation per input length, minutes for a real model)."""
    if cache is None:
        cache = "static" if model.device.type == "cuda" and not is_encoder_decoder(model) else "dynamic"
    compile = bool(compile) if compile is not None else False
    check_cache_options(cache, compile)
    return cache, compile


def _check_inputs(model, input_ids, max_new_tokens, cache="dynamic", compile=False):
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2 or input_ids.shape[0] != 1:
        shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(f"input_ids must be a (1, T) tensor of token ids, or (B, T) for a batch of prompts (got {shape})")
    check_prompt(model, input_ids, max_new_tokens)
    check_cache_options(cache, compile)


def _batched(model, input_ids, attention_mask, decoder_input_ids) -> bool:
    """Whether the prompts are a batch for `specbook.batch`: a decoder-only model, and B > 1 rows or an
    ``attention_mask`` (a tokenizer's padded output, whatever its size)."""
    return not (is_encoder_decoder(model) or decoder_input_ids is not None or not isinstance(input_ids, torch.Tensor)
                or input_ids.ndim != 2 or input_ids.shape[0] == 1 and attention_mask is None)


def _decoder(model, input_ids, attention_mask=None, decoder_input_ids=None):
    """An encoder-decoder ``model`` reads ``input_ids`` with its encoder, once: token ids (1, S), or the features
    its encoder reads instead (Whisper's ``input_features``, (1, mels, frames)). Returns the decoder, a
    `specbook.seq2seq.EncoderDecoderView`, its prompt (``decoder_input_ids``, by default the decoder's start
    token) and the encoder's output. A decoder-only model comes back as it is, ``input_ids`` its prompt."""
    if not is_encoder_decoder(model):
        if attention_mask is not None or decoder_input_ids is not None:
            raise ValueError("attention_mask and decoder_input_ids are for encoder-decoder models (the encoder's "
                             f"input mask and the decoder's prompt); {type(model).__name__} is decoder-only")
        return model, input_ids, None
    check_encoder_inputs(model, input_ids, attention_mask)
    encoder_outputs = encode(model, input_ids, attention_mask)
    prompt = decoder_input_ids if decoder_input_ids is not None else decoder_start(model, input_ids.device)
    return EncoderDecoderView(model, encoder_outputs, attention_mask), prompt, encoder_outputs


def _caches(model, input_ids, max_new_tokens, static_length, compile):
    """A new generation's KV cache for ``model`` and the forward of its calls. With ``static_length``, the emptied
    cache of the model's `StaticModel`, which replays its calls. Else a new cache with room for the prompt and
    the new tokens, and the model's `specbook.decoder.Decoder` where it serves the model, else the model."""
    if static_length is not None:
        runner = static_model(model, static_length, "target", compile)
        return runner.start(), runner
    return cache_and_forward(model, input_ids.shape[1] + max_new_tokens)


STATIC_BLOCK = 256  # static caches are sized in blocks of this many tokens
TREE_ROOM = 64  # and hold this many slots more, for the nodes of a tree verified after the last token


def _static_length(model, input_ids, max_new_tokens, cache):
    """A static cache's length: room for the prompt, the new tokens and a tree's nodes (`TREE_ROOM`), rounded up
    to a block (not past the model's context), so that prompts of different lengths share one compiled step
    instead of each compiling its own (a compiled step is specialised to the cache's shape). None for a
    dynamic cache."""
    if cache != "static":
        return None
    needed = input_ids.shape[1] + max_new_tokens + TREE_ROOM
    rounded = -(-needed // STATIC_BLOCK) * STATIC_BLOCK
    context = getattr(model.config, "max_position_embeddings", None)
    return rounded if context is None else min(rounded, context)


def _target_forward(cache, input_ids, features, forward, **inputs):
    """The target on ``input_ids`` (1, n) after ``cache``: its logits (n, vocab), and the hidden states the
    drafter reads (`specbook.models.read_features`) when ``features`` names them (`Drafter.feature_layers`;
    else None).
    ``forward`` is the target, or its `StaticModel` (which calls it over ``cache`` on n positions);
    ``inputs``: a tree's mask and depths on the device (``tree``, for the decoder) or its mask and positions
    (Hugging Face's), or how many positions' logits to keep; or, for a replaying `StaticModel`, ``verify``:
    a chain step's (pending, draft, sampler, generator), whose call and decision are one replay
    (`StaticModel.verify`), returning the decision (2 + k,), the target's distributions and the features."""
    if isinstance(forward, StaticModel) and "tree" in inputs:  # a tree's graph, by its padded size
        return forward.tree(input_ids, *inputs["tree"], features)
    if isinstance(forward, StaticModel) and "verify" in inputs:  # a chain's call and its decision
        pending, draft, sampler, generator = inputs["verify"]
        return forward.verify(pending, draft.tokens, draft.probs, sampler, features, generator)
    if isinstance(forward, StaticModel):
        return forward(input_ids, features, keep=inputs.get("logits_to_keep"))
    outputs = forward(input_ids, past_key_values=cache, use_cache=True, output_hidden_states=features is not None,
                      **inputs)
    return outputs.logits[0], read_features(outputs, features)


@torch.inference_mode()
def autoregressive_generate(model, input_ids, max_new_tokens, sampler=Sampler(), seed=None, eos_token_id=None,
                            tokenizer=None, cache=None, compile=None, attention_mask=None,
                            decoder_input_ids=None) -> Generation | BatchGeneration:
    """Algorithm 1: one target call per new token. ``input_ids`` is (1, T).

    ``cache`` ("dynamic" or "static") and ``compile`` choose the GPU path, as in `speculative_generate`
    (by default the static cache and its CUDA graphs on a GPU). Tokens stay on the device until the end,
    unless an ``eos_token_id`` must be watched for (one read of the new token per step).
    An encoder-decoder model reads ``input_ids`` (with ``attention_mask``) with its encoder, as its
    ``generate`` does, and decodes after ``decoder_input_ids`` (default: its decoder start token).

    A batch of prompts -- ``input_ids`` (B, T), left-padded, with its ``attention_mask``, as a tokenizer
    pads them for generation -- decodes every row at once and returns a `BatchGeneration`, one
    `Generation` per row (`specbook.batch`); ``seed`` s then gives row b the random stream s + b.
    """
    if _batched(model, input_ids, attention_mask, decoder_input_ids):
        cache = batch_cache_option(model, cache, compile)
        return generate_batch(model, None, input_ids, max_new_tokens, 0, sampler, seed, eos_token_id, tokenizer,
                              attention_mask, lambda row, seed: autoregressive_generate(
                                  model, row, max_new_tokens, sampler, seed, eos_token_id, tokenizer, cache),
                              _static_length(model, input_ids, max_new_tokens, cache))
    cache, compile = gpu_path(model, cache, compile)
    model, input_ids, _ = _decoder(model, input_ids, attention_mask, decoder_input_ids)
    _check_inputs(model, input_ids, max_new_tokens, cache, compile)
    generator = make_generator(seed, model.device)
    started = time.perf_counter()
    static_length = _static_length(model, input_ids, max_new_tokens, cache)
    kv_cache, forward = _caches(model, input_ids, max_new_tokens, static_length, compile)
    vocab = vocab_size(model)
    inputs = input_ids  # the first call reads the whole prompt
    tokens = []
    while len(tokens) < max_new_tokens:
        logits = _target_forward(kv_cache, inputs, None, forward, logits_to_keep=1)[0][-1, :vocab]  # (vocab,)
        token = sampler.sample(sampler.probs(logits), generator).view(1)  # (1,), on the device
        inputs = token[None]  # (1, 1)
        tokens.append(token)
        if eos_token_id is not None and int(token) == eos_token_id:
            break
    token_ids, text = finish(torch.cat(tokens).tolist(), eos_token_id, tokenizer)
    stats = Stats(len(token_ids), 0, float("nan"), 1.0, time.perf_counter() - started)
    return Generation(token_ids, stats, text=text)


def _chain_step(target, cache, pending, draft, drafter, sampler, generator, vocab, features, forward, ahead=None):
    """Verify a chain of drafts (or none) with one target call; roll ``cache`` back and tell ``drafter``.

    ``pending`` (m,) holds the tokens the cache has not seen, on the device. The step's one wait for the
    device reads the decision (`specbook.rejection.chain_decision`) and the drafts in one copy; on a
    replaying static cache the call and the decision are one graph (`StaticModel.verify`). ``ahead``, if
    given, is called with the outcome (2,) on the device just before, to queue work for the next step.
    Returns the `Step`, the next pending token (1,) on the device, the target's distributions at the
    committed positions (accepted + 1, vocab) and the draft's distributions (or None), for the drafter's
    and the policy's hooks, and, when ``features`` is set, the target's features at the committed
    positions (accepted + 1, hidden).
    """
    drafted = draft.tokens if draft is not None else pending[:0]  # (n,), on the device
    if isinstance(forward, StaticModel) and forward.replays and not forward.fresh and len(drafted):
        decision, target_probs, hidden = _target_forward(cache, None, features, forward, verify=(
            pending, draft, sampler, generator))  # the call and the decision, one replay
    else:
        inputs = torch.cat([pending, drafted])[None]  # (1, m + n)
        logits, hidden = _target_forward(cache, inputs, features, forward, logits_to_keep=len(drafted) + 1)
        if len(drafted):
            draft_probs = None if sampler.greedy else draft.over(vocab)  # greedily the decision needs no p
            outcome, target_probs = chain_decision(logits, drafted, draft_probs, sampler, generator)
        else:
            target_probs = sampler.probs(logits)  # (1, vocab)
            outcome = torch.stack([torch.zeros_like(drafted).sum(), sampler.sample(target_probs[0], generator)])
        decision = torch.cat([outcome, drafted])  # (2 + n,)
    if ahead is not None and len(drafted):
        ahead(decision[:2])
    accepted, next_token, *drafted_ids = decision.tolist()  # the step's one sync
    rollback(cache, len(drafted) - accepted)
    drafter.update(accepted, next_token)
    step = Step(drafted_ids, accepted, next_token, accepted == len(drafted) > 0)
    return (step, decision[1:2], target_probs[: accepted + 1], draft.probs if draft is not None else None,
            hidden[: accepted + 1] if hidden is not None else None)


def _with_side(target, context, draft):
    """A tree draft's tokens (rows,) and parents, with its side tree (`Draft.side_tokens`) appended when
    there is one and its deepest row still fits the target's context (near the end it is left out)."""
    if draft.side_tokens is None or not len(draft.side_tokens):
        return draft.tokens, draft.parents
    limit = getattr(target.config, "max_position_embeddings", None)
    if limit is not None and context + max(tree_depths(draft.side_parents)) >= limit:
        return draft.tokens, draft.parents
    n = len(draft)
    side_parents = [parent + n if parent >= 0 else -1 for parent in draft.side_parents]
    return torch.cat([draft.tokens, draft.side_tokens]), draft.parents + side_parents


def _check_tree_cache(cache) -> None:
    """Refuse a static cache that cannot verify a token tree: a transformers `StaticCache` (a model that keeps
    Hugging Face's forward) keeps a chain, a prefix, only; the decoder's `SlotCache` moves a tree's path."""
    if is_static(cache) and not isinstance(cache, SlotCache):
        raise ValueError("tree drafts need cache='dynamic' for a model that keeps Hugging Face's forward: its static "
                         "cache keeps a chain (a prefix) only")


def _tree_step(target, cache, pending, draft, drafter, sampler, generator, vocab, features, forward):
    """Verify a tree draft with one target call; keep the accepted path in ``cache`` and tell ``drafter``.

    The decision is made on the device (`specbook.tree_verification.tree_outcome`) and read once, with the
    drafts; the cache keeps the accepted path's rows in the order it left there (`specbook.cache.keep_tail`),
    and the drafter gets that order too (`specbook.tree_verification.Path`). Returns the `Step`, the next
    pending token (1,) on the device, the target's distributions at the committed positions (accepted + 1,
    vocab) and the draft's along ``step.drafted`` (or None), for the drafter's and the policy's hooks, and,
    when ``features`` is set, the target's features at the committed positions (accepted + 1, hidden).
    """
    _check_tree_cache(cache)  # a drafter that did not say it drafts trees (`Drafter.drafts_trees`)
    context, n, device = cache.get_seq_length(), len(draft), pending.device  # context: the host's own count
    tokens, parents = _with_side(target, context, draft)  # the side tree, if any, after the nodes
    if is_static(cache) and context + 1 + len(tokens) > cache.max_length:
        raise ValueError(f"a tree of {len(tokens)} nodes after {context} tokens overflows the static cache of "
                         f"{cache.max_length}: give the engine more room (decoding.TREE_ROOM) or cache='dynamic'")
    inputs = torch.cat([pending, tokens])[None]  # (1, rows): root, nodes, side
    shape = tree_shape(draft.parents, device)  # the side tree's rows make a tree of their own
    logits, hidden = _target_forward(cache, inputs, features, forward, **tree_inputs(
        shape if len(tokens) == n else parents, cache, 0, target.dtype, device, target.config))
    if len(tokens) > n:
        drafter.observe_side(logits[n + 1:])  # (m, vocab)
    target_probs = sampler.probs(logits[: n + 1])  # (n + 1, vocab)
    if sampler.greedy:
        outcome = tree_outcome_greedy(shape, draft.tokens, logits[: n + 1].argmax(-1))
    else:
        outcome = tree_outcome(shape, draft.tokens, draft.over(vocab), target_probs, generator)
    shaped_there = isinstance(draft.parents, torch.Tensor)  # a tree the drafter shaped on the device
    accepted, next_token, *read = torch.cat([outcome, draft.tokens] + ([draft.parents] if shaped_there else [])
                                            ).tolist()  # the step's one read
    order, drafted = outcome[2:], read[n:2 * n]  # (n,): the path's nodes, then the others
    node_parents = read[2 * n:] if shaped_there else draft.parents  # the draft's nodes', on the host
    rows = torch.cat([order.new_zeros(1), order + 1])  # (n + 1,): the root's row, then the nodes' in that order
    keep_tail(cache, rows, len(tokens) + 1, accepted + 1)
    path = Path(read[:accepted], order)
    drafter.update(accepted, next_token, path)
    children = [node for node, parent in enumerate(node_parents) if parent == (path[-1] if path else -1)]
    walked = path + children[:1]  # + the first rejected child
    step = Step([drafted[node] for node in walked], accepted, next_token, not children, tree_nodes=n,
                side_nodes=len(tokens) - n)
    committed = rows[: accepted + 1]  # (accepted + 1,)
    return (step, torch.full((1,), next_token, device=device), target_probs.index_select(0, committed),
            draft.probs.index_select(0, on_device(walked, device)) if draft.probs is not None else None,
            hidden.index_select(0, committed) if hidden is not None else None)


@torch.inference_mode()
def speculative_generate(target, drafter, input_ids, max_new_tokens, k=4, sampler=Sampler(), seed=None,
                         eos_token_id=None, tokenizer=None, cache=None, compile=None, attention_mask=None,
                         decoder_input_ids=None) -> Generation | BatchGeneration:
    """Speculative sampling: draft up to ``k`` tokens, verify them with one target call, repeat.

    ``drafter`` is a `Drafter` (or a draft model, wrapped in `ModelDrafter`); ``k`` an int or a
    `specbook.policies.DraftLength` policy that picks K step by step. The output follows
    the target's distribution under ``sampler`` exactly; greedily it equals
    `autoregressive_generate` token for token. ``input_ids`` is (1, T).

    The GPU path, the default on a GPU (``cache=None``): ``cache="static"`` pre-allocates the target's KV
    cache (and a draft model's, when ``drafter`` is a model), keeps it for the next generation and rolls
    back by moving a pointer; on a GPU each decode call is then one replayed CUDA graph, the draft's and
    the verification's alike (`specbook.graphs`), and ``compile=True`` fuses the kernels inside them
    (compiled C++ kernels on a CPU). ``cache="dynamic"`` opts out. Same tokens, same distribution; a
    `ModelDrafter` passed in keeps its own settings.

    An encoder-decoder target reads ``input_ids`` (with ``attention_mask``) with its encoder once
    and decodes after ``decoder_input_ids`` (`specbook.seq2seq`); its drafter is told the encoder's
    input and states (`Drafter.read_encoder`): a draft model reads them or runs its own encoder,
    prompt lookup copies from the encoder's input, and a drafter that cannot is refused.

    A batch of prompts -- ``input_ids`` (B, T), left-padded, with its ``attention_mask``, as a tokenizer
    pads them for generation -- decodes every row at once and returns a `BatchGeneration`, one
    `Generation` per row (`specbook.batch`); ``seed`` s then gives row b the random stream s + b.
    """
    if _batched(target, input_ids, attention_mask, decoder_input_ids):
        cache = batch_cache_option(target, cache, compile)
        return generate_batch(target, drafter, input_ids, max_new_tokens, k, sampler, seed, eos_token_id, tokenizer,
                              attention_mask, lambda row, seed: speculative_generate(
                                  target, drafter, row, max_new_tokens, k, sampler, seed, eos_token_id, tokenizer,
                                  cache=cache),
                              _static_length(target, input_ids, max_new_tokens, cache))
    encoder_inputs = input_ids, attention_mask
    cache, compile = gpu_path(target, cache, compile)
    target, input_ids, encoder_outputs = _decoder(target, input_ids, attention_mask, decoder_input_ids)
    _check_inputs(target, input_ids, max_new_tokens, cache, compile)
    policy = as_policy(k)
    static_length = _static_length(target, input_ids, max_new_tokens, cache)
    drafter = as_drafter(drafter, target, cache, compile, static_length)
    if encoder_outputs is not None:
        drafter.read_encoder(encoder_outputs, *encoder_inputs)
    generator = make_generator(seed, target.device)
    started = time.perf_counter()
    features = drafter.feature_layers if drafter.uses_features else None  # which hidden states it reads
    kv_cache, forward = _caches(target, input_ids, max_new_tokens, static_length, compile)
    if drafter.drafts_trees:  # before the first token, not at the first tree
        _check_tree_cache(kv_cache)
    if drafter.needs_prefill:
        pending, prompt_features = prefill(target, kv_cache, input_ids, features, forward)
    else:  # the prompt goes into the first verification call, as one more call would cost a step's time
        pending, prompt_features = input_ids[0], None
    if drafter.uses_target_cache:
        drafter.observe_cache(target, kv_cache)
    drafter.start(input_ids)
    if prompt_features is not None:
        drafter.observe_features(prompt_features)
    policy.start()
    # Only a policy that reads the draft's confidence is asked after every drafted token (a softmax each).
    keep_drafting = policy.keep_drafting if type(policy).keep_drafting is not DraftLength.keep_drafting else None
    vocab = vocab_size(target)
    token_ids, steps = [], []
    while len(token_ids) < max_new_tokens and (not token_ids or token_ids[-1] != eos_token_id):
        budget = min(policy.next_k(), max_new_tokens - len(token_ids) - 1)  # a step emits up to budget + 1 tokens
        draft = drafter.propose(budget, sampler, generator, keep_drafting) if budget > 0 else None
        ahead = None  # a fixed K whose next step has room for all K: the drafter may draft it before the outcome
        if type(policy) is FixedK and len(token_ids) + budget + policy.k + 2 <= max_new_tokens:
            ahead = partial(drafter.draft_ahead, k=policy.k, sampler=sampler, generator=generator)
        tree = draft is not None and draft.parents is not None
        if tree and len(pending) > 1:  # a tree's mask is built after one pending token: cache the prompt first
            pending, _ = prefill(target, kv_cache, input_ids)
        verify = _tree_step if tree else partial(_chain_step, ahead=ahead)
        step, pending, committed_probs, step_draft_probs, committed_features = verify(
            target, kv_cache, pending, draft, drafter, sampler, generator, vocab, features, forward)
        drafter.observe_target(committed_probs)  # the target at the committed positions
        if features is not None:
            drafter.observe_features(committed_features)
        policy.update(len(step.drafted), step.accepted, step_draft_probs)
        steps.append(step)
        token_ids += step.drafted[: step.accepted] + [step.next_token]
    token_ids, text = finish(token_ids, eos_token_id, tokenizer)
    stats = step_stats(token_ids, steps, getattr(drafter, "calls", 0), time.perf_counter() - started)
    return Generation(token_ids, stats, steps, text)

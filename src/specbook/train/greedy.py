"""The target's own text for a draft to learn from: its greedy continuations of stretches of the corpus.

A draft distilled on the corpus (KL(q || p) at every position, `specbook.train.loop`) learns the target's
distributions on Shakespeare's text; a greedy verifier checks it on the target's. There the context is text the
target wrote, on which the next token is the target's argmax, a function of the context, where on the corpus it
is a guess. DistillSpec (Zhou et al., ICLR 2024, Section 4) finds that what text the distillation runs on matters
as much as its loss: text the models generate beats a fixed corpus (its best is the draft's own samples). The
``greedy`` stage of `specbook.train` distils the corpus-distilled draft again, on windows of the target's greedy
continuations with windows of the corpus mixed in (so that it keeps what it knew of the text); the PARD draft
(`specbook.train.pard`) is adapted on the same kinds of window.
"""

from functools import partial

import torch

from .loop import _kl_rows, train_model

WINDOWS, CORPUS = 4096, 1024  # the built-in draft's windows: the target's greedy continuations, the corpus's own
PREFIX, BLOCK = 96, 160  # a window: a stretch of the corpus, then the target's greedy continuation to BLOCK tokens


@torch.no_grad()
def greedy_windows(target, tokens: torch.Tensor, count: int, block: int, prefix: int = 32, seed: int = 0,
                   batch: int = 64) -> torch.Tensor:
    """``count`` windows (count, block): a random stretch of ``prefix`` tokens of ``tokens``, then the target's greedy
    continuation -- the text a greedy verifier accepts, on which a token two or more ahead is a function of the
    context (the target's argmax, unrolled), where on the corpus it is a guess. Decoded as batches."""
    from ..decoding import autoregressive_generate
    from ..sampling import Sampler

    generator = torch.Generator().manual_seed(seed)
    windows = []
    for start in range(0, count, batch):
        starts = torch.randint(0, len(tokens) - prefix, (min(batch, count - start),), generator=generator)
        prompts = torch.stack([tokens[s:s + prefix] for s in starts.tolist()]).to(target.device)
        continued = autoregressive_generate(target, prompts, block - prefix, Sampler(0),
                                            attention_mask=torch.ones_like(prompts)).token_ids  # (rows, block - prefix)
        windows.append(torch.cat([prompts.cpu(), torch.tensor(continued)], 1))
    return torch.cat(windows)


def corpus_windows(tokens: torch.Tensor, count: int, block: int, seed: int = 0) -> torch.Tensor:
    """``count`` windows (count, block) of ``tokens`` at random starts: the corpus's own text, mixed into the greedy
    windows so that a draft keeps what it knew of it (on the grounded prompts a draft adapted on greedy text alone
    guesses its first token worse than the draft it started from)."""
    starts = torch.randint(0, len(tokens) - block, (count,), generator=torch.Generator().manual_seed(seed))
    return torch.stack([tokens[start:start + block] for start in starts.tolist()])


def window_batches(windows: torch.Tensor, batch_size: int, generator: torch.Generator):
    """Endless batches of ``windows`` (count, block) drawn at random: (inputs, targets), the targets unused."""
    while True:
        rows = windows[torch.randint(0, len(windows), (batch_size,), generator=generator)]
        yield rows, rows


def mixed_batches(target, tokens: torch.Tensor, greedy: int, corpus: int, config, prefix: int = 32):
    """The training data of a stage on the target's text, for `specbook.train.loop.train_model`'s ``data``: ``greedy``
    windows of its greedy continuations (`greedy_windows`, seeded by ``config.seed``) and ``corpus`` windows of the
    corpus (`corpus_windows`, seeded apart from them), ``config.block_size`` tokens each, drawn in batches."""
    windows = greedy_windows(target, tokens, greedy, config.block_size, prefix, seed=config.seed)
    if corpus:
        windows = torch.cat([windows, corpus_windows(tokens, corpus, config.block_size, config.seed + 1)])
    return partial(window_batches, windows, config.batch_size)


@torch.no_grad()
def greedy_agreement(draft, target, windows: torch.Tensor, prefix: int) -> dict:
    """On ``windows`` (count, block) of `greedy_windows` with that ``prefix``: at every position whose next token is
    the target's greedy one, the share where the draft's argmax is that token (greedy decoding's α, teacher-forced)
    and KL(q || p) there."""
    draft.eval()
    inputs = windows.to(next(draft.parameters()).device)
    logits = draft(inputs).logits[:, prefix - 1:-1].float()  # (count, block - prefix, vocab): the continuation's
    teacher = target(inputs).logits[:, prefix - 1:-1].float().log_softmax(-1)
    vocab = min(logits.shape[-1], teacher.shape[-1])  # a padded embedding's rows are no tokens
    logits, teacher = logits[..., :vocab], teacher[..., :vocab]
    draft.train()
    return {"agreement": round((logits.argmax(-1) == teacher.argmax(-1)).float().mean().item(), 4),
            "kl_to_target": round(_kl_rows(teacher, logits).mean().item(), 4)}


def distill_on_greedy(draft, target, train_tokens, valid_tokens, config, ckpt_dir, device, windows=WINDOWS,
                      corpus=CORPUS, prefix=PREFIX):
    """Distil ``draft`` (trained in place) again to ``target`` (frozen), KL(q || p) at every position, on ``windows``
    windows of the target's greedy continuations of the corpus (``config.block_size`` tokens from a stretch of
    ``prefix``) and ``corpus`` windows of the corpus itself (`mixed_batches`), evaluated by
    `greedy_agreement` on continuations of the held-out text, before (``start``) and during training. Returns the
    training state."""
    if not 0 < prefix < config.block_size:
        raise ValueError(f"prefix must be in [1, block_size - 1] = [1, {config.block_size - 1}], got {prefix}")
    target.to(device)
    data = mixed_batches(target, train_tokens, windows, corpus, config, prefix)
    held_out = partial(greedy_agreement, draft, target,
                       greedy_windows(target, valid_tokens, 64, config.block_size, prefix, seed=config.seed), prefix)
    start = held_out()  # the corpus-distilled draft's
    state = train_model(draft, train_tokens, valid_tokens, config, ckpt_dir, device, teacher=target,
                        desc="draft, greedy", evaluate_fn=held_out, data=data)
    return {**state, "start": start, "greedy_windows": windows, "corpus_windows": corpus, "prefix": prefix}

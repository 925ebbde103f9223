"""A PARD draft (`specbook.drafters.pard`): the built-in draft adapted to predict K tokens from one call.

PARD (An et al., ICLR 2026, Section 3) trains on every prefix of a text window at once. A window of n tokens
is written out once per depth: depth 0 is the text itself, depth c >= 1 holds the mask token at every
position p, standing for "the c-th mask after a context that ends at x_{p-c}", and is scored on x_{p+1}, the
token c + 1 ahead of that context. Its attention row sees the text up to p - c, the masks of depths 1 .. c - 1
of the same context (at positions p - c + 1 .. p - 1) and itself -- exactly what that mask sees in the
drafting call [x_1 .. x_{p-c}, m, .., m] -- and it sits at position p. One forward over the layout trains
every depth of every context.

Conditional Drop-token (COD, Section 3.2) keeps the layout short: depth c keeps only a share max(r^c, r_min)
of its positions (r = 0.7, r_min = 0.2, the paper's), chosen among those whose mask of depth c - 1 one
position earlier was kept, so that every kept row's chain of masks is in the layout. With 8 depths the
layout holds about 3.4 n rows instead of 8 n.

Where the book differs from the paper: the loss is the built-in draft's own, KL(q || p) to the target's
distribution at each row's position, not the text's cross entropy (α rewards closeness to q, and the draft
it starts from was distilled the same way), so this draft is tuned to the built-in target rather than to
any target of its family; and the mask token is an id of the shared vocabulary that the corpus never
produces, where the paper's models have reserved tokens to spare.
"""

from functools import partial

import torch

from ..drafters.pard import PARD_MAX_K, PARD_TOKEN
from ..masks import attention_inputs
from .greedy import greedy_windows, mixed_batches
from .loop import _kl, _kl_rows, train_model

DEPTHS = 8  # the layout's copies: the text and 7 mask depths, for up to 8 drafts a call
RATIO, FLOOR = 0.7, 0.2  # COD: depth c keeps max(RATIO ** c, FLOOR) of its positions
GREEDY, CORPUS = 512, 512  # the built-in PARD draft's windows: the target's greedy continuations, the corpus's own


def unused_token(tokens: torch.Tensor, vocab: int) -> int:
    """The smallest token id other than 0 (the end of text) that ``tokens`` (the corpus) never holds."""
    unused = (torch.bincount(tokens, minlength=vocab)[1:] == 0).nonzero()
    if not len(unused):
        raise ValueError("every token id occurs in the corpus: a PARD draft needs an unused id for its mask")
    return int(unused[0]) + 1


def kept_positions(n: int, depths: int, ratio: float = RATIO, floor: float = FLOOR,
                   generator: torch.Generator | None = None) -> list[torch.Tensor]:
    """COD's rows: per depth c, the positions p (increasing) whose depth-c mask the layout keeps. Depth 0 keeps all
    n; depth c keeps about max(ratio^c, floor) n of the positions whose depth c - 1 mask at p - 1 is kept (none
    before p = c: a context must hold a token). ``ratio`` 1 keeps every position (no drop)."""
    kept = [torch.arange(n)]
    for depth in range(1, depths):
        candidates = kept[-1] + 1
        candidates = candidates[candidates < n]
        candidates = candidates[candidates >= depth]
        count = min(len(candidates), int(n * max(ratio ** depth, floor)))
        if count < len(candidates):  # a drop: drawn from ``generator`` (no draw where all are kept)
            candidates = candidates[torch.randperm(len(candidates), generator=generator)[:count]].sort().values
        kept.append(candidates)
    return kept


def layout(kept: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layout of ``kept`` (`kept_positions`), depth after depth: each row's depth (N,) and position (N,), and
    which rows each row sees (N, N): the text up to its context's end, its context's masks up to its own depth."""
    depth = torch.cat([torch.full((len(positions),), d) for d, positions in enumerate(kept)])  # (N,)
    position = torch.cat(kept)  # (N,)
    context = position - depth  # (N,): the last text position the row's context holds
    text = (depth[None] == 0) & (position[None] <= context[:, None])  # (N, N)
    masks = (depth[None] >= 1) & (context[None] == context[:, None]) & (depth[None] <= depth[:, None])
    return depth, position, text | masks


def pard_predictions(draft, target, inputs: torch.Tensor, kept: list[torch.Tensor], mask_token: int):
    """The draft's logits at every row of the layout of ``kept`` over text windows ``inputs`` (B, n), and the
    target's log-probabilities at each row's position, what the row is scored against: (B, N, vocab) each."""
    depth, position, visible = layout(kept)
    batch = inputs.shape[0]
    tokens = torch.where(depth == 0, inputs[:, position], mask_token)  # (B, N)
    model_inputs = attention_inputs(visible.expand(batch, -1, -1), position.expand(batch, -1),
                                    position.expand(batch, -1), torch.float32, inputs.device, draft.config)
    logits = draft(tokens, **model_inputs).logits.float()  # (B, N, draft vocab)
    with torch.no_grad():
        teacher = target(inputs).logits.float()  # (B, n, target vocab)
    vocab = min(logits.shape[-1], teacher.shape[-1])  # a padded embedding's rows are no tokens
    return logits[..., :vocab], teacher[..., :vocab].log_softmax(-1)[:, position], depth  # (B, N, vocab) each


def predecessors(depth: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """For each row of a layout (its ``depth`` and ``position``, (N,) each), the rows of the drafts before it in its
    drafting call -- depths 0 .. c - 1 of its context, at positions p - c .. p - 1 -- padded with N: (N, max depth)."""
    rows = {(d, p): i for i, (d, p) in enumerate(zip(depth.tolist(), position.tolist()))}
    width = max(int(depth.max()), 1)
    return torch.tensor([[rows[(before, p - d + before)] for before in range(d)] + [len(rows)] * (width - d)
                         for d, p in zip(depth.tolist(), position.tolist())])


def reach(logits: torch.Tensor, teacher: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
    """Each row's chance of being verified at all: the product, over the drafts before it in its call
    (`predecessors`), of their acceptance probabilities sum_x min(p(x), q(x)), held constant: (B, N). The expected
    number of accepted drafts of a call is the sum of these chances times each row's own acceptance, so weighting a
    row's loss by its chance trains for that expectation, the objective PARD-2 (An et al. 2026) states."""
    accepted = torch.minimum(logits.softmax(-1), teacher.exp()).sum(-1).detach()  # (B, N)
    logs = torch.cat([accepted.clamp_min(1e-6).log(), accepted.new_zeros(accepted.shape[0], 1)], 1)  # (B, N + 1)
    return logs[:, before].sum(-1).exp()  # (B, N)


def pard_loss(draft, target, mask_token, generator, depths, ratio, inputs, targets, reached=False):
    """KL(q || p) over the rows COD keeps, every depth weighted alike (the paper's loss is the text's cross
    entropy on the same rows; module docstring), or with ``reached`` each row weighted by its chance of being
    verified (`reach`). ``targets`` is unused: the labels are the target's."""
    kept = kept_positions(inputs.shape[1], depths, ratio, FLOOR, generator)
    logits, teacher, depth = pard_predictions(draft, target, inputs, kept, mask_token)
    if not reached:
        return _kl(teacher, logits)
    weights = reach(logits, teacher, predecessors(depth, torch.cat(kept)))  # (B, N); the layout's positions
    return (weights * _kl_rows(teacher, logits)).sum() / weights.sum()


def text_windows(tokens: torch.Tensor, block: int, count: int = 16) -> torch.Tensor:
    """The first ``count`` consecutive windows (count, block) of ``tokens``."""
    count = min(count, len(tokens) // block)
    return tokens[: count * block].view(count, block)


@torch.no_grad()
def agreement_by_depth(draft, target, windows: torch.Tensor, mask_token: int, depths: int = DEPTHS) -> dict:
    """On held-out ``windows`` (count, block), every position at every depth (no drop): per depth c, the share of rows
    where the draft's argmax is the target's (a greedy draft c + 1's chance of matching, given the window before
    it), and KL(q || p)."""
    draft.eval()
    count, block = windows.shape
    inputs = windows.to(next(draft.parameters()).device)
    agree, kl = [[] for _ in range(depths)], [[] for _ in range(depths)]
    for start in range(0, count, 4):
        logits, teacher, depth = pard_predictions(draft, target, inputs[start:start + 4],
                                                  kept_positions(block, depths, 1.0, 1.0), mask_token)
        same = logits.argmax(-1) == teacher.argmax(-1)  # (B, N)
        rows_kl = _kl_rows(teacher, logits)  # (B, N)
        for d in range(depths):
            agree[d].append(same[:, depth == d].float().mean().item())
            kl[d].append(rows_kl[:, depth == d].mean().item())
    draft.train()
    return {"agreement": [round(sum(values) / len(values), 4) for values in agree],
            "kl_to_target": [round(sum(values) / len(values), 4) for values in kl]}


def train_pard(draft, target, train_tokens, valid_tokens, config, ckpt_dir, device, depths=DEPTHS, ratio=RATIO,
               greedy=GREEDY, reached=True, corpus=CORPUS):
    """Adapt ``draft`` (a causal LM, trained in place) into a PARD draft of ``depths`` drafts a call for ``target``
    (frozen); ``ratio`` 1 trains without COD. ``greedy``: train on that many windows of the target's greedy
    continuations instead of the corpus; ``reached``: each row's loss weighted by its chance of being verified
    (`reach`); ``corpus``: that many windows of the corpus mixed into the greedy ones (`mixed_batches`). Returns the training state, with the mask token; the
    draft's config gets ``pard_token`` and ``pard_max_k``."""
    mask_token = unused_token(torch.cat([train_tokens, valid_tokens]), draft.config.vocab_size)
    draft.config.update({PARD_TOKEN: mask_token, PARD_MAX_K: depths})
    target.to(device)
    generator = torch.Generator().manual_seed(config.seed + 1)  # the drop pattern (a resumed run draws anew)
    loss = partial(pard_loss, draft, target, mask_token, generator, depths, ratio, reached=reached)
    held_out = text_windows(valid_tokens, config.block_size)
    data = None
    if greedy:  # trained and held out on the target's greedy continuations
        data = mixed_batches(target, train_tokens, greedy, corpus, config)
        held_out = greedy_windows(target, valid_tokens, len(held_out), config.block_size, seed=config.seed)
    held_out = partial(agreement_by_depth, draft, target, held_out, mask_token, depths)
    state = train_model(draft, train_tokens, valid_tokens, config, ckpt_dir, device, desc="pard", loss_fn=loss,
                        evaluate_fn=held_out, data=data)
    return {**state, "mask_token": mask_token, "depths": depths, "cod": {"ratio": ratio, "floor": FLOOR},
            "greedy_windows": greedy, "reached": reached, "corpus_windows": corpus}

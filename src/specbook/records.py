"""What a generation returns: its tokens, per-step trace and statistics, for one sequence or a batch.

`Generation` is one sequence's record: the new tokens, the `Step`s of speculative decoding (what was
drafted, how much the target kept, what it added) and the `Stats` of chapter 3 (target calls, the
acceptance rate alpha, tokens per call). A batch of prompts returns a `BatchGeneration`: one
`Generation` per row, in the order of the prompts, and the `BatchStats` of the batched calls, which
count the padding and the rejected drafts that a batch of ragged rows feeds the target.
"""

from dataclasses import dataclass, field

@dataclass
class Step:
    """One verification step: what was drafted, how much of it the target kept, and what it added.

    For a tree draft, ``drafted`` is the path verification walked: the accepted nodes' tokens, then
    the first candidate tried and rejected after them, if any (the other candidates are counted in
    ``tree_nodes``). So ``drafted[:accepted] + [next_token]`` is what the step emitted, for chains
    and trees alike.
    """

    drafted: list[int]
    accepted: int
    next_token: int
    bonus: bool  # True when every draft was accepted and next_token is the free extra token
    tree_nodes: int | None = None  # the size of a tree draft; None for a chain
    side_nodes: int = field(default=0, repr=False)  # rows scored beside the tree in the same call (lookahead)


@dataclass
class Stats:
    target_calls: int  # target forward passes after the prompt's prefill
    draft_calls: int  # drafter forward passes (0 for model-free drafters)
    acceptance_rate: float  # accepted / (accepted + rejected) drafts: the alpha of chapter 3 (for trees, the
    # chance that some candidate at the current node is accepted: a chain is a tree with one candidate per depth)
    tokens_per_step: float  # new tokens per target call
    seconds: float  # wall time of the whole generation, prefill included
    positions_per_call: float = 1.0  # positions each target call scored after the prompt: the pending token, then
    # the drafts (a chain's, a tree's nodes, a lookahead window): what a call costs where it is not free to widen


@dataclass
class Generation:
    token_ids: list[int]  # the new tokens only
    stats: Stats
    steps: list[Step] = field(default_factory=list)
    text: str | None = None


def acceptance_rate(steps: list[Step]) -> float:
    """alpha from a log of steps: accepted drafts over accepted plus rejected ones (a step rejects at most one;
    NaN when nothing was drafted). For trees, the chance that some candidate at the current node passed."""
    accepted = sum(step.accepted for step in steps)
    rejected = sum(step.accepted < len(step.drafted) for step in steps)
    return accepted / (accepted + rejected) if accepted + rejected else float("nan")


def step_stats(token_ids: list[int], steps: list[Step], draft_calls: int, seconds: float) -> Stats:
    """A speculative generation's `Stats` from the tokens it kept and its steps, one per target call."""
    return Stats(target_calls=len(steps), draft_calls=draft_calls, acceptance_rate=acceptance_rate(steps),
                 tokens_per_step=len(token_ids) / len(steps), seconds=seconds,
                 positions_per_call=sum(1 + (step.tree_nodes or len(step.drafted)) + step.side_nodes
                                        for step in steps) / len(steps))


def finish(token_ids: list[int], eos_token_id: int | None, tokenizer=None) -> tuple[list[int], str | None]:
    """Cut after the first end-of-sequence token; decode when a tokenizer is known."""
    if eos_token_id is not None and eos_token_id in token_ids:
        token_ids = token_ids[: token_ids.index(eos_token_id) + 1]
    return token_ids, (tokenizer.decode(token_ids) if tokenizer is not None else None)


@dataclass
class BatchStats:
    target_calls: int  # batched target forward passes, the prompt's included
    draft_calls: int  # batched drafter forward passes (0 for model-free drafters)
    seconds: float  # wall time of the whole batch
    new_tokens: int  # tokens emitted over all rows
    rows_per_call: float  # rows in a target call, on average: finished rows leave the batch
    positions_per_call: float  # positions a target call fed per row after the prompt: the pending token, the
    # longest row's drafts; shorter rows are padded up to it
    wasted: float  # the share of those positions that committed nothing: padding and rejected drafts


@dataclass
class BatchGeneration:
    """One `Generation` per row of a batch, in the prompts' order, and the batch's `BatchStats`."""

    rows: list[Generation]
    stats: BatchStats

    @classmethod
    def of_one(cls, generation: Generation) -> "BatchGeneration":
        """A batch of one, decoded by the batch-of-one loop."""
        stats, steps = generation.stats, generation.steps
        fed = sum(1 + len(step.drafted) for step in steps)
        wasted = sum(len(step.drafted) - step.accepted for step in steps)
        return cls([generation], BatchStats(stats.target_calls, stats.draft_calls, stats.seconds,
                                            len(generation.token_ids), 1.0, stats.positions_per_call,
                                            wasted / fed if fed else 0.0))

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, row: int) -> Generation:
        return self.rows[row]

    def __iter__(self):
        return iter(self.rows)

    @property
    def token_ids(self) -> list[list[int]]:
        return [row.token_ids for row in self.rows]

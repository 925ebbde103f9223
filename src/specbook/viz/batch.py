"""Chapter 7: a batch's ragged KV cache, and static against continuous batching."""

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .style import COLORS, SERIES


def ragged_cache_plot(visible, prompt_columns: int, *, title: str | None = None):
    """Which columns of a batched KV cache hold each row's tokens (`specbook.ragged.RaggedCache.visible`,
    (B, L) bools): a row per sequence, a column per cache position. Hidden columns left of
    ``prompt_columns`` are padding; hidden columns after them were fed and not kept (rejected drafts, the
    filler of rows that drafted fewer). Returns the Figure."""
    visible = torch.as_tensor(visible, dtype=torch.bool).cpu().numpy()
    if visible.ndim != 2 or not visible.size:
        raise ValueError(f"visible must be a non-empty (B, L) map (got shape {visible.shape})")
    if not 0 <= prompt_columns <= visible.shape[1]:
        raise ValueError(f"prompt_columns must be in [0, {visible.shape[1]}] (got {prompt_columns})")
    kinds = np.where(visible, 2, 0)  # 0 padding, 1 fed and hidden, 2 a token of the row
    kinds[:, prompt_columns:][~visible[:, prompt_columns:]] = 1
    colours = ["#FFFFFF", COLORS["rejected"], COLORS["accepted"]]
    fig = Figure(figsize=(min(1.2 + 0.12 * visible.shape[1], 9.0), 0.9 + 0.35 * visible.shape[0]),
                 layout="constrained")
    ax = fig.subplots()
    ax.imshow(kinds, cmap=ListedColormap(colours), vmin=0, vmax=2, aspect="auto", interpolation="nearest")
    ax.set_xticks(np.arange(-0.5, visible.shape[1]), minor=True)
    ax.set_yticks(np.arange(-0.5, visible.shape[0]), minor=True)
    ax.grid(which="minor", color="#DDDDDD", linewidth=0.5)
    ax.tick_params(which="minor", length=0)
    ax.axvline(prompt_columns - 0.5, color="black", linewidth=1)
    ax.set_yticks(range(visible.shape[0]), [f"row {row}" for row in range(visible.shape[0])])
    ax.set_xlabel("cache column")
    ax.legend(handles=[Patch(facecolor=c, edgecolor="#999999", label=label) for c, label in
                       zip(colours, ["padding", "fed, not kept (hidden)", "the row's token"])],
              loc="upper center", bbox_to_anchor=(0.5, -0.25 if visible.shape[0] < 6 else -0.12), ncol=3,
              frameon=False, fontsize=8)
    if title is not None:
        ax.set_title(title)
    return fig


def batching_timeline_plot(schedules: Mapping[str, Sequence[tuple[int, float, float]]], *,
                           title: str | None = None):
    """One panel per schedule (e.g. "static", "continuous"): each request a bar on the batch slot that served
    it, from its start to its end step. ``schedules``: name -> [(slot, start, end), ...], one per request, in
    the requests' order (a request keeps its colour across panels). Returns the Figure."""
    if not schedules:
        raise ValueError("schedules must name at least one schedule")
    fig = Figure(figsize=(7.0, 1.4 + 1.3 * len(schedules)), layout="constrained")
    axes = fig.subplots(len(schedules), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (name, requests) in zip(axes, schedules.items()):
        for request, (slot, start, end) in enumerate(requests):
            if not end >= start:
                raise ValueError(f"schedules[{name!r}]: request {request} ends ({end}) before it starts ({start})")
            ax.barh(slot, end - start, left=start, color=SERIES[request % len(SERIES)], edgecolor="white")
            ax.text((start + end) / 2, slot, f"r{request}", ha="center", va="center", fontsize=7, color="white")
        finish = max(end for _, _, end in requests)
        ax.set_title(f"{name}: all done after {finish:g} steps", fontsize=9, loc="left")
        ax.set_yticks(sorted({slot for slot, _, _ in requests}))
        ax.set_ylabel("slot")
        ax.invert_yaxis()
    axes[-1].set_xlabel("decoding step")
    if title is not None:
        fig.suptitle(title)
    return fig

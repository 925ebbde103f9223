"""Chapter 6: a token tree, and its attention mask."""

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure

from ..trees import check_parents, tree_attention_mask, tree_positions
from .style import COLORS, show_whitespace


def _tree_labels(parents, labels, name: str = "labels") -> list[str]:
    """Row labels root first: "root" and the node labels (their indices by default)."""
    labels = [str(node) for node in range(len(parents))] if labels is None else [str(label) for label in labels]
    if len(labels) != len(parents):
        raise ValueError(f"{name} must have one entry per node ({len(parents)}), got {len(labels)}")
    return ["root"] + labels


def tree_plot(parents, labels: Sequence[str] | None = None, path: Sequence[int] = (), *, title: str | None = None):
    """A token tree drawn left to right: the root (the pending token), then one column per depth.

    ``parents`` as in `specbook.trees` (-1 for the root's children, parents first); ``labels``
    the nodes' tokens as text; ``path`` the accepted nodes, from the root down, drawn in the
    accepted colour with the edges that lead to them. Each node is a text box with gid "node i"
    (the root "root"), each edge a line with gid "edge i" (into node i). Returns the Figure.
    """
    parents = check_parents(parents)
    names = _tree_labels(parents, labels)
    path = list(path)
    if any(not isinstance(node, int) or not 0 <= node < len(parents) for node in path):
        raise ValueError(f"path must list node indices in [0, {len(parents)}) (got {path})")
    if [parents[node] for node in path] != ([-1] + path[:-1] if path else []):
        raise ValueError(f"path must run from the root down, each node a child of the one before (got {path})")
    depths = tree_positions(parents).tolist()  # (n + 1,) root first
    rows = {}  # each row's vertical slot: leaves in order, a parent centred on its children
    children = [[node for node, parent in enumerate(parents) if parent == row - 1] for row in range(len(parents) + 1)]

    def place(row, next_slot):
        if not children[row]:
            rows[row] = next_slot
            return next_slot + 1
        for child in children[row]:
            next_slot = place(child + 1, next_slot)
        rows[row] = float(np.mean([rows[child + 1] for child in children[row]]))
        return next_slot

    height = place(0, 0)
    fig = Figure(figsize=(1.6 * (max(depths) + 1) + 1.0, 0.45 * height + 1.0), layout="constrained")
    ax = fig.subplots()
    on_path = {0} | {node + 1 for node in path}
    for node, parent in enumerate(parents):
        color = COLORS["accepted"] if node + 1 in on_path else COLORS["rejected"]
        ax.plot([depths[parent + 1], depths[node + 1]], [rows[parent + 1], rows[node + 1]], color=color,
                linewidth=2.0 if node + 1 in on_path else 1.0, zorder=1, gid=f"edge {node}")
    for row, name in enumerate(names):
        color = "black" if row == 0 else COLORS["accepted"] if row in on_path else "white"
        ax.text(depths[row], rows[row], show_whitespace(name), ha="center", va="center", fontsize=9, zorder=2,
                color="white" if row in on_path else "black", gid="root" if row == 0 else f"node {row - 1}",
                bbox=dict(boxstyle="round,pad=0.3", facecolor=color, edgecolor="grey"))
    ax.set_xlim(-0.5, max(depths) + 0.5)
    ax.set_ylim(height - 0.5, -0.5)
    ax.set_xticks(range(max(depths) + 1), ["root"] + [f"depth {depth}" for depth in range(1, max(depths) + 1)])
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    if title is not None:
        ax.set_title(title)
    return fig


def tree_mask_plot(parents, labels: Sequence[str] | None = None, *, title: str | None = None):
    """The tree attention mask (`specbook.trees.tree_attention_mask`) as a grid, root first.

    Row i may attend to the columns drawn dark: itself and its ancestors (every row also sees
    the whole cached context, which is left out). The image's data is the boolean mask. Returns
    the Figure.
    """
    mask = tree_attention_mask(parents).numpy()  # (n + 1, n + 1)
    names = [show_whitespace(name) for name in _tree_labels(parents, labels)]
    size = 0.32 * len(names) + 1.6
    fig = Figure(figsize=(size, size), layout="constrained")
    ax = fig.subplots()
    ax.imshow(mask, cmap="Blues", vmin=-0.3, vmax=1.2, gid="mask")
    ax.set_xticks(range(len(names)), names, rotation=90, fontsize=8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_xlabel("attends to (key)")
    ax.set_ylabel("row (query)")
    ax.set_xticks(np.arange(len(names) + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(len(names) + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", linewidth=1)
    ax.tick_params(which="minor", length=0)
    if title is not None:
        ax.set_title(title)
    return fig

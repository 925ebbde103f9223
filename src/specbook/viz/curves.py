"""Curves against one x axis: the book's line plot for measured and predicted series."""

from collections.abc import Mapping

import numpy as np
from matplotlib.figure import Figure

from .style import SERIES


def curves_plot(x, curves: Mapping[str, object], *, xlabel: str, ylabel: str,
                title: str | None = None, styles: Mapping[str, str] | None = None):
    """Several named curves over the same x (e.g. simulated vs predicted), one Figure.

    styles: optional matplotlib format strings per curve name ("o-", "--", ...).
    """
    fig = Figure(figsize=(5.5, 3.6), layout="constrained")
    ax = fig.subplots()
    for i, (name, values) in enumerate(curves.items()):
        style = (styles or {}).get(name, "o-")
        ax.plot(x, np.asarray(values, dtype=float), style, color=SERIES[i % len(SERIES)],
                markersize=4, label=name, gid=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(frameon=False, fontsize=8)
    return fig

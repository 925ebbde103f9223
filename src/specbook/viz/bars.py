"""Horizontal bars: a benchmark's grouped bars (chapter 5) and the split of a step's cost (chapter 1)."""

from collections.abc import Mapping

import numpy as np
from matplotlib.figure import Figure

from .style import SERIES


def cost_split_plot(rows: Mapping[str, Mapping[str, float]], *, xlabel: str = "milliseconds per step",
                    title: str | None = None):
    """Horizontal stacked bars: for each row (a setting), the time of each component (a cost).

    rows: row label -> {component: value >= 0}; components are stacked in the order they first
    appear and keep one colour across rows (a row may leave one out: it counts as 0). Returns
    the Figure.
    """
    if not rows:
        raise ValueError("rows must name at least one row")
    components = list(dict.fromkeys(name for parts in rows.values() for name in parts))
    for label, parts in rows.items():
        for name, value in parts.items():
            if not value >= 0 or not np.isfinite(value):
                raise ValueError(f"rows[{label!r}][{name!r}] must be a finite number >= 0 (got {value!r})")
    labels = list(rows)
    fig = Figure(figsize=(8.0, 0.55 * len(labels) + 1.4), layout="constrained")
    ax = fig.subplots()
    y = np.arange(len(labels))
    left = np.zeros(len(labels))
    for i, name in enumerate(components):
        widths = np.array([float(rows[label].get(name, 0.0)) for label in labels])
        ax.barh(y, widths, left=left, color=SERIES[i % len(SERIES)], label=name, gid=name)
        left += widths
    return _finish_bars(fig, ax, y, labels, xlabel, title, ncols=len(components))


def grouped_bars_plot(values: Mapping[str, Mapping[str, float]], *, xlabel: str,
                      reference: float | None = None, title: str | None = None):
    """Horizontal bars, one row per item (a method) and one bar per group (a prompt set) in each row.

    values: row label -> {group: value}; groups keep one colour across rows (a row may leave one
    out). ``reference`` draws a vertical line (1 for a speedup). Returns the Figure.
    """
    if not values:
        raise ValueError("values must name at least one row")
    groups = list(dict.fromkeys(group for row in values.values() for group in row))
    for label, row in values.items():
        for group, value in row.items():
            if not np.isfinite(value):
                raise ValueError(f"values[{label!r}][{group!r}] must be a finite number (got {value!r})")
    labels = list(values)
    fig = Figure(figsize=(7.0, 0.25 * len(labels) * len(groups) + 1.6), layout="constrained")
    ax = fig.subplots()
    height = 0.8 / len(groups)
    y = np.arange(len(labels))
    for i, group in enumerate(groups):
        widths = [float(values[label].get(group, np.nan)) for label in labels]
        ax.barh(y + (i - (len(groups) - 1) / 2) * height, widths, height=height,
                color=SERIES[i % len(SERIES)], label=group, gid=group)
    if reference is not None:
        ax.axvline(reference, color="black", linewidth=0.8)
    return _finish_bars(fig, ax, y, labels, xlabel, title, ncols=len(groups))


def _finish_bars(fig, ax, y, labels, xlabel, title, ncols):
    """The shared styling of the horizontal bar charts: labels top to bottom, x grid, legend below."""
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    if title is not None:
        ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=ncols, frameon=False, fontsize=8)
    return fig

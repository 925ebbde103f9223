"""Distributions over tokens: the area-1 / area-2 picture of chapter 2 (a figure and a live chart),
distributions side by side, and chapter 1's sampling warps.
"""

from collections.abc import Mapping, Sequence

import altair as alt
import numpy as np
import torch
from matplotlib.figure import Figure

from .expressions import accepted_expression, mix_expression, rejected_expression, residual_expression
from .style import COLORS, SERIES, _as_distribution, _token_labels


def area_plot(target_probs, draft_probs, tokens: Sequence[str] | None = None, *,
              ax=None, title: str | None = None, legend: bool = True):
    """Draw q and p over the vocabulary and shade where each emitted token comes from.

    For each token x the bar of q(x) is split exactly into two shaded pieces:
    area 1, min(p(x), q(x)) (blue, gid "accepted"): drafted and accepted; the pieces total alpha.
    area 2, (q(x) - p(x))+ (orange, gid "residual"): filled by the residual; total 1 - alpha.
    The part of p above q, (p(x) - q(x))+, is hatched grey (gid "rejected"): drafted, then
    rejected; it also totals 1 - alpha, the mass that area 2 hands back to q.
    q is outlined in black, p is a dashed red line. Every bar has width 1, so a patch's area is
    its height.

    target_probs, draft_probs: 1-D probability vectors (torch or numpy) of the same length.
    tokens: optional names for the x axis. ax: draw into this matplotlib Axes instead of a new
    figure. Returns the Figure.
    """
    target = _as_distribution(target_probs, "target_probs")
    draft = _as_distribution(draft_probs, "draft_probs")
    if target.shape != draft.shape:
        raise ValueError("target_probs and draft_probs must have the same shape "
                         f"(got {target.shape} and {draft.shape})")
    labels = _token_labels(tokens, target.shape[0])
    if ax is None:
        fig = Figure(figsize=(max(5.0, 0.75 * len(labels) + 2.5), 3.6), layout="constrained")
        ax = fig.subplots()
    fig = ax.figure

    accepted = np.minimum(draft, target)  # area 1
    residual = np.clip(target - draft, 0, None)  # area 2
    rejected = np.clip(draft - target, 0, None)  # drafted, then rejected
    alpha = float(accepted.sum())
    x = np.arange(len(labels))

    ax.bar(x, accepted, width=1.0, color=COLORS["accepted"], edgecolor="none", gid="accepted",
           label=f"area 1: min(p, q), total α = {alpha:.3f}")
    ax.bar(x, residual, bottom=accepted, width=1.0, color=COLORS["residual"], edgecolor="none",
           gid="residual", label=f"area 2: (q − p)+, total 1 − α = {1 - alpha:.3f}")
    ax.bar(x, rejected, bottom=target, width=1.0, facecolor="none", hatch="///",
           edgecolor=COLORS["rejected"], linewidth=0, gid="rejected",
           label=f"rejected: (p − q)+, total 1 − α = {1 - alpha:.3f}")
    ax.bar(x, target, width=1.0, facecolor="none", edgecolor=COLORS["target"], linewidth=1.5,
           gid="target", label="q (target)")
    ax.hlines(draft, x - 0.5, x + 0.5, colors=COLORS["draft"], linestyles="--", linewidth=2,
              gid="draft", label="p (draft)")

    ax.set_xticks(x, labels)
    ax.set_xlim(-0.6, len(labels) - 0.4)
    ax.set_ylim(0, 1.12 * max(target.max(), draft.max()))
    ax.set_ylabel("probability")
    ax.set_title(title if title is not None else f"α = Σ min(p, q) = {alpha:.3f}")
    if legend:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
    return fig


def area_chart(target_probs, draft_probs, tokens: Sequence[str] | None = None, *,
               weight: float = 0.0, width: int = 360, height: int = 220) -> alt.LayerChart:
    """The area picture as a live Altair chart, with a slider that moves the draft toward q.

    The slider is the Vega-Lite parameter `mix_weight` (lambda in [0, 1]); the chart draws
    p_lambda = (1 - lambda) p + lambda q against q, shading min(p_lambda, q) (area 1) and
    (q - p_lambda)+ (area 2), with the part of p_lambda above q in grey and
    alpha = sum min(p_lambda, q) written above the plot. Everything is computed in the browser
    by the expressions built by `mix_expression`, `accepted_expression`, `residual_expression`
    and `rejected_expression`.
    """
    target = _as_distribution(target_probs, "target_probs")
    draft = _as_distribution(draft_probs, "draft_probs")
    if target.shape != draft.shape:
        raise ValueError("target_probs and draft_probs must have the same shape "
                         f"(got {target.shape} and {draft.shape})")
    if not 0 <= weight <= 1:
        raise ValueError(f"weight must be in [0, 1] (got {weight:g})")
    labels = _token_labels(tokens, target.shape[0])
    rows = [{"token": label, "order": i, "draft": float(d), "target": float(t)}
            for i, (label, d, t) in enumerate(zip(labels, draft, target))]

    mix_weight = alt.param(name="mix_weight", value=weight, bind=alt.binding_range(
        min=0, max=1, step=0.01, name="λ (p_λ = (1 − λ) p + λ q) "))
    base = alt.Chart().transform_calculate(
        mixed=mix_expression("datum.draft", "datum.target", "mix_weight"),
    ).transform_calculate(
        accepted=accepted_expression("datum.mixed", "datum.target"),
        residual=residual_expression("datum.mixed", "datum.target"),
        rejected=rejected_expression("datum.mixed", "datum.target"),
    ).transform_calculate(
        zero="0",
        accepted_top="datum.accepted + datum.residual",
        rejected_top="datum.target + datum.rejected",
    )
    x = alt.X("token:N", sort=labels, title=None, axis=alt.Axis(labelAngle=0))
    y_scale = alt.Scale(domain=[0, round(1.1 * float(max(target.max(), draft.max())), 3)])
    names = ["area 1: min(p_λ, q)", "area 2: (q − p_λ)+", "rejected: (p_λ − q)+"]
    pieces = dict(zip(names, (COLORS["accepted"], COLORS["residual"], COLORS["rejected"])))
    color_scale = alt.Scale(domain=list(pieces), range=list(pieces.values()))

    def piece(name, low, high):
        return base.transform_calculate(piece=f"'{name}'").mark_bar(
            opacity=0.9 if "rejected" not in name else 0.5).encode(
            x=x, y=alt.Y(f"{low}:Q", title="probability", scale=y_scale), y2=f"{high}:Q",
            color=alt.Color("piece:N", scale=color_scale, title=None,
                            legend=alt.Legend(orient="bottom", direction="horizontal")),
            tooltip=["token:N", alt.Tooltip("target:Q", title="q", format=".3f"),
                     alt.Tooltip("mixed:Q", title="p_λ", format=".3f")])

    accepted = piece(names[0], "zero", "accepted")
    residual = piece(names[1], "accepted", "accepted_top")
    rejected = piece(names[2], "target", "rejected_top")
    target_outline = base.mark_bar(fill=None, stroke=COLORS["target"], strokeWidth=1.5).encode(
        x=x, y=alt.Y("target:Q", scale=y_scale))
    draft_line = base.mark_tick(color=COLORS["draft"], thickness=3, opacity=1,
                                size=0.9 * width / len(labels)).encode(
        x=x, y=alt.Y("mixed:Q", scale=y_scale))
    alpha_text = base.transform_aggregate(alpha="sum(accepted)").transform_calculate(
        label="'α = Σ min(p_λ, q) = ' + format(datum.alpha, '.3f') + "
              "',   1 − α = ' + format(1 - datum.alpha, '.3f')",
    ).mark_text(align="left", baseline="bottom", fontSize=13).encode(
        text="label:N", x=alt.value(0), y=alt.value(-6))
    return alt.layer(accepted, residual, rejected, target_outline, draft_line, alpha_text,
                     data=alt.Data(values=rows)).add_params(mix_weight).properties(
        width=width, height=height,
        title=alt.Title("q (black outline) and p_λ (red line)", anchor="start", offset=22),
        description="Area 1 and area 2: the target q and a draft p_λ mixed toward q by a "
                    "slider; min(p_λ, q) and (q − p_λ)+ shaded, α written above.")


def distributions_plot(distributions: Mapping[str, object], tokens: Sequence[str] | None = None,
                       *, ax=None, title: str | None = None, ylabel: str = "probability"):
    """Grouped bars of several distributions over the same vocabulary (e.g. exact vs empirical).

    distributions: name -> 1-D vector (torch or numpy; need not be normalised, e.g. counts
    divided by runs). Returns the Figure.
    """
    if not distributions:
        raise ValueError("distributions must name at least one distribution")
    arrays = {name: np.asarray(torch.as_tensor(values, dtype=torch.float64))
              for name, values in distributions.items()}
    sizes = {array.shape for array in arrays.values()}
    if len(sizes) != 1 or len(next(iter(sizes))) != 1:
        raise ValueError(f"distributions must be 1-D vectors of one length (got shapes {sizes})")
    labels = _token_labels(tokens, next(iter(sizes))[0])
    if ax is None:
        fig = Figure(figsize=(max(5.0, 0.6 * len(labels) * len(arrays) / 2 + 2.5), 3.2),
                     layout="constrained")
        ax = fig.subplots()
    x = np.arange(len(labels))
    width = 0.8 / len(arrays)
    for i, (name, values) in enumerate(arrays.items()):
        ax.bar(x - 0.4 + width * (i + 0.5), values, width=width, label=name,
               color=SERIES[i % len(SERIES)], gid=name)
    ax.set_xticks(x, labels)
    ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title)
    ax.legend(frameon=False, fontsize=8)
    return ax.figure


def warps_plot(distributions: Mapping[str, object], tokens: Sequence[str], *, ncols: int = 3,
               ymax: float | None = None, ylabel: str = "probability"):
    """One panel per distribution over the same few tokens: one next-token distribution, several warps.

    distributions: panel title -> 1-D vector (torch or numpy) over ``tokens``, e.g. the 15 most
    likely tokens of the unwarped distribution. The vectors need not sum to 1 (the rest of the
    vocabulary is not shown). The panels share their axes, so the warps compare bar for bar.
    ymax: the top of the shared y axis; a bar that reaches above it (greedy's 1.0, say) is cut
    there and labelled with its height, so one tall bar does not flatten every other panel.
    Returns the Figure.
    """
    if not distributions:
        raise ValueError("distributions must name at least one distribution")
    if not isinstance(ncols, (int, np.integer)) or ncols < 1:
        raise ValueError(f"ncols must be an integer >= 1 (got {ncols!r})")
    arrays = {name: np.asarray(torch.as_tensor(values, dtype=torch.float64))
              for name, values in distributions.items()}
    labels = [str(token) for token in tokens]
    for name, array in arrays.items():
        if array.shape != (len(labels),):
            raise ValueError(f"distributions[{name!r}] must be a 1-D vector with one entry per token "
                             f"({len(labels)} tokens; got shape {array.shape})")
        if (array < 0).any() or not np.isfinite(array).all():
            raise ValueError(f"distributions[{name!r}] must hold finite probabilities >= 0")
    if ymax is not None and not (isinstance(ymax, (int, float)) and ymax > 0):
        raise ValueError(f"ymax must be a number > 0 or None (got {ymax!r})")
    ncols = min(ncols, len(arrays))
    nrows = -(-len(arrays) // ncols)
    fig = Figure(figsize=(4.2 * ncols, 2.9 * nrows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False)).ravel()
    x = np.arange(len(labels))
    for i, (ax, (name, values)) in enumerate(zip(axes, arrays.items())):
        ax.bar(x, values, color=SERIES[i % len(SERIES)], gid=name)
        ax.set_title(name, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        if ymax is not None:
            ax.set_ylim(0, ymax)
            for position in np.flatnonzero(values > ymax):
                ax.annotate(f"{values[position]:.2f} ↑", (x[position], ymax), xytext=(3, -12),
                            textcoords="offset points", fontsize=8, gid=f"{name}: cut")
    for ax in axes[len(arrays):]:
        ax.set_visible(False)
    for ax in axes[:len(arrays)]:
        ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=8)
        ax.tick_params(labelbottom=True)
    for row in range(nrows):
        axes[row * ncols].set_ylabel(ylabel)
    return fig

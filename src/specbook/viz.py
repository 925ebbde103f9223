"""The book's figures: small functions that return a matplotlib Figure or an Altair chart.

Matplotlib figures are built on `matplotlib.figure.Figure`, not on pyplot, so no function here
touches global state: a notebook shows a figure by making it the last expression of a cell (or
with `display(fig)`), and nothing is drawn twice.

The Altair charts stay live in the static HTML book: their sliders are Vega-Lite parameters and
every formula is a Vega expression evaluated in the reader's browser. Each expression is built
by one Python helper below (`tokens_per_step_expression`, `speedup_expression`, ...), so the
formula exists once; the tests evaluate those strings and compare them with `specbook.theory`
and `specbook.rejection`.

Notation as everywhere in the book: q is the target distribution, p the draft's, K the draft
length, alpha the acceptance rate, c the draft's cost per token relative to the target's.
"""

from collections.abc import Mapping, Sequence

import altair as alt
import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.ticker import ScalarFormatter

from specbook import theory
from specbook.rejection import check_distribution

# One palette for the whole book: accepted / residual (corrected) / rejected / target / draft.
COLORS = {
    "accepted": "#4C78A8",  # area 1: min(p, q)
    "residual": "#F58518",  # area 2: (q - p)+
    "rejected": "#B0B0B0",  # (p - q)+: drafted, then rejected
    "target": "#000000",
    "draft": "#E45756",
}
SERIES = ["#4C78A8", "#F58518", "#54A24B", "#B279A2", "#E45756", "#72B7B2", "#9D755D"]


# --------------------------------------------------------------------------------------------
# Vega expressions: the formulas the live charts evaluate in the browser, written once here.
# Arguments are Vega expression strings (a parameter name, a `datum.field`, or a number).
# --------------------------------------------------------------------------------------------

def tokens_per_step_expression(alpha: str, k: str) -> str:
    """Vega expression for expected tokens per target call, (1 - alpha^(K+1)) / (1 - alpha).

    Equals `specbook.theory.expected_tokens_per_step`; at alpha = 1 the closed form is 0/0 and
    the expression returns the limit K + 1, as theory does.
    """
    return f"if(({alpha}) == 1, ({k}) + 1, (1 - pow({alpha}, ({k}) + 1)) / (1 - ({alpha})))"


def speedup_expression(alpha: str, k: str, cost_ratio: str) -> str:
    """Vega expression for the wall-time speedup E / (c K + 1), as `specbook.theory.speedup`."""
    return f"({tokens_per_step_expression(alpha, k)}) / (({cost_ratio}) * ({k}) + 1)"


def mix_expression(draft: str, target: str, weight: str) -> str:
    """Vega expression for the mixed draft p_lambda = (1 - lambda) p + lambda q at one token."""
    return f"(1 - ({weight})) * ({draft}) + ({weight}) * ({target})"


def accepted_expression(draft: str, target: str) -> str:
    """Vega expression for min(p, q) at one token: area 1, the mass accepted straight away."""
    return f"min({draft}, {target})"


def residual_expression(draft: str, target: str) -> str:
    """Vega expression for (q - p)+ at one token: area 2, the mass the residual fills."""
    return f"max(({target}) - ({draft}), 0)"


def rejected_expression(draft: str, target: str) -> str:
    """Vega expression for (p - q)+ at one token: the draft mass that gets rejected."""
    return f"max(({draft}) - ({target}), 0)"


# --------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------

def _as_distribution(probs, name: str) -> np.ndarray:
    """A 1-D probability vector as float64 numpy, or ValueError naming the argument."""
    tensor = torch.as_tensor(probs, dtype=torch.float64)
    if tensor.ndim != 1:
        raise ValueError(f"{name} must be a 1-D probability vector (got shape {tuple(tensor.shape)})")
    check_distribution(tensor, name)
    return tensor.numpy()


def _token_labels(tokens, vocab: int) -> list[str]:
    """Token labels for the x axis: the given names, or the token ids."""
    if tokens is None:
        return [str(i) for i in range(vocab)]
    labels = [str(token) for token in tokens]
    if len(labels) != vocab:
        raise ValueError(f"tokens must name every entry of the vocabulary "
                         f"(got {len(labels)} names for {vocab} entries)")
    return labels


def _as_list(values, name: str) -> list[float]:
    """A float or a sequence of floats as a non-empty list."""
    array = np.atleast_1d(np.asarray(values, dtype=float))
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name} must be a number or a non-empty 1-D sequence of numbers")
    return array.tolist()


# --------------------------------------------------------------------------------------------
# Chapter 2: the area-1 / area-2 picture
# --------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------
# Chapter 3: tokens per call, speedup, optimal K
# --------------------------------------------------------------------------------------------

def speedup_plot(alpha, cost_ratio: float, k_max: int = 12, k: int | None = None):
    """Expected tokens per target call and wall-time speedup against K, from `specbook.theory`.

    Left: E(alpha, K) = (1 - alpha^(K+1)) / (1 - alpha) with its limit 1 / (1 - alpha) dashed.
    Right: speedup E / (c K + 1) with the break-even line at 1 and the best K of each curve
    marked. alpha may be one number or a sequence (one curve each); cost_ratio is c. k, if
    given, is highlighted with a vertical line, and for a single alpha its values are written
    in the titles. Returns the Figure.
    """
    alphas = _as_list(alpha, "alpha")
    if not isinstance(k_max, (int, np.integer)) or k_max < 1:
        raise ValueError(f"k_max must be an integer >= 1 (got {k_max!r})")
    if k is not None and not (isinstance(k, (int, np.integer)) and 1 <= k <= k_max):
        raise ValueError(f"k must be an integer in [1, k_max] = [1, {k_max}] (got {k!r})")
    ks = np.arange(1, k_max + 1)
    fig = Figure(figsize=(10, 3.6), layout="constrained")
    tokens_ax, speedup_ax = fig.subplots(1, 2)
    for i, value in enumerate(alphas):
        color = SERIES[i % len(SERIES)]
        tokens = theory.expected_tokens_per_step(value, ks)
        gains = theory.speedup(value, ks, cost_ratio)
        best = theory.optimal_k(value, cost_ratio, k_max=k_max)
        tokens_ax.plot(ks, tokens, "o-", color=color, markersize=3.5, label=f"α = {value:g}",
                       gid=f"tokens α={value:g}")
        if value < 1:
            tokens_ax.axhline(1 / (1 - value), color=color, linestyle=":", linewidth=1)
        speedup_ax.plot(ks, gains, "o-", color=color, markersize=3.5, label=f"α = {value:g}",
                        gid=f"speedup α={value:g}")
        speedup_ax.plot([best], [gains[best - 1]], marker="*", markersize=13, color=color,
                        markeredgecolor="black", linestyle="none")
    speedup_ax.axhline(1, color="black", linewidth=0.8)
    tokens_ax.set_title("expected tokens per target call")
    speedup_ax.set_title(f"wall-time speedup, c = {cost_ratio:g} (★ = best K)")
    if k is not None:
        for ax in (tokens_ax, speedup_ax):
            ax.axvline(k, color="grey", linestyle="--", linewidth=1)
        if len(alphas) == 1:
            tokens_ax.set_title(f"expected tokens per target call: {theory.expected_tokens_per_step(alphas[0], k):.2f} at K = {k}")
            speedup_ax.set_title(f"speedup at K = {k}: {theory.speedup(alphas[0], k, cost_ratio):.2f}×"
                                 f"  (c = {cost_ratio:g}, ★ = best K)")
    tokens_ax.set_ylabel("tokens per target call")
    speedup_ax.set_ylabel("speedup over plain decoding")
    for ax in (tokens_ax, speedup_ax):
        ax.set_xlabel("K (draft length)")
        ax.set_xticks(ks if k_max <= 16 else ks[::max(1, k_max // 12)])
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    tokens_ax.legend(frameon=False, fontsize=8)
    return fig


def optimal_k_plot(cost_ratios, alphas=None, k_max: int = 64):
    """The best draft length and the speedup it buys, against alpha, one curve per c.

    Left: `specbook.theory.optimal_k` over alpha (log scale); right: the speedup at that K.
    Where alpha <= c no K beats plain decoding (Leviathan et al. Corollary 3.9): those stretches
    are drawn faint. Returns the Figure.
    """
    cost_ratios = _as_list(cost_ratios, "cost_ratios")
    alphas = np.round(np.linspace(0.05, 0.95, 91), 4) if alphas is None else np.asarray(alphas)
    fig = Figure(figsize=(10, 3.6), layout="constrained")
    k_ax, gain_ax = fig.subplots(1, 2)
    for i, cost_ratio in enumerate(cost_ratios):
        color = SERIES[i % len(SERIES)]
        best = np.array([theory.optimal_k(a, cost_ratio, k_max=k_max) for a in alphas])
        gains = theory.speedup(alphas, best, cost_ratio)
        useful = gains > 1
        for ax, values in ((k_ax, best), (gain_ax, gains)):
            ax.plot(alphas, np.where(useful, values, np.nan), color=color, drawstyle="steps-mid",
                    label=f"c = {cost_ratio:g}", gid=f"c={cost_ratio:g}")
            ax.plot(alphas, np.where(useful, np.nan, values), color=color, alpha=0.3,
                    drawstyle="steps-mid")
    k_ax.set_yscale("log", base=2)
    k_ax.yaxis.set_major_formatter(ScalarFormatter())
    k_ax.set_ylabel("optimal K")
    k_ax.set_title("the best draft length")
    gain_ax.axhline(1, color="black", linewidth=0.8)
    gain_ax.set_ylabel("speedup at the optimal K")
    gain_ax.set_title("the speedup it buys")
    for ax in (k_ax, gain_ax):
        ax.set_xlabel("α (acceptance rate)")
        ax.grid(alpha=0.3)
    k_ax.legend(frameon=False, fontsize=8)
    return fig


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


def speedup_chart(alpha: float = 0.8, cost_ratio: float = 0.1, k: int = 4, k_max: int = 16,
                  *, width: int = 480, height: int = 280) -> alt.LayerChart:
    """Tokens per target call and speedup against K as a live Altair chart with three sliders.

    The sliders are Vega-Lite parameters `alpha` (0..1), `cost_ratio` (c, 0..1) and `k` (the
    highlighted K, 1..k_max). The curves E = (1 - alpha^(K+1)) / (1 - alpha) and E / (c K + 1)
    are Vega expressions built by `tokens_per_step_expression` and `speedup_expression` and
    evaluated in the browser, so the chart needs no kernel. The best K (largest speedup, the
    smallest K on ties, as `specbook.theory.optimal_k`) is starred.
    """
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1] (got {alpha:g})")
    if not 0 <= cost_ratio <= 1:
        raise ValueError(f"cost_ratio must be in [0, 1] for the slider (got {cost_ratio:g})")
    if not (isinstance(k_max, (int, np.integer)) and k_max >= 1):
        raise ValueError(f"k_max must be an integer >= 1 (got {k_max!r})")
    if not (isinstance(k, (int, np.integer)) and 1 <= k <= k_max):
        raise ValueError(f"k must be an integer in [1, k_max] = [1, {k_max}] (got {k!r})")
    params = [
        alt.param(name="alpha", value=alpha, bind=alt.binding_range(
            min=0, max=1, step=0.01, name="α (acceptance rate) ")),
        alt.param(name="cost_ratio", value=cost_ratio, bind=alt.binding_range(
            min=0, max=1, step=0.01, name="c (draft cost / target cost) ")),
        alt.param(name="k", value=int(k), bind=alt.binding_range(
            min=1, max=int(k_max), step=1, name="K (draft length) ")),
    ]
    tokens_name, speedup_name = "tokens per target call", "speedup E / (cK + 1)"
    base = alt.Chart().transform_calculate(
        tokens=tokens_per_step_expression("alpha", "datum.K"),
        speedup=speedup_expression("alpha", "datum.K", "cost_ratio"),
    )
    x = alt.X("K:Q", title="K (draft length)", scale=alt.Scale(domain=[1, int(k_max)]),
              axis=alt.Axis(tickMinStep=1, format="d"))
    color_scale = alt.Scale(domain=[tokens_name, speedup_name], range=[SERIES[0], SERIES[1]])

    def curve(field, name):
        return base.transform_calculate(series=f"'{name}'").mark_line(point=True).encode(
            x=x, y=alt.Y(f"{field}:Q", title="tokens per call  /  speedup (×)"),
            color=alt.Color("series:N", scale=color_scale, title=None,
                            legend=alt.Legend(orient="top-left")),
            tooltip=[alt.Tooltip("K:Q"), alt.Tooltip(f"{field}:Q", format=".3f", title=name)])

    break_even = alt.Chart(alt.Data(values=[{"one": 1}])).mark_rule(
        color="black", strokeWidth=0.8).encode(y="one:Q")
    chosen = base.transform_filter("datum.K == k")
    k_rule = chosen.mark_rule(color="grey", strokeDash=[4, 3]).encode(x=x)
    k_label = chosen.transform_calculate(
        label="'K = ' + datum.K + ':  ' + format(datum.tokens, '.2f') + ' tokens per call,  '"
              " + format(datum.speedup, '.2f') + '× speedup'",
    ).mark_text(align="left", baseline="bottom", fontSize=12).encode(
        text="label:N", x=alt.value(0), y=alt.value(-6))
    best = base.transform_window(
        rank="row_number()", sort=[alt.SortField("speedup", order="descending"),
                                   alt.SortField("K", order="ascending")],
    ).transform_filter("datum.rank == 1")
    best_star = best.mark_point(shape="diamond", size=160, filled=True, color="black").encode(
        x=x, y="speedup:Q")
    best_label = best.transform_calculate(label="'best K = ' + datum.K").mark_text(
        align="left", dx=8, dy=-8).encode(x=x, y="speedup:Q", text="label:N")
    return alt.layer(
        curve("tokens", tokens_name), curve("speedup", speedup_name), break_even, k_rule,
        best_star, best_label, k_label,
        data=alt.Data(values=[{"K": i} for i in range(1, int(k_max) + 1)]),
    ).add_params(*params).properties(
        width=width, height=height,
        description="Expected tokens per target call and speedup against K, with sliders for "
                    "α, c and the highlighted K; the best K is marked.")


# --------------------------------------------------------------------------- the token trace

TRACE_COLOURS = {  # role -> (HTML background, ANSI colour code)
    "accepted": ("#c8e6c9", "32"),  # a draft the target kept
    "rejected": ("#ffcdd2", "31"),  # the first draft the target refused (shown struck through)
    "corrected": ("#ffe0b2", "33"),  # drawn from the residual in its place
    "bonus": ("#bbdefb", "34"),  # the free extra token after K accepted drafts
    "target": ("#eeeeee", "0"),  # a step with nothing drafted: a plain target token
}


def trace_roles(generation):
    """Every token a speculative generation touched, in order, as (token id, role) pairs.

    Drafts after a rejected one were never verified and are left out; so is anything past the
    generation's end (max_new_tokens or the end-of-sequence token).
    """
    roles = []
    for step in generation.steps:
        roles += [(token, "accepted") for token in step.drafted[: step.accepted]]
        if step.accepted < len(step.drafted):
            roles.append((step.drafted[step.accepted], "rejected"))
            roles.append((step.next_token, "corrected"))
        else:
            roles.append((step.next_token, "bonus" if step.drafted else "target"))
    kept, emitted = [], 0
    for token, role in roles:
        if emitted == len(generation.token_ids):
            break
        kept.append((token, role))
        emitted += role != "rejected"
    return kept


class TokenTrace:
    """A coloured trace of a generation: shows as HTML in a notebook, as ANSI colours in a terminal."""

    def __init__(self, generation, tokenizer):
        self.pieces = [(tokenizer.decode([token]), role) for token, role in trace_roles(generation)]

    def _repr_html_(self):
        import html

        spans = []
        for text, role in self.pieces:
            style = f"background:{TRACE_COLOURS[role][0]};" + ("text-decoration:line-through;" if role == "rejected" else "")
            shown = html.escape(text).replace("\n", "↵<br>")
            spans.append(f'<span class="specbook-{role}" title="{role}" style="{style}">{shown}</span>')
        legend = " ".join(f'<span style="background:{colour};padding:0 4px">{role}</span>'
                          for role, (colour, _) in TRACE_COLOURS.items() if role != "target")
        return (f'<div class="specbook-trace" style="font-family:monospace;white-space:pre-wrap;line-height:1.6">'
                f'{"".join(spans)}</div><div style="font-size:smaller">{legend}</div>')

    def ansi(self) -> str:
        codes = {role: ansi for role, (_, ansi) in TRACE_COLOURS.items()}
        return "".join(f"\033[{codes[role]}{';9' if role == 'rejected' else ''}m{text}\033[0m"
                       for text, role in self.pieces)

    def __str__(self):
        return "".join(f"[{text}]" if role == "rejected" else text for text, role in self.pieces)


def render_trace(generation, tokenizer, style="html"):
    """The token trace of a speculative generation: ``style="html"`` for notebooks, ``"ansi"`` for terminals."""
    if style not in ("html", "ansi"):
        raise ValueError(f"style must be 'html' or 'ansi' (got {style!r})")
    trace = TokenTrace(generation, tokenizer)
    return trace if style == "html" else trace.ansi()


# --------------------------------------------------------------------------------------------
# Chapter 1: sampling warps, the roofline, the cost of a decoding step
# --------------------------------------------------------------------------------------------

def show_whitespace(text: str) -> str:
    """A token's text with its whitespace made visible, for axis labels: " man" -> "␣man", "\\n" -> "↵"."""
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥")


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


def roofline_plot(peak_flops: float, bandwidth: float, points: Mapping[str, float] | None = None, *,
                  title: str | None = None, intensity_range: tuple[float, float] = (0.1, 1e4)):
    """The roofline: attainable FLOP/s = min(peak, intensity x bandwidth), on log-log axes.

    peak_flops in FLOP/s and bandwidth in bytes/s (plotted in TFLOP/s); points: label ->
    arithmetic intensity (FLOPs per byte moved), each marked on the roof. The ridge, where the
    two limits meet (intensity = peak / bandwidth), is the dotted line: left of it a computation
    waits for memory, right of it for arithmetic. Returns the Figure.
    """
    for name, value in (("peak_flops", peak_flops), ("bandwidth", bandwidth)):
        if not isinstance(value, (int, float)) or not value > 0 or not np.isfinite(value):
            raise ValueError(f"{name} must be a positive number (got {value!r})")
    low, high = intensity_range
    if not 0 < low < high:
        raise ValueError(f"intensity_range must be (low, high) with 0 < low < high (got {intensity_range!r})")
    points = dict(points or {})
    for label, intensity in points.items():
        if not intensity > 0:
            raise ValueError(f"points[{label!r}] must be an intensity > 0 (got {intensity!r})")
    ridge = peak_flops / bandwidth
    intensities = np.geomspace(low, high, 400)
    fig = Figure(figsize=(6.5, 4.0), layout="constrained")
    ax = fig.subplots()
    ax.loglog(intensities, np.minimum(peak_flops, intensities * bandwidth) / 1e12, color="black", gid="roof")
    ax.axvline(ridge, color="grey", linestyle=":", linewidth=1)
    ax.annotate(f"ridge: {ridge:.0f} FLOP/byte", (ridge, peak_flops / 1e12), xytext=(6, -14),
                textcoords="offset points", fontsize=8, color="grey")
    for i, (label, intensity) in enumerate(points.items()):
        attained = min(peak_flops, intensity * bandwidth) / 1e12
        shown = f"{intensity:,.0f}" if intensity >= 100 else f"{intensity:.3g}"
        ax.plot([intensity], [attained], "o", color=SERIES[i % len(SERIES)], markersize=7, gid=label,
                label=f"{label}: {shown} FLOP/byte")
    ax.set_xlabel("arithmetic intensity (FLOPs per byte moved)")
    ax.set_ylabel("attainable TFLOP/s")
    if title is not None:
        ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    if points:
        ax.legend(frameon=False, fontsize=8, loc="lower right")
    return fig


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


# --------------------------------------------------------------------------------------------
# Chapter 5: draft length over one generation, and the ablation's grouped bars
# --------------------------------------------------------------------------------------------

def _as_vector(values, name: str, length: int | None = None) -> np.ndarray:
    """A 1-D float array (None entries become NaN), of ``length`` entries when given."""
    array = np.array([np.nan if value is None else float(value) for value in values], dtype=float)
    if length is not None and len(array) != length:
        raise ValueError(f"{name} must have one entry per step ({length}), got {len(array)}")
    return array


def draft_length_plot(draft_lengths, accepted, entropies, smoothed=None, *, k_bounds=None,
                      entropy_ref: float | None = None, title: str | None = None):
    """K over one generation, under the draft's entropy: two panels that share the step axis.

    draft_lengths: the tokens drafted at each step (``len(step.drafted)``); accepted: how many
    of them the target kept (``step.accepted``); entropies: the mean entropy of the step's
    draft distributions, in nats (None for a step that drafted nothing); smoothed: optional,
    its moving average as the policy saw it (None where it had none yet). k_bounds: optional
    (gamma_min, gamma_max), drawn as dashed lines; entropy_ref: optional, the entropy at which
    K reaches gamma_min. Returns the Figure.
    """
    lengths = _as_vector(draft_lengths, "draft_lengths")
    if len(lengths) == 0:
        raise ValueError("draft_lengths must have at least one step")
    kept = _as_vector(accepted, "accepted", len(lengths))
    entropy = _as_vector(entropies, "entropies", len(lengths))
    if np.isnan(lengths).any() or (lengths < 0).any():
        raise ValueError("draft_lengths must be counts >= 0")
    if np.isnan(kept).any() or (kept < 0).any() or (kept > lengths).any():
        raise ValueError("accepted must be counts between 0 and the step's draft length")
    if (entropy[~np.isnan(entropy)] < 0).any():
        raise ValueError("entropies must be >= 0 (nats)")
    steps = np.arange(1, len(lengths) + 1)
    fig = Figure(figsize=(9.0, 4.6), layout="constrained")
    entropy_ax, k_ax = fig.subplots(2, 1, sharex=True, height_ratios=[1, 1.2])
    entropy_ax.plot(steps, entropy, "o", color=SERIES[1], markersize=3.5, gid="entropy",
                    label="draft entropy of the step")
    if smoothed is not None:
        entropy_ax.plot(steps, _as_vector(smoothed, "smoothed", len(lengths)), "-", color=SERIES[0],
                        gid="smoothed", label="moving average")
    if entropy_ref is not None:
        entropy_ax.axhline(entropy_ref, color="grey", linestyle=":", linewidth=1, gid="entropy_ref")
    entropy_ax.set_ylabel("entropy (nats)")
    entropy_ax.grid(alpha=0.3)
    entropy_ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    k_ax.bar(steps, lengths, width=0.8, color=COLORS["rejected"], gid="drafted", label="drafted (K)")
    k_ax.bar(steps, kept, width=0.8, color=COLORS["accepted"], gid="accepted", label="accepted")
    if k_bounds is not None:
        for bound in k_bounds:
            k_ax.axhline(bound, color="black", linestyle="--", linewidth=0.8)
    k_ax.set_xlabel("step (one target call each)")
    k_ax.set_ylabel("tokens")
    k_ax.grid(axis="y", alpha=0.3)
    k_ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    if title is not None:
        entropy_ax.set_title(title)
    return fig


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


# --------------------------------------------------------------------------------------------
# Chapter 6: a token tree and its attention mask
# --------------------------------------------------------------------------------------------

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
    from .trees import check_parents, tree_positions

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
    from .trees import tree_attention_mask

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

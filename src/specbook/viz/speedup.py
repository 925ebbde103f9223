"""Chapter 3: the speedup against K (a figure and a live chart with sliders for K, α and c) and the
best K against c.
"""

import altair as alt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import ScalarFormatter

from .. import theory
from .expressions import speedup_expression, tokens_per_step_expression
from .style import SERIES, _as_list


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

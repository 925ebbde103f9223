"""The book's figures: small functions that return a matplotlib Figure or an Altair chart.

Matplotlib figures are built on `matplotlib.figure.Figure`, not on pyplot, so no function here
touches global state: a notebook shows a figure by making it the last expression of a cell (or
with `display(fig)`), and nothing is drawn twice.

The Altair charts stay live in the static HTML book: their sliders are Vega-Lite parameters and
every formula is a Vega expression evaluated in the reader's browser. Each expression is built
by one Python helper in `expressions` (`tokens_per_step_expression`, `speedup_expression`, ...), so
the formula exists once; the tests evaluate those strings and compare them with `specbook.theory`
and `specbook.rejection`.

Notation as everywhere in the book: q is the target distribution, p the draft's, K the draft
length, alpha the acceptance rate, c the draft's cost per token relative to the target's.

One module a kind of figure: `distributions`, `speedup`, `curves`, `trace`, `roofline`, `bars`,
`draft_length`, `trees` and `batch`, with the colours and input checks they share in `style` and the live
charts' formulas in `expressions`. Every figure is imported here: ``from specbook.viz import area_plot``.
"""

from .style import COLORS, SERIES, show_whitespace
from .expressions import (accepted_expression, mix_expression, rejected_expression, residual_expression,
                          speedup_expression, tokens_per_step_expression)
from .distributions import area_chart, area_plot, distributions_plot, warps_plot
from .speedup import optimal_k_plot, speedup_chart, speedup_plot
from .curves import curves_plot
from .trace import TRACE_COLOURS, TokenTrace, render_trace, trace_roles
from .roofline import roofline_plot
from .bars import cost_split_plot, grouped_bars_plot
from .draft_length import draft_length_plot
from .trees import tree_mask_plot, tree_plot
from .batch import batching_timeline_plot, ragged_cache_plot

__all__ = [
    "COLORS",
    "SERIES",
    "TRACE_COLOURS",
    "TokenTrace",
    "accepted_expression",
    "area_chart",
    "area_plot",
    "batching_timeline_plot",
    "cost_split_plot",
    "curves_plot",
    "distributions_plot",
    "draft_length_plot",
    "grouped_bars_plot",
    "mix_expression",
    "optimal_k_plot",
    "ragged_cache_plot",
    "rejected_expression",
    "render_trace",
    "residual_expression",
    "roofline_plot",
    "show_whitespace",
    "speedup_chart",
    "speedup_expression",
    "speedup_plot",
    "tokens_per_step_expression",
    "trace_roles",
    "tree_mask_plot",
    "tree_plot",
    "warps_plot",
]

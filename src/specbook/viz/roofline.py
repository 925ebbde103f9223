"""Chapter 1: the roofline, and where a decoding step sits on it."""

from collections.abc import Mapping

import numpy as np
from matplotlib.figure import Figure

from .style import SERIES


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

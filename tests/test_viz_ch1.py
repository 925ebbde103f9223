"""Tests for chapter 1's figures in specbook.viz: each draws exactly the numbers it is given.

- warps_plot: one visible panel per distribution, bar heights equal to the given probabilities.
- roofline_plot: the roof is min(peak, intensity x bandwidth) and every point sits on it.
- cost_split_plot: each row's bars stack to the row's total, component by component.
Bad input gets a ValueError that names the argument.
"""

import numpy as np
import pytest
import torch

from specbook import viz


def bars(ax, gid):
    return [patch for patch in ax.patches if patch.get_gid() == gid]


def test_show_whitespace():
    assert viz.show_whitespace(" man\n\t") == "␣man↵⇥"
    assert viz.show_whitespace("ow") == "ow"


def test_warps_plot_draws_one_panel_per_distribution():
    tokens = ["␣a", "␣b", "c"]
    distributions = {"T = 1": torch.tensor([0.5, 0.3, 0.2]), "greedy": np.array([1.0, 0.0, 0.0]),
                     "top-k, k = 2": [0.625, 0.375, 0.0], "T = 2": [0.4, 0.35, 0.25]}
    fig = viz.warps_plot(distributions, tokens, ncols=3)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 4 and len(fig.axes) == 6  # a 2 x 3 grid with two empty cells hidden
    for ax, (name, values) in zip(visible, distributions.items()):
        assert ax.get_title() == name
        heights = [patch.get_height() for patch in bars(ax, name)]
        np.testing.assert_allclose(heights, np.asarray(values, dtype=float))
        assert [label.get_text() for label in ax.get_xticklabels()] == tokens


def test_warps_plot_cuts_bars_above_ymax_and_labels_them():
    fig = viz.warps_plot({"greedy": [1.0, 0.0], "T = 1": [0.3, 0.2]}, ["a", "b"], ymax=0.4)
    greedy_ax, plain_ax = fig.axes[:2]
    assert greedy_ax.get_ylim() == plain_ax.get_ylim() == pytest.approx((0, 0.4))
    labels = [text for text in greedy_ax.texts if text.get_gid() == "greedy: cut"]
    assert [text.get_text() for text in labels] == ["1.00 ↑"]
    assert not plain_ax.texts  # nothing was cut in this panel


def test_warps_plot_rejects_bad_input():
    with pytest.raises(ValueError, match="distributions"):
        viz.warps_plot({}, ["a"])
    with pytest.raises(ValueError, match=r"distributions\['x'\].*one entry per token"):
        viz.warps_plot({"x": [0.5, 0.5]}, ["a", "b", "c"])
    with pytest.raises(ValueError, match=r"distributions\['x'\].*>= 0"):
        viz.warps_plot({"x": [1.5, -0.5]}, ["a", "b"])
    with pytest.raises(ValueError, match="ncols"):
        viz.warps_plot({"x": [1.0]}, ["a"], ncols=0)
    with pytest.raises(ValueError, match="ymax"):
        viz.warps_plot({"x": [1.0]}, ["a"], ymax=0)


def test_roofline_is_the_minimum_of_the_two_limits():
    peak, bandwidth = 990e12, 3.35e12
    points = {"batch 1": 1.0, "K + 1 = 5": 5.0, "batch 1024": 1024.0}
    fig = viz.roofline_plot(peak, bandwidth, points)
    ax = fig.axes[0]
    roof = next(line for line in ax.get_lines() if line.get_gid() == "roof")
    intensity, attained = roof.get_data()
    np.testing.assert_allclose(attained, np.minimum(peak, intensity * bandwidth) / 1e12)
    for label, value in points.items():
        point = next(line for line in ax.get_lines() if line.get_gid() == label)
        np.testing.assert_allclose(point.get_ydata(), [min(peak, value * bandwidth) / 1e12])
    # below the ridge (about 296 FLOP/byte) the attained rate is bandwidth-bound, above it flat
    assert next(l for l in ax.get_lines() if l.get_gid() == "batch 1").get_ydata()[0] == pytest.approx(3.35)
    assert next(l for l in ax.get_lines() if l.get_gid() == "batch 1024").get_ydata()[0] == pytest.approx(990)


def test_roofline_rejects_bad_input():
    with pytest.raises(ValueError, match="peak_flops"):
        viz.roofline_plot(0, 1e12)
    with pytest.raises(ValueError, match="bandwidth"):
        viz.roofline_plot(1e12, -1)
    with pytest.raises(ValueError, match="intensity_range"):
        viz.roofline_plot(1e12, 1e12, intensity_range=(10, 1))
    with pytest.raises(ValueError, match=r"points\['zero'\]"):
        viz.roofline_plot(1e12, 1e12, {"zero": 0.0})


def test_cost_split_bars_stack_to_each_rows_total():
    rows = {"7B, 1 token": {"linear layers": 4.0, "attention": 0.5},
            "70B, 8 GPUs": {"linear layers": 5.2, "attention": 0.1, "all-reduce": 1.6}}
    fig = viz.cost_split_plot(rows, title="step")
    ax = fig.axes[0]
    assert ax.get_title() == "step"
    ends = {label: 0.0 for label in rows}
    for name in ("linear layers", "attention", "all-reduce"):
        patches = bars(ax, name)
        assert len(patches) == len(rows)
        for patch, (label, parts) in zip(patches, rows.items()):
            assert patch.get_x() == pytest.approx(ends[label])  # stacked on the previous component
            assert patch.get_width() == pytest.approx(parts.get(name, 0.0))
            ends[label] += patch.get_width()
    assert ends == pytest.approx({label: sum(parts.values()) for label, parts in rows.items()})


def test_cost_split_rejects_bad_input():
    with pytest.raises(ValueError, match="rows"):
        viz.cost_split_plot({})
    with pytest.raises(ValueError, match=r"rows\['a'\]\['x'\]"):
        viz.cost_split_plot({"a": {"x": -1.0}})

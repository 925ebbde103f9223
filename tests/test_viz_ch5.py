"""Tests for chapter 5's figures in specbook.viz: each draws exactly the numbers it is given.

- draft_length_plot: bars of drafted and accepted tokens per step, the step entropies and their
  moving average as lines, on two panels that share the step axis.
- grouped_bars_plot: one bar per (row, group) with the given length, one colour per group.
Bad input gets a ValueError that names the argument.
"""

import numpy as np
import pytest

from specbook import viz


def _by_gid(ax, gid):
    return [artist for artist in ax.patches + ax.lines if artist.get_gid() == gid]


def test_draft_length_plot_draws_each_step():
    drafted, accepted = [8, 6, 3, 1, 0], [8, 2, 0, 1, 0]
    entropies, smoothed = [0.1, 1.2, 2.5, 3.0, None], [None, 0.65, 1.575, 2.2875, 2.2875]
    fig = viz.draft_length_plot(drafted, accepted, entropies, smoothed, k_bounds=(1, 8), entropy_ref=2.0)
    entropy_ax, k_ax = fig.axes
    assert k_ax.get_shared_x_axes().joined(entropy_ax, k_ax)
    np.testing.assert_array_equal([bar.get_height() for bar in _by_gid(k_ax, "drafted")], drafted)
    np.testing.assert_array_equal([bar.get_height() for bar in _by_gid(k_ax, "accepted")], accepted)
    [points] = _by_gid(entropy_ax, "entropy")
    np.testing.assert_array_equal(points.get_xdata(), np.arange(1, 6))
    np.testing.assert_allclose(points.get_ydata(), [0.1, 1.2, 2.5, 3.0, np.nan])  # nothing drafted: no point
    [average] = _by_gid(entropy_ax, "smoothed")
    np.testing.assert_allclose(average.get_ydata(), [np.nan, *smoothed[1:]])
    [reference] = _by_gid(entropy_ax, "entropy_ref")
    assert reference.get_ydata()[0] == 2.0
    assert len(fig.legends) == 0 and entropy_ax.get_legend() and k_ax.get_legend()


def test_draft_length_plot_without_the_optional_parts():
    fig = viz.draft_length_plot([4], [4], [0.0])
    entropy_ax, _ = fig.axes
    assert not _by_gid(entropy_ax, "smoothed") and not _by_gid(entropy_ax, "entropy_ref")


@pytest.mark.parametrize("arguments, name", [
    (([], [], []), "draft_lengths"),
    (([4, 4], [1], [0.5, 0.5]), "accepted"),
    (([4, 4], [1, 5], [0.5, 0.5]), "accepted"),
    (([4, -1], [1, 0], [0.5, 0.5]), "draft_lengths"),
    (([4, 4], [1, 1], [0.5]), "entropies"),
    (([4, 4], [1, 1], [0.5, -0.1]), "entropies"),
])
def test_draft_length_plot_names_bad_arguments(arguments, name):
    with pytest.raises(ValueError, match=name):
        viz.draft_length_plot(*arguments)


def test_draft_length_plot_needs_one_average_per_step():
    with pytest.raises(ValueError, match="smoothed"):
        viz.draft_length_plot([4, 4], [1, 1], [0.5, 0.5], [0.5])


def test_grouped_bars_plot_draws_each_value():
    values = {"autoregressive": {"open": 1.0, "grounded": 1.0}, "prompt lookup": {"open": 1.3, "grounded": 2.6},
              "model drafter": {"grounded": 1.8}}
    fig = viz.grouped_bars_plot(values, xlabel="speedup", reference=1.0)
    [ax] = fig.axes
    open_bars, grounded_bars = _by_gid(ax, "open"), _by_gid(ax, "grounded")
    np.testing.assert_allclose([bar.get_width() for bar in grounded_bars], [1.0, 2.6, 1.8])
    np.testing.assert_allclose([bar.get_width() for bar in open_bars], [1.0, 1.3, np.nan])
    assert len({bar.get_facecolor() for bar in open_bars}) == 1
    assert open_bars[0].get_facecolor() != grounded_bars[0].get_facecolor()
    assert [label.get_text() for label in ax.get_yticklabels()] == list(values)
    [legend] = fig.legends
    assert [text.get_text() for text in legend.get_texts()] == ["open", "grounded"]


def test_grouped_bars_plot_names_bad_arguments():
    with pytest.raises(ValueError, match="values"):
        viz.grouped_bars_plot({}, xlabel="x")
    with pytest.raises(ValueError, match="values\\['a'\\]\\['open'\\]"):
        viz.grouped_bars_plot({"a": {"open": float("nan")}}, xlabel="x")

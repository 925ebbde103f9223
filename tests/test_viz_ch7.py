"""Chapter 7's figures: the ragged cache and the batching timeline draw what they are given, or refuse."""

import pytest
import torch
from matplotlib.figure import Figure

from specbook.viz import batching_timeline_plot, ragged_cache_plot


def test_ragged_cache_plot_colours_padding_hidden_and_kept_columns():
    visible = torch.tensor([[0, 1, 1, 1, 0, 1], [1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    figure = ragged_cache_plot(visible, prompt_columns=3, title="t")
    assert isinstance(figure, Figure)
    image = figure.axes[0].images[0].get_array()
    assert image.tolist() == [[0, 2, 2, 2, 1, 2], [2, 2, 2, 2, 2, 1]]  # padding 0, fed and hidden 1, kept 2


@pytest.mark.parametrize("visible, columns, match", [(torch.zeros(0, 3), 0, "non-empty"),
                                                     (torch.ones(2, 3), 4, "prompt_columns")])
def test_ragged_cache_plot_refuses_bad_input(visible, columns, match):
    with pytest.raises(ValueError, match=match):
        ragged_cache_plot(visible, columns)


def test_batching_timeline_plot_has_a_panel_per_schedule():
    figure = batching_timeline_plot({"static": [(0, 0, 3), (1, 0, 1)], "continuous": [(0, 0, 3), (1, 0, 1)]})
    assert len(figure.axes) == 2 and "after 3 steps" in figure.axes[0].get_title(loc="left")
    with pytest.raises(ValueError, match="ends"):
        batching_timeline_plot({"static": [(0, 3, 1)]})

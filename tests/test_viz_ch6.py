"""Tests for chapter 6's figures in specbook.viz: the tree drawing and the tree attention mask.

Each draws exactly the tree it is given: one box per node, one edge per parent link, the accepted
path highlighted, and the mask image equal to `specbook.trees.tree_attention_mask`.
"""

import numpy as np
import pytest

from specbook import viz
from specbook.trees import TreeSpec, tree_attention_mask

PARENTS = TreeSpec.from_branching((2, 2)).parents  # [-1, -1, 0, 0, 1, 1]
LABELS = [" the", " a", " king", " queen", " man", " lord"]


def _texts(ax):
    return {text.get_gid(): text for text in ax.texts}


def test_tree_plot_draws_every_node_and_edge_and_the_path():
    fig = viz.tree_plot(PARENTS, LABELS, path=[1, 4])
    [ax] = fig.axes
    texts = _texts(ax)
    assert set(texts) == {"root"} | {f"node {i}" for i in range(6)}
    assert texts["node 2"].get_text() == "␣king"
    edges = {line.get_gid(): line for line in ax.lines}
    assert set(edges) == {f"edge {i}" for i in range(6)}
    for node, parent in enumerate(PARENTS):  # each edge joins a node to its parent, one depth apart
        x, y = edges[f"edge {node}"].get_data()
        assert x[1] - x[0] == 1
        parent_box = texts["root" if parent == -1 else f"node {parent}"]
        assert (x[0], y[0]) == parent_box.get_position()
        assert (x[1], y[1]) == texts[f"node {node}"].get_position()
    on_path = {gid for gid, text in texts.items() if text.get_bbox_patch().get_facecolor()[:3]
               == pytest.approx(tuple(int(viz.COLORS["accepted"][i:i + 2], 16) / 255 for i in (1, 3, 5)))}
    assert on_path == {"node 1", "node 4"}
    assert edges["edge 4"].get_linewidth() > edges["edge 5"].get_linewidth()


def test_tree_plot_without_a_path_highlights_only_the_root():
    texts = _texts(viz.tree_plot(PARENTS, LABELS).axes[0])
    assert all(texts[f"node {i}"].get_color() == "black" for i in range(6))


def test_tree_mask_plot_shows_the_mask():
    fig = viz.tree_mask_plot(PARENTS, LABELS)
    [image] = fig.axes[0].images
    np.testing.assert_array_equal(image.get_array(), tree_attention_mask(PARENTS).numpy())
    assert [label.get_text() for label in fig.axes[0].get_yticklabels()][:2] == ["root", "␣the"]


@pytest.mark.parametrize("call, match", [
    (lambda: viz.tree_plot([-1, 5], None), "parents: node 1 has parent 5"),
    (lambda: viz.tree_plot(PARENTS, LABELS[:3]), "labels must have one entry per node"),
    (lambda: viz.tree_plot(PARENTS, LABELS, path=[2]), "path must run from the root down"),
    (lambda: viz.tree_plot(PARENTS, LABELS, path=[0, 4]), "path must run from the root down"),
    (lambda: viz.tree_plot(PARENTS, LABELS, path=[9]), r"path must list node indices in \[0, 6\)"),
    (lambda: viz.tree_mask_plot(PARENTS, ["x"]), "labels must have one entry per node"),
])
def test_bad_input_is_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()

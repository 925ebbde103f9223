"""Numbers for the book's prose, from the cell that computed them (myst-nb's glue).

A paragraph that quotes a result writes {glue:text}`name:.2f` and a cell above it calls
``glue("name", value)``: the book's build pastes the value this run computed, so re-executing a
notebook cannot leave its prose behind. Nothing shows in the notebook itself. Where myst-nb is
not installed (a learner's Colab session runs the chapters without the book's builder) ``glue``
does nothing: only the build reads glued values.
"""

import numpy as np


def glue(name: str, value) -> None:
    """Record ``value`` under ``name`` for the book's prose; NumPy scalars become Python numbers, so that a
    format spec such as ``:.2f`` applies to them."""
    try:
        from myst_nb import glue as record
    except ImportError:
        return
    record(name, value.item() if isinstance(value, np.generic) else value, display=False)

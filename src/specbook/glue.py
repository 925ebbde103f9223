"""Numbers for the book's prose, from the cell that computed them (myst-nb's glue).

A paragraph that quotes a result writes {glue:text}`name:.2f` and a cell above it calls
``glue("name", value)``: the book's build pastes the value this run computed, so re-executing a
notebook cannot leave its prose behind. Jupyter and Colab do not render that role, so ``glue`` also
prints the value in the cell's output (``name = value``): a learner who reads the role's name in the
paragraph finds its value just above. Where myst-nb is not installed (a learner's Colab session runs
the chapters without the book's builder) only that line is written.
"""

import numpy as np


def shown(value) -> str:
    """``value`` as the cell's output shows it: four significant digits for a float, else as it prints."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def glue(name: str, value) -> None:
    """Record ``value`` under ``name`` for the book's prose and print ``name = value``; NumPy scalars become Python
    numbers, so that a format spec such as ``:.2f`` applies to them."""
    value = value.item() if isinstance(value, np.generic) else value
    print(f"{name} = {shown(value)}")
    try:
        from myst_nb import glue as record
    except ImportError:
        return
    record(name, value, display=False)

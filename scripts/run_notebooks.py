"""Execute notebooks in place, top to bottom, as `make notebooks` does.

Outputs are what the book publishes and what nbval checks, so they must come from a clean run:
no widget state (random ids that would only make noise in git and break renderers) and no
execution timestamps.
"""

import argparse
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def run(path, timeout):
    notebook = nbformat.read(path, as_version=4)
    started = time.perf_counter()
    # the widgets' state is kept while the notebook runs (nbclient's hook for an Output widget, which
    # `ipywidgets.interact` makes, looks it up) and dropped before the notebook is written
    NotebookClient(notebook, timeout=timeout, kernel_name="python3", store_widget_state=True, record_timing=False,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    notebook.metadata.pop("widgets", None)
    nbformat.write(notebook, path)
    print(f"{path}: {time.perf_counter() - started:.0f} s")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--timeout", type=int, default=1200, help="seconds per cell (default: %(default)s)")
    args = parser.parse_args()
    for path in args.notebooks:
        run(path, args.timeout)


if __name__ == "__main__":
    main()

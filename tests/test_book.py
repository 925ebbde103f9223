"""The book's apparatus: notebooks that run on Colab as committed, a table of contents that
lists them all, and figures whose HTML is deterministic and works without a kernel or a CDN.

- every notebook's first code cell installs specbook from the repository named in _config.yml
  (the launch buttons read the same URL, so the two cannot drift apart);
- every notebook has a kernelspec, was executed top to bottom in one run, and carries no widget
  state, and no widget view the book would show (the static book cannot run widgets: they would
  be empty boxes, and their state would make myst-nb load its widget manager from a CDN);
- _toc.yml lists every chapter notebook, and every page it lists exists;
- specbook.display writes the same HTML for the same chart every time, with the spec, a static
  picture, and the script that calls the book's own vegaEmbed.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
NOTEBOOKS = CHAPTERS + sorted((ROOT / "exercises").rglob("*.ipynb"))
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text())


def toc_files(node) -> list[str]:
    if isinstance(node, dict):
        found = [node["file"]] if "file" in node else []
        return found + [f for key, value in node.items() if key != "file" for f in toc_files(value)]
    if isinstance(node, list):
        return [f for item in node for f in toc_files(item)]
    return []


def toc_entries() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [toc["root"]] + toc_files(toc)


def read(path: Path):
    return nbformat.read(path, as_version=4)


def code_cells(notebook) -> list:
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def ids(paths):
    return [path.relative_to(ROOT).as_posix() for path in paths]


# --- _config.yml and _toc.yml ------------------------------------------------------------------


def test_repository_url_is_a_github_repository():
    repository = config()["repository"]
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", repository["url"]), repository["url"]
    assert repository.get("branch"), "_config.yml: repository.branch is what the Colab buttons open"


def test_toc_lists_every_chapter_notebook():
    listed = set(toc_entries())
    missing = [p.relative_to(ROOT).with_suffix("").as_posix() for p in CHAPTERS
               if p.relative_to(ROOT).with_suffix("").as_posix() not in listed]
    assert not missing, f"chapter notebooks missing from _toc.yml: {missing}"


def test_every_toc_entry_exists():
    absent = [entry for entry in toc_entries()
              if not any((ROOT / f"{entry}{suffix}").exists() for suffix in (".md", ".ipynb"))]
    assert not absent, f"_toc.yml lists pages that do not exist: {absent}"


# --- Notebooks ---------------------------------------------------------------------------------


def installed_url(source: str) -> str | None:
    """The repository a setup cell pip-installs specbook from, without .git or @ref."""
    match = re.search(r"specbook\s*@\s*git\+(https://[^\s\"'@]+?)(?:\.git)?(?:@([^\s\"']+))?[\"'\s]", source + " ")
    return match.group(1) if match else None


def test_installed_url_parser():
    url = "https://github.com/specbook/specbook"
    assert installed_url(f'%pip install "specbook @ git+{url}"') == url
    assert installed_url(f"!pip install -q 'specbook @ git+{url}.git@main'") == url
    assert installed_url(f"%pip install specbook @ git+{url}") == url
    assert installed_url("%pip install specbook") is None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_first_code_cell_installs_specbook_from_the_book_repository(path):
    cells = code_cells(read(path))
    assert cells, "no code cell"
    source = cells[0].source
    url = config()["repository"]["url"].removesuffix(".git")
    assert installed_url(source) == url, (
        f"the first code cell must `%pip install \"specbook @ git+{url}\"` (the URL in _config.yml); "
        f"found:\n{source}")
    assert re.search(r"find_spec\(\s*[\"']specbook[\"']\s*\)|except\s+(ImportError|ModuleNotFoundError)", source), (
        "the setup cell must install specbook only when it is missing (importlib.util.find_spec or "
        "try/except ImportError), so that a local run uses the checkout")


def test_the_package_ships_the_recorded_runs_the_notebooks_read():
    """On Colab the package is installed and the repository is not: results/ travels inside it, as specbook/results
    (a link in src/, package data in pyproject.toml), so every run a notebook reads is found from any folder."""
    import tomllib

    from specbook.bench import RESULTS

    link = ROOT / "src" / "specbook" / "results"
    assert link.is_symlink() and link.resolve() == (ROOT / "results").resolve()
    assert "results/*" in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "specbook"]
    names = {name for path in NOTEBOOKS for cell in code_cells(read(path))
             for name in re.findall(r'read_recorded\(\s*"([^"]+)"\s*\)', cell.source)}  # the required ones
    assert names and all((RESULTS / name).exists() for name in names), names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_notebook_has_a_kernelspec(path):
    kernelspec = read(path).metadata.get("kernelspec", {})
    assert kernelspec.get("name") and kernelspec.get("display_name"), f"kernelspec: {kernelspec}"
    assert kernelspec.get("language", "python") == "python"


def execution_problem(notebook) -> str | None:
    """Why the notebook's execution counts do not say "one run, top to bottom", or None."""
    counts = [cell.get("execution_count") for cell in code_cells(notebook) if cell.source.strip()]
    if counts != list(range(1, len(counts) + 1)):
        return f"execution counts {counts}"
    return None


def widget_problem(notebook) -> str | None:
    """Why the notebook's widgets would break the static book, or None."""
    if WIDGET_STATE in notebook.metadata.get("widgets", {}):
        return "stale widget state in the notebook's metadata"
    shown = sorted({i for i, cell in enumerate(notebook.cells) if cell.cell_type == "code"
                    and not {"remove-output", "remove-cell"} & set(cell.metadata.get("tags", []))
                    for output in cell.get("outputs", []) if WIDGET_VIEW in output.get("data", {})})
    return f"cells {shown} show widgets" if shown else None


def synthetic_notebook(counts=(1, 2), widget_tags=None, widget_state=False):
    notebook = nbformat.v4.new_notebook()
    for count in counts:
        notebook.cells.append(nbformat.v4.new_code_cell(f"x = {count}", execution_count=count))
    if widget_tags is not None:
        view = {WIDGET_VIEW: {"model_id": "0" * 32, "version_major": 2, "version_minor": 0},
                "text/plain": "IntSlider(value=1)"}
        notebook.cells.append(nbformat.v4.new_code_cell(
            "slider", execution_count=len(counts) + 1, metadata={"tags": widget_tags},
            outputs=[nbformat.v4.new_output("display_data", data=view)]))
    if widget_state:
        notebook.metadata["widgets"] = {WIDGET_STATE: {"state": {}, "version_major": 2, "version_minor": 0}}
    return notebook


def test_notebook_checks_can_fail():
    assert execution_problem(synthetic_notebook()) is None
    assert execution_problem(synthetic_notebook(counts=(2, 1)))
    assert execution_problem(synthetic_notebook(counts=(1, 3)))
    assert widget_problem(synthetic_notebook(widget_tags=["remove-output"])) is None
    assert widget_problem(synthetic_notebook(widget_tags=[]))
    assert widget_problem(synthetic_notebook(widget_state=True))


GLUED = re.compile(r"\{glue:text\}`([A-Za-z0-9_]+)")  # a value the book's build pastes into the prose
PRINTED = re.compile(r"^([A-Za-z0-9_]+) = ", re.MULTILINE)  # the line `specbook.glue.glue` prints for it


def unprinted_glue(notebook) -> list[str]:
    """The glued names that a markdown cell quotes but no code cell's output shows (``name = value``, printed by
    `specbook.glue.glue` in the cell that computed it, next to the paragraph): Jupyter and Colab show the role's
    name in the paragraph, not the value."""
    printed = {name for cell in code_cells(notebook) for output in cell.get("outputs", [])
               if output.get("output_type") == "stream" for name in PRINTED.findall(output.get("text", ""))}
    return [name for cell in notebook.cells if cell.cell_type == "markdown" for name in GLUED.findall(cell.source)
            if name not in printed]


def test_unprinted_glue_can_fail():
    quoted = nbformat.v4.new_markdown_cell("It took {glue:text}`seconds:.1f` s.")
    printing = nbformat.v4.new_code_cell("glue('seconds', 1.5)", outputs=[
        nbformat.v4.new_output("stream", name="stdout", text="seconds = 1.5\n")])
    silent = nbformat.v4.new_code_cell("glue('seconds', 1.5)", outputs=[])
    assert unprinted_glue(nbformat.v4.new_notebook(cells=[printing, quoted])) == []
    assert unprinted_glue(nbformat.v4.new_notebook(cells=[silent, quoted])) == ["seconds"]
    assert unprinted_glue(nbformat.v4.new_notebook(cells=[quoted])) == ["seconds"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_every_glued_value_the_prose_quotes_is_printed(path):
    missing = unprinted_glue(read(path))
    assert not missing, (f"the prose quotes {sorted(set(missing))}, which no cell's output shows: call "
                         "specbook.glue.glue in the cell that computes them, and re-execute the notebook")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_notebook_was_executed_top_to_bottom(path):
    problem = execution_problem(read(path))
    assert not problem, f"{problem}: re-run the notebook top to bottom in a fresh kernel (`make notebooks`)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_notebook_has_no_widget_the_book_would_show(path):
    problem = widget_problem(read(path))
    assert not problem, (
        f"{problem}: the static book cannot run widgets (they are empty boxes, and committed widget "
        "state makes myst-nb load its widget manager from a CDN). Clear the widget state; tag a "
        "widget cell `remove-output` (the book shows its code, Colab still runs it), or show an "
        "Altair figure with bound params, which stays live in the book")


# --- Figures (specbook.display) ----------------------------------------------------------------


@pytest.fixture(scope="module")
def chart():
    alt = pytest.importorskip("altair")
    import pandas as pd

    alpha = alt.param(name="alpha", value=0.8, bind=alt.binding_range(min=0.05, max=0.95, step=0.05))
    data = pd.DataFrame({"k": range(1, 9)})
    return (alt.Chart(data).mark_line()
            .transform_calculate(tokens="(1 - pow(alpha, datum.k + 1)) / (1 - alpha)")
            .encode(x="k:Q", y="tokens:Q").add_params(alpha)
            .properties(title="Tokens per target call </script>", width=200, height=120))


def test_display_is_the_active_altair_renderer(chart):
    import altair as alt

    from specbook import display

    display.enable(force=True)  # importing specbook.display enables it unless another is active
    assert alt.renderers.active == display.RENDERER_NAME
    bundle = chart._repr_mimebundle_()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    assert set(data) == {display.VEGALITE_MIME_TYPE, "text/html", "text/plain"}


def test_figure_html_is_deterministic_and_self_contained(chart):
    from specbook import display

    spec = chart.to_dict()
    first, second = display.chart_html(spec), display.chart_html(json.loads(json.dumps(spec)))
    assert first == second, "the same chart must give the same HTML (nbval, git)"
    element_id = display.chart_id(spec, display.DEFAULT_EMBED_OPTIONS)
    assert f'id="{element_id}"' in first
    # The title holds "</script>": the spec must survive its trip through a <script> element.
    embedded = json.loads(re.search(r'class="specbook-vega-spec">(.*?)</script>', first, re.S).group(1))
    assert embedded == spec
    picture = re.search(r'src="data:image/svg\+xml;base64,([^"]+)"', first)
    assert picture, "the figure must carry a static picture for when JavaScript cannot run"
    assert base64.b64decode(picture.group(1)).startswith(b"<svg")
    assert "vegaEmbed" in first and "data-specbook-vega-bundle" in first


def test_figure_output_is_valid_nbformat(chart):
    from specbook import display

    data, metadata = display.chart_mimebundle(chart.to_dict())
    notebook = nbformat.v4.new_notebook()
    notebook.cells.append(nbformat.v4.new_code_cell(
        "chart", execution_count=1,
        outputs=[nbformat.v4.new_output("execute_result", data=data, metadata=metadata, execution_count=1)]))
    nbformat.validate(notebook)


def test_book_loads_vega_and_mathjax_from_its_own_static_files():
    book = config()
    assert "specbook.display" in book["sphinx"]["extra_extensions"]
    mathjax_path = book["sphinx"]["config"]["mathjax_path"]
    assert "://" not in mathjax_path, "MathJax must come from the book's _static, not a CDN"
    from specbook import display

    assert (display._mathjax_source() / Path(mathjax_path).relative_to(display.MATHJAX_DIR)).is_file()

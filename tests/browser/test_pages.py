"""The built HTML book, as a reader's browser sees it (run by `make test` after the strict build).

Every page opens with no console error, no failed request, no request that leaves the book
(the test machine has no network: MathJax, Vega and fonts must come from the book's own static
files), no broken image, its math typeset and every live figure live. On chapter 3, moving the
alpha or K slider of the speedup figure must redraw it; and the checker that says so must say
"did not change" on a copy of the page whose sliders are detached from the figure, or it would
prove nothing. Screenshots of every page go to _build/screenshots/: the first screen of each, or the
whole page with SPECBOOK_FULL_SCREENSHOTS=1 (twice as slow on two cores).
"""

from __future__ import annotations

import json
import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

import pytest
import yaml

BOOK_DIR = Path(os.environ.get("SPECBOOK_BOOK_DIR", Path(__file__).resolve().parents[2]))
HTML_DIR = BOOK_DIR / "_build" / "html"
LIVE_FIGURE_PAGE = "chapters/03_how_fast.html"
SPEEDUP_SLIDERS = ("alpha", "k")  # the speedup figure's params that the test moves
DETACHED = "_detached"
TIMEOUT_MS = 20_000

FIGURES_SETTLED = """() => [...document.querySelectorAll(".specbook-vega")].every(
  (e) => ["live", "static"].includes(e.getAttribute("data-specbook-state")))"""

# Display equations wider than the text column at a laptop's width (1280 px), by the text their first 40
# characters spell: MathJax does not wrap them, so a wider one runs off the page or is cut.
WIDE_EQUATIONS = """() => [...document.querySelectorAll("mjx-container[display='true']")]
  .filter((e) => e.firstElementChild && e.firstElementChild.getBoundingClientRect().width
                 > e.parentElement.getBoundingClientRect().width + 1)
  .map((e) => (e.getAttribute("aria-label") || e.textContent).slice(0, 40))"""

BROKEN_IMAGES = """async () => {
  const images = [...document.images];
  images.forEach((image) => { image.loading = "eager"; });
  await Promise.all(images.map((image) => image.complete ? null : new Promise((done) => {
    image.addEventListener("load", done); image.addEventListener("error", done);
    setTimeout(done, 5000);
  })));
  return images.filter((image) => image.naturalWidth === 0).map((image) => image.currentSrc || image.src);
}"""


def built_pages() -> list[str]:
    """Every HTML page of the built book, as paths relative to _build/html."""
    if not HTML_DIR.is_dir():
        return ["<the book is not built: run make book-strict>"]
    skip = ("_static/", "_sources/", "_images/")
    pages = (p.relative_to(HTML_DIR).as_posix() for p in HTML_DIR.rglob("*.html"))
    return sorted(p for p in pages if not p.startswith(skip))


def book_config() -> dict:
    return yaml.safe_load((BOOK_DIR / "_config.yml").read_text())


def toc_files(node) -> list[str]:
    """Every `file:` entry in _toc.yml, in order."""
    if isinstance(node, dict):
        found = [node["file"]] if "file" in node else []
        for key, value in node.items():
            if key != "file":
                found += toc_files(value)
        return found
    if isinstance(node, list):
        return [f for item in node for f in toc_files(item)]
    return []


def chapter_notebooks() -> list[str]:
    """The toc entries that are notebooks under chapters/ ("chapters/03_how_fast")."""
    toc = yaml.safe_load((BOOK_DIR / "_toc.yml").read_text())
    entries = [toc.get("root", "")] + toc_files(toc)
    return [e for e in entries if e.startswith("chapters/") and (BOOK_DIR / f"{e}.ipynb").exists()]


# --- Visiting a page ---------------------------------------------------------------------------


@dataclass
class Visit:
    page: object
    console_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)


@contextmanager
def visit(browser, site: str, path: str, *, rewrite: Callable[[str], str] | None = None,
          block: str | None = None, wait_until: str = "networkidle"):
    """Open `path` of the served book in a fresh browser context and record what went wrong.

    Any request outside the served book is aborted and recorded: the page must work offline.
    `rewrite` edits the page's HTML on its way to the browser; requests whose URL contains
    `block` are aborted on purpose and not recorded.
    """
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    record = Visit(page=None)
    page_url = f"{site}/{path}"

    def route(route):
        url = route.request.url
        if block and block in url:
            return route.abort()
        if not url.startswith(site + "/"):
            record.failed_requests.append(f"{url} (outside the book: a page must not need the network)")
            return route.abort()
        if rewrite and url.split("?")[0].split("#")[0] == page_url:
            response = route.fetch()
            return route.fulfill(response=response, body=rewrite(response.text()))
        return route.continue_()

    context.route("**/*", route)
    page = context.new_page()
    record.page = page
    page.on("console", lambda m: record.console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda error: record.console_errors.append(f"uncaught: {error}"))
    page.on("requestfailed", lambda r: None if (block and block in r.url) else
            record.failed_requests.append(f"{r.url} ({r.failure})"))
    page.on("response", lambda r: record.failed_requests.append(f"{r.url} (HTTP {r.status})")
            if r.status >= 400 else None)
    try:
        page.goto(page_url, wait_until=wait_until, timeout=TIMEOUT_MS)
        yield record
    finally:
        context.close()


def wait_for_figures(page) -> list[str]:
    """Wait until every live-figure container has settled; return their states."""
    page.wait_for_function(FIGURES_SETTLED, timeout=TIMEOUT_MS)
    return page.locator(".specbook-vega").evaluate_all(
        "(figures) => figures.map((e) => e.getAttribute('data-specbook-state'))")


# --- The slider checker ------------------------------------------------------------------------


@dataclass
class SliderCheck:
    changed: bool
    detail: str


def figure_markup(figure) -> str:
    """What the live figure shows now: its SVG markup (or its canvas pixels)."""
    return figure.evaluate("""(root) => {
      const live = root.querySelector(".specbook-vega-live");
      if (!live) { return ""; }
      const svg = live.querySelector("svg");
      if (svg) { return svg.outerHTML; }
      const canvas = live.querySelector("canvas");
      return canvas ? canvas.toDataURL() : "";
    }""")


def find_slider(figure, param: str):
    """The range input bound to `param` (or to its detached twin) in a figure, or None."""
    names = figure.locator("input[type=range]").evaluate_all("(inputs) => inputs.map((e) => e.name)")
    for name in names:
        if name.lower() in (param.lower(), (param + DETACHED).lower()):
            return figure.locator(f'input[type=range][name="{name}"]')
    return None


def slider_changes_figure(page, figure, slider, timeout_s: float = 5.0) -> SliderCheck:
    """Move `slider` to its other end with the keyboard and report whether the figure redrew."""
    before = figure_markup(figure)
    if not before:
        return SliderCheck(False, "no live figure: nothing to compare")
    state = slider.evaluate("(e) => ({name: e.name, value: e.value, max: e.max})")
    slider.focus()
    slider.press("Home" if state["value"] == state["max"] else "End")
    moved_to = slider.input_value()
    if moved_to == state["value"]:
        return SliderCheck(False, f"the slider {state['name']} did not move")
    movement = f"{state['name']} moved from {state['value']} to {moved_to}"
    deadline = time.monotonic() + timeout_s
    while figure_markup(figure) == before:
        if time.monotonic() > deadline:
            return SliderCheck(False, f"the figure did not change when {movement}")
        page.wait_for_timeout(100)
    return SliderCheck(True, f"the figure changed when {movement}")


def detach_sliders(spec):
    """Cut every slider off its figure: each bound param keeps its value but loses its input,
    and the input now drives a new param (named with DETACHED) that nothing reads."""
    if isinstance(spec, dict):
        params = spec.get("params")
        if isinstance(params, list):
            twins = []
            for param in params:
                if isinstance(param, dict) and isinstance(param.get("bind"), dict) and "input" in param["bind"]:
                    twin = {"name": param["name"] + DETACHED, "bind": param.pop("bind")}
                    if "value" in param:
                        twin["value"] = param["value"]
                    twins.append(twin)
            params.extend(twins)
        for value in spec.values():
            detach_sliders(value)
    elif isinstance(spec, list):
        for value in spec:
            detach_sliders(value)
    return spec


SPEC_SCRIPT = re.compile(r'(<script type="application/json" class="specbook-vega-spec">)(.*?)(</script>)', re.S)


def with_detached_sliders(html: str) -> str:
    def replace(match):
        spec = detach_sliders(json.loads(match.group(2)))
        text = json.dumps(spec, separators=(",", ":"), ensure_ascii=False)
        text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
        return match.group(1) + text + match.group(3)

    rewritten, count = SPEC_SCRIPT.subn(replace, html)
    assert count, "the page has no live-figure spec to rewrite"
    return rewritten


def speedup_figure(page, param: str):
    """The first live figure on the page with a slider for `param`, and that slider."""
    for index in range(page.locator(".specbook-vega").count()):
        figure = page.locator(".specbook-vega").nth(index)
        slider = find_slider(figure, param)
        if slider is not None:
            return figure, slider
    pytest.fail(f"no live figure on the page has a slider for {param!r}")


# --- The tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", built_pages())
def test_page_works_offline(browser, site, screenshot_dir, path):
    with visit(browser, site, path) as record:
        page = record.page
        states = wait_for_figures(page)
        if page.locator(".math").count():
            page.wait_for_function("() => document.querySelector('mjx-container') !== null",
                                   timeout=TIMEOUT_MS)
            assert page.locator("mjx-merror").count() == 0, "MathJax could not typeset some math"
            page.evaluate("async () => { if (window.MathJax?.startup?.promise) await MathJax.startup.promise; }")
            wide = page.evaluate(WIDE_EQUATIONS)
            assert not wide, f"display equations wider than the page at 1280 px on {path}: {wide}"
        broken = page.evaluate(BROKEN_IMAGES)
        page.screenshot(path=str(screenshot_dir / (path.replace("/", "__").removesuffix(".html") + ".png")),
                        full_page=bool(os.environ.get("SPECBOOK_FULL_SCREENSHOTS")))
        assert not record.console_errors, f"console errors on {path}: {record.console_errors}"
        assert not record.failed_requests, f"failed requests on {path}: {record.failed_requests}"
        assert not broken, f"broken images on {path}: {broken}"
        assert all(state == "live" for state in states), f"figures not live on {path}: {states}"


COLAB_LINK = re.compile(r'href="(https://colab\.research\.google\.com/[^"]*)"')


@pytest.mark.parametrize("notebook", chapter_notebooks())
def test_colab_button_opens_this_chapter(html_dir, notebook):
    """The launch button is in the page's HTML as the theme wrote it (no script adds or changes it), so the
    built file is read directly: a browser would see the same anchor."""
    config = book_config()["repository"]
    owner_repo = urlparse(config["url"]).path.strip("/").removesuffix(".git")
    prefix = config.get("path_to_book", "").strip("/")
    notebook_path = "/".join(filter(None, [prefix, f"{notebook}.ipynb"]))
    expected = f"https://colab.research.google.com/github/{owner_repo}/blob/{config.get('branch', 'main')}/{notebook_path}"
    links = COLAB_LINK.findall((html_dir / f"{notebook}.html").read_text())
    assert links == [expected], f"Colab links on {notebook}: {links}, expected [{expected}]"


@pytest.mark.parametrize("param", SPEEDUP_SLIDERS)
def test_speedup_figure_follows_its_slider(browser, site, param):
    with visit(browser, site, LIVE_FIGURE_PAGE) as record:
        page = record.page
        wait_for_figures(page)
        figure, slider = speedup_figure(page, param)
        check = slider_changes_figure(page, figure, slider)
        assert check.changed, check.detail
        name = slider.evaluate("(e) => e.name")
        signal = figure.evaluate("(root, name) => root.specbookView.signal(name)", name)
        assert float(signal) == pytest.approx(float(slider.input_value())), "the Vega view missed the slider"
        assert not record.console_errors, record.console_errors


def test_checker_says_did_not_change_when_sliders_are_detached(browser, site):
    """The same page with every slider cut off its figure: the slider moves, the figure must not."""
    with visit(browser, site, LIVE_FIGURE_PAGE, rewrite=with_detached_sliders) as record:
        page = record.page
        wait_for_figures(page)
        figure, slider = speedup_figure(page, SPEEDUP_SLIDERS[0])
        assert slider.evaluate("(e) => e.name").endswith(DETACHED), "the rewrite did not take"
        check = slider_changes_figure(page, figure, slider)
    assert not check.changed, check.detail
    assert "did not change" in check.detail, check.detail


def test_figure_degrades_to_its_static_picture_without_vega(browser, site):
    """If the book's Vega bundle fails to load, each figure keeps its picture: never an empty box."""
    with visit(browser, site, LIVE_FIGURE_PAGE, block="vega-bundle.js") as record:
        page = record.page
        states = wait_for_figures(page)
        assert states and all(state == "static" for state in states), states
        picture = page.locator(".specbook-vega .specbook-vega-static img").first
        assert picture.is_visible()
        assert picture.evaluate("(img) => img.naturalWidth") > 0
        figure = page.locator(".specbook-vega").first
        check = slider_changes_figure(page, figure, figure.locator("input[type=range]").first)
    assert not check.changed and "no live figure" in check.detail, check.detail
    assert not record.failed_requests, f"the picture fallback must not reach for a CDN: {record.failed_requests}"

"""How the book shows Altair charts: live in Jupyter and Colab, live in the static HTML book
(no kernel, no CDN), and as a static picture wherever JavaScript cannot run.

Importing this module registers an Altair renderer named ``"specbook"`` and enables it, unless
the reader already picked another renderer. Its MIME bundle carries

- ``application/vnd.vegalite.v6+json``: the Vega-Lite spec as JSON, for frontends that render
  it natively. (Altair 6 itself writes ``application/vnd.vegalite.v6.json``, which nbformat only
  accepts as a string, and which today's JupyterLab and Colab do not render: they show the
  ``text/html`` below, as they do for Altair 6's own default renderer.)
- ``text/html``: one ``<div class="specbook-vega">`` holding a static SVG picture of the chart
  (rendered now, in Python, by vl-convert), the spec as JSON, and a short script that replaces the
  picture with the live, slider-driven chart by calling ``vegaEmbed``. In the HTML book,
  ``vegaEmbed`` comes from a bundle this module writes into the book's ``_static`` folder (see
  :func:`setup`: this module is also the book's Sphinx extension), so the page needs no network.
  Elsewhere (Colab, classic Jupyter) the script loads Vega from the jsDelivr CDN, as Altair's own
  renderer does. If the script cannot run (GitHub's notebook viewer, an untrusted notebook) or
  Vega fails, the static picture stays: never an empty box.
- ``text/plain``: a one-line description.

The output is deterministic, so nbval and git stay clean: no random element ids (the id is a
hash of the spec) and the picture is an SVG, whose text layout vl-convert computes with fonts it
ships (a PNG's pixels would change with the machine's fonts).
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from pathlib import Path
from typing import Any

import altair as alt

RENDERER_NAME = "specbook"
VEGALITE_MIME_TYPE = "application/vnd.vegalite.v6+json"

#: Where the book's copy of Vega lives, relative to the HTML output's ``_static`` folder.
VEGA_BUNDLE_PATH = "specbook/vega-bundle.js"
#: Where the book's copy of MathJax lives (the ``mathjax_path`` in ``_config.yml`` points here).
MATHJAX_DIR = "mathjax"

#: Options for vegaEmbed: SVG (crisp, and testable by its markup), no "..." actions menu.
DEFAULT_EMBED_OPTIONS: dict[str, Any] = {"renderer": "svg", "actions": False}

_CDN = "https://cdn.jsdelivr.net/npm"

# The script that makes one chart live. `root` is the chart's <div>. States, in the attribute
# data-specbook-state: "pending", then "live" (the chart replaced the picture) or "static".
_EMBED_SCRIPT = """\
(function (root) {
  "use strict";
  if (!root || root.getAttribute("data-specbook-state")) { return; }
  root.setAttribute("data-specbook-state", "pending");
  var spec = JSON.parse(root.querySelector("script.specbook-vega-spec").textContent);
  var options = JSON.parse(root.getAttribute("data-embed-options"));
  function keepPicture(error) {
    root.setAttribute("data-specbook-state", "static");
    if (error) { console.warn("specbook: showing the static picture:", error); }
  }
  function embed(vegaEmbed) {
    var target = document.createElement("div");
    target.className = "specbook-vega-live";
    root.appendChild(target);
    return vegaEmbed(target, spec, options).then(function (result) {
      root.specbookView = result.view;
      var picture = root.querySelector(".specbook-vega-static");
      if (picture) { picture.hidden = true; picture.style.display = "none"; }
      root.setAttribute("data-specbook-state", "live");
    }, function (error) { target.remove(); keepPicture(error); });
  }
  function loadScript(src) {
    return new Promise(function (resolve, reject) {
      var script = document.createElement("script");
      script.src = src; script.async = false;
      script.onload = resolve;
      script.onerror = function () { reject(new Error("could not load " + src)); };
      document.head.appendChild(script);
    });
  }
  function loadFromCdn() {
    var cdn = root.getAttribute("data-cdn");
    var paths = JSON.parse(root.getAttribute("data-cdn-paths"));
    if (typeof window.requirejs === "function" && typeof window.define === "function" && window.define.amd) {
      return new Promise(function (resolve, reject) {
        var amdPaths = {};
        Object.keys(paths).forEach(function (name) { amdPaths[name] = cdn + "/" + paths[name] + "?noext"; });
        window.requirejs.config({paths: amdPaths});
        window.requirejs(["vega-embed"], resolve, reject);
      });
    }
    if (!window.specbookVegaLoading) {
      window.specbookVegaLoading = loadScript(cdn + "/" + paths.vega)
        .then(function () { return loadScript(cdn + "/" + paths["vega-lite"]); })
        .then(function () { return loadScript(cdn + "/" + paths["vega-embed"]); })
        .then(function () { return window.vegaEmbed; });
    }
    return window.specbookVegaLoading;
  }
  function start() {
    if (typeof window.vegaEmbed === "function") { embed(window.vegaEmbed); return; }
    // In the book, Vega comes from the book's own static files, never from the network.
    if (document.querySelector("script[data-specbook-vega-bundle]")) {
      keepPicture("the book's Vega bundle did not load"); return;
    }
    loadFromCdn().then(embed, keepPicture);
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})(document.currentScript ? document.currentScript.parentElement : document.getElementById("__ID__"));
"""


def _vegalite_version(spec: dict) -> str:
    """The Vega-Lite version a spec was written for ("6.4.1"), from its ``$schema`` URL."""
    match = re.search(r"/vega-lite/v(\d+(?:\.\d+)*)\.json", str(spec.get("$schema", "")))
    return match.group(1) if match else alt.SCHEMA_VERSION.lstrip("v")


def _vl_convert_version(vegalite_version: str) -> str | None:
    """The version key vl-convert knows for ``vegalite_version`` ("6.4.1" -> "6.4"), or None."""
    import vl_convert

    known = vl_convert.get_vegalite_versions()
    major_minor = ".".join(vegalite_version.split(".")[:2])
    return major_minor if major_minor in known else None


def chart_id(spec: dict, embed_options: dict | None = None) -> str:
    """A stable element id for a chart: a hash of its spec and options, never a random id."""
    payload = json.dumps([spec, embed_options or {}], sort_keys=True, separators=(",", ":"))
    return "specbook-vega-" + hashlib.sha256(payload.encode()).hexdigest()[:12]


def static_svg(spec: dict) -> str | None:
    """The chart as an SVG picture (its params at their initial values), or None without vl-convert."""
    try:
        import vl_convert
    except ImportError:
        return None
    return vl_convert.vegalite_to_svg(spec, vl_version=_vl_convert_version(_vegalite_version(spec)))


def _json_for_script(value: Any) -> str:
    """JSON that is safe inside a <script> element (no "</script>", no "<!--")."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _describe(spec: dict) -> str:
    """A short text for the picture's alt attribute: the chart's description or title."""
    title = spec.get("description") or spec.get("title") or "chart"
    if isinstance(title, dict):
        title = title.get("text", "chart")
    if isinstance(title, list):
        title = " ".join(map(str, title))
    return str(title)


def _static_picture(spec: dict) -> str:
    svg = static_svg(spec)
    description = html.escape(_describe(spec), quote=True)
    note = (
        '<p class="specbook-vega-note"><small>A static picture of an interactive figure: its '
        "controls need JavaScript (open the book's web page, or run the notebook).</small></p>"
    )
    if svg is None:
        return f'<div class="specbook-vega-static"><p>[Figure: {description}]</p>{note}</div>'
    size = re.search(r'<svg[^>]*\bwidth="([\d.]+)"[^>]*\bheight="([\d.]+)"', svg)
    width_height = f' width="{size.group(1)}" height="{size.group(2)}"' if size else ""
    data = base64.b64encode(svg.encode()).decode()
    return (
        f'<div class="specbook-vega-static"><img alt="{description}"{width_height} '
        f'src="data:image/svg+xml;base64,{data}">{note}</div>'
    )


def chart_html(spec: dict, embed_options: dict | None = None) -> str:
    """The ``text/html`` of a chart: its static picture, its spec, and the script that makes it live."""
    options = {**DEFAULT_EMBED_OPTIONS, **(embed_options or {})}
    element_id = chart_id(spec, options)
    version = _vegalite_version(spec)
    cdn_paths = {
        "vega": f"vega@{alt.VEGA_VERSION}",
        "vega-lite": f"vega-lite@{version}",
        "vega-embed": f"vega-embed@{alt.VEGAEMBED_VERSION}",
    }
    attributes = {
        "id": element_id,
        "class": "specbook-vega",
        "data-embed-options": json.dumps(options, sort_keys=True),
        "data-cdn": _CDN,
        "data-cdn-paths": json.dumps(cdn_paths, sort_keys=True),
    }
    opening = " ".join(f'{key}="{html.escape(value, quote=True)}"' for key, value in attributes.items())
    return (
        f"<div {opening}>\n"
        f"{_static_picture(spec)}\n"
        f'<script type="application/json" class="specbook-vega-spec">{_json_for_script(spec)}</script>\n'
        f"<script>\n{_EMBED_SCRIPT.replace('__ID__', element_id)}</script>\n"
        "</div>"
    )


def chart_mimebundle(spec: dict, embed_options: dict | None = None) -> tuple[dict, dict]:
    """The renderer: the MIME bundle (and its metadata) for one Vega-Lite spec."""
    bundle = {
        VEGALITE_MIME_TYPE: spec,
        "text/html": chart_html(spec, embed_options),
        "text/plain": f"<specbook figure: {_describe(spec)}>",
    }
    return bundle, {}


def renderer(spec: dict, embed_options: dict | None = None, **_ignored: Any) -> tuple[dict, dict]:
    """Altair renderer entry point (``alt.renderers.enable("specbook")``)."""
    return chart_mimebundle(spec, embed_options)


def enable(force: bool = False) -> None:
    """Register the renderer and enable it, unless another non-default renderer is active."""
    if RENDERER_NAME not in alt.renderers.names():
        alt.renderers.register(RENDERER_NAME, renderer)
    if force or alt.renderers.active in ("default", RENDERER_NAME):
        alt.renderers.enable(RENDERER_NAME)


enable()


# --- The Sphinx side: ship Vega and MathJax inside the book ------------------------------------


def _vega_bundle_header() -> str:
    """The bundle's first line: what it contains and where it came from (also its cache key)."""
    from importlib.metadata import version

    import vl_convert

    vl_version = _vl_convert_version(alt.SCHEMA_VERSION.lstrip("v"))
    return (
        f"/*! Vega {vl_convert.get_vega_version()}, Vega-Lite {vl_version or 'latest'} and vega-embed "
        f"{vl_convert.get_vega_embed_version()} (BSD-3-Clause, University of Washington Interactive "
        "Data Lab), with their dependencies (d3 modules: ISC; the others: MIT or BSD), bundled by "
        f"vl-convert-python {version('vl-convert-python')} javascript_bundle(). https://vega.github.io */\n"
    )


def vega_bundle() -> str:
    """Vega, Vega-Lite and vega-embed as one classic script that defines ``window.vegaEmbed``.

    Built by vl-convert-python's ``javascript_bundle`` (which ships the libraries in its wheel),
    wrapped in a function so that its top-level names do not leak into the page.
    """
    import vl_convert

    bundle = vl_convert.javascript_bundle(vl_version=_vl_convert_version(alt.SCHEMA_VERSION.lstrip("v")))
    return f"{_vega_bundle_header()}(function () {{\n{bundle}\n}})();\n"


def _mathjax_source() -> Path:
    """MathJax 3.2.2's es5 folder, as shipped by the PyPI package sphinx-mathjax-offline."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution("sphinx-mathjax-offline")
    except PackageNotFoundError:
        raise RuntimeError(
            "the book ships MathJax from the package sphinx-mathjax-offline: "
            "run `make setup` (or pip install -r requirements.txt)"
        ) from None
    return Path(dist.locate_file("sphinx-mathjax-offline/static/mathjax"))


def _first_line(path: Path) -> str:
    try:
        with path.open(encoding="utf-8") as file:
            return file.readline()
    except OSError:
        return ""


def _write_if_changed(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def _install_assets(app) -> None:
    """Before any page is written: put the Vega bundle and MathJax into the output's _static."""
    if app.builder.format != "html":
        return
    from sphinx.util.fileutil import copy_asset

    static = Path(app.outdir) / "_static"
    bundle = static / VEGA_BUNDLE_PATH
    if _first_line(bundle) != _vega_bundle_header():  # else built by these versions: keep it
        _write_if_changed(bundle, vega_bundle())
    if not (static / MATHJAX_DIR / "tex-chtml.js").exists():
        copy_asset(str(_mathjax_source()), str(static / MATHJAX_DIR))


def _add_vega_to_page(app, pagename, templatename, context, doctree) -> None:
    """Load the Vega bundle only on pages that show a chart."""
    if "specbook-vega" in context.get("body", ""):
        app.add_js_file(VEGA_BUNDLE_PATH, loading_method="defer", **{"data-specbook-vega-bundle": "true"})


def _drop_duplicate_inline_scripts(app, pagename, templatename, context, doctree) -> None:
    """Write each inline script once per page.

    Sphinx 7.4 writes an inline script that an extension registered with ``add_js_file(None,
    body=...)`` twice (once as filename None, once as ""): for sphinx-thebe's, which Jupyter Book
    always loads, the second copy redeclares its ``const``s and throws a SyntaxError on every page.
    """
    scripts = context.get("script_files")
    if not isinstance(scripts, list):
        return
    seen, unique = set(), []
    for script in scripts:
        attributes = getattr(script, "attributes", None)
        if getattr(script, "filename", "x") or not attributes or "body" not in attributes:
            unique.append(script)  # a script file: Sphinx already writes each once
            continue
        key = tuple(sorted(attributes.items()))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    scripts[:] = unique


def setup(app) -> dict:
    """Sphinx extension (``sphinx: extra_extensions: [specbook.display]`` in ``_config.yml``)."""
    app.connect("builder-inited", _install_assets)
    app.connect("html-page-context", _add_vega_to_page)
    app.connect("html-page-context", _drop_duplicate_inline_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

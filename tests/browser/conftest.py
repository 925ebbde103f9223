"""Fixtures for the browser test: the built book served on loopback, and Debian's Chromium.

The book is served from ``_build/html`` (or ``$SPECBOOK_BOOK_DIR/_build/html``) by Python's own
static file server on 127.0.0.1, on a free port the OS picks; the server starts with the test
session and stops with it. Chromium is ``/usr/bin/chromium`` (``make setup`` installs it from
Debian); nothing here downloads a browser.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("SPECBOOK_CHROMIUM", "/usr/bin/chromium")
# Headless, and no background traffic: this machine has no network beyond package registries.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _book_dir() -> Path:
    return Path(os.environ.get("SPECBOOK_BOOK_DIR", Path(__file__).resolve().parents[2]))


def pytest_configure(config):
    """Clear the last run's screenshots once, before any test: in the one process of a plain run, or in
    pytest-xdist's controller (`make browser` runs two workers, each with its own browser and server, and
    a worker clearing the folder could delete the other's screenshots)."""
    if not hasattr(config, "workerinput"):
        shutil.rmtree(_book_dir() / "_build" / "screenshots", ignore_errors=True)


@pytest.fixture(scope="session")
def book_dir() -> Path:
    """The book's source folder (the repository root, unless SPECBOOK_BOOK_DIR says otherwise)."""
    return _book_dir()


@pytest.fixture(scope="session")
def html_dir(book_dir: Path) -> Path:
    html = book_dir / "_build" / "html"
    if not (html / "index.html").exists():
        pytest.fail(f"no built book in {html}: run `make book-strict` first")
    return html


@pytest.fixture(scope="session")
def screenshot_dir(book_dir: Path) -> Path:
    path = book_dir / "_build" / "screenshots"  # emptied by pytest_configure
    path.mkdir(parents=True, exist_ok=True)
    return path


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the signature is http.server's
        pass


@pytest.fixture(scope="session")
def site(html_dir: Path):
    """Base URL of the built book, served on 127.0.0.1 at a free port for this session."""
    handler = functools.partial(_QuietHandler, directory=str(html_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make setup` installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()

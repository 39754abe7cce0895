"""The documentation: the README stays short, the MkDocs site builds strictly, pages render.

`mkdocs build --strict` with mkdocs.yml's validation fails on a broken link, a stale anchor or a
page left out of the nav. The browser test serves the built site on loopback and looks at two
pages in Debian's chromium (Playwright never downloads a browser); its screenshots are kept in
var/test-artifacts/docs/ (the paths are printed).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kimi_batch_tests.support.browser import chromium, screenshot
from kimi_batch_tests.support.repo import REPO_ROOT

# Its slow tests start no llama-server: they run beside the ones that do (support/slow_split.py).
pytestmark = pytest.mark.no_llama_server

ARTIFACTS = REPO_ROOT / "var" / "test-artifacts" / "docs"
README_MAX_LINES = 150
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=config.parent,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built from the checkout, strictly."""
    built = tmp_path_factory.mktemp("docs") / "site"
    result = _build(REPO_ROOT / "mkdocs.yml", built)
    assert result.returncode == 0, result.stdout + result.stderr
    return built


def test_the_readme_is_short_and_every_link_in_it_resolves() -> None:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    links = [link for link in _LINK.findall(text) if "://" not in link]
    assert links, "the README links into the docs"
    missing = [link for link in links if not (REPO_ROOT / link).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_the_site_builds_strictly_with_every_page(site: Path) -> None:
    for page in (
        "getting-started",
        "concepts/resident-server",
        "how-to/batch-api",
        "operations/troubleshooting",
        "reference/environment",
        "reference/cli",
        "reference/tables",
        "reference/batch-api",
        "architecture",
        "deployment",
    ):
        assert (site / page / "index.html").is_file(), page
    bench = (site / "performance" / "bench" / "index.html").read_text(encoding="utf-8")
    assert "(C) engine" in bench  # the bench's own table, included
    assert (site / "bench.png").is_file()


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    shutil.copy(REPO_ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(REPO_ROOT / "docs", tmp_path / "docs")
    with (tmp_path / "docs" / "index.md").open("a", encoding="utf-8") as page:
        page.write("\n[gone](no-such-page.md)\n")

    result = _build(tmp_path / "mkdocs.yml", tmp_path / "site")

    assert result.returncode != 0
    assert "no-such-page.md" in result.stdout + result.stderr


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # the base class names it so
        """Requests are not the test's output."""


@pytest.fixture
def served(site: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_two_pages_render_in_a_real_browser(served: str) -> None:
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pages = (
        ("", "home", "kimi_batch", "resident server"),
        (
            "reference/environment/",
            "reference-environment",
            "Environment variables",
            "KIMI_BATCH_LLAMA_THREADS",
        ),
    )
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        for path, name, title, text in pages:
            page.goto(f"{served}/{path}")
            expect(page).to_have_title(re.compile(re.escape(title)))
            expect(page.locator("article h1")).to_have_text(re.compile(re.escape(title)))
            expect(page.locator("article")).to_contain_text(text)
            nav = page.locator("nav.md-nav--primary")
            expect(nav).to_be_visible()
            expect(nav).to_contain_text("Getting started")
            expect(nav).to_contain_text("Reference")
            screenshot(page, ARTIFACTS, name)

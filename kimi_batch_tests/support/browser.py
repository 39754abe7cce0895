"""Debian's chromium driven by Playwright, for the tests that look at a page as a user does.

Chromium comes from Debian (`make test` installs it with apt-get); Playwright is pointed at it
with `executable_path` and never downloads a browser. Playwright is imported when a browser is
launched, not when this module is: most sessions never open one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

__all__ = ["CHROMIUM", "chromium", "dismiss_welcome", "screenshot"]

CHROMIUM = Path("/usr/bin/chromium")


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    """A headless chromium, closed on exit."""
    from playwright.sync_api import sync_playwright

    assert CHROMIUM.exists(), "chromium missing: `make browser` (apt-get install chromium)"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            yield launched
        finally:
            launched.close()


def screenshot(page: Page, folder: Path, name: str) -> Path:
    """The whole page as `folder/name.png`; the path is printed for whoever reads the log."""
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


def dismiss_welcome(page: Page) -> None:
    """A fresh profile gets Dagster's community dialog once; skip it when it shows."""
    from playwright.sync_api import Error as PlaywrightError

    skip = page.get_by_role("button", name="Skip")
    with contextlib.suppress(PlaywrightError):  # absent on this version or already dismissed
        skip.click(timeout=5000)

"""What the real-browser tests share: Debian's Chromium through Playwright (never `playwright
install`), the skip when it is missing, and screenshots in test-artifacts/ for a human to look at.

    from tests.browser_helpers import BROWSER_MARKS, browser, shot, sync_api   # noqa: F401 (fixture)
    pytestmark = BROWSER_MARKS
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Iterator

import pytest

from studio.page.ui import BROWSER_STORAGE_KEY

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"

sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
BROWSER_MARKS = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists() or shutil.which("chromium") is None,
                       reason="Debian chromium is not installed (apt-get install -y chromium)"),
]


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def wait_for_history_token(page, timeout_ms: float = 120_000) -> None:
    """Until the page holds its browser's History token (its first load event answered with it):
    a request sent before then waits for its tab's token on the server (studio.page.tab_tokens),
    so tests that time their requests start from a page that has it."""
    page.wait_for_function(f"() => !!localStorage.getItem({BROWSER_STORAGE_KEY!r})", timeout=timeout_ms)


def shot(page, name: str, full_page: bool = True) -> None:
    """The whole page (or, `full_page=False`, what the window shows) in test-artifacts/NAME.png."""
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=full_page)


@contextlib.contextmanager
def editor_page(browser, url: str, viewport: tuple[int, int] = (1500, 1200), **context_options) -> Iterator:
    """A fresh page on the studio at `url` in a window of `viewport` (width, height) pixels, once its
    node editor has drawn its nodes; on leaving, no JavaScript error may have happened on it."""
    context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]}, **context_options)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(url)
    page.wait_for_selector("#ss-node-editor .drawflow-node")
    yield page
    context.close()
    assert errors == [], f"JavaScript errors on the page: {errors}"

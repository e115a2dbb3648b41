"""The studio in a real headless Chromium: generate with live progress, cancel, two tabs.

Needs Debian's `chromium` and the `playwright` package (never `playwright install`).
Screenshots land in test-artifacts/ for a human to look at.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from engine import Engine
from pipelines.interface import ModelDefaults
from pipelines.toy import ToyPipeline
from studio.config import StudioOptions
from studio.server import StudioServer, build_app

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
STEPS = 30
STEP_DELAY_S = 0.05

sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists() or shutil.which("chromium") is None,
                       reason="Debian chromium is not installed (apt-get install -y chromium)"),
]


@pytest.fixture(scope="module")
def studio():
    defaults = ModelDefaults(width=64, height=64, num_inference_steps=STEPS, guidance_scale=1.0,
                             example_prompts=("a red circle", "a blue square"))
    pipeline = ToyPipeline(step_delay_s=STEP_DELAY_S, defaults=defaults)
    config = StudioOptions(model="toy", port=0, preview_every=2, max_per_session=4)
    engine = Engine(pipeline, mode=config.mode, max_batch=config.max_batch, limits=config.limits).start()
    server = StudioServer(build_app(engine, config), "127.0.0.1", 0).start()
    yield server, engine, pipeline
    server.stop()
    engine.close()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def open_page(studio, browser):
    """New tab in its own browser context (= its own Gradio session)."""
    contexts = []

    def open_() -> "sync_api.Page":
        context = browser.new_context(viewport={"width": 1400, "height": 1100})
        contexts.append(context)
        page = context.new_page()
        page.goto(studio[0].url)
        page.get_by_role("tab", name="Simple").click()  # the Workflow tab is the default
        page.wait_for_selector("#ss-generate")
        page.wait_for_selector("#ss-queue table")  # the live views have ticked once
        return page

    yield open_
    for context in contexts:
        context.close()


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def status_of(page) -> dict:
    return page.eval_on_selector("#ss-status .ss-status", "el => ({...el.dataset})")


def generate(page, prompt: str) -> None:
    page.fill("#ss-prompt textarea", prompt)
    page.click("#ss-generate")


def test_generate_shows_moving_progress_then_the_image(open_page):
    page = open_page()
    generate(page, "a large red circle")
    seen_steps: list[int] = []
    gradio_bar_seen = False
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        status = status_of(page)
        if status.get("state") == "running":
            seen_steps.append(int(status["step"]))
            gradio_bar_seen = gradio_bar_seen or page.locator("#ss-progress .progress-bar").count() > 0
            if len(set(seen_steps)) == 4:
                shot(page, "browser-generate-running")
        if status.get("state") == "completed":
            break
        time.sleep(0.05)
    page.wait_for_selector("#ss-result img")
    shot(page, "browser-generate-done")
    assert status_of(page)["state"] == "completed" and status_of(page)["step"] == str(STEPS)
    distinct = sorted(set(seen_steps))
    assert len(distinct) >= 4 and seen_steps == sorted(seen_steps), seen_steps  # moves forward, step by step
    assert gradio_bar_seen, "Gradio's progress bar never appeared"
    assert page.locator("#ss-preview img").count() == 1  # a live preview arrived
    assert page.locator("#ss-gallery img").count() >= 1  # and the result joined this session's gallery
    seed = page.input_value("#ss-seed input")
    assert f"seed {seed}" in page.inner_text("#ss-status")  # the used seed is shown for reuse


def test_cancel_stops_the_running_request(open_page, studio):
    _, engine, pipeline = studio
    page = open_page()
    generate(page, "a request to cancel")
    page.wait_for_function("Number(document.querySelector('#ss-status .ss-status').dataset.step) >= 3",
                           timeout=20000)
    short_id = page.inner_text("#ss-status code")
    page.click("#ss-cancel")
    page.wait_for_function("document.querySelector('#ss-status .ss-status').dataset.state === 'aborted'",
                           timeout=5000)
    forwards_after_cancel = len(pipeline.forward_log)
    time.sleep(10 * STEP_DELAY_S)
    shot(page, "browser-cancelled")
    ours = [ids for ids in pipeline.forward_log[forwards_after_cancel:] if any(i.startswith(short_id) for i in ids)]
    assert len(ours) <= 1, "the cancelled request kept running"
    assert not [v for v in engine.snapshot().requests if v.request_id.startswith(short_id)]
    assert page.locator("#ss-result img").count() == 0  # no image for a cancelled request


def test_two_pages_see_each_other_in_the_queue(open_page):
    first, second = open_page(), open_page()
    generate(first, "first tab's prompt")
    generate(second, "second tab's prompt")
    for page in (first, second):
        page.wait_for_function("document.querySelectorAll('#ss-queue tr[data-request]').length === 2",
                               timeout=20000)
    shot(first, "browser-two-tabs-first")
    shot(second, "browser-two-tabs-second")
    for page, own, other in ((first, "first tab's prompt", "second tab's prompt"),
                             (second, "second tab's prompt", "first tab's prompt")):
        mine = page.locator("#ss-queue tr.ss-mine")
        assert mine.count() == 1 and own in mine.inner_text() and "you" in mine.inner_text()
        table = page.inner_text("#ss-queue table")
        assert other not in table and "(hidden)" in table
        assert page.locator("#ss-graph g.ss-you").count() == 1
    for page in (first, second):
        page.wait_for_function("document.querySelector('#ss-status .ss-status').dataset.state === 'completed'",
                               timeout=20000)


def test_closing_the_tab_cancels_its_request(open_page, studio):
    _, engine, pipeline = studio
    page = open_page()
    generate(page, "a tab that will be closed")
    page.wait_for_function("Number(document.querySelector('#ss-status .ss-status').dataset.step) >= 2",
                           timeout=20000)
    short_id = page.inner_text("#ss-status code")
    page.context.close()
    deadline = time.monotonic() + 10
    while any(v.request_id.startswith(short_id) for v in engine.snapshot().requests):
        assert time.monotonic() < deadline, "the closed tab's request kept running"
        time.sleep(0.05)
    ran = [ids for ids in pipeline.forward_log if any(i.startswith(short_id) for i in ids)]
    assert len(ran) < STEPS  # it ended early: aborted, not finished

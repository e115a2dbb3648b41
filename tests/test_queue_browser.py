"""The Simple tab's queue controls in a real headless Chromium: Pause holds the tab's requests
(their rows say so), a row's ⤒ moves it to the front, Resume runs them in that order, Clear ends
the queued ones. Needs Debian's `chromium` and the `playwright` package (never `playwright install`)."""

from __future__ import annotations

import pytest

from pipelines.interface import ModelDefaults
from pipelines.toy import ToyPipeline
from tests.browser_helpers import BROWSER_MARKS, browser, shot, sync_api  # noqa: F401 (browser: a fixture)
from tests.studio_helpers import live_studio, wait_for

pytestmark = BROWSER_MARKS


@pytest.fixture(scope="module")
def studio():
    defaults = ModelDefaults(width=64, height=64, num_inference_steps=4, guidance_scale=1.0)
    pipeline = ToyPipeline(defaults=defaults)
    with live_studio(pipeline, preview_every=0, max_per_session=4) as (server, engine):
        yield server, engine, pipeline


@pytest.fixture
def page(studio, browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    errors: list[str] = []
    page = context.new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(studio[0].url)
    page.get_by_role("tab", name="Simple").click()  # the Workflow tab is the default
    page.wait_for_selector("#ss-generate")
    yield page
    context.close()
    assert errors == [], f"JavaScript errors on the page: {errors}"


def rows(page) -> list[dict]:
    return page.eval_on_selector_all(
        "#ss-tab-queue .ss-job",
        "els => els.map(el => ({...el.dataset, text: el.querySelector('.ss-job-state').textContent}))")


def wait_rows(page, condition: str) -> None:
    page.wait_for_function(
        "() => { const rows = [...document.querySelectorAll('#ss-tab-queue .ss-job')].map(el => "
        f"({{...el.dataset, text: el.querySelector('.ss-job-state').textContent}})); return {condition}; }}",
        timeout=30000)


def generate(page, prompt: str) -> None:
    page.fill("#ss-prompt textarea", prompt)
    page.click("#ss-generate")


def test_pause_move_to_front_resume_and_clear_from_the_simple_tab(page, studio):
    _, engine, pipeline = studio
    page.click("#ss-pause-queue")
    page.wait_for_function("() => document.querySelector('#ss-queue-note').textContent.includes('your queue is paused')"
                           " || document.querySelector('#ss-queue-note').textContent.includes('Your queue is paused')")
    generate(page, "first")
    wait_rows(page, "rows.length === 1 && rows[0].request !== '' && rows[0].text.includes('paused')")
    generate(page, "second")
    wait_rows(page, "rows.length === 2 && rows.every(r => r.request !== '' && r.text.includes(\"paused (this tab's queue)\"))")
    first, second = (row["request"] for row in rows(page))
    assert [row["state"] for row in rows(page)] == ["queued", "queued"]
    assert first not in pipeline.encoded and second not in pipeline.encoded
    shot(page, "queue-paused")
    # ⤒ on the second row: it goes first in the tab's queue.
    page.click(f'#ss-tab-queue .ss-job[data-request="{second}"] .ss-job-front')
    wait_for(lambda: [v.request_id for v in engine.snapshot().waiting if v.request_id in (first, second)] == [second, first],
             what="the second request first in the engine's queue")
    page.click("#ss-resume-queue")
    wait_rows(page, "rows.length === 2 && rows.every(r => r.state === 'completed')")
    assert pipeline.encoded.index(second) < pipeline.encoded.index(first)
    # Paused again, one more request, then Clear: it ends without a step.
    page.click("#ss-pause-queue")
    page.wait_for_function("() => document.querySelector('#ss-queue-note').textContent.includes('paused')")
    generate(page, "third")
    wait_rows(page, "rows.length === 3 && rows[2].request !== '' && rows[2].text.includes('paused')")
    third = rows(page)[2]["request"]
    page.click("#ss-clear-queue")
    wait_rows(page, "rows.length === 3 && rows[2].state === 'aborted'")
    assert "Cleared 1 queued request" in page.text_content("#ss-queue-note")
    assert third not in pipeline.encoded and not [f for f in pipeline.forward_log if third in f]
    shot(page, "queue-cleared")
    page.click("#ss-resume-queue")


def test_the_editors_pause_holds_a_run_and_resume_finishes_it(studio, browser):
    _, engine, pipeline = studio
    context = browser.new_context(viewport={"width": 1500, "height": 1200})
    errors: list[str] = []
    page = context.new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(studio[0].url)
        page.wait_for_selector("#ss-node-editor .drawflow-node")  # the editor is the default tab
        page.click("#sse-pause-queue")
        page.wait_for_function("() => document.querySelector('#sse-queue-note').textContent.includes('paused')")
        forwards = len(pipeline.forward_log)
        page.click("[data-action='run']")
        page.wait_for_function("() => [...document.querySelectorAll('.sse-branch .sse-branch-step')]"
                               ".some(el => el.textContent === 'paused')", timeout=30000)
        assert len(pipeline.forward_log) == forwards  # nothing of the run has started
        assert engine.snapshot().waiting and all(v.paused == "session" for v in engine.snapshot().waiting)
        shot(page, "editor-paused")
        page.click("#sse-resume-queue")
        page.wait_for_selector(".sse-root[data-run-state='completed']", timeout=30000)
        assert len(pipeline.forward_log) > forwards
    finally:
        context.close()
    assert errors == [], f"JavaScript errors on the page: {errors}"

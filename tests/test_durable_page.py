"""The page across a crash, in Chromium: a Simple-tab batch queued in a real `python app.py`, the
process killed mid-run, started again on the same folder and port: the returning browser reads
"The studio restarted; 3 of your requests were resumed.", its tab's queue buttons pause and resume
the resumed work, and its History holds all 4 results, once."""

from __future__ import annotations

import signal
import socket

import httpx

from tests.browser_helpers import (  # noqa: F401 (fixture)
    BROWSER_MARKS,
    browser,
    shot,
    sync_api,
    wait_for_history_token,
)
from tests.studio_helpers import START_TIMEOUT_S
from tests.test_durable_restart import count, rows
from tests.test_http_api import wait_until
from tests.test_reliability_app import app_process

pytestmark = BROWSER_MARKS

STEPS = 10
SEED = 500
ADMIN_KEY = "operator-key-for-the-test"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def open_simple_tab(context, url: str):
    """The page at `url` on its Simple tab, once it holds its History token: a request sent before
    the page's first load event has answered with the token is filed under the tab's session, not
    the browser, and no later page of this browser would be told of it."""
    page = context.new_page()
    page.set_default_timeout(120_000)  # each wait is for one event of a real studio, on a machine maybe loaded
    page.goto(url)
    page.get_by_role("tab", name="Simple").click()
    page.wait_for_selector("#ss-generate")
    wait_for_history_token(page, timeout_ms=START_TIMEOUT_S * 1000)
    return page


def test_a_returning_browser_is_told_what_was_resumed_and_finds_every_result(browser, tmp_path):
    outputs = tmp_path / "outputs"
    database = outputs / "studio.db"
    port = str(free_port())  # the same origin after the restart: the browser keeps its History token
    studio_args = ("--port", port, "--outputs", str(outputs), "--max-steps", str(STEPS), "--max-per-session", "1")
    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    try:
        with app_process(*studio_args, step_delay_s=0.2) as first:
            url = first.url()
            page = open_simple_tab(context, url)
            page.uncheck("#ss-random-seed input")
            page.fill("#ss-seed input", str(SEED))
            page.fill("#ss-steps input[type=number]", str(STEPS))
            page.press("#ss-steps input[type=number]", "Enter")
            page.fill("#ss-batch-count input[type=number]", "4")
            page.press("#ss-batch-count input[type=number]", "Enter")
            page.fill("#ss-prompt textarea", "a batch that outlives its process")
            page.click("#ss-generate")
            wait_until(lambda: count(database, "workflow_branches") == 1, timeout=300, what="the first result")
            first.process.send_signal(signal.SIGKILL)
            first.process.wait(60)
            # The browser returns with a new tab: a tab left open reconnects to the restarted studio
            # on the same port, runs the page's load events again and would be told first (each
            # owner is told once), so whichever tab got there first would read the notice.
            page.close()
        assert count(database, "workflow_runs") == 1 and count(database, "history") == 1

        # Started paused by its operator, so the returning tab acts on the resumed work before any of it runs.
        with app_process(*studio_args, "--start-paused", "--admin-key", ADMIN_KEY, step_delay_s=0.01) as second:
            url = second.url()
            page = open_simple_tab(context, url)
            banner = page.locator("#ss-restart-banner")
            banner.wait_for(state="visible", timeout=120_000)
            assert banner.inner_text().startswith("The studio restarted; 3 of your requests were resumed.")
            # The resumed request runs in the session of the tab that is gone; this tab adopted it: "you".
            mine = page.locator("#ss-queue tr.ss-mine")
            mine.filter(has_text="resumed after restart").first.wait_for()
            # ... and the Simple tab's own queue lists the batch: 3 requests to run again, and the one
            # that had finished before the stop.
            tab_states = "[...document.querySelectorAll('#ss-tab-queue .ss-job')].map(el => el.dataset.state)"
            page.wait_for_function(f"{tab_states}.length === 4", timeout=60_000)
            assert page.evaluate(tab_states) == ["completed", "queued", "waiting", "waiting"]  # nothing runs yet
            page.click("#ss-pause-queue")
            page.locator("#ss-queue-note").filter(has_text="Your queue is paused").wait_for()
            resumed = httpx.post(url + "v1/admin/resume", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, json={})
            assert resumed.status_code == 200, resumed.text
            mine.filter(has_text="paused: its queue is paused").first.wait_for()
            assert "paused by the operator" not in page.locator("#ss-queue").inner_text()
            assert count(database, "history") == 1  # paused before the operator resumed: nothing of it ran
            shot(page, "browser-restart-paused")
            page.click("#ss-resume-queue")
            wait_until(lambda: count(database, "workflow_runs") == 0, timeout=300, what="the resumed batch")
            page.wait_for_function(f"{tab_states}.filter(state => state === 'completed').length === 4", timeout=60_000)
            page.get_by_role("tab", name="History").click()
            page.wait_for_function("document.querySelectorAll('#ss-history img').length === 4", timeout=120_000)
            shot(page, "browser-restart-banner")
    finally:
        context.close()
    seeds = sorted(int(text.split("Seed: ", 1)[1].split(",")[0]) for (text,) in rows(database, "SELECT parameters FROM history"))
    assert seeds == [SEED, SEED + 1, SEED + 2, SEED + 3]

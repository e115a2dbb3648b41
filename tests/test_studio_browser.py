"""The Simple tab and the History tab in a real headless Chromium: live progress in one bar per
request, prompts that queue, cancel, two tabs, closing a tab, results that survive a reload.

Needs Debian's `chromium` and the `playwright` package (never `playwright install`).
Screenshots land in test-artifacts/ for a human to look at.
"""

from __future__ import annotations

import json
import threading
import urllib.request

import numpy as np
import pytest
from PIL import Image

from engine import Aborted
from pipelines.interface import ModelDefaults
from pipelines.toy import ToyPipeline
from tests.browser_helpers import (  # noqa: F401 (browser: a fixture)
    BROWSER_MARKS,
    browser,
    shot,
    sync_api,
    wait_for_history_token,
)
from studio.page.ui import BROWSER_STORAGE_KEY
from tests.engine_helpers import StepGate, spy_on_cancels, spy_on_submits
from tests.studio_helpers import live_studio, wait_for

STEPS = 30
LONG_STEPS = 100  # the studio's max_steps
STEP_DELAY_S = 0.05

pytestmark = BROWSER_MARKS


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    defaults = ModelDefaults(width=64, height=64, num_inference_steps=STEPS, guidance_scale=1.0,
                             example_prompts=("a red circle", "a blue square"))
    pipeline = ToyPipeline(step_delay_s=STEP_DELAY_S, defaults=defaults)
    outputs = tmp_path_factory.mktemp("outputs")
    with live_studio(pipeline, outputs, preview_every=2, max_per_session=4) as (server, engine):
        yield server, engine, pipeline, outputs


@pytest.fixture
def open_page(studio, browser):
    """New tab in its own browser context (= its own Gradio session and its own browser token)."""
    contexts = []

    def open_(context=None) -> "sync_api.Page":
        if context is None:
            context = browser.new_context(viewport={"width": 1400, "height": 1100})
            contexts.append(context)
        page = context.new_page()
        page.goto(studio[0].url)
        page.get_by_role("tab", name="Simple").click()  # the Workflow tab is the default
        page.wait_for_selector("#ss-generate")
        page.wait_for_selector("#ss-queue table")  # the live views have ticked once
        wait_for_history_token(page)
        return page

    yield open_
    for context in contexts:
        context.close()


def rows(page) -> list[dict]:
    """The tab's queue: one row per request, oldest first."""
    return page.eval_on_selector_all("#ss-tab-queue .ss-job", "els => els.map(el => ({...el.dataset}))")


def wait_rows(page, condition: str, timeout: int = 120_000) -> None:
    """Until the tab's queue rows meet `condition`: a generation's time, which on a loaded machine
    (a whole suite on 2 cores) has gone past 20 s; a long wait only where it would fail anyway."""
    page.wait_for_function(
        f"() => {{ const rows = [...document.querySelectorAll('#ss-tab-queue .ss-job')].map(el => el.dataset); "
        f"return {condition}; }}", timeout=timeout)


def generate(page, prompt: str) -> None:
    page.fill("#ss-prompt textarea", prompt)
    page.click("#ss-generate")


def test_generate_shows_one_moving_bar_then_the_image(open_page, studio):
    pipeline = studio[2]
    page = open_page()
    # The engine holds inside the request's forwards 3, 6, 9 and 12 in turn (3, 6, 9, 12 steps
    # done) until the page shows that step: the bar is seen at each one, however busy the machine.
    held_at = (3, 6, 9, 12)
    first = len(pipeline.forward_log)
    gates = [StepGate(first + steps) for steps in held_at]
    pipeline.on_forward = lambda index, batch: [gate(index, batch) for gate in gates]
    try:
        generate(page, "a large red circle")
        for steps, gate in zip(held_at, gates):
            gate.wait()
            wait_rows(page, f"rows.length === 1 && rows[0].state === 'running' && rows[0].step === '{steps}'")
            if steps == held_at[-1]:
                shot(page, "browser-generate-running")
            # One progress display: the row's own bar, no Gradio progress bar anywhere on the tab.
            assert page.locator("#ss-tab-simple .progress-bar, #ss-tab-simple .progress-text").count() == 0
            assert page.locator("#ss-tab-simple progress").count() == 1
            gate.release()
    finally:
        pipeline.on_forward = None
        for gate in gates:
            gate.release()
    wait_rows(page, "rows.length === 1 && rows[0].state === 'completed'")
    page.wait_for_selector("#ss-result img")
    shot(page, "browser-generate-done")
    (row,) = rows(page)
    assert row["state"] == "completed" and row["step"] == str(STEPS)
    assert page.locator("#ss-preview img").count() == 1  # a live preview arrived
    assert page.locator("#ss-gallery img").count() == 1  # and the result joined this tab's gallery
    assert page.input_value("#ss-seed input") == row["seed"]  # the used seed is written back


def test_three_quick_clicks_queue_three_requests_and_give_three_results_in_order(open_page, studio):
    page = open_page()
    page.fill("#ss-prompt textarea", "a queued request")
    for _ in range(3):
        page.click("#ss-generate")
    wait_rows(page, "rows.length === 3")
    shot(page, "browser-three-queued")
    wait_rows(page, "rows.length === 3 && rows.every(r => r.state === 'completed')")
    seeds = [int(r["seed"]) for r in rows(page)]
    assert len(set(seeds)) == 3
    caption_selector = "#ss-gallery .caption-label, #ss-gallery figcaption"
    # The gallery's update may land just after the queue's last row turned completed.
    page.wait_for_function(f"document.querySelectorAll({caption_selector!r}).length === 3", timeout=20000)
    captions = page.eval_on_selector_all(caption_selector, "els => els.map(el => el.textContent)")
    # Newest first in the gallery: the reverse of the queue's order.
    assert [int(c.split("seed ")[1].split(" ")[0]) for c in captions] == seeds[::-1]


def test_batch_count_makes_consecutive_seeds(open_page):
    page = open_page()
    page.uncheck("#ss-random-seed input")
    page.fill("#ss-seed input", "40")
    page.fill("#ss-batch-count input[type=number]", "3")
    page.press("#ss-batch-count input[type=number]", "Enter")
    generate(page, "a batch")
    wait_rows(page, "rows.length === 3 && rows.every(r => r.state === 'completed')")
    assert [int(r["seed"]) for r in rows(page)] == [40, 41, 42]


def test_shift_enter_generates_and_enter_adds_a_line(open_page):
    page = open_page()
    page.click("#ss-prompt textarea")
    page.keyboard.type("a red circle")
    page.keyboard.press("Enter")
    page.keyboard.type("on two lines")
    assert page.input_value("#ss-prompt textarea") == "a red circle\non two lines"
    assert rows(page) == []
    page.keyboard.press("Shift+Enter")
    wait_rows(page, "rows.length === 1")
    assert "Shift+Enter generates" in page.inner_text("#ss-prompt")


def test_errors_show_one_at_a_time_the_newest(open_page):
    page = open_page()
    for index in range(3):  # three refused requests, one after the other
        generate(page, f"a red circle <lora:missing{index}:1>")
        page.wait_for_function("() => [...document.querySelectorAll('.toast-message-text')]"
                               f".some(el => el.innerText.includes(\"'missing{index}'\"))")
    shown = page.evaluate("() => [...document.querySelectorAll('.toast-message-text')]"
                          ".filter(el => el.offsetParent !== null).map(el => el.innerText)")
    shot(page, "browser-one-toast")
    assert len(shown) == 1 and "LoRA 'missing2' is not loaded" in shown[0], shown


def test_cancel_one_request_and_cancel_all(open_page, studio, monkeypatch):
    _, engine, pipeline, _ = studio
    cancels = spy_on_cancels(engine, monkeypatch)
    page = open_page()
    page.fill("#ss-batch-count input[type=number]", "2")
    page.press("#ss-batch-count input[type=number]", "Enter")
    # Each cancel goes out while the engine is held inside a forward of the request, so it is
    # surely still running when the cancel arrives (no timing window on a busy machine).
    gate = StepGate(min_requests=2)
    pipeline.on_forward = gate
    try:
        generate(page, "two requests to cancel")
        gate.wait()
        wait_rows(page, "rows.length === 2 && rows.every(r => r.state === 'running')")
        first, second = rows(page)
        page.dispatch_event(f"#ss-tab-queue .ss-job[data-request='{first['request']}'] .ss-job-cancel", "pointerdown")
        wait_for(lambda: cancels == [first["request"]], timeout_s=20, what="the first cancel to reach the engine")
        gate_two = StepGate(len(pipeline.forward_log) + 1)
        pipeline.on_forward = gate_two
    finally:
        gate.release()
    try:
        gate_two.wait()  # the first request has ended; the second runs on
        wait_rows(page, "rows[0].state === 'aborted' && rows[1].state === 'running'")
        page.click("#ss-cancel")
        wait_for(lambda: second["request"] in cancels, timeout_s=20, what="Cancel all to reach the engine")
        forwards_after_cancel = len(pipeline.forward_log)
    finally:
        pipeline.on_forward = None
        gate_two.release()
    wait_rows(page, "rows[1].state === 'aborted'")
    shot(page, "browser-cancelled")
    ours = [ids for ids in pipeline.forward_log[forwards_after_cancel:] if {first["request"], second["request"]} & set(ids)]
    assert len(ours) <= 1, "a cancelled request kept running"
    assert not [v for v in engine.snapshot().requests if v.request_id in (first["request"], second["request"])]
    assert page.locator("#ss-result img").count() == 0  # no image for a cancelled request


def test_two_pages_see_each_other_in_the_queue(open_page, studio):
    engine, pipeline = studio[1], studio[2]
    first, second = open_page(), open_page()
    # The engine holds in the first forward both requests share, while the pages are read. The
    # first request waits at its step boundary until the second is in, however slow the second
    # click is on a busy machine, so that forward comes.
    gate, waited = StepGate(min_requests=2), []

    def once_both_are_in(index, batch):
        if not waited:  # the first forward only
            waited.append(index)
            wait_for(lambda: engine.requests_in_flight >= 2, timeout_s=60, what="the second tab's request")
        gate(index, batch)

    pipeline.on_forward = once_both_are_in
    try:
        generate(first, "first tab's prompt")
        generate(second, "second tab's prompt")
        gate.wait()
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
    finally:
        pipeline.on_forward = None
        gate.release()
    for page in (first, second):
        wait_rows(page, "rows.length === 1 && rows[0].state === 'completed'")


def test_closing_the_tab_cancels_its_request(open_page, studio, monkeypatch):
    _, engine, pipeline, _ = studio
    cancels = spy_on_cancels(engine, monkeypatch)
    asked = threading.Event()
    spied_cancel = engine.cancel
    monkeypatch.setattr(engine, "cancel", lambda *args, **kwargs: (asked.set(), spied_cancel(*args, **kwargs))[1])
    handles = []
    submit = engine.submit
    monkeypatch.setattr(engine, "submit", lambda *args, **kwargs: handles.append(submit(*args, **kwargs)) or handles[-1])
    page = open_page()
    page.fill("#ss-steps input[type=number]", str(LONG_STEPS))
    page.press("#ss-steps input[type=number]", "Enter")
    # The engine holds inside the request's third forward until the tab has closed: the request
    # is surely running when the page goes. Gradio notices a closed stream when it next has
    # something to send (a next step's update); until the cancel comes, each later forward waits
    # for it (up to 2 s a step), so however busy the machine, the request has 97 steps' worth of
    # time to be cancelled in, and it must end aborted, not completed.
    gate = StepGate(len(pipeline.forward_log) + 2)
    pipeline.on_forward = gate
    try:
        generate(page, "a tab that will be closed")
        gate.wait()
        wait_rows(page, "rows.length === 1 && rows[0].state === 'running'")
        request_id = rows(page)[0]["request"]
        page.context.close()
        pipeline.on_forward = lambda index, batch: request_id in batch.request_ids and asked.wait(2)
    except BaseException:
        pipeline.on_forward = None
        raise
    finally:
        gate.release()
    try:
        (handle,) = [handle for handle in handles if handle.request_id == request_id]
        final = handle.result(timeout=LONG_STEPS * 3)
    finally:
        pipeline.on_forward = None
    assert request_id in cancels  # it was cancelled ...
    assert isinstance(final, Aborted) and final.cause == "cancelled", final  # ... and ended aborted, not finished
    wait_for(lambda: not any(v.request_id == request_id for v in engine.snapshot().requests), timeout_s=30,
             what="the closed tab's request to leave the engine")


def test_history_survives_a_reload_and_its_settings_fill_the_form(open_page, browser, studio):
    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    try:
        page = open_page(context)
        page.uncheck("#ss-random-seed input")
        page.fill("#ss-seed input", "1234")
        generate(page, "a result to keep")
        wait_rows(page, "rows.length === 1 && rows[0].state === 'completed'")
        page.get_by_role("tab", name="History").click()  # opening the tab lists what is new
        page.wait_for_selector("#ss-history img")
        page.reload()
        page.get_by_role("tab", name="History").click()
        page.wait_for_selector("#ss-history img")
        assert page.locator("#ss-history img").count() == 1
        page.click("#ss-history img")
        page.wait_for_function("document.querySelector('#ss-history-details textarea').value.includes('Seed: 1234')")
        details = page.input_value("#ss-history-details textarea")
        assert details.startswith("a result to keep\nSteps: 30, Sampler: default, CFG scale: 1, Seed: 1234")
        page.click("#ss-history-use")
        page.wait_for_selector("#ss-generate")
        assert page.input_value("#ss-prompt textarea") == "a result to keep"
        assert page.input_value("#ss-seed input") == "1234"
        assert not page.is_checked("#ss-random-seed input")
        shot(page, "browser-history")
        # Another browser (its own token) sees its own result and none of the first one's: the
        # listing is waited for (its own image arrives), not assumed after a pause.
        stranger = open_page()
        generate(stranger, "a stranger's own result")
        wait_rows(stranger, "rows.length === 1 && rows[0].state === 'completed'")
        stranger.get_by_role("tab", name="History").click()
        stranger.wait_for_selector("#ss-history img")
        stranger.click("#ss-history img")
        stranger.wait_for_function(
            "document.querySelector('#ss-history-details textarea').value.startsWith(\"a stranger's own result\")")
        assert stranger.locator("#ss-history img").count() == 1
    finally:
        context.close()


def _dependency_index(url: str, api_name: str) -> int:
    with urllib.request.urlopen(url + "config") as answer:
        dependencies = json.load(answer)["dependencies"]
    (index,) = [i for i, dependency in enumerate(dependencies) if dependency.get("api_name") == api_name]
    return index


def test_a_click_before_a_first_visit_keeps_its_token_still_joins_that_browsers_history(studio, browser):
    # A new browser's token comes with the page's load event; here that event's request is held
    # back until the Generate pressed before it has been sent, so the click carries no token.
    url = studio[0].url
    history_start, generate_click = _dependency_index(url, "ui_history_start"), _dependency_index(url, "ui_generate")
    held, sent = [], []

    def route_join(route):
        fn_index = (route.request.post_data_json or {}).get("fn_index")
        if fn_index == history_start and not sent:
            held.append(route)
            return
        sent.append(fn_index)
        route.continue_()

    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    try:
        page = context.new_page()
        page.route("**/queue/join*", route_join)
        page.goto(url)
        page.get_by_role("tab", name="Simple").click()
        page.wait_for_selector("#ss-generate")
        # (page.wait_for_timeout lets Playwright run the route handler meanwhile)
        wait_for(lambda: held or page.wait_for_timeout(50), 120, what="the history start's request to be held")
        assert page.evaluate(f"localStorage.getItem({BROWSER_STORAGE_KEY!r})") is None
        page.uncheck("#ss-random-seed input")
        page.fill("#ss-seed input", "4321")
        generate(page, "made before the token arrived")
        wait_for(lambda: generate_click in sent or page.wait_for_timeout(50), 120, what="the Generate's request")
        held[0].continue_()
        wait_for_history_token(page)
        wait_rows(page, "rows.length === 1 && rows[0].state === 'completed'")
        page.reload()  # a reload finds it through the token the browser kept
        page.get_by_role("tab", name="History").click()
        page.wait_for_selector("#ss-history img")
        page.click("#ss-history img")
        page.wait_for_function("document.querySelector('#ss-history-details textarea').value.includes('Seed: 4321')")
        assert page.locator("#ss-history img").count() == 1
        assert page.input_value("#ss-history-details textarea").startswith("made before the token arrived")
    finally:
        context.close()


def generate_saved(page, outputs, prompt: str, seed: int):
    """Generate one image with a fixed seed on a fresh page; the PNG the studio saved."""
    page.uncheck("#ss-random-seed input")
    page.fill("#ss-seed input", str(seed))
    before = set(outputs.rglob("*.png"))
    generate(page, prompt)
    wait_rows(page, "rows.length === 1 && rows[0].state === 'completed'")
    (saved,) = set(outputs.rglob("*.png")) - before
    return saved


def test_a_saved_pngs_parameters_round_trip_into_the_form(open_page, studio):
    page = open_page()
    saved = generate_saved(page, studio[3], "a png to reopen", 777)
    page.fill("#ss-prompt textarea", "something else")
    page.check("#ss-random-seed input")
    page.get_by_role("tab", name="History").click()
    page.set_input_files("#ss-history-upload input[type=file]", str(saved))
    page.wait_for_function("document.querySelector('#ss-history-details textarea').value.includes('Seed: 777')")
    page.click("#ss-history-use")
    page.wait_for_selector("#ss-generate")
    assert page.input_value("#ss-prompt textarea") == "a png to reopen"
    assert page.input_value("#ss-seed input") == "777" and not page.is_checked("#ss-random-seed input")
    assert page.input_value("#ss-steps input[type=number]") == str(STEPS)


def test_a_saved_result_goes_on_to_image_to_image_and_into_the_editor(open_page, studio, monkeypatch):
    submitted = spy_on_submits(studio[1], monkeypatch)
    page = open_page()
    saved = generate_saved(page, studio[3], "a picture to redraw", 4242)
    page.get_by_role("tab", name="History").click()
    page.wait_for_selector("#ss-history img")
    page.click("#ss-history img")
    page.wait_for_function("document.querySelector('#ss-history-details textarea').value.includes('Seed: 4242')")
    # History -> the Simple tab's image to image: the picture is there, redrawn at strength 0.5.
    page.click("#ss-history-img2img")
    page.wait_for_selector("#ss-picture canvas")
    page.fill("#ss-strength input[type=number]", "0.5")
    page.press("#ss-strength input[type=number]", "Enter")
    generate(page, "a blue square")
    wait_rows(page, "rows.length === 2 && rows[1].state === 'completed'")
    shot(page, "browser-image-to-image")
    redraw = submitted[-1]
    with Image.open(saved) as original:
        assert np.array_equal(np.asarray(redraw.init_image), np.asarray(original.convert("RGB")))
    assert (redraw.prompt, redraw.strength, redraw.denoise_steps, redraw.mask_image) == ("a blue square", 0.5, 15, None)
    # History -> the editor: a Load image node holding the same picture joins the graph.
    page.get_by_role("tab", name="History").click()
    page.click("#ss-history img >> nth=0")
    page.wait_for_function("document.querySelector('#ss-history-details textarea').value.length > 0")
    nodes_before = page.evaluate("() => document.querySelector('.sse-root').stepstudioEditor.toWorkflow().nodes.length")
    page.click("#ss-history-to-editor")
    page.wait_for_selector(".sse-canvas .drawflow-node[data-node-type='load_image'] .sse-picture[data-has='yes']")
    workflow = page.evaluate("() => document.querySelector('.sse-root').stepstudioEditor.toWorkflow()")
    assert len(workflow["nodes"]) == nodes_before + 1
    (load,) = [n for n in workflow["nodes"] if n["type"] == "load_image"]
    assert load["values"]["image"].startswith("data:image/png;base64,")

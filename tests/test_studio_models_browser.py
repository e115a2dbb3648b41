"""One studio, three models, in a real Chromium: the model picker reshapes the Simple form (the
built-in model's card allows 64x64 only, the toy model any multiple of 8, the built-in video model
v2 two sizes and two lengths), and a request made with each model runs on it."""

from __future__ import annotations

import pytest

from pipelines.interface import ModelDefaults
from pipelines.loader import load_pipeline
from pipelines.toy import ToyPipeline
from tests.browser_helpers import BROWSER_MARKS, browser, shot, sync_api  # noqa: F401 (browser: a fixture)
from tests.studio_helpers import live_studio
from tests.test_http_videos import Instrumented

pytestmark = BROWSER_MARKS


@pytest.fixture(scope="module")
def studio():
    toy = ToyPipeline(step_delay_s=0.02, defaults=ModelDefaults(width=64, height=64, num_inference_steps=6,
                                                                 guidance_scale=1.0))
    video = Instrumented(load_pipeline("builtin-video-v2"))
    video.shapes = []  # (width, height, frames) of each forward's rows

    def record(index, batch):
        video.shapes.append([(s.params.width, s.params.height, s.params.num_frames) for s in batch.states])
    video.on_forward = record
    with live_studio([load_pipeline("builtin"), toy, video], preview_every=2) as (server, engine):
        yield server, engine, video


def visible(page, selector: str) -> bool:
    return page.locator(selector).is_visible()


def pick(page, dropdown: str, option: str) -> None:
    page.click(f"{dropdown} input")
    page.get_by_role("option", name=option, exact=True).click()


@pytest.fixture
def page(studio, browser):
    """A fresh page of the studio, on its Simple tab."""
    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    try:
        page = context.new_page()
        page.goto(studio[0].url)
        page.get_by_role("tab", name="Simple").click()
        page.wait_for_selector("#ss-generate")
        yield page
    finally:
        context.close()


def test_the_model_picker_reshapes_the_form_and_each_model_serves_its_requests(studio, page):
    engine = studio[1]
    # The built-in model (the default) names its sizes: a size dropdown, no sliders.
    assert visible(page, "#ss-size") and not visible(page, "#ss-width")
    assert page.input_value("#ss-size input") == "64x64"
    page.fill("#ss-prompt textarea", "a large red circle on a blue background, left")
    page.click("#ss-generate")
    page.wait_for_function("() => { const r = document.querySelector('#ss-tab-queue .ss-job');"
                           " return r && r.dataset.state === 'completed'; }", timeout=60_000)
    page.wait_for_selector("#ss-result img")
    # The toy model takes any multiple of 8: sliders, and its own step count.
    pick(page, "#ss-model", "toy")
    page.wait_for_function("() => !document.querySelector('#ss-size') || "
                           "document.querySelector('#ss-size').offsetParent === null")
    assert visible(page, "#ss-width") and page.input_value("#ss-steps input[type=number]") == "6"
    page.fill("#ss-prompt textarea", "a toy request")
    page.click("#ss-generate")
    page.wait_for_function("() => [...document.querySelectorAll('#ss-tab-queue .ss-job')]"
                           ".filter(r => r.dataset.state === 'completed').length === 2", timeout=60_000)
    shot(page, "studio-two-models")
    table = page.inner_text("#ss-queue")
    assert "model" in table
    assert engine.snapshot().stats.completed_by_model == {"shapes-flux": 1, "toy": 1}


def test_a_video_card_s_lengths_are_a_pick_list_and_the_picked_length_and_size_are_made(studio, page):
    video = studio[2]
    assert not visible(page, "#ss-frame-choice")  # an image model: no frames at all
    pick(page, "#ss-model", "shapes-wan-v2")
    # The card names its lengths (9, 13) and sizes: two dropdowns, no number field, no sliders.
    page.wait_for_selector("#ss-frame-choice", state="visible")
    assert not visible(page, "#ss-frames") and not visible(page, "#ss-width")
    assert page.input_value("#ss-frame-choice input") == "9" and page.input_value("#ss-size input") == "64x64"
    page.click("#ss-frame-choice input")
    offered = page.locator("#ss-frame-choice [role=option]").all_inner_texts()
    assert [text.replace("✓", "").strip() for text in offered] == ["9", "13"], offered  # ✓: the picked one
    page.get_by_role("option", name="13", exact=True).click()
    pick(page, "#ss-size", "96x64")
    page.fill("#ss-steps input[type=number]", "2")
    page.press("#ss-steps input[type=number]", "Enter")
    page.fill("#ss-prompt textarea", "a red circle moving right on an orange background")
    page.click("#ss-generate")
    page.wait_for_selector("#ss-result-video video[src]", timeout=120_000)
    shot(page, "studio-video-card-lengths")
    assert video.shapes == [[(96, 64, 13)]] * 2

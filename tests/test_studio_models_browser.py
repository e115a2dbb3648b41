"""One studio, two models, in a real Chromium: the model picker reshapes the Simple form (the
built-in model's card allows 64x64 only, the toy model any multiple of 8), and a request made
with each model runs on it."""

from __future__ import annotations

import pytest

from pipelines.interface import ModelDefaults
from pipelines.loader import load_pipeline
from pipelines.toy import ToyPipeline
from tests.browser_helpers import BROWSER_MARKS, browser, shot, sync_api  # noqa: F401 (browser: a fixture)
from tests.studio_helpers import live_studio

pytestmark = BROWSER_MARKS


@pytest.fixture(scope="module")
def studio():
    toy = ToyPipeline(step_delay_s=0.02, defaults=ModelDefaults(width=64, height=64, num_inference_steps=6,
                                                                 guidance_scale=1.0))
    with live_studio([load_pipeline("builtin"), toy], preview_every=2) as (server, engine):
        yield server, engine


def visible(page, selector: str) -> bool:
    return page.locator(selector).is_visible()


def test_the_model_picker_reshapes_the_form_and_each_model_serves_its_requests(studio, browser):
    server, engine = studio
    page = browser.new_context(viewport={"width": 1400, "height": 1100}).new_page()
    try:
        page.goto(server.url)
        page.get_by_role("tab", name="Simple").click()
        page.wait_for_selector("#ss-generate")
        # The built-in model (the default) names its sizes: a size dropdown, no sliders.
        assert visible(page, "#ss-size") and not visible(page, "#ss-width")
        assert page.input_value("#ss-size input") == "64x64"
        page.fill("#ss-prompt textarea", "a large red circle on a blue background, left")
        page.click("#ss-generate")
        page.wait_for_function("() => { const r = document.querySelector('#ss-tab-queue .ss-job');"
                               " return r && r.dataset.state === 'completed'; }", timeout=60_000)
        page.wait_for_selector("#ss-result img")
        # The toy model takes any multiple of 8: sliders, and its own step count.
        page.click("#ss-model input")
        page.get_by_role("option", name="toy").click()
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
    finally:
        page.context.close()

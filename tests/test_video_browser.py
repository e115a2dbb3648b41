"""The Simple tab makes a video in a real headless Chromium: the video model picked in the model
dropdown, Generate, and the result's `<video>` element plays. Each model's example prompts show
with that model only.

Needs Debian's `chromium` and the `playwright` package (never `playwright install`).
The screenshot lands in test-artifacts/ for a human to look at.
"""

from __future__ import annotations

import contextlib

import pytest

from pipelines.loader import load_pipeline
from tests.browser_helpers import BROWSER_MARKS, browser, shot, sync_api  # noqa: F401 (browser: a fixture)
from tests.studio_helpers import live_studio
from tests.test_http_videos import FLUX_CONFIG, FPS, WAN_CONFIG
from tests.tiny_checkpoints import build_tiny_flux, build_tiny_wan

pytestmark = BROWSER_MARKS
IMAGE_EXAMPLES = ["a red circle on a blue background", "a green square on a black background"]
VIDEO_EXAMPLES = ["a red circle moving left", "a blue square moving up"]


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    wan = load_pipeline(str(build_tiny_wan(folder / "wan", {**WAN_CONFIG, "num_inference_steps": 8,
                                                             "example_prompts": VIDEO_EXAMPLES})))
    flux = load_pipeline(str(build_tiny_flux(folder / "flux", {**FLUX_CONFIG, "example_prompts": IMAGE_EXAMPLES})))
    with live_studio({"flux": flux, "wan": wan}, preview_every=2) as (server, engine):
        yield server, engine


@contextlib.contextmanager
def simple_tab(browser, url: str):
    """A fresh page of the studio, on its Simple tab (the Workflow tab is the default)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    try:
        page = context.new_page()
        page.goto(url)
        page.get_by_role("tab", name="Simple").click()
        page.wait_for_selector("#ss-generate")
        yield page
    finally:
        context.close()


def test_the_simple_tab_makes_a_video_that_plays(studio, browser):
    server, engine = studio
    with simple_tab(browser, server.url) as page:
        page.click("#ss-model input")
        page.get_by_role("option", name="wan", exact=True).click()
        page.wait_for_selector("#ss-frames", state="visible")  # the form reshaped for the video model
        page.fill("#ss-prompt textarea", "a red circle moving left")
        page.click("#ss-generate")
        page.wait_for_selector("#ss-result-video video[src]", timeout=30000)
        playing = page.evaluate("""async () => {
            const video = document.querySelector('#ss-result-video video');
            video.muted = true;
            if (video.readyState < 1) await new Promise(r => video.addEventListener('loadedmetadata', r, {once: true}));
            await video.play();
            if (video.readyState < 2) await new Promise(r => video.addEventListener('loadeddata', r, {once: true}));
            return {duration: video.duration, readyState: video.readyState, width: video.videoWidth,
                    height: video.videoHeight, paused: video.paused, error: video.error && video.error.code};
        }""")
        shot(page, "browser-video-plays")
        assert playing["error"] is None, playing
        assert playing["readyState"] >= 2, playing
        assert (playing["width"], playing["height"]) == (32, 32), playing
        assert engine.snapshot().stats.finished == {"completed": 1}
        # The model's default video: 9 frames at its 8 fps, 1.125 s (to a millisecond: a frame is 125 ms).
        assert playing["duration"] == pytest.approx(WAN_CONFIG["num_frames"] / FPS, abs=1e-3), playing


def shown_examples(page, prompts: list[str]) -> list[str]:
    """Which of `prompts` the Simple tab shows as visible example buttons."""
    return page.evaluate("""(prompts) => prompts.filter(p => [...document.querySelectorAll('#ss-tab-simple button')]
        .some(b => b.offsetParent !== null && b.innerText.trim() === p))""", prompts)


def test_each_model_shows_its_own_example_prompts(studio, browser):
    server, _ = studio
    with simple_tab(browser, server.url) as page:
        page.wait_for_function("() => [...document.querySelectorAll('#ss-tab-simple button')]"
                               f".some(b => b.offsetParent !== null && b.innerText.trim() === {IMAGE_EXAMPLES[0]!r})")
        # The default (image) model's examples, and no video prompts among them.
        assert shown_examples(page, IMAGE_EXAMPLES + VIDEO_EXAMPLES) == IMAGE_EXAMPLES
        page.click("#ss-model input")
        page.get_by_role("option", name="wan", exact=True).click()
        page.wait_for_function("() => [...document.querySelectorAll('#ss-tab-simple button')]"
                               f".some(b => b.offsetParent !== null && b.innerText.trim() === {VIDEO_EXAMPLES[0]!r})")
        assert shown_examples(page, IMAGE_EXAMPLES + VIDEO_EXAMPLES) == VIDEO_EXAMPLES
        shot(page, "browser-video-examples")
        page.get_by_role("button", name=VIDEO_EXAMPLES[1], exact=True).click()  # a click fills the prompt
        page.wait_for_function(f"() => document.querySelector('#ss-prompt textarea').value === {VIDEO_EXAMPLES[1]!r}")

"""Videos in a real headless Chromium: the Simple tab makes one (the video model picked in the model
dropdown, Generate) whose live preview fills the preview panel and whose `<video>` plays; the
editor makes one; both, as sent to the page and as saved in outputs/, play at the model's own
8 fps (read back from the MP4 with imageio-ffmpeg); History shows a video as an animated poster and
plays it when selected. Each model's example prompts show with that model only.

The Simple tab, editor and History tests share one page (one browser token), in order.
Needs Debian's `chromium` and the `playwright` package (never `playwright install`).
Screenshots land in test-artifacts/ for a human to look at.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import httpx
import imageio_ffmpeg
import pytest
from PIL import Image

from pipelines.loader import load_pipeline
from tests.browser_helpers import BROWSER_MARKS, browser, shot, sync_api  # noqa: F401 (browser: a fixture)
from tests.engine_helpers import StepGate
from tests.studio_helpers import live_studio
from tests.test_http_videos import FLUX_CONFIG, FPS, WAN_CONFIG, Instrumented
from tests.tiny_checkpoints import build_tiny_flux, build_tiny_wan

pytestmark = BROWSER_MARKS
IMAGE_EXAMPLES = ["a red circle on a blue background", "a green square on a black background"]
VIDEO_EXAMPLES = ["a red circle moving left", "a blue square moving up"]
STEPS = 8
# The model's default video: 9 frames at its 8 fps, 1.125 s (the default model, flux, has no fps of
# its own: the studio's default 16 would make it 0.5625 s).
VIDEO = {"frames": WAN_CONFIG["num_frames"], "fps": float(FPS), "seconds": WAN_CONFIG["num_frames"] / FPS}


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    wan = Instrumented(load_pipeline(str(build_tiny_wan(folder / "wan", {
        **WAN_CONFIG, "num_inference_steps": STEPS, "example_prompts": VIDEO_EXAMPLES}))))
    flux = load_pipeline(str(build_tiny_flux(folder / "flux", {**FLUX_CONFIG, "example_prompts": IMAGE_EXAMPLES})))
    outputs = tmp_path_factory.mktemp("outputs")
    with live_studio({"flux": flux, "wan": wan}, outputs, preview_every=2) as (server, engine):
        yield server, engine, wan, outputs


@pytest.fixture(scope="module")
def page(studio, browser):
    """One page for the tests that follow each other's results (its History is theirs)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    try:
        page = context.new_page()
        page.goto(studio[0].url)
        page.wait_for_selector("#ss-node-editor .drawflow-node")
        yield page
    finally:
        context.close()


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


def mp4_facts(path: Path) -> dict:
    """An MP4's frame count, frames per second and length, read back with imageio-ffmpeg."""
    reader = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24")
    meta = next(reader)
    frames = sum(1 for _ in reader)
    return {"frames": frames, "fps": meta["fps"], "seconds": round(frames / meta["fps"], 4)}


def fetched(url: str, folder: Path, name: str) -> Path:
    """What the page's `<video>` plays, as a file."""
    answer = httpx.get(url, timeout=60)
    assert answer.status_code == 200, answer.text[:200]
    path = folder / name
    path.write_bytes(answer.content)
    return path


def new_files(outputs: Path, before: set[Path], suffix: str) -> list[Path]:
    return sorted(path for path in set(outputs.rglob(f"*{suffix}")) - before)


PLAYED = """async (selector) => {
    const video = document.querySelector(selector);
    video.muted = true;
    if (video.readyState < 1) await new Promise(r => video.addEventListener('loadedmetadata', r, {once: true}));
    await video.play();
    if (video.readyState < 2) await new Promise(r => video.addEventListener('loadeddata', r, {once: true}));
    return {duration: video.duration, readyState: video.readyState, width: video.videoWidth, height: video.videoHeight,
            error: video.error && video.error.code, src: video.currentSrc};
}"""


def pick_model(page, name: str) -> None:
    page.click("#ss-model input")
    page.get_by_role("option", name=name, exact=True).click()


def test_the_simple_tab_previews_a_video_in_its_panel_and_makes_it_at_the_models_fps(page, studio, tmp_path):
    server, engine, wan, outputs = studio
    before = set(outputs.rglob("*.mp4"))
    page.get_by_role("tab", name="Simple").click()
    pick_model(page, "wan")
    page.wait_for_selector("#ss-frames", state="visible")  # the form reshaped for the video model
    page.fill("#ss-prompt textarea", "a red circle moving left")
    # The engine holds in the request's fifth forward: the previews after steps 2 and 4 are out.
    gate = StepGate(wan.forwards + 4)
    wan.on_forward = gate
    try:
        page.click("#ss-generate")
        gate.wait()
        page.wait_for_function("() => { const img = document.querySelector('#ss-animation img.ss-animation');"
                               " return img && img.complete && img.naturalWidth > 0; }")
        preview = page.evaluate("""() => { const img = document.querySelector('#ss-animation img.ss-animation');
            const box = img.getBoundingClientRect();
            return {width: box.width, height: box.height, natural: img.naturalWidth}; }""")
        shot(page, "browser-video-live-preview")
    finally:
        wan.on_forward = None
        gate.release()
    # The live preview (latent-sized frames) fills the preview panel, as an image's does: 256 px high.
    assert preview["natural"] < 64 and preview["height"] == 256 and preview["width"] >= 256, preview
    page.wait_for_selector("#ss-result-video video[src]", timeout=60_000)
    playing = page.evaluate(PLAYED, "#ss-result-video video")
    shot(page, "browser-video-plays")
    assert playing["error"] is None and playing["readyState"] >= 2, playing
    assert (playing["width"], playing["height"]) == (32, 32), playing
    assert playing["duration"] == pytest.approx(VIDEO["seconds"], abs=1e-3), playing
    # The MP4 the page plays, and the one saved in outputs/, at the model's 8 fps.
    assert mp4_facts(fetched(playing["src"], tmp_path, "sent.mp4")) == VIDEO
    (saved,) = new_files(outputs, before, ".mp4")
    assert mp4_facts(saved) == VIDEO
    assert engine.snapshot().stats.finished == {"completed": 1}


def test_the_editor_makes_a_video_at_the_models_fps(page, studio, tmp_path):
    outputs = studio[3]
    before = set(outputs.rglob("*.mp4"))
    link = lambda a, b, port: {"from": {"node": a, "port": port}, "to": {"node": b, "port": port}}  # noqa: E731
    workflow = {"version": 1, "nodes": [
        {"id": "p", "type": "prompt", "values": {"text": "a blue square moving up"}, "position": [40, 20]},
        {"id": "m", "type": "model", "values": {"name": "wan"}, "position": [40, 220]},
        {"id": "d", "type": "seed", "values": {"seed": 3}, "position": [40, 360]},
        {"id": "s", "type": "sampler", "values": {}, "position": [330, 100]},
        {"id": "io", "type": "image_output", "values": {}, "position": [660, 40]}],
        "links": [link("p", "s", "prompt"), link("m", "s", "model"), link("d", "s", "seed"), link("s", "io", "images")]}
    page.get_by_role("tab", name="Workflow").click()
    page.evaluate("(w) => document.querySelector('.sse-root').stepstudioEditor.load(w)", workflow)
    page.wait_for_function("() => document.querySelectorAll('.sse-canvas .drawflow-node').length == 5")
    page.click("[data-action='run']")
    page.wait_for_selector(".sse-root[data-run-state='completed']", timeout=60_000)
    page.wait_for_selector("#ss-workflow-results video[src]", timeout=30_000)
    playing = page.evaluate(PLAYED, "#ss-workflow-results video")
    shot(page, "browser-video-editor")
    assert playing["error"] is None and playing["duration"] == pytest.approx(VIDEO["seconds"], abs=1e-3), playing
    assert mp4_facts(fetched(playing["src"], tmp_path, "sent.mp4")) == VIDEO
    (saved,) = new_files(outputs, before, ".mp4")
    assert mp4_facts(saved) == VIDEO


def test_history_shows_a_video_as_an_animated_poster_and_plays_it(page, studio):
    page.get_by_role("tab", name="History").click()
    page.wait_for_function("() => [...document.querySelectorAll('#ss-history .thumbnail-item img')]"
                           ".filter((img) => img.complete && img.naturalWidth > 0).length == 2")
    shot(page, "browser-video-history")
    for src in page.eval_on_selector_all("#ss-history .thumbnail-item img", "els => els.map((img) => img.src)"):
        answer = httpx.get(src, timeout=60)
        assert answer.status_code == 200
        with Image.open(io.BytesIO(answer.content)) as poster:
            assert (poster.format, poster.n_frames, poster.info.get("loop")) == ("GIF", VIDEO["frames"], 0)
            frames = []
            for index in range(poster.n_frames):
                poster.seek(index)
                frames.append(poster.convert("RGB").tobytes())
            assert len(set(frames)) > 1  # it moves
    page.locator("#ss-history .thumbnail-item").first.click()
    page.wait_for_selector("#ss-history-video video[src]")
    playing = page.evaluate(PLAYED, "#ss-history-video video")
    shot(page, "browser-video-history-player")
    assert playing["error"] is None and playing["duration"] == pytest.approx(VIDEO["seconds"], abs=1e-3), playing
    assert page.locator("#ss-history-view").is_hidden()


def shown_examples(page, prompts: list[str]) -> list[str]:
    """Which of `prompts` the Simple tab shows as visible example buttons."""
    return page.evaluate("""(prompts) => prompts.filter(p => [...document.querySelectorAll('#ss-tab-simple button')]
        .some(b => b.offsetParent !== null && b.innerText.trim() === p))""", prompts)


def test_each_model_shows_its_own_example_prompts(studio, browser):
    server = studio[0]
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

"""Results a person can read, in a real headless Chromium: the Image output node shows each
branch's live preview while it denoises, a grid opens large in a lightbox (from its Grid node and
from History), and History lists a run's grid with captions that name the swept values.

The tests share one page and run in order: the first runs a 2x2 sweep, the next ones look at
what it left. Needs Debian's `chromium` and the `playwright` package (never `playwright install`).
Screenshots land in test-artifacts/ for a human to look at.
"""

from __future__ import annotations

import pytest

from pipelines.interface import ModelDefaults
from pipelines.toy import ToyPipeline
from tests.browser_helpers import BROWSER_MARKS, browser, editor_page, shot, sync_api  # noqa: F401 (browser: a fixture)
from tests.engine_helpers import StepGate

STEP_DELAY_S = 0.02
pytestmark = BROWSER_MARKS


def link(source: str, target: str, port: str, target_port: str | None = None) -> dict:
    return {"from": {"node": source, "port": port}, "to": {"node": target, "port": target_port or port}}


SWEEP = {"version": 1, "nodes": [
    {"id": "p", "type": "prompt", "values": {"text": "a red circle"}, "position": [40, 20]},
    {"id": "d", "type": "seed", "values": {"seed": 5}, "position": [40, 200]},
    {"id": "g", "type": "sweep", "values": {"param": "guidance", "values": "1, 2"}, "position": [40, 330]},
    {"id": "t", "type": "sweep", "values": {"param": "steps", "values": "12, 16"}, "position": [40, 500]},
    {"id": "s", "type": "sampler", "values": {}, "position": [330, 140]},
    {"id": "io", "type": "image_output", "values": {}, "position": [660, 20]},
    {"id": "grid", "type": "grid", "values": {"x": "guidance", "y": "steps"}, "position": [660, 300]}],
    "links": [link("p", "s", "prompt"), link("d", "s", "seed"), link("g", "s", "values", "guidance"),
              link("t", "s", "values", "steps"), link("s", "io", "images"), link("s", "grid", "images")]}
CAPTIONS = ["steps 12, guidance 1 · seed 5", "steps 12, guidance 2 · seed 5",
            "steps 16, guidance 1 · seed 5", "steps 16, guidance 2 · seed 5"]


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    from tests.studio_helpers import live_studio

    defaults = ModelDefaults(width=64, height=64, num_inference_steps=12, guidance_scale=1.0)
    pipeline = ToyPipeline(step_delay_s=STEP_DELAY_S, defaults=defaults)
    with live_studio(pipeline, tmp_path_factory.mktemp("outputs"), preview_every=2, max_per_session=8) as (
            server, engine):
        yield server, engine, pipeline


@pytest.fixture(scope="module")
def page(studio, browser):
    with editor_page(browser, studio[0].url) as page:
        yield page


def node_element(node_type: str) -> str:
    """The CSS selector of the (one) node of this type on the canvas."""
    return f".sse-canvas .drawflow-node[data-node-type='{node_type}']"


def lightbox(page) -> dict:
    """The open lightbox's picture: its shown and natural size, and the window's."""
    return page.evaluate("""() => { const img = document.querySelector('.ss-lightbox img');
        const box = img.getBoundingClientRect();
        return {width: box.width, height: box.height, natural: [img.naturalWidth, img.naturalHeight],
                window: [window.innerWidth, window.innerHeight], scale: Number(img.dataset.scale),
                caption: document.querySelector('.ss-lightbox figcaption').textContent}; }""")


def test_the_image_output_node_shows_each_branchs_preview_while_it_runs(page, studio):
    _, engine, pipeline = studio
    page.evaluate("(w) => document.querySelector('.sse-root').stepstudioEditor.load(w)", SWEEP)
    page.wait_for_function("() => document.querySelectorAll('.sse-canvas .drawflow-node').length == 7")
    output = node_element("image_output")
    # The engine holds in the forward after every branch has run 6 steps (a preview every 2),
    # until the page has shown what it holds.
    gate = StepGate(len(pipeline.forward_log) + 6)
    pipeline.on_forward = gate
    try:
        page.click("[data-action='run']")
        gate.wait()
        page.wait_for_function("""(node) => [...document.querySelectorAll(node + ' .sse-thumb img')].filter((img) =>
            img.src.startsWith('data:image/jpeg') && img.complete && img.naturalWidth > 0
            && getComputedStyle(img).display !== 'none').length == 4""", arg=output, timeout=20_000)
        assert page.get_attribute(".sse-root", "data-run-state") == "running"
        assert [v.state for v in engine.snapshot().requests] == ["running"] * 4  # still denoising
        assert page.locator(f"{output} .sse-thumb-empty:visible").count() == 0  # no grey boxes
        shot(page, "results-output-node-previews")
    finally:
        pipeline.on_forward = None
        gate.release()
    page.wait_for_selector(".sse-root[data-run-state='completed']", timeout=60_000)
    # Each preview gave way to its branch's result, a file written once.
    page.wait_for_function("(node) => [...document.querySelectorAll(node + ' .sse-thumb img')]"
                           ".filter((img) => img.getAttribute('src').startsWith('gradio_api/file=')).length == 4",
                           arg=output)


def test_a_grid_opens_large_enough_to_read_and_closes(page):
    grid = node_element("grid") + " img.sse-grid"
    page.wait_for_function("(grid) => { const img = document.querySelector(grid); "
                           "return img && img.complete && img.naturalWidth > 0; }", arg=grid)
    on_node = page.evaluate("(grid) => { const img = document.querySelector(grid); "
                            "return [img.getBoundingClientRect().width, img.naturalWidth]; }", grid)
    assert on_node[0] < on_node[1]  # on its node the grid is shown smaller than it was drawn
    page.click(grid)
    page.wait_for_selector(".ss-lightbox img")
    shown = lightbox(page)
    shot(page, "results-grid-lightbox")
    # Enlarged by a whole factor (its lettering at least as large as drawn, sharp), and all in the window.
    assert shown["scale"] >= 1 and shown["scale"] == int(shown["scale"])
    assert shown["width"] == shown["natural"][0] * shown["scale"] and shown["height"] == shown["natural"][1] * shown["scale"]
    assert shown["width"] <= shown["window"][0] and shown["height"] <= shown["window"][1]
    page.keyboard.press("Escape")
    page.wait_for_selector(".ss-lightbox", state="detached")
    page.click(grid)  # again, and a click anywhere closes it
    page.wait_for_selector(".ss-lightbox img")
    page.mouse.click(20, 20)
    page.wait_for_selector(".ss-lightbox", state="detached")
    assert page.evaluate("() => document.querySelector('.sse-root').stepstudioEditor.toWorkflow().nodes.length") == 7
    # The grid among the run's results (grids first), opened in the gallery, opens in the lightbox too.
    detailed = "#ss-workflow-results img[data-testid='detailed-image']"
    if not page.locator(detailed).is_visible():
        page.locator("#ss-workflow-results .thumbnail-item").first.click()
    page.wait_for_selector(detailed)
    page.click(detailed)
    page.wait_for_selector(".ss-lightbox img")
    assert lightbox(page)["natural"][0] > 2 * 128 and lightbox(page)["scale"] >= 1  # the grid, not a cell
    page.keyboard.press("Escape")
    page.wait_for_selector(".ss-lightbox", state="detached")


def test_history_lists_the_grid_and_opens_it_large(page):
    page.get_by_role("tab", name="History").click()
    page.wait_for_function("() => document.querySelectorAll('#ss-history .thumbnail-item img').length == 5")
    captions = page.eval_on_selector_all("#ss-history .caption-label", "els => els.map((el) => el.textContent.trim())")
    assert sorted(captions) == sorted([f"{cell} · a red circle" for cell in CAPTIONS]
                                      + ["grid: guidance × steps · a red circle"])
    grid_index = next(index for index, caption in enumerate(captions) if caption.startswith("grid"))
    page.locator("#ss-history .thumbnail-item").nth(grid_index).click()
    page.wait_for_function("() => { const img = document.querySelector('#ss-history-view img'); "
                           "return img && img.complete && img.naturalWidth > 0; }")
    assert page.input_value("#ss-history-details textarea").startswith("a red circle\n")
    natural = page.evaluate("() => document.querySelector('#ss-history-view img').naturalWidth")
    assert natural > 2 * 128  # the grid itself (2 columns of 128 px cells and labels), not one cell
    page.click("#ss-history-view img")
    page.wait_for_selector(".ss-lightbox img")
    shown = lightbox(page)
    assert shown["natural"][0] == natural and shown["scale"] >= 1 and shown["width"] <= shown["window"][0]
    shot(page, "results-history-grid-lightbox")
    page.keyboard.press("Escape")
    page.wait_for_selector(".ss-lightbox", state="detached")
    shot(page, "results-history-grid")

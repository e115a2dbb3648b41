"""The built-in `outline` LoRA from the page, in a real Chromium, on the built-in model as
`python app.py` serves it: a LoRA node whose scale is swept (0 and 1) in the node editor, both
branches in shared forwards, and the Simple tab's "Add a LoRA" picker writing `<lora:outline:1>`
into the prompt. The pictures are checked: with the adapter the shape's centre shows the
background (an outline), without it the shape's colour."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from pipelines.loader import load_models
from tests.browser_helpers import BROWSER_MARKS, browser, editor_page, shot, sync_api  # noqa: F401 (browser: a fixture)
from tests.engine_helpers import spy_on_submits
from tests.studio_helpers import live_studio
from tests.test_node_editor_browser import drag_from_palette, drag_link, links, nodes

pytestmark = BROWSER_MARKS
PROMPT = "a large red circle on a blue background"
RED, BLUE = np.array([220, 40, 40]), np.array([40, 70, 220])


@pytest.fixture(scope="module")
def studio():
    [pipeline] = load_models(("builtin",))
    assert "outline" in pipeline.info.loras, "assets/loras/shapes-flux/outline.safetensors is not served"
    with live_studio(pipeline, preview_every=4, max_per_session=8) as (server, engine):
        yield server, engine


@pytest.fixture
def page(studio, browser):
    with editor_page(browser, studio[0].url) as page:
        yield page


def centre_colour(picture: Image.Image) -> str:
    """Which of the prompt's two colours the middle of the picture is nearest to."""
    pixels = np.asarray(picture.convert("RGB")).astype(float)
    h, w = pixels.shape[:2]
    middle = pixels[h // 2 - 3: h // 2 + 3, w // 2 - 3: w // 2 + 3].reshape(-1, 3).mean(axis=0)
    return "red" if np.linalg.norm(middle - RED) < np.linalg.norm(middle - BLUE) else "blue"


def fetched_picture(page, base_url: str, url: str) -> Image.Image:
    """A picture the page shows, by its (file or data) URL."""
    if url.startswith("data:"):
        return Image.open(io.BytesIO(base64.b64decode(url.partition(",")[2])))
    absolute = url if url.startswith("http") else base_url.rstrip("/") + "/" + url.lstrip("/")
    return Image.open(io.BytesIO(page.request.get(absolute).body()))


def test_a_lora_node_with_a_swept_scale_outlines_only_the_branch_at_scale_1(page, studio, monkeypatch):
    submitted = spy_on_submits(studio[1], monkeypatch)
    engine = studio[1]
    page.click("[data-action='clear']")
    prompt = drag_from_palette(page, "prompt", 40, 40)
    sweep = drag_from_palette(page, "sweep", 40, 280)
    lora = drag_from_palette(page, "lora", 330, 280)
    sampler = drag_from_palette(page, "sampler", 640, 40)
    grid = drag_from_palette(page, "grid", 960, 40)
    assert page.input_value(f"#node-{lora} select") == "outline"  # the model's first adapter, preselected
    page.fill(f"#node-{prompt} textarea", PROMPT)
    page.select_option(f"#node-{sweep} select", "lora_scale")
    page.fill(f"#node-{sweep} input", "0, 1")
    drag_link(page, prompt, 1, sampler, 1)
    drag_link(page, sweep, 1, lora, 2)       # lora_scale values -> the LoRA node's scale
    drag_link(page, lora, 1, sampler, 13)    # lora -> the sampler's lora input (its last)
    drag_link(page, sampler, 1, grid, 1)
    assert links(page) == 4 and len(nodes(page)) == 5
    shot(page, "editor-lora-built")
    before = dict(engine.snapshot().stats.forwards_by_batch_size)

    page.click("[data-action='run']")
    page.wait_for_selector(".sse-root[data-run-state='completed']", timeout=120_000)
    page.wait_for_selector(f"#node-{grid} img")
    shot(page, "editor-lora-done")
    after = engine.snapshot().stats.forwards_by_batch_size
    forwards = {size: count - before.get(size, 0) for size, count in after.items() if count - before.get(size, 0)}
    assert forwards.get(2, 0) >= 1, f"the two branches never shared a forward: {forwards}"
    assert sorted(use.scale for p in submitted for use in p.loras) == [0.0, 1.0]
    assert {p.loras[0].name for p in submitted} == {"outline"}
    state = page.evaluate("() => document.querySelector('.sse-root').stepstudioEditor.runState")
    by_scale = {b["label"]: fetched_picture(page, studio[0].url, b["image"]) for b in state["branches"] if b.get("image")}
    assert len(by_scale) == 2
    colours = {label: centre_colour(picture) for label, picture in by_scale.items()}
    assert colours == {"lora outline:0": "red", "lora outline:1": "blue"}, colours


def test_the_simple_tabs_picker_writes_the_tag_and_the_result_is_outlined(page, studio, monkeypatch):
    submitted = spy_on_submits(studio[1], monkeypatch)
    page.get_by_role("tab", name="Simple").click()
    page.wait_for_selector("#ss-generate")
    page.fill("#ss-prompt textarea", PROMPT)
    # A fixed seed: the adapter outlines 94% of held-out prompts, so a random seed fails now and then.
    # Seeds 0-23 of this prompt all come out outlined (measured with tools.evaluate_builtin).
    page.uncheck("#ss-random-seed input")
    page.fill("#ss-seed input", "5")
    page.click("#ss-lora input")
    page.get_by_role("option", name="outline").click()
    page.wait_for_function("() => document.querySelector('#ss-prompt textarea').value.endsWith('<lora:outline:1>')")
    assert page.input_value("#ss-prompt textarea") == f"{PROMPT} <lora:outline:1>"
    page.click("#ss-generate")
    page.wait_for_selector("#ss-result img", timeout=120_000)
    shot(page, "browser-simple-lora")
    [params] = submitted
    assert params.prompt == PROMPT and [(u.name, u.scale) for u in params.loras] == [("outline", 1.0)]
    assert params.seed == 5
    picture = fetched_picture(page, studio[0].url, page.get_attribute("#ss-result img", "src"))
    assert centre_colour(picture) == "blue"

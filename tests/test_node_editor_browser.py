"""The node editor in a real headless Chromium: build a graph with the mouse, run it, watch it, cancel.

Needs Debian's `chromium` and the `playwright` package (never `playwright install`).
Screenshots land in test-artifacts/ for a human to look at.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipelines.interface import ModelDefaults
from pipelines.toy import ToyPipeline
from tests.browser_helpers import BROWSER_MARKS, browser, editor_page, shot, sync_api  # noqa: F401 (browser: a fixture)
from tests.engine_helpers import StepGate, spy_on_cancels, spy_on_submits
from tests.studio_helpers import live_studio, wait_for

STEPS = 30
STEP_DELAY_S = 0.04

pytestmark = BROWSER_MARKS


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    defaults = ModelDefaults(width=64, height=64, num_inference_steps=STEPS, guidance_scale=1.0)
    pipeline = ToyPipeline(step_delay_s=STEP_DELAY_S, defaults=defaults)
    outputs = tmp_path_factory.mktemp("outputs")
    with live_studio(pipeline, outputs, preview_every=2, max_per_session=8) as (server, engine):
        yield server, engine, pipeline, outputs


@pytest.fixture
def page(studio, browser):
    with editor_page(browser, studio[0].url, accept_downloads=True) as page:
        yield page


def nodes(page, node_type: str | None = None) -> list[str]:
    selector = ".sse-canvas .drawflow-node" + (f"[data-node-type='{node_type}']" if node_type else "")
    return [el.get_attribute("id").removeprefix("node-") for el in page.query_selector_all(selector)]


def center(page, selector: str) -> tuple[float, float]:
    box = page.locator(selector).bounding_box()
    return box["x"] + box["width"] / 2, box["y"] + box["height"] / 2


def drag_from_palette(page, node_type: str, x: int, y: int) -> str:
    """Drag a palette entry onto the canvas at canvas point (x, y) (the view unpanned: from the top-left
    of the canvas's free part, beside the palette); returns the new node's id."""
    before = set(nodes(page))
    page.drag_and_drop(f".sse-palette-item[data-node-type='{node_type}']", ".sse-canvas .drawflow",
                       target_position={"x": x, "y": y})
    (new,) = set(nodes(page)) - before
    return new


def drag_link(page, source: str, output_index: int, target: str, input_index: int) -> None:
    """Press on an output port, move to an input port, release: drawflow's link gesture."""
    sx, sy = center(page, f"#node-{source} .outputs .output_{output_index}")
    tx, ty = center(page, f"#node-{target} .inputs .input_{input_index}")
    page.mouse.move(sx, sy)
    page.mouse.down()
    page.mouse.move(tx, ty, steps=12)
    page.mouse.up()


def links(page) -> int:
    return page.locator(".sse-canvas svg.connection").count()


def editor_workflow(page) -> dict:
    """The workflow JSON the editor would send on Run."""
    return page.evaluate("() => document.querySelector('.sse-root').stepstudioEditor.toWorkflow()")


def zoom(page) -> float:
    return page.evaluate("() => document.querySelector('.sse-root').stepstudioEditor.df.zoom")


def test_the_editor_is_the_default_tab_with_a_palette_and_the_text_to_image_graph(page):
    types = [el.get_attribute("data-node-type") for el in page.query_selector_all(".sse-palette-item")]
    assert types == ["prompt", "negative_prompt", "seed", "size", "steps", "guidance", "scheduler", "frames", "model",
                     "strength", "lora", "step_cache", "prompt_list", "seed_batch", "sweep", "load_image", "mask",
                     "upscale", "sampler", "image_output", "live_preview", "grid"]
    assert sorted(page.get_attribute(f"#node-{n}", "data-node-type") for n in nodes(page)) == sorted(
        ["prompt", "seed", "steps", "guidance", "sampler", "live_preview", "image_output"])
    assert links(page) == 6
    shot(page, "editor-default")


# What of the window the canvas covers: its box clipped to the window, over the window's area.
CANVAS_SHARE = """() => { const r = document.querySelector('.sse-canvas').getBoundingClientRect();
    const w = Math.max(0, Math.min(r.right, innerWidth) - Math.max(r.left, 0));
    const h = Math.max(0, Math.min(r.bottom, innerHeight) - Math.max(r.top, 0));
    return w * h / (innerWidth * innerHeight); }"""


def test_the_editor_opens_as_a_full_window_canvas_with_its_panels_over_it(studio, browser):
    with editor_page(browser, studio[0].url, viewport=(1440, 900)) as page:
        # As the page opens, the canvas covers most of the window (the help paragraph and the toolbar
        # above it once left it 46%: it started 339 px down, and 290 px of it were below the window).
        share = page.evaluate(CANVAS_SHARE)
        assert share >= 0.85, f"the canvas covers {share:.1%} of the window"
        shot(page, "editor-opens-full-window", full_page=False)
        canvas = page.locator(".sse-canvas").bounding_box()

        def over_canvas(selector: str) -> bool:
            box = page.locator(selector).bounding_box()
            return (canvas["x"] <= box["x"] and box["x"] + box["width"] <= canvas["x"] + canvas["width"]
                    and canvas["y"] <= box["y"] and box["y"] + box["height"] <= canvas["y"] + canvas["height"])

        # The toolbar, the palette, the run bar with the tab's queue controls float over the canvas.
        for selector in (".sse-toolbar", ".sse-palette", ".sse-runbar", "#sse-pause-queue", "#sse-resume-queue",
                         "#sse-clear-queue", "[data-action='full-screen']", ".sse-minimap"):
            assert over_canvas(selector), selector
        # The help is behind a button: hidden, shown by Help, gone again with Escape.
        assert not page.locator(".sse-help").is_visible()
        page.click("[data-action='help']")
        assert over_canvas(".sse-help") and "double-click the canvas" in page.inner_text(".sse-help")
        shot(page, "editor-help", full_page=False)
        page.keyboard.press("Escape")
        assert not page.locator(".sse-help").is_visible()
        # Full screen still hides the page's header and tabs: the canvas is the whole window.
        page.click("[data-action='full-screen']")
        assert page.evaluate(CANVAS_SHARE) == 1.0
        page.keyboard.press("Escape")
        assert page.evaluate(CANVAS_SHARE) == share


def test_build_a_graph_with_the_mouse_run_it_and_cancel_one_branch(page, studio, monkeypatch):
    engine, pipeline = studio[1], studio[2]
    cancels = spy_on_cancels(engine, monkeypatch)
    page.click("[data-action='clear']")
    assert nodes(page) == []
    prompt = drag_from_palette(page, "prompt", 60, 60)
    sweep = drag_from_palette(page, "sweep", 60, 260)
    sampler = drag_from_palette(page, "sampler", 380, 120)
    preview = drag_from_palette(page, "live_preview", 720, 40)
    grid = drag_from_palette(page, "grid", 720, 320)
    assert len(nodes(page)) == 5

    page.fill(f"#node-{prompt} textarea", "a red circle")
    page.select_option(f"#node-{sweep} select", "guidance")
    page.fill(f"#node-{sweep} input", "1, 2, 3, 4")

    # A wrong link is refused: a prompt does not go into the sampler's seed input (3rd input).
    drag_link(page, prompt, 1, sampler, 3)
    assert links(page) == 0
    assert "Can't link prompt to seed" in page.inner_text(".sse-message")

    drag_link(page, prompt, 1, sampler, 1)      # prompt -> prompt
    drag_link(page, sweep, 1, sampler, 6)       # guidance values -> guidance
    drag_link(page, sampler, 1, preview, 1)     # images -> live preview
    drag_link(page, sampler, 1, grid, 1)        # images -> grid
    assert links(page) == 4
    # A Sweep's output has the type of the setting it varies (its node type says so): set to steps,
    # its link into the guidance input no longer fits and goes; set back, it links again.
    page.select_option(f"#node-{sweep} select", "steps")
    page.wait_for_function("() => document.querySelectorAll('.sse-canvas svg.connection').length === 3")
    assert "the sweep now makes steps" in page.inner_text(".sse-message")
    page.select_option(f"#node-{sweep} select", "guidance")
    drag_link(page, sweep, 1, sampler, 6)
    assert links(page) == 4
    workflow = editor_workflow(page)
    assert {(lk["from"]["port"], lk["to"]["port"]) for lk in workflow["links"]} == {
        ("prompt", "prompt"), ("values", "guidance"), ("images", "images")}
    shot(page, "editor-built")

    # The engine holds inside the branches' 9th forward while the page is looked at and the cancel
    # goes out, so the branch is surely still running when its cancel arrives (no timing window);
    # then inside the 13th, while the page shows one branch aborted and none finished.
    first = len(pipeline.forward_log)
    gate, later = StepGate(first + 8), StepGate(first + 12)
    pipeline.on_forward = lambda index, batch: [hold(index, batch) for hold in (gate, later)]
    try:
        page.click("[data-action='run']")
        page.wait_for_selector(f"#node-{sampler}[data-state='running'] .sse-branch")
        bars = page.locator(f"#node-{sampler} .sse-branch")
        assert bars.count() == 4
        gate.wait()
        # The branch bars moved with the run, and every branch shows live previews.
        page.wait_for_function(
            f"() => +document.querySelector('#node-{sampler} .sse-branch[data-index=\"0\"] progress').value >= 8")
        page.wait_for_selector(f"#node-{preview} .sse-thumb img")
        shot(page, "editor-running")
        page.click(f"#node-{sampler} .sse-branch[data-index='2'] .sse-branch-cancel")
        wait_for(lambda: cancels, timeout_s=30, what="the branch's cancel to reach the engine")
        gate.release()
        later.wait()
        page.wait_for_selector(f"#node-{sampler} .sse-branch[data-index='2'][data-state='aborted']")
        # The run bar and the node's badge count finished branches, and say how many were aborted.
        assert page.inner_text(".sse-run-text") == "RUNNING · 0/4 finished · 1 aborted"
        badge = page.locator(f"#node-{sampler} .sse-badge")
        assert (badge.inner_text(), badge.get_attribute("title")) == ("running 0/4", "0/4 finished · 1 aborted")
        shot(page, "editor-one-aborted")
    finally:
        pipeline.on_forward = None
        gate.release()
        later.release()
    page.wait_for_selector(".sse-root[data-run-state='partial']", timeout=30_000)
    states = [el.get_attribute("data-state") for el in page.query_selector_all(f"#node-{sampler} .sse-branch")]
    assert states == ["completed", "completed", "aborted", "completed"]
    assert page.locator(f"#node-{grid} img.sse-grid").count() == 1
    assert page.locator("#ss-workflow-results img").count() >= 4  # the grid and three images
    # The run's words on its nodes too: "partial" (some finished, some aborted), never "cancelled".
    assert page.get_attribute(f"#node-{sampler}", "data-state") == "partial"
    assert page.inner_text(f"#node-{sampler} .sse-badge") == "partial 3/4"
    assert page.inner_text(".sse-run-text") == "PARTIAL · 3/4 finished · 1 aborted"
    shot(page, "editor-finished")
    assert engine.snapshot().requests == ()


def test_cancel_the_whole_run_from_the_toolbar(page, studio, monkeypatch):
    engine, pipeline = studio[1], studio[2]
    cancels = spy_on_cancels(engine, monkeypatch)
    page.select_option(".sse-examples", "example:guidance-steps-xy")
    page.wait_for_function("() => document.querySelectorAll('.sse-canvas .drawflow-node').length == 7")
    gate = StepGate(len(pipeline.forward_log) + 1)  # held in the run's second forward: nothing can finish
    pipeline.on_forward = gate
    try:
        page.click("[data-action='run']")
        (sampler,) = nodes(page, "sampler")
        page.wait_for_selector(f"#node-{sampler} .sse-branch[data-state='running']")
        gate.wait()
        page.click("[data-action='cancel']")
        wait_for(lambda: cancels, timeout_s=30, what="the run's cancels to reach the engine")
    finally:
        pipeline.on_forward = None
        gate.release()
    page.wait_for_selector(".sse-root[data-run-state]:not([data-run-state='running'])", timeout=30_000)
    assert page.get_attribute(".sse-root", "data-run-state") in ("aborted", "partial")
    states = {el.get_attribute("data-state") for el in page.query_selector_all(f"#node-{sampler} .sse-branch")}
    assert "aborted" in states and "running" not in states


def test_problems_are_shown_on_their_nodes_and_nothing_runs(page, studio):
    pipeline = studio[2]
    encoded = len(pipeline.encoded)
    (steps,) = nodes(page, "steps")
    page.fill(f"#node-{steps} input", "5000")
    page.click("[data-action='run']")
    page.wait_for_selector(f"#node-{steps}[data-state='invalid'] .sse-problem")
    assert "num_inference_steps=5000 is above this server's limit" in page.inner_text(f"#node-{steps} .sse-problem")
    assert page.get_attribute(".sse-root", "data-run-state") == "invalid"
    assert len(pipeline.encoded) == encoded
    shot(page, "editor-problem")
    # A new example clears the old graph's problems: no stale "Not run" or marked nodes.
    page.select_option(".sse-examples", "example:guidance-steps-xy")
    page.wait_for_function("() => document.querySelectorAll('.sse-canvas .drawflow-node').length == 7")
    assert page.inner_text(".sse-run-text") == "Ready."
    assert page.locator(".sse-problem").count() == 0 and page.locator("[data-state='invalid']").count() == 0
    assert page.get_attribute(".sse-root", "data-run-state") is None


def test_delete_undo_zoom_pan_save_and_upload(page, tmp_path):
    count = len(nodes(page))
    (preview,) = nodes(page, "live_preview")
    page.click(f"#node-{preview} .sse-delete")
    assert len(nodes(page)) == count - 1
    page.click("[data-action='undo']")
    assert len(nodes(page)) == count and nodes(page, "live_preview")
    assert links(page) == 6

    page.click("[data-action='zoom-in']")
    assert zoom(page) == pytest.approx(1.1)
    page.click("[data-action='zoom-reset']")
    assert zoom(page) == 1
    canvas = page.locator(".sse-canvas").bounding_box()
    page.mouse.move(canvas["x"] + canvas["width"] - 40, canvas["y"] + 500)  # right of the nodes, above the minimap
    page.mouse.down()
    page.mouse.move(canvas["x"] + canvas["width"] - 140, canvas["y"] + 450, steps=5)
    page.mouse.up()
    transform = page.get_attribute(".sse-canvas .drawflow", "style")
    assert "translate(-100px, -50px)" in transform

    with page.expect_download() as download:
        page.click("[data-action='download']")
    saved = json.loads(Path(download.value.path()).read_text())
    assert saved["version"] == 1 and len(saved["nodes"]) == count

    upload = tmp_path / "two.json"
    upload.write_text(json.dumps({"version": 1, "nodes": [
        {"id": "a", "type": "prompt", "values": {"text": "a blue square"}, "position": [40, 40]},
        {"id": "b", "type": "sampler", "values": {}, "position": [320, 40]}],
        "links": [{"from": {"node": "a", "port": "prompt"}, "to": {"node": "b", "port": "prompt"}}]}))
    page.set_input_files(".sse-file", str(upload))
    page.wait_for_function("() => document.querySelectorAll('.sse-canvas .drawflow-node').length == 2")
    assert links(page) == 1
    (prompt,) = nodes(page, "prompt")
    assert page.input_value(f"#node-{prompt} textarea") == "a blue square"
    # The graph survives a reload (kept in the browser).
    page.reload()
    page.wait_for_selector("#ss-node-editor .drawflow-node")
    assert len(nodes(page)) == 2 and links(page) == 1


def test_a_link_that_would_make_a_cycle_is_refused_with_a_reason(page, tmp_path):
    page.click("[data-action='clear']")
    sampler = drag_from_palette(page, "sampler", 300, 120)
    drag_link(page, sampler, 1, sampler, 1)  # its images onto its own prompt input
    assert links(page) == 0
    assert page.inner_text(".sse-message") == ("That link would make a cycle: a Sampler's output can't feed its "
                                               "own input.")
    assert page.get_attribute(".sse-message", "data-kind") == "error"
    # A file with such a link: refused as a drawn one is, and named as the file names it.
    looped = tmp_path / "looped.json"
    looped.write_text(json.dumps({"version": 1, "nodes": [
        {"id": "1", "type": "prompt", "values": {"text": "a loop"}, "position": [40, 40]},
        {"id": "2", "type": "sampler", "values": {}, "position": [320, 40]}],
        "links": [{"from": {"node": "1", "port": "prompt"}, "to": {"node": "2", "port": "prompt"}},
                  {"from": {"node": "2", "port": "images"}, "to": {"node": "2", "port": "image"}}]}))
    page.set_input_files(".sse-file", str(looped))
    page.wait_for_function("() => document.querySelectorAll('.sse-canvas .drawflow-node').length == 2")
    assert links(page) == 1  # the prompt's link only
    assert page.inner_text(".sse-message") == ("Skipped links that would make a cycle: Sampler (node 2) -> "
                                               "Sampler (node 2).")
    shot(page, "editor-cycle-refused")


def test_a_saved_png_opens_its_workflow(page, studio):
    outputs = studio[3]
    before = set(outputs.rglob("*.png"))
    page.select_option(".sse-examples", "example:seed-batch-2x2")
    page.wait_for_function("() => document.querySelectorAll('.sse-canvas .drawflow-node').length == 5")
    original = editor_workflow(page)
    page.click("[data-action='run']")
    page.wait_for_selector(".sse-root[data-run-state='completed']", timeout=60_000)
    new = sorted(set(outputs.rglob("*.png")) - before)
    saved = [path for path in new if not path.stem.endswith("-grid")]
    assert len(saved) == 4 and len(new) == 5  # each branch, and the run's grid
    page.click("[data-action='clear']")
    assert nodes(page) == []
    page.set_input_files(".sse-file", str(saved[0]))  # what dropping the file on the canvas does
    page.wait_for_function("() => document.querySelectorAll('.sse-canvas .drawflow-node').length == 5")
    reopened = editor_workflow(page)
    by_type = lambda w: sorted((n["type"], json.dumps(n["values"], sort_keys=True)) for n in w["nodes"])  # noqa: E731
    assert by_type(reopened) == by_type(original)
    assert len(reopened["links"]) == len(original["links"]) == 4


def test_a_finished_run_shows_every_branch_image_and_each_picture_came_once(page, studio):
    """The run's updates carry a branch's preview only when it is new and results as file URLs;
    the editor merges them, so once the run completes every branch's image shows."""
    def link(a, b, port):
        return {"from": {"node": a, "port": port}, "to": {"node": b, "port": port}}

    workflow = {"version": 1, "nodes": [
        {"id": "p", "type": "prompt", "values": {"text": "a red circle"}, "position": [40, 40]},
        {"id": "d", "type": "seed_batch", "values": {"start": 3, "count": 4}, "position": [40, 240]},
        {"id": "s", "type": "sampler", "values": {}, "position": [330, 100]},
        {"id": "lp", "type": "live_preview", "values": {}, "position": [660, 20]},
        {"id": "io", "type": "image_output", "values": {}, "position": [660, 260]},
        {"id": "g", "type": "grid", "values": {"x": "seed", "y": "auto"}, "position": [660, 500]}],
        "links": [link("p", "s", "prompt"), link("d", "s", "seed"), link("s", "lp", "images"),
                  link("s", "io", "images"), link("s", "g", "images")]}
    page.evaluate("(w) => document.querySelector('.sse-root').stepstudioEditor.load(w)", workflow)
    page.wait_for_function("() => document.querySelectorAll('.sse-canvas .drawflow-node').length == 6")
    # Every update as it arrives from Python, before the editor merges it.
    page.evaluate("""() => { const editor = document.querySelector('.sse-root').stepstudioEditor;
        window.updates = []; const show = editor.showRun.bind(editor);
        editor.showRun = (update) => { window.updates.push(JSON.parse(JSON.stringify(update))); return show(update); }; }""")
    page.click("[data-action='run']")
    page.wait_for_selector(".sse-root[data-run-state='completed']", timeout=60_000)
    (output,) = nodes(page, "image_output")
    (preview,) = nodes(page, "live_preview")
    (grid,) = nodes(page, "grid")
    loaded = "(img) => img.complete && img.naturalWidth > 0 && getComputedStyle(img).display !== 'none'"
    for node in (output, preview):
        page.wait_for_function(f"() => [...document.querySelectorAll('#node-{node} .sse-thumb img')].filter({loaded}).length == 4")
    page.wait_for_function(f"() => [...document.querySelectorAll('#node-{grid} img.sse-grid')].filter({loaded}).length == 1")
    sources = [img.get_attribute("src") for img in page.query_selector_all(f"#node-{output} .sse-thumb img")]
    assert len(set(sources)) == 4 and all(src.startswith("gradio_api/file=") for src in sources)
    assert page.get_attribute(f"#node-{grid} img.sse-grid", "src").startswith("gradio_api/file=")
    # Each branch's thumbnails show its own image: its figure says which branch it is.
    indices = [el.get_attribute("data-index") for el in page.query_selector_all(f"#node-{output} .sse-thumb")]
    assert indices == ["0", "1", "2", "3"]

    updates = page.evaluate("() => window.updates")
    assert len(updates) > 5 and all(len(u["branches"]) == 4 for u in updates)
    for index in range(4):
        previews = [u["branches"][index]["preview"] for u in updates if "preview" in u["branches"][index]]
        # A preview is sent only in the update where it is new: one every 2 steps (preview_every=2).
        assert 1 <= len(previews) <= STEPS // 2 + 1
        images = {u["branches"][index]["image"] for u in updates if u["branches"][index]["image"]}
        assert len(images) == 1  # one file, written once, named in every later update
    # The editor kept each branch's last preview between the updates that brought one.
    kept = page.evaluate("() => document.querySelector('.sse-root').stepstudioEditor.runState.branches.map((b) => !!b.preview)")
    assert kept == [True] * 4


def test_fit_shows_every_node(page):
    page.select_option(".sse-examples", "example:guidance-steps-xy")
    page.wait_for_function("() => document.querySelectorAll('.sse-canvas .drawflow-node').length == 7")
    page.click("[data-action='zoom-in']")
    page.click("[data-action='zoom-in']")
    page.click("[data-action='fit']")
    canvas = page.locator(".sse-canvas").bounding_box()
    for node_id in nodes(page):
        box = page.locator(f"#node-{node_id}").bounding_box()
        assert canvas["x"] <= box["x"] and box["x"] + box["width"] <= canvas["x"] + canvas["width"] + 1
        assert canvas["y"] <= box["y"] and box["y"] + box["height"] <= canvas["y"] + canvas["height"] + 1
    assert zoom(page) <= 1
    shot(page, "editor-fit")


def load_image_node(page, tmp_path, picture: Image.Image) -> str:
    """A new Load image node on a cleared canvas, its picture chosen with the node's file input."""
    picture.save(tmp_path / "start.png")
    page.click("[data-action='clear']")
    node_id = drag_from_palette(page, "load_image", 30, 40)
    page.set_input_files(f"#node-{node_id} .sse-picture input[type=file]", str(tmp_path / "start.png"))
    page.wait_for_selector(f"#node-{node_id} .sse-picture[data-has='yes'] img")
    return node_id


def test_a_picture_chosen_on_a_load_image_node_is_redrawn_in_two_chained_stages(page, studio, tmp_path, monkeypatch):
    submitted = spy_on_submits(studio[1], monkeypatch)
    start = Image.new("RGB", (64, 64), (30, 60, 200))
    start.paste((240, 200, 20), (8, 8, 40, 40))
    picture = load_image_node(page, tmp_path, start)
    prompt = drag_from_palette(page, "prompt", 30, 330)
    first = drag_from_palette(page, "sampler", 320, 20)
    second = drag_from_palette(page, "sampler", 640, 20)
    output = drag_from_palette(page, "image_output", 960, 20)
    page.fill(f"#node-{prompt} textarea", "a red circle")
    drag_link(page, picture, 1, first, 11)  # image -> the sampler's image input
    drag_link(page, prompt, 1, first, 1)
    drag_link(page, prompt, 1, second, 1)
    drag_link(page, first, 1, second, 11)  # images of stage 1 -> the picture stage 2 starts from
    drag_link(page, second, 1, output, 1)
    assert links(page) == 5
    workflow = editor_workflow(page)
    (load,) = [n for n in workflow["nodes"] if n["type"] == "load_image"]
    assert load["values"]["image"].startswith("data:image/png;base64,")
    assert {(lk["from"]["port"], lk["to"]["port"]) for lk in workflow["links"]} == {
        ("image", "image"), ("prompt", "prompt"), ("images", "image"), ("images", "images")}
    shot(page, "editor-two-stages-built")

    page.click("[data-action='run']")
    page.wait_for_selector(".sse-root[data-run-state='completed']", timeout=60_000)
    page.wait_for_selector(f"#node-{output} .sse-thumb img")
    for sampler in (first, second):
        assert page.get_attribute(f"#node-{sampler}", "data-state") == "done"
    assert page.get_attribute(f"#node-{picture}", "data-state") == "done"
    shot(page, "editor-two-stages-done")
    # Stage 1 started from the uploaded picture, stage 2 from stage 1's image, each redrawing 18
    # of the model's 30 steps (its default strength, 0.6).
    stage1, stage2 = submitted
    assert np.array_equal(np.asarray(stage1.init_image), np.asarray(start))
    assert stage1.strength == stage2.strength == 0.6 and stage1.denoise_steps == stage2.denoise_steps == 18
    assert stage2.init_image.size == (64, 64)
    assert not np.array_equal(np.asarray(stage2.init_image), np.asarray(start))  # stage 1's image, redrawn


def test_a_mask_painted_in_the_editor_is_what_the_sampler_repaints(page, studio, tmp_path, monkeypatch):
    submitted = spy_on_submits(studio[1], monkeypatch)
    picture = load_image_node(page, tmp_path, Image.new("RGB", (64, 64), (30, 60, 200)))
    mask = drag_from_palette(page, "mask", 30, 330)
    prompt = drag_from_palette(page, "prompt", 320, 420)
    sampler = drag_from_palette(page, "sampler", 640, 20)
    page.fill(f"#node-{prompt} textarea", "a red circle")
    drag_link(page, picture, 1, sampler, 11)
    drag_link(page, mask, 1, sampler, 12)
    drag_link(page, prompt, 1, sampler, 1)
    page.click(f"#node-{mask} .sse-picture-pick")
    view = page.locator(".sse-paint-view")
    box = view.bounding_box()
    assert round(box["width"]) == 6 * 64  # the 64 px picture, shown 6x
    # A stroke across the left quarter, top to bottom.
    page.mouse.move(box["x"] + box["width"] * 0.12, box["y"] + 2)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.12, box["y"] + box["height"] - 2, steps=20)
    page.mouse.up()
    shot(page, "editor-mask-painting")
    page.click(".sse-paint-dialog [data-paint='done']")
    page.wait_for_selector(f"#node-{mask} .sse-picture[data-has='yes'] img")
    (values,) = [n["values"] for n in editor_workflow(page)["nodes"] if n["type"] == "mask"]
    assert values["source"] == "painted" and values["painted"].startswith("data:image/png;base64,")
    assert page.eval_on_selector(f"#node-{mask} select[df-source]", "el => el.value") == "painted"
    page.click("[data-action='run']")
    page.wait_for_selector(".sse-root[data-run-state='completed']", timeout=60_000)
    (params,) = submitted
    painted = np.asarray(params.mask_image)
    assert painted[:, 6:9].min() == 255  # the stroke (x = 0.12 * 64 = 7.7, a 6 px brush)
    assert painted[:, 20:].max() == 0  # nothing painted right of it

"""The node editor's everyday gestures in a real headless Chromium, done with the mouse and the
keyboard: search, links dropped on empty canvas, right-click menus, copy/paste (also into a second
tab), duplicate, box-select, groups, bypass, full screen, the minimap, Ctrl+Enter and Ctrl+Alt+Enter,
and the undo entry of each. Every test reads the graph JSON the editor would run.

One page serves every test (each starts by opening its own workflow); screenshots land in
test-artifacts/ for a human to look at.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.interface import ModelDefaults
from pipelines.toy import ToyPipeline
from tests.browser_helpers import BROWSER_MARKS, browser, editor_page, shot, sync_api  # noqa: F401 (browser: a fixture)
from tests.editor_driver import (
    EDITOR,
    center,
    client,
    drag,
    graph,
    layout,
    links,
    menu_labels,
    node_ids,
    open_workflow,
    port,
    positions,
    press,
    run_js,
    search_entries,
    typed_links,
)
from tests.engine_helpers import StepGate, spy_on_cancels, spy_on_submits
from tests.studio_helpers import live_studio, wait_for

pytestmark = BROWSER_MARKS

XY = json.loads((Path(__file__).resolve().parent.parent / "assets" / "workflows" / "guidance-steps-xy.json").read_text())
EMPTY = {"version": 1, "nodes": [], "links": []}


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    defaults = ModelDefaults(width=64, height=64, num_inference_steps=12, guidance_scale=1.0)
    pipeline = ToyPipeline(step_delay_s=0.02, defaults=defaults)
    with live_studio(pipeline, None, preview_every=4) as (server, engine):
        yield server, engine, pipeline


@pytest.fixture(scope="module")
def page(studio, browser):
    with editor_page(browser, studio[0].url) as page:
        yield page


@pytest.fixture(autouse=True)
def editor_in_view(page):
    """Each test opens its own workflow, on the page as it opens: at its top, the canvas filling the window."""
    page.evaluate("() => window.scrollTo(0, 0)")
    yield


# ---------------------------------------------------------------------------- search
def test_double_click_search_filters_by_name_and_port_type_and_adds_where_you_clicked(page):
    open_workflow(page, EMPTY)
    x, y = client(page, 300, 200)
    page.mouse.dblclick(x, y)
    page.wait_for_selector(".sse-search-input:focus")
    page.keyboard.type("seed")
    assert search_entries(page) == ["Seed", "Seed batch", "Sampler"]  # names first, then a seed port
    page.fill(".sse-search-input", "in:seed")
    assert search_entries(page) == ["Sampler"]
    page.fill(".sse-search-input", "out:seed")
    assert search_entries(page) == ["Seed", "Seed batch"]
    shot(page, "gestures-search")
    press(page, "ArrowDown")
    press(page, "Enter")
    assert page.locator(".sse-search").count() == 0
    (node,) = graph(page)["nodes"]
    assert (node["type"], node["values"], node["position"]) == ("seed_batch", {"start": 0, "count": 4}, [300, 200])
    # Escape closes the search and adds nothing.
    page.mouse.dblclick(*client(page, 600, 400))
    page.keyboard.type("grid")
    press(page, "Escape")
    assert page.locator(".sse-search").count() == 0 and len(graph(page)["nodes"]) == 1
    # Undo takes the node away, redo brings it back.
    press(page, "Control+z")
    assert graph(page)["nodes"] == []
    press(page, "Control+Shift+z")
    assert [n["type"] for n in graph(page)["nodes"]] == ["seed_batch"]


def test_a_link_dropped_on_empty_canvas_opens_the_search_for_nodes_that_fit_it(page):
    open_workflow(page, XY)
    (sampler,) = node_ids(page, "sampler")
    before, typed = links(page), typed_links(page)
    # From an output: the nodes that take images; the chosen one is added there and linked.
    drag(page, port(page, sampler, "output", 1), client(page, 700, 700))
    page.wait_for_selector(".sse-search-input:focus")
    assert page.inner_text(".sse-search-head") == "NODES THAT TAKE IMAGES"
    assert search_entries(page) == ["Mask", "Upscale", "Sampler", "Image output", "Live preview", "Grid"]
    page.keyboard.type("image o")
    press(page, "Enter")
    (output,) = node_ids(page, "image_output")
    assert links(page) == before | {(sampler, "images", output, "images")}
    shot(page, "gestures-link-dropped")
    press(page, "Control+z")
    assert node_ids(page, "image_output") == [] and typed_links(page) == typed
    (sampler,) = node_ids(page, "sampler")

    # From a free input (the sampler's size): the nodes that make a size, a Sweep set to vary it.
    drag(page, port(page, sampler, "input", 4), client(page, 560, 760))
    page.wait_for_selector(".sse-search-input:focus")
    assert search_entries(page) == ["Size", "Sweep (size)"]
    press(page, "ArrowDown")
    press(page, "Enter")
    (sweep,) = [n for n in graph(page)["nodes"] if n["type"] == "sweep" and n["values"]["param"] == "size"]
    assert (sweep["id"], "values", sampler, "size") in links(page)
    press(page, "Control+z")
    assert typed_links(page) == typed and len(graph(page)["nodes"]) == 7

    # Dropped on a node's body: it joins that node's first free input that takes it.
    open_workflow(page, {"version": 1, "links": [], "nodes": [
        {"id": "p", "type": "prompt", "values": {"text": "a red circle"}, "position": [40, 40]},
        {"id": "s", "type": "sampler", "values": {}, "position": [400, 40]}]})
    (prompt,), (sampler,) = node_ids(page, "prompt"), node_ids(page, "sampler")
    drag(page, port(page, prompt, "output", 1), center(page, f"#node-{sampler} .sse-title-text"))
    assert links(page) == {(prompt, "prompt", sampler, "prompt")}
    assert page.locator(".sse-search").count() == 0


def dragged_link(page) -> list[float]:
    """The link being dragged (drawflow's path with no ends yet), as [start x, start y, end x, end y] in
    the window (zoom 1)."""
    return run_js(page, """const path = editor.canvas.querySelector('svg.connection:not([class*="node_in"]) .main-path');
        if (!path) return null;
        const n = path.getAttribute('d').match(/-?[0-9.]+/g).map(Number), r = editor.df.precanvas.getBoundingClientRect();
        return [n[0] + r.x, n[1] + r.y, n[n.length - 2] + r.x, n[n.length - 1] + r.y];""")


def test_a_drag_from_a_linked_input_lifts_its_link_onto_another_input_or_off_in_one_undo_entry(page):
    open_workflow(page, {"version": 1, "nodes": [
        {"id": "p", "type": "prompt", "values": {"text": "a red circle"}, "position": [40, 40]},
        {"id": "d", "type": "seed", "values": {"seed": 7}, "position": [40, 300]},
        {"id": "a", "type": "sampler", "values": {}, "position": [360, 40]},
        {"id": "b", "type": "sampler", "values": {}, "position": [720, 40]}],
        "links": [{"from": {"node": "p", "port": "prompt"}, "to": {"node": "a", "port": "prompt"}},
                  {"from": {"node": "d", "port": "seed"}, "to": {"node": "a", "port": "seed"}}]})
    (prompt,), (seed,), (first, second) = node_ids(page, "prompt"), node_ids(page, "seed"), node_ids(page, "sampler")
    linked = {(prompt, "prompt", first, "prompt"), (seed, "seed", first, "seed")}
    assert links(page) == linked
    entries = run_js(page, "return editor.undoStack.length;")

    # Pressed and moved, the link leaves the input and follows the mouse from its output.
    start, output = port(page, first, "input", 1), port(page, prompt, "output", 1)
    page.mouse.move(*start)
    page.mouse.down()
    page.mouse.move(start[0] + 150, start[1] + 250, steps=8)
    assert links(page) == {(seed, "seed", first, "seed")}
    ends = dragged_link(page)
    expected = [output[0], output[1], start[0] + 150, start[1] + 250]  # from the output port to the mouse
    assert ends is not None and max(abs(a - b) for a, b in zip(ends, expected)) <= 1, (ends, expected)
    shot(page, "gestures-link-lifted", full_page=False)
    # Dropped on another sampler's prompt input: linked there, one undo entry.
    target = port(page, second, "input", 1)
    page.mouse.move(*target, steps=8)
    page.mouse.up()
    assert links(page) == {(prompt, "prompt", second, "prompt"), (seed, "seed", first, "seed")}
    assert run_js(page, "return editor.undoStack.length;") == entries + 1
    press(page, "Control+z")
    assert typed_links(page) == {("prompt", "prompt", "sampler", "prompt"), ("seed", "seed", "sampler", "seed")}
    (prompt,), (seed,), (first, second) = node_ids(page, "prompt"), node_ids(page, "seed"), node_ids(page, "sampler")
    assert links(page) == {(prompt, "prompt", first, "prompt"), (seed, "seed", first, "seed")}

    # A press without a move lifts nothing: the link stays, no undo entry.
    entries = run_js(page, "return editor.undoStack.length;")
    page.mouse.click(*port(page, first, "input", 1))
    assert links(page) == {(prompt, "prompt", first, "prompt"), (seed, "seed", first, "seed")}
    assert run_js(page, "return editor.undoStack.length;") == entries
    # Dropped on an input of another type: refused as a drawn link is, and the lifted link stays off.
    drag(page, port(page, first, "input", 1), port(page, second, "input", 3))
    assert "Can't link prompt to seed" in page.inner_text(".sse-message")
    assert links(page) == {(seed, "seed", first, "seed")}
    press(page, "Control+z")
    (prompt,), (seed,), (first, second) = node_ids(page, "prompt"), node_ids(page, "seed"), node_ids(page, "sampler")
    assert links(page) == {(prompt, "prompt", first, "prompt"), (seed, "seed", first, "seed")}

    # Dropped on empty canvas: the link is off, and the search offers the nodes that take a seed,
    # as for a link dragged from the output (ComfyUI's link release); closed unused, the link is gone.
    drag(page, port(page, first, "input", 3), client(page, 420, 700))
    page.wait_for_selector(".sse-search-input:focus")
    assert page.inner_text(".sse-search-head") == "NODES THAT TAKE SEED"
    assert links(page) == {(prompt, "prompt", first, "prompt")}
    press(page, "Escape")
    assert page.locator(".sse-search").count() == 0 and len(graph(page)["nodes"]) == 4
    assert links(page) == {(prompt, "prompt", first, "prompt")}
    press(page, "Control+z")
    assert typed_links(page) == {("prompt", "prompt", "sampler", "prompt"), ("seed", "seed", "sampler", "seed")}
    # Picked from that search, the new node takes the link: the lift and the node are one undo entry.
    (first, _) = node_ids(page, "sampler")
    drag(page, port(page, first, "input", 3), client(page, 420, 700))
    page.wait_for_selector(".sse-search-input:focus")
    page.keyboard.type("sampler")
    press(page, "Enter")
    (seed,), samplers = node_ids(page, "seed"), node_ids(page, "sampler")
    assert len(samplers) == 3 and (seed, "seed", samplers[2], "seed") in links(page)
    assert (seed, "seed", samplers[0], "seed") not in links(page)
    press(page, "Control+z")
    assert len(node_ids(page, "sampler")) == 2
    assert typed_links(page) == {("prompt", "prompt", "sampler", "prompt"), ("seed", "seed", "sampler", "seed")}


# ---------------------------------------------------------------------------- right-click menus
def test_right_click_menus_add_colour_duplicate_and_delete_each_with_an_undo(page):
    open_workflow(page, XY)
    page.mouse.click(*client(page, 700, 760), button="right")
    assert menu_labels(page) == ["Search nodes…", "Add node", "Add group here", "Paste", "Select all", "Fit view"]
    page.hover(".sse-menu-root > [data-label='Add node']")
    page.hover(".sse-submenu > [data-label='Sampler']")
    page.click(".sse-submenu .sse-submenu [data-node-type='sampler']")
    samplers = node_ids(page, "sampler")
    assert len(samplers) == 2
    added = samplers[1]
    assert positions(page)[added] == [700, 760]

    page.click(f"#node-{added} .sse-title-text", button="right")
    assert menu_labels(page) == ["Duplicate", "Copy", "Delete", "Bypass", "Colour", "Group this node"]
    assert page.locator(".drawflow-delete").count() == 0  # drawflow's own right-click "x" never shows
    page.hover(".sse-menu-root > [data-label='Colour']")
    page.click(".sse-submenu > [data-label='Blue']")
    assert {n["id"]: n.get("color") for n in graph(page)["nodes"]}[added] == "#2563eb"
    assert page.eval_on_selector(f"#node-{added} .sse-title", "el => getComputedStyle(el).backgroundColor") == "rgb(37, 99, 235)"
    shot(page, "gestures-node-menu")

    page.click(f"#node-{added} .sse-title-text", button="right")
    page.click(".sse-menu-root > [data-label='Duplicate']")
    copies = [n for n in graph(page)["nodes"] if n["type"] == "sampler"]
    assert len(copies) == 3 and copies[2]["color"] == "#2563eb" and copies[2]["position"] == [730, 790]
    page.click(f"#node-{copies[2]['id']} .sse-title-text", button="right")
    page.click(".sse-menu-root > [data-label='Delete']")
    assert len(node_ids(page, "sampler")) == 2
    for count, colour in ((3, "#2563eb"), (2, "#2563eb"), (2, None), (1, None)):  # undo: delete, duplicate, colour, add
        press(page, "Control+z")
        nodes = [n for n in graph(page)["nodes"] if n["type"] == "sampler"]
        assert len(nodes) == count and nodes[-1].get("color") == (colour if count > 1 else None)

    # On a link: delete it.
    typed = typed_links(page)
    (seed,) = node_ids(page, "seed")
    x, y = port(page, seed, "output", 1)
    page.mouse.click(x + 12, y, button="right")  # on its link, just right of the port
    assert menu_labels(page) == ["Delete link"]
    page.click(".sse-menu-root > [data-label='Delete link']")
    assert typed - typed_links(page) == {("seed", "seed", "sampler", "seed")}
    press(page, "Control+z")
    assert typed_links(page) == typed


# ---------------------------------------------------------------------------- copy, paste, duplicate
def test_copy_paste_and_duplicate_keep_the_links_between_copied_nodes_also_in_a_second_tab(page, studio):
    open_workflow(page, XY)
    (sampler,), (grid,) = node_ids(page, "sampler"), node_ids(page, "grid")
    before = links(page)
    page.click(f"#node-{sampler} .sse-title-text")
    page.click(f"#node-{grid} .sse-title-text", modifiers=["Shift"])
    assert sorted(run_js(page, "return editor.selection.selected();")) == sorted([sampler, grid])
    press(page, "Control+c")
    page.mouse.move(*client(page, 300, 820))
    press(page, "Control+v")
    page.wait_for_function(f"() => {EDITOR}.toWorkflow().nodes.length == 9")
    new_sampler, new_grid = node_ids(page, "sampler")[1], node_ids(page, "grid")[1]
    assert links(page) - before == {(new_sampler, "images", new_grid, "images")}
    assert positions(page)[new_sampler] == [300, 820]  # the copied nodes' top-left at the mouse
    assert positions(page)[new_grid][0] - positions(page)[new_sampler][0] == 330  # as far apart as the originals
    assert [n["values"] for n in graph(page)["nodes"] if n["id"] == new_grid] == [{"x": "guidance", "y": "steps"}]
    # The pasted nodes are selected: Ctrl+D duplicates them, with their link.
    press(page, "Control+d")
    assert len(graph(page)["nodes"]) == 11 and len(links(page)) == 8
    shot(page, "gestures-pasted")
    press(page, "Control+z")
    assert len(graph(page)["nodes"]) == 9 and len(links(page)) == 7
    press(page, "Control+z")
    assert len(graph(page)["nodes"]) == 7 and len(links(page)) == 6
    # Ctrl+X: copied, then gone; Ctrl+V brings it back where the mouse is.
    (grid,) = node_ids(page, "grid")
    page.click(f"#node-{grid} .sse-title-text")
    press(page, "Control+x")
    assert node_ids(page, "grid") == [] and len(links(page)) == 5
    page.mouse.move(*client(page, 900, 500))
    press(page, "Control+v")
    page.wait_for_function(f"() => {EDITOR}.toWorkflow().nodes.length == 7")
    assert [(n["position"], n["values"]) for n in graph(page)["nodes"] if n["type"] == "grid"] == [
        ([900, 500], {"x": "guidance", "y": "steps"})]
    press(page, "Control+z")
    press(page, "Control+z")
    assert layout(page) == sorted((n["type"], n["position"]) for n in XY["nodes"])
    # The first copy again, for the other tab.
    (sampler,), (grid,) = node_ids(page, "sampler"), node_ids(page, "grid")
    page.click(f"#node-{sampler} .sse-title-text")
    page.click(f"#node-{grid} .sse-title-text", modifiers=["Shift"])
    press(page, "Control+c")

    # Another tab of the same browser pastes them too: the copy waits in the storage every tab of
    # the studio shares, and on the system clipboard (for another browser), each enough alone.
    other = page.context.new_page()
    other.goto(studio[0].url)
    other.wait_for_selector("#ss-node-editor .drawflow-node")
    stored = json.loads(other.evaluate("() => localStorage.getItem('stepstudio.clipboard')"))
    assert (stored["kind"], sorted(n["type"] for n in stored["nodes"]), len(stored["links"])) == (
        "stepstudio-nodes", ["grid", "sampler"], 1)
    other.evaluate(f"() => {EDITOR}.load({{version: 1, nodes: [], links: []}})")
    for source in ("either", "the system clipboard alone"):
        if source != "either":
            other.evaluate("() => localStorage.removeItem('stepstudio.clipboard')")
            other.keyboard.press("Control+z")
            assert graph(other)["nodes"] == []
        other.mouse.move(*client(other, 100, 100))
        other.keyboard.press("Control+v")
        other.wait_for_function(f"() => {EDITOR}.toWorkflow().nodes.length == 2")
        pasted = graph(other)
        assert sorted(n["type"] for n in pasted["nodes"]) == ["grid", "sampler"] and len(pasted["links"]) == 1, source
    shot(other, "gestures-pasted-in-another-tab")
    other.close()


# ---------------------------------------------------------------------------- box-select, move, delete
def test_a_box_selects_nodes_that_then_move_and_go_together(page):
    open_workflow(page, XY)
    sweeps = node_ids(page, "sweep")
    start, laid_out = positions(page), layout(page)
    # Shift+drag on empty canvas: a box over the two Sweeps (and nothing else).
    drag(page, client(page, 20, 340), client(page, 280, 720), modifier="Shift")
    assert sorted(run_js(page, "return editor.selection.selected();")) == sorted(sweeps)
    assert page.locator(".drawflow-node.sse-picked").count() == 2
    # Dragging one of them moves both.
    title = center(page, f"#node-{sweeps[0]} .sse-title-text")
    drag(page, title, (title[0] + 150, title[1] + 40))
    moved = positions(page)
    assert {i: [moved[i][0] - start[i][0], moved[i][1] - start[i][1]] for i in moved} == {
        i: [150, 40] if i in sweeps else [0, 0] for i in moved}
    moved_out = layout(page)
    shot(page, "gestures-box-moved")
    press(page, "Delete")
    assert sorted(n["type"] for n in graph(page)["nodes"]) == ["grid", "live_preview", "prompt", "sampler", "seed"]
    assert len(links(page)) == 4
    press(page, "Control+z")  # the delete
    assert layout(page) == moved_out and len(links(page)) == 6
    press(page, "Control+z")  # the move, one entry for both nodes
    assert layout(page) == laid_out


# ---------------------------------------------------------------------------- groups
def test_a_group_moves_the_nodes_inside_it_and_is_kept_in_the_workflow(page, studio):
    # The X/Y example, its Seed a little higher: the group's title (above the Sweeps) shows.
    open_workflow(page, {**XY, "nodes": [{**n, "position": [40, 160]} if n["type"] == "seed" else n for n in XY["nodes"]]})
    sweeps = node_ids(page, "sweep")
    drag(page, client(page, 20, 340), client(page, 280, 720), modifier="Control")
    press(page, "Control+g")
    (group,) = graph(page)["groups"]
    boxes = run_js(page, "return arg.map((id) => [editor.nodeElement(id).offsetWidth, editor.nodeElement(id).offsetHeight]);", sweeps)
    # Around the two sweeps (at 40,330 and 40,510), with room for its title.
    assert group["title"] == "Group" and group["position"] == [20, 276]
    assert group["size"] == [boxes[0][0] + 40, 510 + boxes[1][1] + 20 - 276]
    start = positions(page)
    laid_out = layout(page)
    title = center(page, ".sse-group-title")
    drag(page, title, (title[0] + 10, title[1] + 260))
    moved = positions(page)
    assert {i: [moved[i][0] - start[i][0], moved[i][1] - start[i][1]] for i in moved} == {
        i: [10, 260] if i in sweeps else [0, 0] for i in moved}
    assert graph(page)["groups"][0]["position"] == [30, 536]
    page.dblclick(".sse-group-title")
    page.keyboard.press("Control+a")
    page.keyboard.type("Axes")
    press(page, "Enter")
    assert graph(page)["groups"][0]["title"] == "Axes"
    shot(page, "gestures-group")
    press(page, "Control+z")  # the title
    assert graph(page)["groups"][0]["title"] == "Group"
    press(page, "Control+z")  # the move: group and nodes
    assert layout(page) == laid_out and graph(page)["groups"][0]["position"] == [20, 276]
    press(page, "Control+Shift+z")
    moved_out = layout(page)
    # Kept with the workflow: a reload (the browser's copy) shows it again.
    page.reload()
    page.wait_for_selector(".sse-group")
    assert graph(page)["groups"] == [{"title": "Group", "position": [30, 536], "size": group["size"]}]
    assert layout(page) == moved_out


def test_a_copy_takes_along_the_groups_that_hold_only_copied_nodes(page):
    frame = {"title": "Axes", "position": [20, 296], "size": [320, 520], "color": "#2563eb"}  # around both Sweeps
    open_workflow(page, {**XY, "groups": [frame]})
    first, second = node_ids(page, "sweep")
    page.click(f"#node-{first} .sse-title-text")
    page.click(f"#node-{second} .sse-title-text", modifiers=["Shift"])
    press(page, "Control+c")
    page.mouse.move(*client(page, 400, 900))
    press(page, "Control+v")
    page.wait_for_function(f"() => {EDITOR}.toWorkflow().nodes.length == 9")
    # The group came along, as far from its nodes as the original (the Sweeps' top-left moved from 40,330 to 400,900).
    assert graph(page)["groups"] == [frame, {**frame, "position": [20 + 360, 296 + 570]}]
    press(page, "Control+z")  # nodes and group: one undo entry
    assert len(graph(page)["nodes"]) == 7 and graph(page)["groups"] == [frame]
    # One of the two Sweeps only: the group holds a node not copied, so it stays behind.
    first = node_ids(page, "sweep")[0]  # (an undo draws the nodes anew)
    page.click(f"#node-{first} .sse-title-text")
    press(page, "Control+c")
    page.mouse.move(*client(page, 400, 900))
    press(page, "Control+v")
    page.wait_for_function(f"() => {EDITOR}.toWorkflow().nodes.length == 8")
    assert graph(page)["groups"] == [frame]


# ---------------------------------------------------------------------------- bypass
def test_bypass_from_the_menu_and_ctrl_b_is_kept_in_the_workflow_undone_and_run_through(page, studio, monkeypatch):
    open_workflow(page, XY)
    ids = {n["values"].get("param"): n["id"] for n in graph(page)["nodes"] if n["type"] == "sweep"}
    steps, guidance = ids["steps"], ids["guidance"]

    def bypassed() -> list[str]:
        return sorted(n["id"] for n in graph(page)["nodes"] if n.get("bypass") is True)

    page.click(f"#node-{steps} .sse-title-text", button="right")
    page.click(".sse-menu-root > [data-label='Bypass']")
    assert bypassed() == [steps]
    look = page.eval_on_selector(f"#node-{steps}", """el => [getComputedStyle(el).opacity,
        getComputedStyle(el.querySelector('.sse-title')).backgroundColor]""")
    assert look == ["0.6", "rgb(147, 51, 234)"]  # faded, its title purple
    shot(page, "gestures-bypassed")
    page.click(f"#node-{steps} .sse-title-text", button="right")
    assert "Stop bypassing" in menu_labels(page)
    press(page, "Escape")
    # Ctrl+B on the selection; not while typing in a field.
    page.click(f"#node-{guidance} input[df-values]")
    press(page, "Control+b")
    assert bypassed() == [steps]
    page.click(f"#node-{guidance} .sse-title-text")
    press(page, "Control+b")
    assert bypassed() == sorted([steps, guidance])
    # A duplicate of a bypassed node is bypassed too.
    press(page, "Control+d")
    assert len(bypassed()) == 3
    # One undo entry per toggle: the duplicate, Ctrl+B, then the menu's Bypass.
    press(page, "Control+z")
    assert len(graph(page)["nodes"]) == 7 and len(bypassed()) == 2
    press(page, "Control+z")
    assert [n["values"]["param"] for n in graph(page)["nodes"] if n.get("bypass")] == ["steps"]
    press(page, "Control+z")
    assert bypassed() == []
    press(page, "Control+Shift+z")
    (steps,) = bypassed()  # the menu's Bypass again (undo numbers the nodes afresh)
    assert [n["values"]["param"] for n in graph(page)["nodes"] if n["id"] == steps] == ["steps"]
    # Opened from JSON (a file, an example, History: one path), the node comes back bypassed.
    open_workflow(page, graph(page))
    (steps,) = bypassed()
    assert page.locator(".drawflow-node.sse-bypassed").count() == 1

    # Run: the bypassed steps Sweep fans nothing out: 3 branches (of 9) reach the engine.
    submitted = spy_on_submits(studio[1], monkeypatch)
    page.mouse.click(*client(page, 1000, 900))  # on the canvas, away from any field
    press(page, "Control+Enter")
    page.wait_for_selector(".sse-root[data-run-state='completed']", timeout=60_000)
    assert sorted((p.guidance_scale, p.num_inference_steps, p.seed) for p in submitted) == [
        (1.0, 12, 7), (3.0, 12, 7), (5.0, 12, 7)]  # steps: the model's default
    (sampler,) = node_ids(page, "sampler")
    assert page.inner_text(f"#node-{sampler} .sse-badge") == "done 3/3"
    assert page.inner_text(f"#node-{steps} .sse-badge") == "" and page.get_attribute(f"#node-{steps}", "data-state") == "idle"
    shot(page, "gestures-bypassed-run")


# ---------------------------------------------------------------------------- the canvas
def test_the_canvas_fills_the_window_takes_links_on_low_ports_and_goes_full_screen(page):
    open_workflow(page, XY)
    viewport = page.viewport_size
    canvas = page.locator(".sse-canvas").bounding_box()
    # Edge to edge, and down to the window's bottom: the panels float over it.
    assert (canvas["x"], canvas["width"]) == (0, page.evaluate("() => document.documentElement.clientWidth"))
    assert abs(canvas["y"] + canvas["height"] - viewport["height"]) <= 1
    # A node near the bottom of the canvas's free part (above the run bar): its input takes a link.
    free = run_js(page, "return editor.freeArea();")
    low = free["height"] - 70
    page.mouse.dblclick(*client(page, 700, low))
    page.keyboard.type("live")
    press(page, "Enter")
    (_, preview) = node_ids(page, "live_preview")
    (sampler,) = node_ids(page, "sampler")
    drag(page, port(page, sampler, "output", 1), port(page, preview, "input", 1))
    assert (sampler, "images", preview, "images") in links(page)
    assert port(page, preview, "input", 1)[1] > free["bottom"] - 80

    page.click("[data-action='full-screen']")
    full = page.locator(".sse-canvas").bounding_box()
    assert full["y"] + full["height"] >= viewport["height"] - 40 and full["width"] >= viewport["width"] - 200
    assert page.locator(".sse-root").bounding_box() == {"x": 0, "y": 0, **viewport}
    shot(page, "gestures-full-screen")
    page.mouse.click(full["x"] + 20, full["y"] + 20)  # on the canvas: keys are the editor's
    press(page, "Escape")
    assert page.get_attribute(".sse-root", "class") == "sse-root"

    # Pan without limit: three drags of 700 px, from a place with no node.
    start = client(page, 1000, 300)
    for _ in range(3):
        drag(page, start, (start[0] - 700, start[1]))
    assert run_js(page, "return editor.df.canvas_x;") == -2100


def test_the_minimap_shows_every_node_and_a_click_brings_that_place_to_the_middle(page):
    open_workflow(page, XY)
    page.wait_for_function("() => document.querySelector('.sse-minimap').dataset.nodes === '7'")
    (grid,) = node_ids(page, "grid")
    # Where the Grid node is drawn on the minimap, in the window.
    x, y = run_js(page, """const map = editor.minimap.layout(), el = editor.nodeElement(arg), node = editor.nodeData(arg);
        const r = editor.minimap.canvas.getBoundingClientRect(), k = r.width / editor.minimap.canvas.width;
        return [r.x + (map.offX + (node.pos_x + el.offsetWidth / 2 - map.minX) * map.scale) * k,
                r.y + (map.offY + (node.pos_y + el.offsetHeight / 2 - map.minY) * map.scale) * k];""", grid)
    page.mouse.click(x, y)
    free = run_js(page, "return editor.freeArea();")  # the middle of the view: of the canvas beside the panels
    canvas = (free["left"] + free["width"] / 2, free["top"] + free["height"] / 2)
    node = center(page, f"#node-{grid}")
    scale = run_js(page, "return editor.minimap.map.scale;")
    assert abs(node[0] - canvas[0]) <= 1.5 / scale and abs(node[1] - canvas[1]) <= 1.5 / scale
    shot(page, "gestures-minimap")


def minimap_pixel(page, node_id: str) -> list[int]:
    """The minimap's RGBA pixel at the middle of where it draws node `node_id`."""
    return run_js(page, """const map = editor.minimap.layout(), el = editor.nodeElement(arg), node = editor.nodeData(arg);
        const x = map.offX + (node.pos_x + el.offsetWidth / 2 - map.minX) * map.scale;
        const y = map.offY + (node.pos_y + el.offsetHeight / 2 - map.minY) * map.scale;
        return [...editor.minimap.canvas.getContext('2d').getImageData(Math.round(x), Math.round(y), 1, 1).data];""", node_id)


def nodes_under_minimap(page) -> list[str]:
    return page.evaluate("""() => { const m = document.querySelector('.sse-minimap').getBoundingClientRect();
        return [...document.querySelectorAll('.sse-canvas .drawflow-node')].filter((el) => { const b = el.getBoundingClientRect();
            return b.left < m.right && m.left < b.right && b.top < m.bottom && m.top < b.bottom; }).map((el) => el.id); }""")


def next_frames(page) -> None:
    page.evaluate("() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))")


def test_the_minimap_draws_bypassed_nodes_as_the_canvas_does_and_moves_off_the_nodes_under_it(page):
    free = run_js(page, "return editor.freeArea();")
    w, h = free["width"], free["height"]  # canvas pixels too: the view at zoom 1, unpanned
    prompt = {"id": "p", "type": "prompt", "values": {"text": "a red circle"}, "position": [40, 40]}  # top-left corner
    sweep = {"id": "s", "type": "sweep", "values": {"param": "guidance", "values": "1, 3"}, "position": [40, 320], "bypass": True}
    in_corner = {"id": "c", "type": "seed", "values": {"seed": 7}, "position": [w - 160, h - 100]}  # under bottom-right
    open_workflow(page, {"version": 1, "nodes": [prompt, sweep, in_corner], "links": []})
    next_frames(page)
    (prompt_id,), (sweep_id,), (seed_id,) = node_ids(page, "prompt"), node_ids(page, "sweep"), node_ids(page, "seed")
    # A bypassed node in the canvas's bypass purple, faded as on the canvas (opacity 0.6); others in their title's colour.
    bypass_colour = page.eval_on_selector(f"#node-{sweep_id} .sse-title", "el => getComputedStyle(el).backgroundColor")
    assert bypass_colour == "rgb(147, 51, 234)"
    assert [abs(a - b) <= 2 for a, b in zip(minimap_pixel(page, sweep_id), [147, 51, 234, 153])] == [True] * 4
    assert minimap_pixel(page, prompt_id) == [100, 116, 139, 255]  # a value node's slate (#64748b)
    # A node lies under the bottom-right corner: the minimap sits top-right, over no node.
    assert page.get_attribute(".sse-minimap", "data-corner") == "top-right"
    assert nodes_under_minimap(page) == []
    shot(page, "gestures-minimap-moved-aside", full_page=False)

    # A node in every corner: it hides until one is free.
    open_workflow(page, {"version": 1, "links": [], "nodes": [prompt, sweep, in_corner,
        {"id": "t", "type": "steps", "values": {"steps": 20}, "position": [w - 160, 40]},
        {"id": "b", "type": "guidance", "values": {"scale": 3}, "position": [40, h - 100]}]})
    next_frames(page)
    assert page.get_attribute(".sse-minimap", "data-corner") == "none"
    assert not page.locator(".sse-minimap").is_visible()
    # The bottom-right node dragged away with the mouse: the minimap is back there as the node goes.
    (seed_id,) = node_ids(page, "seed")
    title = center(page, f"#node-{seed_id} .sse-title-text")
    drag(page, title, (title[0] - 500, title[1] - 300))
    next_frames(page)
    assert page.get_attribute(".sse-minimap", "data-corner") == "bottom-right"
    assert page.locator(".sse-minimap").is_visible() and nodes_under_minimap(page) == []
    box, area = page.locator(".sse-minimap").bounding_box(), run_js(page, "return editor.freeArea();")
    gaps = (area["right"] - box["x"] - box["width"], area["bottom"] - box["y"] - box["height"])
    assert all(abs(gap - 10) <= 1 for gap in gaps), gaps  # 10 px in from the free part's bottom-right


# ---------------------------------------------------------------------------- keyboard
def test_ctrl_enter_runs_and_ctrl_alt_enter_cancels_even_from_a_prompt_while_other_keys_stay_the_fields(
        page, studio, monkeypatch):
    engine = studio[1]
    submitted, cancels = spy_on_submits(engine, monkeypatch), spy_on_cancels(engine, monkeypatch)
    workflow = {"version": 1, "nodes": [
        {"id": "p", "type": "prompt", "values": {"text": "a red circle"}, "position": [40, 40], "color": "#16a34a"},
        {"id": "b", "type": "seed_batch", "values": {"start": 5, "count": 3}, "position": [40, 260]},
        {"id": "s", "type": "sampler", "values": {}, "position": [330, 60]}],
        "links": [{"from": {"node": "p", "port": "prompt"}, "to": {"node": "s", "port": "prompt"}},
                  {"from": {"node": "b", "port": "seed"}, "to": {"node": "s", "port": "seed"}}],
        "groups": [{"title": "Inputs", "position": [20, 0], "size": [260, 420]}]}
    open_workflow(page, workflow)
    (prompt,) = node_ids(page, "prompt")
    # Keys typed into a node's field are the field's (but Run and Cancel, below).
    page.click(f"#node-{prompt} textarea")
    for keys in ("Delete", "Control+a", "Control+d"):
        press(page, keys)
    assert page.inner_text(".sse-message") != "Submitting…" and submitted == []
    assert len(graph(page)["nodes"]) == 3
    # Nor while another tab of the page shows.
    page.get_by_role("tab", name="Simple").click()
    page.wait_for_selector("#ss-generate")
    page.mouse.click(5, 5)
    for keys in ("Control+a", "Delete", "Control+Enter"):
        press(page, keys)
    assert len(graph(page)["nodes"]) == 3 and submitted == []
    page.get_by_role("tab", name="Workflow").click()
    page.wait_for_selector(".sse-canvas .drawflow-node")
    page.evaluate("() => getSelection().removeAllRanges()")  # the page text Ctrl+A selected there

    pipeline = studio[2]
    gate = StepGate(min_requests=3)  # held while all three branches run: none can finish first
    pipeline.on_forward = gate
    try:
        page.click(f"#node-{prompt} textarea")  # as in ComfyUI, Ctrl+Enter in a prompt runs the graph
        press(page, "Control+Enter")
        wait_for(lambda: len(submitted) == 3, timeout_s=30, what="the run's three branches to reach the engine")
        assert sorted(params.seed for params in submitted) == [5, 6, 7]
        assert "\n" not in page.input_value(f"#node-{prompt} textarea")  # the key ran the graph, typed nothing
        gate.wait()
        page.wait_for_selector(".sse-root[data-run-state='running']")  # the page knows its run
        press(page, "Control+Alt+Enter")
        wait_for(lambda: len(cancels) == 3, timeout_s=30, what="the run's cancels to reach the engine")
    finally:
        pipeline.on_forward = None
        gate.release()
    page.wait_for_selector(".sse-root[data-run-state='aborted']", timeout=30_000)
    shot(page, "gestures-run-cancelled")

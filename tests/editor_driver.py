"""Reading and driving the node editor in a Playwright page, as the editor's browser tests do it:
the graph JSON it would run, where a canvas point or a port is in the window, and mouse drags.

    from tests.editor_driver import EDITOR, graph, open_workflow, client, drag, port
"""

from __future__ import annotations

EDITOR = "document.querySelector('.sse-root').stepstudioEditor"


def run_js(page, body: str, arg=None):
    return page.evaluate(f"(arg) => {{ const editor = {EDITOR}; {body} }}", arg)


def graph(page) -> dict:
    """The workflow JSON the editor would send on Run."""
    return run_js(page, "return editor.toWorkflow();")


def open_workflow(page, workflow: dict) -> dict:
    """Opens `workflow` (as a file would be) at zoom 1, unpanned; returns it with the editor's node ids."""
    run_js(page, """editor.load(arg); editor.df.zoom_reset();
        Object.assign(editor.df, { canvas_x: 0, canvas_y: 0 }); editor.df.precanvas.style.transform = 'translate(0px, 0px) scale(1)';
        editor.emit('view');""", workflow)
    return graph(page)


def node_ids(page, node_type: str) -> list[str]:
    return [n["id"] for n in graph(page)["nodes"] if n["type"] == node_type]


def links(page) -> set[tuple[str, str, str, str]]:
    return {(lk["from"]["node"], lk["from"]["port"], lk["to"]["node"], lk["to"]["port"]) for lk in graph(page)["links"]}


def typed_links(page) -> set[tuple[str, str, str, str]]:
    """The links by node type: what an undo restores (the editor numbers the nodes afresh)."""
    workflow = graph(page)
    type_of = {n["id"]: n["type"] for n in workflow["nodes"]}
    return {(type_of[a], pa, type_of[b], pb) for a, pa, b, pb in links(page)}


def positions(page) -> dict[str, list[int]]:
    return {n["id"]: n["position"] for n in graph(page)["nodes"]}


def layout(page) -> list[tuple[str, list[int]]]:
    """Every node's type and place: what an undo restores (under new node ids)."""
    return sorted((n["type"], n["position"]) for n in graph(page)["nodes"])


def client(page, x: float, y: float) -> tuple[float, float]:
    """Where canvas point (x, y) is in the window (zoom 1), to the whole pixel a mouse event has."""
    box = run_js(page, "const r = editor.df.precanvas.getBoundingClientRect(); return [r.x, r.y];")
    return round(box[0]) + x, round(box[1]) + y


def center(page, selector: str) -> tuple[float, float]:
    box = page.locator(selector).bounding_box()
    return box["x"] + box["width"] / 2, box["y"] + box["height"] / 2


def drag(page, start: tuple[float, float], end: tuple[float, float], modifier: str | None = None) -> None:
    page.mouse.move(*start)
    if modifier:
        page.keyboard.down(modifier)
    page.mouse.down()
    page.mouse.move(*end, steps=8)
    page.mouse.up()
    if modifier:
        page.keyboard.up(modifier)


def port(page, node_id: str, side: str, index: int) -> tuple[float, float]:
    return center(page, f"#node-{node_id} .{side}s .{side}_{index}")


def search_entries(page) -> list[str]:
    return [el.inner_text() for el in page.query_selector_all(".sse-search-item .sse-search-title")]


def menu_labels(page, selector: str = ".sse-menu-root") -> list[str]:
    return page.eval_on_selector_all(f"{selector} > .sse-menu-item", "rows => rows.map((r) => r.dataset.label)")


def press(page, keys: str) -> None:
    page.keyboard.press(keys)

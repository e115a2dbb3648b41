"""How many actions it takes to build the X/Y example (assets/workflows/guidance-steps-xy.json) from
an empty canvas in the node editor, done by headless Chromium as a user would do it, three ways:

- palette: drag each node from the palette, then drag each link (the only way before the gestures);
- search: double-click search for the first node, then links dropped on empty canvas (from an
  output or from a free input) that open the search filtered to what fits;
- search, mouse: the same, each node picked from the search's list with a click instead of typed;
- search + copy/paste: the keyboard way, the second Sweep pasted from the first instead of searched.

    python benchmarks/editor_actions.py

Every action goes through one recorder: a click (a select's open and choice are two), a
double-click, a drag, a key chord (Enter, Ctrl+V), or typed text (one action, but every character
is a key press). After each way the editor's graph is compared with the example (node types and
values, links by type and port; positions may differ) and the run stops if they differ. The studio
runs in this process on the weightless toy model; nothing is generated.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

EXAMPLE = ROOT / "assets" / "workflows" / "guidance-steps-xy.json"
CHROMIUM = "/usr/bin/chromium"
EDITOR = "document.querySelector('.sse-root').stepstudioEditor"


@dataclass
class Recorder:
    """Drives the page and counts what a user would do."""

    page: object
    clicks: int = 0
    drags: int = 0
    chords: int = 0
    typed_runs: int = 0
    typed_keys: int = 0
    log: list[str] = field(default_factory=list)

    # ------------------------------------------------------------------ where things are
    def point(self, x: float, y: float) -> tuple[float, float]:
        """Canvas point (x, y) in the window (zoom 1, unpanned)."""
        box = self.page.evaluate(f"() => {{ const r = {EDITOR}.df.precanvas.getBoundingClientRect(); return [r.x, r.y]; }}")
        return round(box[0]) + x, round(box[1]) + y

    def center(self, selector: str) -> tuple[float, float]:
        box = self.page.locator(selector).bounding_box()
        return box["x"] + box["width"] / 2, box["y"] + box["height"] / 2

    def port(self, node_id: str, side: str, index: int) -> tuple[float, float]:
        return self.center(f"#node-{node_id} .{side}s .{side}_{index}")

    def newest(self, node_type: str) -> str:
        return [n["id"] for n in self.graph()["nodes"] if n["type"] == node_type][-1]

    def graph(self) -> dict:
        return self.page.evaluate(f"() => {EDITOR}.toWorkflow()")

    # ------------------------------------------------------------------ actions
    def click(self, where, what: str) -> None:
        self.clicks += 1
        self.log.append(f"click {what}")
        if isinstance(where, str):
            self.page.click(where)
        else:
            self.page.mouse.click(*where)

    def dblclick(self, where, what: str) -> None:
        self.clicks += 1
        self.log.append(f"double-click {what}")
        self.page.mouse.dblclick(*where)

    def drag(self, start, end, what: str) -> None:
        self.drags += 1
        self.log.append(f"drag {what}")
        self.page.mouse.move(*start)
        self.page.mouse.down()
        self.page.mouse.move(*end, steps=10)
        self.page.mouse.up()

    def drag_from_palette(self, node_type: str, x: int, y: int) -> str:
        self.drags += 1
        self.log.append(f"drag {node_type} from the palette")
        self.page.drag_and_drop(f".sse-palette-item[data-node-type='{node_type}']", ".sse-canvas .drawflow",
                                target_position={"x": x, "y": y})  # canvas point (x, y), unpanned
        return self.newest(node_type)

    def key(self, chord: str) -> None:
        self.chords += 1
        self.log.append(f"key {chord}")
        self.page.keyboard.press(chord)

    def type(self, text: str) -> None:
        self.typed_runs += 1
        self.typed_keys += len(text)
        self.log.append(f"type {text!r}")
        self.page.keyboard.type(text)

    def choose(self, selector: str, value: str) -> None:
        """A select: a click to open it, a click on the choice."""
        self.clicks += 2
        self.log.append(f"choose {value}")
        self.page.select_option(selector, value)

    def fill(self, selector: str, text: str) -> None:
        """Replace a field's text: click it, Ctrl+A, type."""
        self.click(selector, "a field")
        self.key("Control+a")
        self.type(text)

    def totals(self) -> dict:
        return {"actions": self.clicks + self.drags + self.chords + self.typed_runs,
                "key presses and mouse actions": self.clicks + self.drags + self.chords + self.typed_keys,
                "clicks": self.clicks, "drags": self.drags, "key chords": self.chords,
                "typed texts": self.typed_runs, "typed characters": self.typed_keys}


# ---------------------------------------------------------------------------- the three ways
def values(example: dict) -> dict[str, dict]:
    by_id = {n["id"]: n for n in example["nodes"]}
    return {"prompt": by_id["1"]["values"]["text"], "seed": str(by_id["2"]["values"]["seed"]),
            "steps": by_id["4"]["values"]["values"]}


def build_with_palette(r: Recorder, example: dict) -> None:
    v = values(example)
    ids = {}
    for key, node_type, x, y in (("prompt", "prompt", 40, 20), ("seed", "seed", 40, 200), ("guidance", "sweep", 40, 330),
                                 ("steps", "sweep", 40, 510), ("sampler", "sampler", 330, 140),
                                 ("preview", "live_preview", 660, 20), ("grid", "grid", 660, 330)):
        ids[key] = r.drag_from_palette(node_type, x, y)
    r.fill(f"#node-{ids['prompt']} textarea", v["prompt"])
    r.fill(f"#node-{ids['seed']} input", v["seed"])
    r.choose(f"#node-{ids['steps']} select", "steps")
    r.fill(f"#node-{ids['steps']} input", v["steps"])
    r.choose(f"#node-{ids['grid']} select[df-x]", "guidance")
    r.choose(f"#node-{ids['grid']} select[df-y]", "steps")
    sampler = ids["sampler"]
    for source, target, index in (("prompt", sampler, 1), ("seed", sampler, 3), ("guidance", sampler, 6),
                                  ("steps", sampler, 5)):
        r.drag(r.port(ids[source], "output", 1), r.port(target, "input", index), f"a link {source} -> sampler")
    for target in ("preview", "grid"):
        r.drag(r.port(sampler, "output", 1), r.port(ids[target], "input", 1), f"a link sampler -> {target}")


def build_with_search(r: Recorder, example: dict, paste_second_sweep: bool = False, mouse: bool = False) -> None:
    v = values(example)

    def pick(title: str, keys: list[str]) -> None:
        """The search's entry `title`: clicked, or reached with `keys` (text to type, or key chords)."""
        if mouse:
            r.click(f".sse-search-title >> text='{title}'", f"{title} in the search's list")
            return
        for key in keys:
            r.key(key) if key in ("Enter", "ArrowDown") else r.type(key)

    r.dblclick(r.point(40, 20), "the empty canvas")
    pick("Prompt", ["pro", "Enter"])
    prompt = r.newest("prompt")
    r.fill(f"#node-{prompt} textarea", v["prompt"])
    r.drag(r.port(prompt, "output", 1), r.point(330, 180), "the prompt's link onto empty canvas")
    pick("Sampler", ["Enter"])  # the only node that takes a prompt
    sampler = r.newest("sampler")
    for title, text, x, y in (("Live preview", "li", 660, 60), ("Grid", "gr", 660, 370)):
        r.drag(r.port(sampler, "output", 1), r.point(x, y), "the sampler's images onto empty canvas")
        pick(title, [text, "Enter"])
    grid = r.newest("grid")
    r.choose(f"#node-{grid} select[df-x]", "guidance")
    r.choose(f"#node-{grid} select[df-y]", "steps")
    r.drag(r.port(sampler, "input", 3), r.point(270, 240), "from the sampler's seed input onto empty canvas")
    pick("Seed", ["Enter"])  # first of Seed / Seed batch / Sweep (seed)
    r.fill(f"#node-{r.newest('seed')} input", v["seed"])
    r.drag(r.port(sampler, "input", 6), r.point(270, 370), "from the sampler's guidance input onto empty canvas")
    pick("Sweep (guidance)", ["ArrowDown", "Enter"])  # after Guidance
    if paste_second_sweep:
        first = r.newest("sweep")
        r.click(r.center(f"#node-{first} .sse-title-text"), "the Sweep's title")
        r.key("Control+c")
        r.page.mouse.move(*r.point(40, 510))  # where the mouse goes anyway; not an action
        r.key("Control+v")
        second = r.newest("sweep")
        r.choose(f"#node-{second} select", "steps")
        r.drag(r.port(second, "output", 1), r.port(sampler, "input", 5), "a link sweep -> sampler steps")
    else:
        r.drag(r.port(sampler, "input", 5), r.point(270, 550), "from the sampler's steps input onto empty canvas")
        pick("Sweep (steps)", ["ArrowDown", "Enter"])  # after Steps
        second = r.newest("sweep")
    r.fill(f"#node-{second} input", v["steps"])


def shape(workflow: dict) -> tuple[list, list]:
    """What must match the example: each node as its type and values (as the text a field shows:
    the editor keeps "7" where the file has 7), each link as the nodes it joins and their ports;
    ids and positions may differ."""
    node = {n["id"]: json.dumps([n["type"], sorted((k, str(v)) for k, v in n["values"].items())]) for n in workflow["nodes"]}
    links = sorted((node[lk["from"]["node"]], lk["from"]["port"], node[lk["to"]["node"]], lk["to"]["port"])
                   for lk in workflow["links"])
    return sorted(node.values()), links


def measure(browser, url: str, build, example: dict, **options) -> dict:
    context = browser.new_context(viewport={"width": 1500, "height": 1200})
    page = context.new_page()
    page.goto(url)
    page.wait_for_selector("#ss-node-editor .drawflow-node")
    page.evaluate(f"() => {{ {EDITOR}.load({{version: 1, nodes: [], links: []}}); window.scrollTo(0, 0); }}")
    recorder = Recorder(page)
    build(recorder, example, **options)
    built = recorder.graph()
    context.close()
    if shape(built) != shape(example):
        raise SystemExit(f"{build.__name__} built something else:\n{json.dumps(shape(built))}\n{json.dumps(shape(example))}")
    return {**recorder.totals(), "log": recorder.log}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", action="store_true", help="print every action of each way")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    from engine import Engine
    from pipelines.toy import ToyPipeline
    from studio.config import StudioOptions
    from studio.app import build_app
    from studio.server.serving import StudioServer

    example = json.loads(EXAMPLE.read_text())
    config = StudioOptions(model="toy", port=0, outputs=None)
    engine = Engine(ToyPipeline(), mode=config.mode, max_batch_requests=config.max_batch, limits=config.limits).start()
    server = StudioServer(build_app(engine, config), "127.0.0.1", 0).start()
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            ways = {"palette (before)": measure(browser, server.url, build_with_palette, example),
                    "search": measure(browser, server.url, build_with_search, example),
                    "search, mouse": measure(browser, server.url, build_with_search, example, mouse=True),
                    "search + copy/paste": measure(browser, server.url, build_with_search, example, paste_second_sweep=True)}
            browser.close()
    finally:
        server.stop()
        engine.close()
    columns = [key for key in next(iter(ways.values())) if key != "log"]
    print("| way | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for name, counts in ways.items():
        print(f"| {name} | " + " | ".join(str(counts[c]) for c in columns) + " |")
    if args.log:
        for name, counts in ways.items():
            print(f"\n{name}:\n  " + "\n  ".join(counts["log"]))


if __name__ == "__main__":
    main()

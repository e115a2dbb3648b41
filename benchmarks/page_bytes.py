"""What one browser tab receives while a 4x4 X/Y grid runs, and how long the server's event loop stalls.

    python benchmarks/page_bytes.py                       # built-in model, 4 guidance x 4 seeds, 20 steps
    python benchmarks/page_bytes.py --steps 10 --rounds 2 --json benchmarks/results/page_bytes.json

The studio (`python app.py --model builtin`, as wired by app.py) runs in a child process with one
addition: a loop-lag probe, an asyncio task on the server's event loop that sleeps 10 ms again and
again and records by how much each wake-up came late (anything that runs inline in an async
handler, such as image encoding or drawing a grid, shows up as lateness). Headless Chromium
(/usr/bin/chromium through Playwright) opens the page, loads the grid workflow into the node
editor (Prompt, Seed batch of 4, Sweep of guidance over 4 values, Steps -> Sampler -> Grid and
Live preview: 16 branches that share each forward), presses Run and, through the DevTools
protocol, sums the payload of every network message the tab receives until the run completes
(`Network.dataReceived` for the event stream and files, `Network.webSocketFrameReceived`).

Printed per round and as the median over rounds: bytes received, bytes per denoise step (the run's
branches advance together, so a step is one forward of the grid), the run's updates, and the
event loop's longest stall and 99th percentile lateness during the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
PROBE_PERIOD_S = 0.010
LAG_ROUTE = "/bench/loop-lag"
PROMPT = "a large green circle on an orange background, right"


def grid_workflow(steps: int, guidance: list[float], seeds: int) -> dict:
    """Prompt + Seed batch + Sweep of guidance + Steps -> Sampler -> Grid (guidance x seed) and Live preview."""
    def link(a, ap, b, bp):
        return {"from": {"node": a, "port": ap}, "to": {"node": b, "port": bp}}

    return {
        "version": 1,
        "nodes": [
            {"id": "1", "type": "prompt", "values": {"text": PROMPT}, "position": [40, 20]},
            {"id": "2", "type": "seed_batch", "values": {"start": 1, "count": seeds}, "position": [40, 200]},
            {"id": "3", "type": "sweep", "values": {"param": "guidance", "values": ", ".join(f"{g:g}" for g in guidance)},
             "position": [40, 330]},
            {"id": "4", "type": "steps", "values": {"steps": steps}, "position": [40, 510]},
            {"id": "5", "type": "sampler", "values": {}, "position": [330, 140]},
            {"id": "6", "type": "live_preview", "values": {}, "position": [660, 20]},
            {"id": "7", "type": "grid", "values": {"x": "guidance", "y": "seed"}, "position": [660, 330]},
        ],
        "links": [link("1", "prompt", "5", "prompt"), link("2", "seed", "5", "seed"),
                  link("3", "values", "5", "guidance"), link("4", "steps", "5", "steps"),
                  link("5", "images", "6", "images"), link("5", "images", "7", "images")],
    }


# ---------------------------------------------------------------------------- the server (child process)
class LoopLagProbe:
    """Sleeps PROBE_PERIOD_S on the event loop it runs on and keeps how late each wake-up was."""

    def __init__(self) -> None:
        self.lateness: list[float] = []
        self._task: asyncio.Task | None = None

    def ensure_running(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(PROBE_PERIOD_S)
            self.lateness.append(loop.time() - start - PROBE_PERIOD_S)

    def take(self) -> dict:
        """The lateness since the last take, and start over."""
        samples, self.lateness = self.lateness, []
        ordered = sorted(samples)
        return {
            "samples": len(ordered),
            "max_ms": round(1000 * ordered[-1], 1) if ordered else None,
            "p99_ms": round(1000 * ordered[int(0.99 * (len(ordered) - 1))], 1) if ordered else None,
            "mean_ms": round(1000 * statistics.fmean(ordered), 2) if ordered else None,
        }


def serve(argv: list[str]) -> int:
    """`python app.py` with `argv`, plus LAG_ROUTE (GET: start the probe, or return its figures and reset)."""
    import app as studio_app
    from studio.server.temp_files import use_private_cache_folder

    args = studio_app.build_parser().parse_args(argv)
    config = studio_app.config_from_args(args)
    use_private_cache_folder()  # before gradio is imported, as app.py does

    from fastapi.routing import APIRoute

    from engine import Engine
    from studio.app import build_app
    from studio.server.serving import StudioServer

    engine = Engine(studio_app.load_models(config), mode=config.mode, max_batch_requests=config.max_batch,
                    limits=config.limits).start()
    fastapi_app = build_app(engine, config)
    probe = LoopLagProbe()

    async def loop_lag() -> dict:
        probe.ensure_running()
        return probe.take()

    # Before Gradio's mount at "/", which would take the path otherwise.
    fastapi_app.router.routes.insert(0, APIRoute(LAG_ROUTE, loop_lag, methods=["GET"]))
    server = StudioServer(fastapi_app, config.host, config.port)
    print(f"SERVING {server.url}", flush=True)
    server.run()
    return 0


def start_server(steps: int, seeds: int) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, str(Path(__file__).resolve()), "--serve", "--model", "builtin", "--port", "0",
               "--no-save", "--max-batch", str(4 * seeds), "--max-per-session", str(4 * seeds),
               "--max-branches", str(4 * seeds), "--max-steps", str(max(steps, 100))]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("SERVING "):
            url = line.split(" ", 1)[1].strip()
            # Keep draining the child's output so it never blocks on a full pipe.
            threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()
            return process, url
    process.kill()
    raise RuntimeError("the studio did not start:\n" + "".join(lines[-30:]))


def loop_lag(url: str) -> dict:
    with urllib.request.urlopen(url.rstrip("/") + LAG_ROUTE, timeout=30) as response:
        return json.loads(response.read())


# ---------------------------------------------------------------------------- the browser
class ReceivedBytes:
    """Sums what the page's network layer hands the page, from DevTools protocol events."""

    def __init__(self, cdp) -> None:
        self.counting = False
        self.data = self.encoded = self.websocket = self.event_source = self.chunks = 0
        self.by_url: dict[str, int] = {}
        self._urls: dict[str, str] = {}
        cdp.on("Network.responseReceived", self._response)
        cdp.on("Network.dataReceived", self._data)
        cdp.on("Network.webSocketFrameReceived", self._frame)
        cdp.on("Network.eventSourceMessageReceived", self._event_source)
        cdp.send("Network.enable", {"maxTotalBufferSize": 0, "maxResourceBufferSize": 0})

    def _response(self, event) -> None:
        self._urls[event["requestId"]] = event["response"]["url"].split("?")[0]

    def _data(self, event) -> None:
        url = self._urls.get(event["requestId"], "?")
        if not self.counting or url.startswith("data:"):  # an <img> decoding a data URL it already has
            return
        self.data += event["dataLength"]
        self.encoded += event.get("encodedDataLength", 0)
        self.chunks += 1
        route = url.split("/gradio_api/", 1)[-1]
        key = "file=" if route.startswith("file=") else route
        self.by_url[key] = self.by_url.get(key, 0) + event["dataLength"]

    def _frame(self, event) -> None:
        if self.counting:
            self.websocket += len(event["response"]["payloadData"])

    def _event_source(self, event) -> None:
        if self.counting:
            self.event_source += len(event["data"])

    @property
    def total(self) -> int:
        return self.data + self.websocket


def measure_round(browser, url: str, workflow: dict, steps: int) -> dict:
    context = browser.new_context(viewport={"width": 1500, "height": 1100})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    cdp = context.new_cdp_session(page)
    received = ReceivedBytes(cdp)
    page.goto(url)
    page.wait_for_selector("#ss-node-editor .drawflow-node", timeout=60_000)
    page.evaluate("(w) => { const e = document.querySelector('.sse-root').stepstudioEditor; e.load(w); e.fit(); }",
                  workflow)
    # Count the run's updates in the page, as the editor gets them.
    page.evaluate("""() => { const e = document.querySelector('.sse-root').stepstudioEditor;
        window.__updates = 0; const show = e.showRun.bind(e);
        e.showRun = (s) => { window.__updates++; return show(s); }; }""")
    page.wait_for_timeout(500)
    loop_lag(url)  # reset the probe: only the run counts
    received.counting = True
    start = time.perf_counter()
    page.click("[data-action='run']")
    page.wait_for_selector(".sse-root[data-run-state='completed']", timeout=600_000)
    page.wait_for_timeout(300)  # the last messages and files of the run
    seconds = time.perf_counter() - start
    received.counting = False
    lag = loop_lag(url)
    shown = page.evaluate("""() => [...document.querySelectorAll('.sse-canvas .drawflow-node[data-node-type="live_preview"] .sse-thumb img')]
                                   .filter((img) => img.complete && img.naturalWidth > 0 && img.style.display !== 'none').length""")
    updates = page.evaluate("() => window.__updates")
    context.close()
    if errors:
        raise RuntimeError(f"JavaScript errors on the page: {errors}")
    return {
        "bytes": received.total,
        "bytes_per_step": round(received.total / steps),
        "encoded_bytes": received.encoded,
        "event_source_bytes": received.event_source,
        "chunks": received.chunks,
        "bytes_by_route": dict(sorted(received.by_url.items(), key=lambda kv: -kv[1])),
        "updates": updates,
        "images_shown": shown,
        "run_s": round(seconds, 2),
        "loop_lag": lag,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--serve":
        return serve(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="denoise steps of every branch")
    parser.add_argument("--guidance", type=float, nargs="+", default=[1.0, 2.0, 3.0, 4.0])
    parser.add_argument("--seeds", type=int, default=4, help="seeds in the batch (the grid's rows)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)

    from playwright.sync_api import sync_playwright

    workflow = grid_workflow(args.steps, args.guidance, args.seeds)
    branches = len(args.guidance) * args.seeds
    process, url = start_server(args.steps, args.seeds)
    rounds = []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            measure_round(browser, url, workflow, args.steps)  # warm-up: first compile, caches, page assets
            for index in range(args.rounds):
                figures = measure_round(browser, url, workflow, args.steps)
                rounds.append(figures)
                print(f"round {index + 1}: {json.dumps(figures)}", flush=True)
            browser.close()
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()

    for r in rounds:  # the run's own stream, the live views' timer and the files the page fetched
        routes = r["bytes_by_route"]
        r["stream_bytes_per_step"] = round(routes.get("queue/data", 0) / args.steps)
        r["timer_bytes_per_s"] = round(routes.get("run/predict", 0) / r["run_s"])
        r["file_bytes"] = routes.get("file=", 0)
    median = {key: statistics.median(r[key] for r in rounds) for key in (
        "bytes", "bytes_per_step", "updates", "run_s", "stream_bytes_per_step", "timer_bytes_per_s", "file_bytes")}
    median["loop_lag_max_ms"] = statistics.median(r["loop_lag"]["max_ms"] for r in rounds)
    median["loop_lag_p99_ms"] = statistics.median(r["loop_lag"]["p99_ms"] for r in rounds)
    print(f"grid {len(args.guidance)}x{args.seeds} ({branches} branches), {args.steps} steps, built-in model")
    print(f"bytes received by the tab per denoise step: {median['bytes_per_step']:,.0f} "
          f"({median['bytes']:,.0f} bytes over the run, {median['updates']:.0f} updates, {median['run_s']} s)")
    print(f"  of which the run's stream {median['stream_bytes_per_step']:,.0f} per step, the live views' timer "
          f"{median['timer_bytes_per_s']:,.0f} per second, files {median['file_bytes']:,.0f} over the run")
    print(f"event loop's longest stall during the run: {median['loop_lag_max_ms']} ms "
          f"(99th percentile lateness {median['loop_lag_p99_ms']} ms)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"branches": branches, "steps": args.steps, "median": median,
                                         "rounds": rounds}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Stress: many requests through the HTTP API and gradio_client at once, with cancels,
disconnects, injected faults and hostile sizes; then an engine crash. Checks that nothing
hangs or leaks.

    python benchmarks/stress.py                       # 1,000 requests, then a crash
    python benchmarks/stress.py --requests 120 --workers 8 --json out.json

One studio (the toy model behind the real app: HTTP API, Gradio, guards) serves every call
in this process. Each worker thread sends a random mix:

- normal requests (1-12 steps, 32 or 64 px) over HTTP and over gradio_client;
- cancels: gradio_client's /cancel with the request id once it runs;
- disconnects: an HTTP caller that hangs up mid-request, a page (Gradio queue stream) that
  closes mid-request;
- injected faults: "[fail:<method>]" in each protocol method, "[nan]" latents;
- hostile input: sizes over the limit, not a multiple of 8, zero steps, words for numbers;
- hostile callers at Gradio's door: History listings with forged tokens (another caller's
  session, its old-style key text, unsigned and re-signed tokens), call bodies nested 5,000 deep,
  an empty session hash, crafted PNGs opened in the History tab (a zTXt bomb, not a PNG, a cut
  PNG, a seed past 64 bits), workflows over the byte limit sent as objects, and one client's two
  jobs on one endpoint with one of them cancelled (the other must still finish).

Invariants (the run fails loudly if one breaks):

- every call is answered (an HTTP status or a gradio result/error) within its timeout: 0 hangs;
- every kind of call gets only the answers it should (EXPECTED; benchmarks/stress_callers.py
  reads each answer): hostile input is refused under its own field (a 4xx naming it or a gr.Error
  that starts with it; never taken, never a 5xx), every fault fires and fails with its own message
  (a 500 is right only as that fault's generation_failed), a forged History token lists nothing,
  a cancelled job's sibling completes;
- every request the engine accepted sent exactly one final event, and the engine's counters
  agree: submitted == completed + aborted + failed;
- nothing is left in the engine: no request in flight, no request state, an empty queue view;
- resident memory stays bounded: reported at the start, after a quarter of the calls (clients,
  threads and caches warm), at its peak and at the end; the end may be at most 200 MB over the
  warm figure;
- after the mix, a crash of the engine thread: every waiting caller is answered (HTTP 503
  engine_failed, gr.Error), new calls get 503, and the server stops by itself.
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import logging
import random
import shutil
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.stress_callers import (  # noqa: E402 - after the path, for `python benchmarks/stress.py`
    CALL_TIMEOUT_S,
    Endpoints,
    Outcome,
    call_door,
    call_gradio,
    call_gradio_disconnect,
    call_http,
    call_http_disconnect,
)
from benchmarks.client_streams import SettledClient  # noqa: E402

MAX_RSS_GROWTH_MB = 200  # from a quarter of the calls to the end
DOOR = ("forged_history", "deep_json", "empty_hash", "crafted_png", "big_workflow", "sibling_cancel")
KINDS = ("http", "http_disconnect", "gradio", "gradio_cancel", "gradio_disconnect", "fault", "hostile") + DOOR
WEIGHTS = (30, 8, 20, 10, 6, 14, 12) + (3, 2, 2, 3, 2, 3)
# What each kind of call may be answered (by kind/via); anything else is a broken promise.
EXPECTED = {
    "http/http": {"completed"},
    "gradio/gradio": {"completed"},
    "http_disconnect/http": {"disconnected"},
    "gradio_disconnect/gradio": {"disconnected"},
    "gradio_cancel/gradio": {"aborted", "completed"},  # the cancel may come after the last step
    "fault/http": {"failed"},
    "fault/gradio": {"failed"},
    "hostile/http": {"rejected"},
    "hostile/gradio": {"rejected"},
    "forged_history/gradio": {"listed nothing"},
    "deep_json/gradio": {"rejected"},
    "empty_hash/gradio": {"rejected"},
    "crafted_png/gradio": {"rejected"},
    "big_workflow/gradio": {"rejected"},
    "sibling_cancel/gradio": {"completed"},
}


@dataclass
class Report:
    requests: int
    workers: int
    seconds: float = 0.0
    answers: dict = field(default_factory=dict)  # answer -> count
    by_kind: dict = field(default_factory=dict)  # kind -> {answer: count}
    engine: dict = field(default_factory=dict)  # the engine's own counters at the end
    final_events_per_request: dict = field(default_factory=dict)  # how many final events -> how many requests
    rss_mb: dict = field(default_factory=dict)  # start, peak, end
    tracebacks: dict = field(default_factory=dict)  # logged: "unexpected" (must be 0), "injected" (the faults'), examples
    crash: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)  # broken invariants (empty = pass)

    @property
    def ok(self) -> bool:
        return not self.problems


class TracebackCounter(logging.Handler):
    """Counts the tracebacks the studio logs (through logging, or printed to stderr as Gradio
    does), less those of the faults the run injects on purpose; keeps a few for the report.
    Nothing is printed: the report says it all."""

    INJECTED = ("injected failure in", "injected crash of the engine thread", "latents became NaN or infinite")
    MARK = "Traceback (most recent call last)"

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.logged: list[str] = []
        self.printed: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.logged.append(record.getMessage() + "\n" + "".join(traceback.format_exception(*record.exc_info)))

    def stderr(self) -> io.TextIOBase:
        """A stderr that keeps what is written to it (tracebacks arrive a line at a time)."""
        printed = self.printed

        class Kept(io.TextIOBase):
            def write(self, text: str) -> int:
                printed.append(text)
                return len(text)

        return Kept()

    def tracebacks(self) -> tuple[list[str], int]:
        """(the unexpected tracebacks, how many the injected faults made)."""
        text = "".join(self.printed)
        found = self.logged + [self.MARK + part for part in text.split(self.MARK)[1:]]
        unexpected = [item[-600:] for item in found if not any(marker in item for marker in self.INJECTED)]
        return unexpected, len(found) - len(unexpected)


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# ---------------------------------------------------------------------------- the studio
class RecordingEngine:
    """Wraps Engine.submit to keep every accepted handle (to count its final events later)."""

    def __init__(self, engine) -> None:
        self.handles = []
        self._lock = threading.Lock()
        submit = engine.submit

        def recording_submit(*args, **kwargs):
            handle = submit(*args, **kwargs)
            with self._lock:
                self.handles.append(handle)
            return handle

        engine.submit = recording_submit


def start_studio(step_delay_s: float, outputs: Path):
    from engine import Engine
    from pipelines.toy import ToyPipeline
    from studio.config import StudioOptions
    from studio.app import build_app
    from studio.server.serving import StudioServer

    # Results are saved (under each caller's key), so a forged History token has something to find.
    config = StudioOptions(model="toy", port=0, preview_every=2, max_size=64, max_steps=50, max_per_session=64,
                           max_session_cost=None, shutdown_timeout_s=5.0, outputs=str(outputs))
    engine = Engine(ToyPipeline(step_delay_s=step_delay_s), mode="step", max_batch_requests=8, limits=config.limits)
    recorder = RecordingEngine(engine)
    engine.start()
    app = build_app(engine, config)
    server = StudioServer(app, "127.0.0.1", 0).start()
    return server, engine, recorder, Endpoints.of(app.state.demo)




def worker(url: str, endpoints: Endpoints, count: int, seed: int, first: tuple[str, ...], outcomes: list,
           lock: threading.Lock) -> None:
    """`count` calls: first the kinds in `first` (so every kind is in even a short run), then a random mix."""
    rng = random.Random(seed)
    client = SettledClient(url, verbose=False, httpx_kwargs={"timeout": CALL_TIMEOUT_S})
    for number in range(count):
        kind = first[number] if number < len(first) else rng.choices(KINDS, WEIGHTS)[0]
        via_gradio = kind.startswith("gradio") or (kind in ("fault", "hostile") and rng.random() < 0.5)
        started = time.monotonic()
        try:
            if kind == "http_disconnect":
                outcome = call_http_disconnect(url, rng)
            elif kind == "gradio_disconnect":
                outcome = call_gradio_disconnect(url, rng, endpoints.generate)
            elif kind in DOOR:
                outcome = call_door(url, client, rng, kind, endpoints)
            elif via_gradio:
                outcome = call_gradio(client, rng, kind)
            else:
                outcome = call_http(url, rng, kind)
        except Exception as error:  # noqa: BLE001 - a timeout or a broken answer: recorded, never raised
            answer = "hang" if "timeout" in type(error).__name__.lower() or "Timeout" in str(error) else "wrong"
            via = "gradio" if via_gradio or kind in DOOR else "http"
            outcome = Outcome(kind, via, answer, f"{type(error).__name__}: {error}"[:160])
        outcome.seconds = time.monotonic() - started
        with lock:
            outcomes.append(outcome)


# ---------------------------------------------------------------------------- the crash phase
def crash_phase(url: str, engine, server) -> dict:
    """Two callers wait on long requests; a third request crashes the engine thread."""
    import httpx
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    answers: dict = {}
    client = Client(url, verbose=False, httpx_kwargs={"timeout": CALL_TIMEOUT_S})
    job = client.submit(prompt="waits for the crash", negative_prompt="", width=64, height=64, steps=50,
                        guidance_scale=1.0, seed=1, api_name="/generate")

    def http_call() -> None:
        response = httpx.post(url + "v1/images/generations", json={"prompt": "waits too", "num_inference_steps": 50},
                              timeout=CALL_TIMEOUT_S)
        answers["http_waiting"] = response.status_code, response.json()["error"]["code"]

    waiting = threading.Thread(target=http_call)
    waiting.start()
    deadline = time.monotonic() + 30
    while len(engine.snapshot().running) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    crash = httpx.post(url + "v1/images/generations", json={"prompt": "[crash] the engine"}, timeout=CALL_TIMEOUT_S)
    answers["http_crasher"] = crash.status_code, crash.json()["error"]["code"]
    waiting.join(CALL_TIMEOUT_S)
    try:
        job.result(timeout=CALL_TIMEOUT_S)
        answers["gradio_waiting"] = "no error"
    except AppError as error:
        answers["gradio_waiting"] = "gr.Error: " + str(error)[:80]
    try:
        late = httpx.post(url + "v1/images/generations", json={"prompt": "after the crash"}, timeout=10)
        answers["http_after"] = late.status_code, late.json()["error"]["code"]
    except httpx.TransportError:  # the server has stopped already: also an answer
        answers["http_after"] = "connection refused (server stopped)"
    server._thread.join(30)
    answers["server_stopped"] = not server._thread.is_alive()
    answers["engine_failure"] = engine.failure
    return answers


# ---------------------------------------------------------------------------- the run
def run(requests: int = 1000, workers: int = 16, seed: int = 0, step_delay_s: float = 0.002,
        crash: bool = True) -> Report:
    # Every traceback the studio logs is counted (the injected faults' apart) instead of printed.
    counter, root = TracebackCounter(), logging.getLogger()
    handlers, level, stderr = root.handlers[:], root.level, sys.stderr
    root.handlers, sys.stderr = [counter], counter.stderr()
    root.setLevel(logging.WARNING)
    try:
        return _run(requests, workers, seed, step_delay_s, crash, counter)
    finally:
        root.handlers, sys.stderr = handlers, stderr
        root.setLevel(level)


def _run(requests: int, workers: int, seed: int, step_delay_s: float, crash: bool, counter: TracebackCounter) -> Report:
    report = Report(requests=requests, workers=workers)
    outputs = Path(tempfile.mkdtemp(prefix="stepstudio-stress-"))
    server, engine, recorder, endpoints = start_studio(step_delay_s, outputs)
    report.rss_mb["start"] = round(rss_mb(), 1)
    peak = [report.rss_mb["start"]]
    sampling = threading.Event()
    outcomes: list[Outcome] = []

    def sample_rss() -> None:
        # After a quarter of the calls the clients, threads and caches are warm: growth past
        # that point is what would show a leak.
        while not sampling.wait(0.2):
            peak.append(rss_mb())
            if "warm" not in report.rss_mb and len(outcomes) >= requests // 4:
                report.rss_mb["warm"] = round(peak[-1], 1)

    threading.Thread(target=sample_rss, daemon=True).start()
    lock = threading.Lock()
    shares = [requests // workers + (1 if i < requests % workers else 0) for i in range(workers)]
    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(server.url, endpoints, n, seed * 1000 + i, KINDS[i::workers],
                                                     outcomes, lock))
               for i, n in enumerate(shares)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(CALL_TIMEOUT_S * (max(shares) + 1))
    report.seconds = round(time.monotonic() - started, 2)

    # Disconnected callers' requests end at the engine's next step boundary: let it settle.
    deadline = time.monotonic() + 30
    while (engine.requests_in_flight or engine.snapshot().requests) and time.monotonic() < deadline:
        time.sleep(0.01)
    sampling.set()
    report.rss_mb.update(peak=round(max(peak), 1), end=round(rss_mb(), 1))
    report.answers = dict(collections.Counter(o.answer for o in outcomes))
    by_kind: dict = collections.defaultdict(collections.Counter)
    for outcome in outcomes:
        by_kind[f"{outcome.kind}/{outcome.via}"][outcome.answer] += 1
    report.by_kind = {kind: dict(counts) for kind, counts in sorted(by_kind.items())}
    check_invariants(report, outcomes, engine, recorder, requests, threads)
    if crash:
        report.crash = crash_phase(server.url, engine, server)
        check_crash(report)
    else:
        server.stop()
    engine.close()
    shutil.rmtree(outputs, ignore_errors=True)
    unexpected, injected = counter.tracebacks()
    report.tracebacks = {"unexpected": len(unexpected), "injected": injected, "examples": unexpected[:3]}
    if unexpected:
        report.problems.append(f"{len(unexpected)} tracebacks in the log: {unexpected[:2]}")
    return report


def check_invariants(report: Report, outcomes: list, engine, recorder, requests: int, threads) -> None:
    problems = report.problems
    if any(thread.is_alive() for thread in threads):
        problems.append("a worker thread never finished")
    if len(outcomes) != requests:
        problems.append(f"{requests} calls sent, {len(outcomes)} answered")
    for answer in ("hang", "wrong"):
        if report.answers.get(answer):
            examples = [f"{o.kind}/{o.via}: {o.detail}" for o in outcomes if o.answer == answer][:3]
            problems.append(f"{report.answers[answer]} calls got '{answer}': {examples}")
    for kind, counts in report.by_kind.items():
        unexpected = {answer: n for answer, n in counts.items() if answer not in EXPECTED[kind] | {"hang", "wrong"}}
        if unexpected:
            examples = [o.detail for o in outcomes if f"{o.kind}/{o.via}" == kind and o.answer in unexpected][:3]
            problems.append(f"{kind} calls got {unexpected}, expected only {sorted(EXPECTED[kind])}: {examples}")
    metric = engine.metrics.registry.get_sample_value
    finished = {s: metric("stepstudio_requests_finished_total", {"status": s}) for s in ("completed", "aborted", "error")}
    submitted = metric("stepstudio_requests_submitted_total")
    report.engine = {"submitted": submitted, **finished,
                     "rejected": {r: metric("stepstudio_requests_rejected_total", {"reason": r})
                                  for r in ("invalid", "queue_full", "session_limit", "closed")},
                     "in_flight": engine.requests_in_flight, "states_in_memory": engine.states_in_memory,
                     "queue_view": len(engine.snapshot().requests)}
    if submitted != sum(finished.values()):
        problems.append(f"the engine accepted {submitted} requests but finished {sum(finished.values())}")
    if engine.requests_in_flight or engine.states_in_memory or engine.snapshot().requests:
        problems.append(f"left in the engine: {report.engine}")
    from engine.events import FINAL_EVENTS

    finals = collections.Counter(sum(isinstance(e, FINAL_EVENTS) for e in handle.history) for handle in recorder.handles)
    report.final_events_per_request = {str(k): v for k, v in sorted(finals.items())}
    if set(finals) - {1}:
        problems.append(f"requests without exactly one final event: {dict(finals)}")
    if len(recorder.handles) != submitted:
        problems.append(f"{len(recorder.handles)} handles recorded, the engine counted {submitted}")
    growth = report.rss_mb["end"] - report.rss_mb.get("warm", report.rss_mb["start"])
    if growth > MAX_RSS_GROWTH_MB:
        problems.append(f"resident memory grew by {growth:.0f} MB after the first quarter of the calls")


def check_crash(report: Report) -> None:
    crash = report.crash
    expected = {"http_waiting": (503, "engine_failed"), "http_crasher": (503, "engine_failed")}
    for name, answer in expected.items():
        if tuple(crash.get(name, ())) != answer:
            report.problems.append(f"crash phase: {name} got {crash.get(name)!r}, expected {answer}")
    if not str(crash.get("gradio_waiting", "")).startswith("gr.Error"):
        report.problems.append(f"crash phase: the page got {crash.get('gradio_waiting')!r}")
    if crash.get("http_after") not in ((503, "engine_failed"), "connection refused (server stopped)"):
        report.problems.append(f"crash phase: a call after the crash got {crash.get('http_after')!r}")
    if not crash.get("server_stopped"):
        report.problems.append("crash phase: the server kept running after the engine crashed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-delay", type=float, default=0.002, help="seconds per toy forward")
    parser.add_argument("--no-crash", action="store_true", help="skip the engine-crash phase")
    parser.add_argument("--json", default=None, help="write the report here")
    args = parser.parse_args()
    report = run(args.requests, args.workers, args.seed, args.step_delay, crash=not args.no_crash)
    text = json.dumps(asdict(report), indent=2, default=str)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    print("PASS" if report.ok else "FAIL: " + "; ".join(report.problems))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())

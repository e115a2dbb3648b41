"""A live studio for tests: the engine and the web server over a given pipeline, wired as
`python app.py --model toy` wires them, on a free port, saving outputs only where asked."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path
from typing import Callable

import httpx

from benchmarks.client_streams import SettledClient
from engine import Engine
from studio.config import StudioOptions
from studio.app import build_app
from studio.server.serving import StudioServer


@contextlib.contextmanager
def live_studio(pipeline, outputs: Path | None = None, **options):
    """Yields (server, engine); `options` are StudioOptions fields."""
    config = StudioOptions(model="toy", port=0, outputs=str(outputs) if outputs else None, **options)
    engine = Engine(pipeline, mode=config.mode, max_batch_requests=config.max_batch, limits=config.limits).start()
    server = StudioServer(build_app(engine, config), "127.0.0.1", 0).start()
    try:
        yield server, engine
    finally:
        server.stop()
        engine.close()


# gradio_client's own HTTP calls wait 5 s (httpx's default); a studio on a loaded 2-core machine
# (a test run beside a training run) has been seen to take longer to answer its config.
CLIENT_TIMEOUT_S = 120


def connect(url: str, **options) -> SettledClient:
    """A gradio_client for a studio, quiet, with waits that hold on a loaded machine, that never
    sends a call into a closing event stream (benchmarks/client_streams.py)."""
    return SettledClient(url, verbose=False, httpx_kwargs={"timeout": CLIENT_TIMEOUT_S}, **options)


def streamed(job) -> list[tuple]:
    """The updates a gradio_client job has streamed so far, less any it could not process: those
    it keeps as [exception] instead of raising (e.g. a file download that failed)."""
    return [output for output in job.outputs() if not isinstance(output[0], Exception)]


def statuses(job) -> list[dict]:
    """The status dicts a gradio_client job has streamed so far (its first output)."""
    return [output[0] for output in streamed(job) if isinstance(output[0], dict)]


def wait_for(predicate, timeout_s: float = 20.0, what: str = "condition"):
    """Poll `predicate` (for what only a client can see, e.g. streamed outputs) until it is truthy."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


# A studio in its own process imports torch and Gradio and loads its model before it answers: on
# a loaded 2-core machine (two such starts at once, beside a training run) that has taken well over
# a minute. The cap only ends a start that hangs; a process that dies is reported at once.
START_TIMEOUT_S = 600


def wait_until_serving(process: subprocess.Popen, url: str, output: Callable[[], str] = lambda: "",
                       timeout_s: float = START_TIMEOUT_S, healthy: Callable[[httpx.Response], bool] | None = None):
    """Wait until the studio at `url` answers GET /healthz with a 200 (and `healthy(response)`, when
    given), or fail as soon as `process` has ended, with the end of its `output`."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert process.poll() is None, f"the studio exited with status {process.returncode}:\n{output()[-4000:]}"
        try:
            response = httpx.get(url.rstrip("/") + "/healthz", timeout=5)
            if response.status_code == 200 and (healthy is None or healthy(response)):
                return
        except httpx.HTTPError:
            pass  # not listening yet
        assert time.monotonic() < deadline, f"{url} did not answer in {timeout_s:.0f} s:\n{output()[-4000:]}"
        time.sleep(0.2)  # pacing between polls, not a wait for anything

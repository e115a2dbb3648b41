"""A live studio for tests: the engine and the web server over a given pipeline, wired as
`python app.py --model toy` wires them, on a free port, saving outputs only where asked."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from gradio_client import Client

from engine import Engine
from studio.config import StudioOptions
from studio.server.app import StudioServer, build_app


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


def connect(url: str, **options) -> Client:
    """A gradio_client for a studio, quiet, with waits that hold on a loaded machine."""
    return Client(url, verbose=False, httpx_kwargs={"timeout": CLIENT_TIMEOUT_S}, **options)


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

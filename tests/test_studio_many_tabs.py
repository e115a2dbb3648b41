"""32 sessions at once: Gradio does not serialise them, the engine co-batches them, and the
page's own endpoints keep answering while they stream."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from pipelines.toy import ToyPipeline
from tests.studio_helpers import connect, live_studio, wait_for

SESSIONS = 32
STEPS = 30


@pytest.fixture(scope="module")
def studio():
    pipeline = ToyPipeline(step_delay_s=0.05)
    with live_studio(pipeline, max_batch=SESSIONS, preview_every=0, max_per_session=1) as (server, engine):
        yield server, engine, pipeline


def test_32_sessions_share_forwards_and_the_page_stays_responsive(studio):
    server, engine, pipeline = studio
    answered = threading.Event()
    joined = threading.Event()

    def hold_the_last_step(index, batch) -> None:
        # The sessions stream freely; only their last step waits, and only until the page has
        # answered: the answers surely come while every session is still streaming, however
        # busy the machine (no clock involved). The first forward also waits until half of the
        # sessions have reached the engine: on a loaded machine 32 submits can take longer than
        # one request's 30 steps, and the first ones would end (or hold) before the rest join.
        if not joined.is_set():
            wait_for(lambda: engine.requests_in_flight >= SESSIONS // 2, timeout_s=120,
                     what="half of the sessions at the engine")
            joined.set()
        if not answered.is_set() and any(v.step >= STEPS - 1 for v in engine.snapshot().requests):
            answered.wait(120)

    with ThreadPoolExecutor(SESSIONS) as pool:
        clients = list(pool.map(lambda _: connect(server.url), range(SESSIONS + 1)))
    observer = clients.pop()
    pipeline.on_forward = hold_the_last_step
    try:
        jobs = [
            c.submit(prompt=f"tab {i}", negative_prompt="", width=64, height=64, steps=STEPS, guidance_scale=1.0,
                     seed=i, api_name="/generate")
            for i, c in enumerate(clients)
        ]
        # While they stream: the health route and another session's queue call still answer.
        wait_for(lambda: engine.snapshot().stats.current_batch_size >= SESSIONS // 2, timeout_s=120,
                 what="half of the sessions running together")
        health = httpx.get(f"{server.url.rstrip('/')}/healthz", timeout=60)
        queue = observer.predict(api_name="/queue")
    finally:
        answered.set()
        pipeline.on_forward = None
    assert health.status_code == 200
    assert len(queue["requests"]) >= SESSIONS // 2
    assert all(r["state"] in ("waiting", "running") and r["step"] < STEPS for r in queue["requests"]), queue

    finals = [job.result(timeout=120) for job in jobs]
    assert all(status["state"] == "completed" and status["step"] == STEPS for status, _, _ in finals)
    sizes = engine.snapshot().stats.forwards_by_batch_size
    # Gradio let them all through: at least half of the tabs shared one forward.
    assert max(sizes) >= SESSIONS // 2

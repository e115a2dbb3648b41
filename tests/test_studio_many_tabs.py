"""32 sessions at once: Gradio does not serialise them, the engine co-batches them, and the
page's own endpoints keep answering while they stream."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from gradio_client import Client

from pipelines.toy import ToyPipeline
from tests.studio_helpers import live_studio

SESSIONS = 32
STEPS = 30


@pytest.fixture(scope="module")
def studio():
    pipeline = ToyPipeline(step_delay_s=0.05)
    with live_studio(pipeline, max_batch=SESSIONS, preview_every=0, max_per_session=1) as (server, engine):
        yield server, engine


def test_32_sessions_share_forwards_and_the_page_stays_responsive(studio):
    server, engine = studio
    with ThreadPoolExecutor(SESSIONS) as pool:
        clients = list(pool.map(lambda _: Client(server.url, verbose=False), range(SESSIONS + 1)))
    observer = clients.pop()
    jobs = [
        c.submit(prompt=f"tab {i}", negative_prompt="", width=64, height=64, steps=STEPS, guidance_scale=1.0,
                 seed=i, api_name="/generate")
        for i, c in enumerate(clients)
    ]
    # While they stream: the health route and another session's queue call still answer.
    deadline = time.monotonic() + 30
    while engine.snapshot().stats.current_batch_size < SESSIONS // 2:
        assert time.monotonic() < deadline, "the sessions never ran together"
        time.sleep(0.02)
    started = time.monotonic()
    health = httpx.get(f"{server.url.rstrip('/')}/healthz", timeout=10)
    queue = observer.predict(api_name="/queue")
    answered_in = time.monotonic() - started
    assert health.status_code == 200
    assert len(queue["requests"]) >= SESSIONS // 2
    assert answered_in < 10, f"the page took {answered_in:.1f} s to answer while {SESSIONS} sessions streamed"

    finals = [job.result(timeout=120) for job in jobs]
    assert all(status["state"] == "completed" and status["step"] == STEPS for status, _, _ in finals)
    sizes = engine.snapshot().stats.forwards_by_batch_size
    # Gradio let them all through: at least half of the tabs shared one forward.
    assert max(sizes) >= SESSIONS // 2

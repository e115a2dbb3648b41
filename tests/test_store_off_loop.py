"""Durable writes off the event loop: the synced commits that accept a `/generate` request (gradio_client)
or a `/v1/videos` job run on the store's writer thread. With a store whose commits take 0.4 s (a slow
disk's fsync), a coroutine beside them keeps ticking on the same loop the whole time, and the caller
is answered only after the commit: /generate's first status, /v1/videos' job object."""

from __future__ import annotations

import asyncio
import time

import fastapi
import httpx

from engine import Completed, Engine
from pipelines.toy import ToyPipeline
from studio.api.gradio_endpoints import follow_request
from studio.api.http_routes import HttpApiConfig, build_router
from studio.api.video_routes import video_jobs_for
from studio.form import FormValues
from studio.store.database import open_database
from studio.store.durable import DurableRequests
from studio.store.store import StudioStore
from tests.test_readme_claims import ToyVideo

COMMIT_S = 0.4
TICK_S = 0.01


class SlowStore(StudioStore):
    """A store in memory whose accepting commits take COMMIT_S, each recorded as (what, began, ended)."""

    def __init__(self) -> None:
        super().__init__(open_database(None), None)
        self.commits: list[tuple[str, float, float]] = []

    def _slowly(self, what: str, write):
        began = time.monotonic()
        time.sleep(COMMIT_S)
        result = write()
        self.commits.append((what, began, time.monotonic()))
        return result

    def accept(self, *args, **kwargs):
        return self._slowly("accept", lambda: super(SlowStore, self).accept(*args, **kwargs))

    def add_video_job(self, *args, **kwargs):
        return self._slowly("add_video_job", lambda: super(SlowStore, self).add_video_job(*args, **kwargs))


async def ticking(stop: asyncio.Event) -> list[float]:
    """The loop's heartbeat: a tick every TICK_S while nothing blocks it."""
    ticks = []
    while not stop.is_set():
        ticks.append(time.monotonic())
        await asyncio.sleep(TICK_S)
    return ticks


def assert_the_loop_ticked_through(commits, ticks) -> None:
    for what, began, ended in commits:
        during = [tick for tick in ticks if began < tick < ended]
        # ~40 ticks fit in a commit; a loop blocked by it gets none (a loaded machine, still several).
        assert len(during) >= 8, (what, len(during))
        assert max(b - a for a, b in zip([began, *during], [*during, ended])) < COMMIT_S / 2, what


def test_a_generate_requests_commit_runs_off_the_loop_and_its_first_status_waits_for_it():
    store = SlowStore()
    durable = DurableRequests(store)
    engine = Engine(ToyPipeline()).start()

    async def main():
        stop = asyncio.Event()
        ticker = asyncio.create_task(ticking(stop))
        followed = []

        async def accept(handle) -> None:  # as /generate's acceptor: its finish ends the entry
            followed.append(await durable.accept("image", handle, "", lambda entry, event: store.finished(entry)))

        statuses = []
        form = FormValues("a red circle", width=64, height=64, steps=3, seed=7)
        async for status in follow_request(engine, form, "tab-1", preview_every=0, accept=accept):
            statuses.append((time.monotonic(), status.state))
        stop.set()
        return await ticker, statuses, followed

    try:
        ticks, statuses, followed = asyncio.run(main())
        [(what, began, committed)] = store.commits
        assert what == "accept" and committed - began >= COMMIT_S
        assert_the_loop_ticked_through(store.commits, ticks)
        assert statuses[0][0] >= committed  # the caller hears nothing before its request is committed
        assert statuses[-1][1] == "completed"
        followed[0].result(timeout=10)  # finished by the durable finisher: the entry is gone
        assert store.pending() == []
    finally:
        engine.close()


def test_a_video_jobs_commits_run_off_the_loop_and_the_job_is_answered_after_them():
    store = SlowStore()
    durable = DurableRequests(store)
    engine = Engine(ToyVideo()).start()
    config = HttpApiConfig()
    router = build_router(engine, config, video_jobs=video_jobs_for(config, None, durable))
    app = fastapi.FastAPI()
    app.include_router(router)

    async def main():
        stop = asyncio.Event()
        ticker = asyncio.create_task(ticking(stop))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://studio", timeout=30) as client:
            response = await client.post("/v1/videos", json={"prompt": "a red square", "num_inference_steps": 2})
            answered = time.monotonic()
        stop.set()
        return await ticker, response, answered

    try:
        ticks, response, answered = asyncio.run(main())
        assert response.status_code == 200, response.text
        assert [what for what, _, _ in store.commits] == ["add_video_job", "accept"]
        assert_the_loop_ticked_through(store.commits, ticks)
        assert answered >= store.commits[-1][2]  # answered after both commits
        [pending] = store.pending()
        assert (pending.kind, pending.video_id) == ("video_job", response.json()["id"])
        job = router.video_jobs.store.by_id(response.json()["id"])
        assert isinstance(job.handle.result(timeout=30), Completed)
    finally:
        engine.close()

"""Events from threads and asyncio, snapshots, and a clean shutdown."""

import asyncio
import threading

import pytest

from engine import Aborted, Completed, Engine, EngineClosedError, Progress, Queued, Started
from pipelines.toy import ToyPipeline
from tests.engine_helpers import params, running_engine


def test_events_can_be_consumed_from_asyncio():
    async def consume(engine):
        handle = engine.submit(params(steps=4))
        return [type(e) async for e in handle.stream()]

    with running_engine() as engine:
        kinds = asyncio.run(consume(engine))
    assert kinds == [Queued, Started, Progress, Progress, Progress, Progress, Completed]


def test_late_subscribers_get_the_whole_history():
    with running_engine() as engine:
        handle = engine.submit(params(steps=3))
        handle.result(timeout=30)
        assert [type(e) for e in handle.events()] == [Queued, Started, Progress, Progress, Progress, Completed]


def test_snapshot_shows_positions_batch_mates_and_eta():
    pipeline = ToyPipeline()
    seen = {}

    def look(index, batch):
        if index == 2:
            seen["snapshot"] = engine.snapshot()

    pipeline.on_forward = look
    with running_engine(pipeline, max_batch=2) as engine:
        handles = [engine.submit(params(seed=i, steps=5, prompt=f"p{i}"), session_id=f"s{i}") for i in range(3)]
        for h in handles:
            h.result(timeout=30)
    snap = seen["snapshot"]
    by_id = {r.request_id: r for r in snap.requests}
    first, second, third = (by_id[h.request_id] for h in handles)
    assert (first.state, first.step, first.total) == ("running", 2, 5)
    assert first.batch_mates == (second.request_id,)
    assert (third.state, third.position) == ("waiting", 1)
    assert third.eta_s is not None and third.eta_s > 0
    assert snap.stats.current_batch_size == 2 and snap.stats.mode == "step"


def test_close_aborts_pending_requests_and_stops_the_thread():
    pipeline = ToyPipeline(step_delay_s=0.01)
    engine = Engine(pipeline, max_batch=1).start()
    handles = [engine.submit(params(steps=50, seed=i), session_id=f"s{i}") for i in range(3)]
    next(e for e in handles[0].events(timeout=30) if isinstance(e, Progress))
    engine.close()
    assert not engine.is_alive
    finals = [h.last_event for h in handles]
    assert all(isinstance(f, Aborted) and f.reason == "the engine was shut down" for f in finals)
    assert engine.states_in_memory == 0
    with pytest.raises(EngineClosedError):
        engine.submit(params())
    assert not any(t.name == "stepstudio-engine" for t in threading.enumerate())


def test_state_cache_is_empty_when_idle():
    with running_engine(max_batch=3) as engine:
        handles = [engine.submit(params(seed=i, steps=3 + i), session_id=str(i)) for i in range(5)]
        assert all(isinstance(h.result(timeout=30), Completed) for h in handles)
        assert engine.states_in_memory == 0
        assert engine.snapshot().requests == ()
        assert engine.snapshot().stats.finished == {"completed": 5}


def test_an_asyncio_consumer_that_subscribes_after_the_end_still_gets_every_event():
    with running_engine() as engine:
        handle = engine.submit(params(steps=2, prompt="[fail:denoise_step]"))
        handle.result(timeout=30)

        async def consume():
            return [type(e).__name__ async for e in handle.stream()]

        kinds = asyncio.run(asyncio.wait_for(consume(), timeout=5))
    assert kinds == ["Queued", "Started", "Failed"]

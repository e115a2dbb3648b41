"""Events from threads and asyncio, snapshots, and a clean shutdown."""

import asyncio
import gc
import threading
import weakref

import pytest

from engine import (
    Aborted,
    Completed,
    Engine,
    EngineClosedError,
    Progress,
    Queued,
    Started,
)
from pipelines.toy import ToyPipeline
from tests.engine_helpers import StepGate, engine_started_after, params, running_engine


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
    pipeline.on_forward = lambda index, batch: index == 2 and seen.setdefault("snapshot", engine.snapshot())
    engine = Engine(pipeline, max_batch_requests=2)
    handles = [engine.submit(params(seed=i, steps=5, prompt=f"p{i}"), session_id=f"s{i}") for i in range(3)]
    engine.start()
    try:
        for h in handles:
            h.result(timeout=30)
    finally:
        engine.close()
    snap = seen["snapshot"]
    by_id = {r.request_id: r for r in snap.requests}
    first, second, third = (by_id[h.request_id] for h in handles)
    assert (first.state, first.step, first.total) == ("running", 2, 5)
    assert first.batch_mates == (second.request_id,)
    assert (third.state, third.position) == ("waiting", 1)
    # Its ETA: the 3 + 3 steps left ahead of it spread over 2 slots, then its own 5, at the mean step time.
    step_s = snap.stats.stages.denoise_step_s
    assert third.eta_s == pytest.approx((6 / 2 + 5) * step_s)
    assert snap.stats.current_batch_size == 2 and snap.stats.mode == "step"


def test_shutdown_aborts_every_request_at_the_next_step_boundary():
    pipeline = ToyPipeline()
    gate = StepGate(1)
    pipeline.on_forward = gate
    engine = Engine(pipeline, max_batch_requests=1)
    handles = [engine.submit(params(steps=50, seed=i), session_id=f"s{i}") for i in range(3)]
    others = set(threading.enumerate())  # an engine another test left closing is not this one's
    engine.start()
    gate.wait()  # inside the second forward
    engine.shutdown()  # returns at once
    with pytest.raises(EngineClosedError, match="shutting down"):
        engine.submit(params())
    gate.release()
    assert engine.wait_stopped(timeout=30)
    engine.close()
    assert not engine.is_alive and engine.failure is None
    finals = [h.last_event for h in handles]
    assert all(isinstance(f, Aborted) and (f.reason, f.cause) == ("the engine was shut down", "shutdown") for f in finals)
    assert len(pipeline.forward_log) == 2 and pipeline.decoded == []  # no step after the boundary
    assert (engine.states_in_memory, engine.requests_in_flight) == (0, 0)
    assert not any(t.name == "stepstudio-engine" for t in set(threading.enumerate()) - others)


def test_state_cache_is_empty_when_idle():
    with running_engine(max_batch_requests=3) as engine:
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


def test_a_closed_event_loop_is_not_kept_alive_by_the_engine():
    with running_engine() as engine:
        handle = engine.submit(params(steps=2))

        async def consume():
            return [type(e) async for e in handle.stream()]

        loop = asyncio.new_event_loop()
        assert loop.run_until_complete(consume())[-1] is Completed
        loop.close()
        loop_ref = weakref.ref(loop)
        del loop
        gc.collect()
        assert loop_ref() is None

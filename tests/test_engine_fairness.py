"""Incompatible groups take turns; a busy session can't starve a quiet one; limits hold."""

import pytest

from engine import Completed, Engine, QueueFullError, ServingLimits, SessionLimitError
from pipelines.toy import ToyPipeline
from tests.engine_helpers import engine_started_after, params, running_engine


def test_incompatible_batch_keys_take_turns():
    pipeline = ToyPipeline()
    submissions = [(params(size=64, steps=10, prompt="big"), "a"), (params(size=32, steps=10, prompt="small"), "b")]
    with engine_started_after(submissions, pipeline, max_batch=8) as (engine, (big, small)):
        assert isinstance(big.result(timeout=30), Completed)
        assert isinstance(small.result(timeout=30), Completed)
    log = pipeline.forward_log
    # Never mixed in one forward, and strictly alternating while both have work.
    assert all(len(f) == 1 for f in log)
    assert [f[0] for f in log[:6]] == [big.request_id, small.request_id] * 3
    assert len(log) == 20


def test_a_busy_session_does_not_starve_another():
    pipeline = ToyPipeline()
    quiet = {}

    def quiet_session_arrives(index, batch):
        if index == 1:
            quiet["handle"] = engine.submit(params(seed=99, steps=3, prompt="quiet"), session_id="quiet")

    pipeline.on_forward = quiet_session_arrives
    engine = Engine(pipeline, max_batch=2, limits=ServingLimits(max_per_session=20))
    busy = [engine.submit(params(seed=i, steps=3), session_id="busy") for i in range(12)]
    engine.start()
    try:
        for h in busy:
            assert isinstance(h.result(timeout=30), Completed)
        assert isinstance(quiet["handle"].result(timeout=30), Completed)
    finally:
        engine.close()
    quiet_id = quiet["handle"].request_id
    first_quiet_forward = next(i for i, f in enumerate(pipeline.forward_log) if quiet_id in f)
    # The busy session's first two fill both slots for 3 steps; the quiet one takes the
    # next free slot (forward 3), ahead of the busy session's ten queued requests.
    assert first_quiet_forward == 3
    busy_done_before_quiet_started = sum(
        1 for h in busy if max(i for i, f in enumerate(pipeline.forward_log) if h.request_id in f) < 3
    )
    assert busy_done_before_quiet_started == 2


def test_session_in_flight_limit_and_queue_limit():
    pipeline = ToyPipeline(step_delay_s=0.02)
    with running_engine(pipeline, limits=ServingLimits(max_per_session=2, max_queue=3)) as engine:
        engine.submit(params(steps=20), session_id="a")
        engine.submit(params(steps=20), session_id="a")
        with pytest.raises(SessionLimitError, match="already has 2 requests in flight"):
            engine.submit(params(steps=20), session_id="a")
        engine.submit(params(steps=20), session_id="b")
        with pytest.raises(QueueFullError, match="queue is full"):
            engine.submit(params(steps=20), session_id="c")

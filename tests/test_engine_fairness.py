"""Incompatible groups take turns by cost; a busy session can't starve a quiet one; limits hold."""

import pytest

from engine import Completed, Engine, QueueFullError, ServingLimits, SessionLimitError
from pipelines.toy import ToyPipeline
from tests.engine_helpers import engine_started_after, params


def test_incompatible_batch_keys_take_turns_weighted_by_cost():
    pipeline = ToyPipeline()
    # 64x64 is 64 latent tokens per row, 32x32 is 16: a big forward costs four small ones.
    submissions = [(params(size=64, steps=10, prompt="big"), "a"), (params(size=32, steps=10, prompt="small"), "b")]
    with engine_started_after(submissions, pipeline, max_batch_requests=8) as (engine, (big, small)):
        assert isinstance(big.result(timeout=30), Completed)
        assert isinstance(small.result(timeout=30), Completed)
    b, s = big.request_id, small.request_id
    # Never mixed in one forward; while both have work, four small forwards per big one
    # (equal device time); once the small one is done the big one runs alone.
    assert [f[0] for f in pipeline.forward_log] == [b] + [s] * 4 + [b] + [s] * 4 + [b] + [s] * 2 + [b] * 7
    assert all(len(f) == 1 for f in pipeline.forward_log)


def test_a_large_request_never_starves_small_ones():
    pipeline = ToyPipeline()
    # The large request costs 4x a small one per step (256 vs 64 tokens) and arrives first.
    submissions = [(params(size=128, steps=3, prompt="large"), "big-caller")] + [
        (params(size=64, steps=8, seed=i, prompt=f"small {i}"), f"small-caller-{i}") for i in range(2)
    ]
    limits = ServingLimits(max_size=128)
    with engine_started_after(submissions, pipeline, limits=limits) as (engine, (large, *smalls)):
        assert all(isinstance(h.result(timeout=30), Completed) for h in (large, *smalls))
    small_ids = tuple(h.request_id for h in smalls)
    log = pipeline.forward_log
    # The two small requests share a forward (128 tokens); the large one runs once per two
    # of theirs, so their eight steps are done after two of its three.
    assert log == [(large.request_id,)] + [small_ids] * 2 + [(large.request_id,)] + [small_ids] * 2 + [
        (large.request_id,)
    ] + [small_ids] * 4


def test_a_busy_session_does_not_starve_another():
    pipeline = ToyPipeline()
    quiet = {}

    def quiet_session_arrives(index, batch):
        if index == 1:
            quiet["handle"] = engine.submit(params(seed=99, steps=3, prompt="quiet"), session_id="quiet")

    pipeline.on_forward = quiet_session_arrives
    engine = Engine(pipeline, max_batch_requests=2, limits=ServingLimits(max_per_session=20))
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
    engine = Engine(ToyPipeline(), limits=ServingLimits(max_per_session=2, max_queue=3))  # not started: all stay queued
    engine.submit(params(steps=20), session_id="a")
    engine.submit(params(steps=20), session_id="a")
    with pytest.raises(SessionLimitError, match="already has 2 requests in flight"):
        engine.submit(params(steps=20), session_id="a")
    engine.submit(params(steps=20), session_id="b")
    with pytest.raises(QueueFullError, match="queue is full"):
        engine.submit(params(steps=20), session_id="c")
    assert engine.requests_in_flight == 3
    engine.close()
    assert engine.requests_in_flight == 0


def test_in_flight_cost_per_session_is_capped_in_default_requests():
    # The toy's default request: 64x64 (64 tokens), 8 steps, one row: cost 512.
    engine = Engine(ToyPipeline(), limits=ServingLimits(max_session_cost=2.0, max_steps=100))
    assert engine.unit_cost == 64 * 8
    alone = engine.submit(params(steps=100), session_id="a")  # 12.5 default requests: alone, it is admitted
    with pytest.raises(SessionLimitError, match=r"already cost 12\.5 default requests and this one costs 0\.1"):
        engine.submit(params(steps=1), session_id="a")
    engine.submit(params(steps=16), session_id="b")  # 2.0: at the limit
    with pytest.raises(SessionLimitError, match=r"the limit is 2"):
        engine.submit(params(steps=1), session_id="b")
    small = engine.submit(params(size=32, steps=8), session_id="c")  # 16 tokens x 8 steps = 0.25
    engine.submit(params(size=32, steps=56), session_id="c")  # + 1.75 = 2.0
    engine.close()
    assert [alone.last_event.cause, small.last_event.cause] == ["shutdown", "shutdown"]
    assert engine.metrics.requests_rejected.labels("session_limit")._value.get() == 2


def test_the_default_max_size_is_the_models_own_size():
    engine = Engine(ToyPipeline())  # the toy model makes 64x64 images
    assert engine.limits.max_size == 64
    with pytest.raises(ValueError, match="width=128 is above this server's limit of 64 pixels"):
        engine.submit(params(size=128))
    assert Engine(ToyPipeline(), limits=ServingLimits(max_size=256)).limits.max_size == 256

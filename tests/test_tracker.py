"""The request tracker on a real engine with the toy pipeline: exact states and steps, the one
cancel, a caller that goes away, a shutdown, a failure, and polling that agrees with following."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np

from engine import Engine, GenerationParams, Progress
from engine.engine import SHUTDOWN_REASON
from pipelines.toy import ToyPipeline
from studio.tracker import RequestTracker, Status, status_of
from tests.engine_helpers import StepGate, params, solo_pixels, spy_on_cancels

STEPS = 6


def started_engine_with(*submissions: GenerationParams, pipeline=None, **engine_kwargs):
    """An engine with the requests submitted before its thread starts (they arrive at the same
    first step boundary), and a tracker for each."""
    engine = Engine(pipeline or ToyPipeline(), max_batch_requests=4, **engine_kwargs)
    trackers = [RequestTracker(engine.submit(p, session_id="tab")) for p in submissions]
    engine.start()
    return engine, trackers


async def collected(tracker: RequestTracker) -> list[tuple[str, int, int, int | None, int, str]]:
    return [(type(event).__name__, status.state, status.step, status.position, status.batch_size, status.message)
            async for status, event in tracker.updates()]


def test_a_request_is_followed_step_by_step_to_its_image():
    request = params(steps=STEPS, seed=7, preview_every=2)
    engine, (tracker,) = started_engine_with(request)
    try:
        seen = asyncio.run(collected(tracker))
    finally:
        engine.close()
    assert seen == [
        ("NoneType", "queued", 0, None, 0, ""),  # as submitted, before any event
        ("Queued", "queued", 0, 1, 0, ""),
        ("Started", "running", 0, None, 1, ""),
        *[("Progress", "running", step, None, 1, "") for step in range(1, STEPS + 1)],
        ("Completed", "completed", STEPS, None, 1, ""),
    ]
    final = tracker.status
    assert (final.total, final.seed, final.is_final, final.ended_by) == (STEPS, 7, True, None)
    np.testing.assert_array_equal(np.asarray(final.result.images[0]), solo_pixels(request))
    # The latest preview is kept (previews come every 2 steps, the last step's image is the result).
    previews = [(e.step, e.preview) for e in tracker.handle.history if isinstance(e, Progress) and e.preview]
    assert [step for step, _ in previews] == [2, 4] and final.preview is previews[-1][1]
    assert tracker.cancel() is False  # nothing to cancel once it ended


def test_requests_that_share_forwards_see_their_batch_size():
    engine, trackers = started_engine_with(params(seed=1, steps=3), params(seed=2, steps=3))

    async def both():
        return await asyncio.gather(*(tracker.final() for tracker in trackers))

    try:
        finals = asyncio.run(both())
    finally:
        engine.close()
    assert [(f.state, f.step, f.batch_size) for f in finals] == [("completed", 3, 2)] * 2


def test_cancel_asks_the_engine_once_and_ends_the_request_at_the_next_step_boundary(monkeypatch):
    gate = StepGate(2)  # held inside the third forward
    engine = Engine(ToyPipeline(on_forward=gate), max_batch_requests=4)
    cancels = spy_on_cancels(engine, monkeypatch)
    tracker = RequestTracker(engine.submit(params(steps=STEPS), session_id="tab"))
    engine.start()

    async def cancel_at_step_3() -> Status:
        await asyncio.to_thread(gate.wait)
        assert (tracker.cancel(), tracker.cancel()) == (True, False)  # asked once
        gate.release()
        return await tracker.final()

    try:
        final = asyncio.run(cancel_at_step_3())
    finally:
        gate.release()
        engine.close()
    assert (final.state, final.step, final.message) == ("aborted", 3, "cancelled by the user")
    assert not final.is_shutdown and final.result is None
    assert cancels == [tracker.request_id]  # the closing stream did not ask again


def test_a_caller_that_stops_listening_cancels_its_request(monkeypatch):
    gate = StepGate(3)
    engine = Engine(ToyPipeline(on_forward=gate), max_batch_requests=4)
    cancels = spy_on_cancels(engine, monkeypatch)
    tracker = RequestTracker(engine.submit(params(steps=STEPS), session_id="tab"))
    engine.start()

    async def leave_after_step_2() -> None:
        async with contextlib.aclosing(tracker.updates()) as updates:
            async for status, _ in updates:
                if status.step == 2:
                    break  # a closed tab: Gradio closes the handler's generator

    try:
        asyncio.run(leave_after_step_2())
        assert cancels == [tracker.request_id]
        gate.release()
        final = tracker.handle.result(timeout=30)
    finally:
        gate.release()
        engine.close()
    assert final.reason == "cancelled by the user"
    assert status_of(tracker.handle).step < STEPS  # it never ran to its end


def test_a_cancelled_wait_for_the_final_status_cancels_the_request(monkeypatch):
    gate = StepGate(1)
    engine = Engine(ToyPipeline(on_forward=gate), max_batch_requests=4)
    cancels = spy_on_cancels(engine, monkeypatch)
    tracker = RequestTracker(engine.submit(params(steps=STEPS), session_id="tab"))
    engine.start()

    async def give_up_waiting() -> None:
        waiting = asyncio.ensure_future(tracker.final())
        await asyncio.to_thread(gate.wait)
        waiting.cancel()  # an HTTP client that hung up
        with contextlib.suppress(asyncio.CancelledError):
            await waiting

    try:
        asyncio.run(give_up_waiting())
        gate.release()
        assert tracker.handle.result(timeout=30).cause == "cancelled"
    finally:
        gate.release()
        engine.close()
    assert cancels == [tracker.request_id]


def test_a_shutdown_ends_the_request_as_a_shutdown_not_a_cancel(monkeypatch):
    gate = StepGate(1)
    engine = Engine(ToyPipeline(on_forward=gate), max_batch_requests=4)
    cancels = spy_on_cancels(engine, monkeypatch)
    tracker = RequestTracker(engine.submit(params(steps=STEPS), session_id="tab"))
    engine.start()

    async def shut_down_at_step_2() -> Status:
        await asyncio.to_thread(gate.wait)
        engine.shutdown()
        gate.release()
        return await tracker.final()

    try:
        final = asyncio.run(shut_down_at_step_2())
    finally:
        gate.release()
        engine.close()
    assert (final.state, final.message, final.is_shutdown, final.is_engine_failure) == (
        "aborted", SHUTDOWN_REASON, True, False)
    assert final.step == 2
    assert cancels == []  # the engine ended it; nobody had to ask


def test_a_failing_request_ends_failed_with_the_pipelines_message():
    engine, (tracker,) = started_engine_with(params(prompt="[fail:post_decode] a circle", steps=3))
    try:
        final = asyncio.run(tracker.final())
    finally:
        engine.close()
    assert (final.state, final.step, final.is_engine_failure) == ("failed", 3, False)
    assert "injected failure in post_decode" in final.message and final.result is None


def test_polling_a_handle_tells_what_following_it_told():
    engine, (tracker,) = started_engine_with(params(steps=4, seed=3, preview_every=1))
    try:
        followed = asyncio.run(tracker.final())
    finally:
        engine.close()
    polled = status_of(tracker.handle)
    assert polled == followed and polled.result is followed.result and polled.preview is followed.preview


def test_a_held_back_request_and_one_stopped_before_the_engine_had_it():
    request = GenerationParams(prompt="p", num_inference_steps=5, seed=9, width=64, height=64)
    waiting = Status.waiting(request)
    assert waiting.as_dict() == {"request_id": None, "state": "waiting", "step": 0, "total": 5, "position": None,
                                 "batch_size": 0, "seed": 9, "message": "", "paused": "", "skipped": 0}
    stopped = waiting.stopped("aborted", "cancelled before it started")
    assert (stopped.state, stopped.message, stopped.is_final, stopped.ended_by) == (
        "aborted", "cancelled before it started", True, None)


def test_a_paused_queue_is_said_while_queued_and_forgotten_once_started():
    from engine import Queued, Started
    from studio.tracker import status_after

    status = Status.waiting(GenerationParams(prompt="p", num_inference_steps=5, seed=9, width=64, height=64))
    status = status_after(status, Queued(position=3, paused="session"))
    assert (status.state, status.position, status.paused) == ("queued", 3, "session")
    assert status.as_dict()["paused"] == "session"
    status = status_after(status, Queued(position=1, paused=""))
    assert (status.position, status.paused) == (1, "")
    status = status_after(status_after(status, Queued(position=1, paused="engine")), Started(batch_size=2))
    assert (status.state, status.position, status.paused) == ("running", None, "")

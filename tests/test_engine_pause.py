"""Pausing, resuming, reordering and clearing a queue: exact states and step counts, with the
engine thread acting at exact forwards (the toy pipeline's `on_forward` hook runs on it)."""

import time

import pytest

from engine import Aborted, Completed, Engine, Queued
from engine.queue_control import CLEAR_REASON, PAUSE_ABORT_REASON, AbortSessionRequests
from pipelines.toy import ToyPipeline
from tests.engine_helpers import params


def queued(handle) -> list[tuple[int, str]]:
    return [(event.position, event.paused) for event in handle.history if isinstance(event, Queued)]


def forwards_of(pipeline, handle) -> list[int]:
    return [index for index, forward in enumerate(pipeline.forward_log) if handle.request_id in forward]


def test_a_paused_session_finishes_its_running_request_and_holds_its_waiting_one():
    pipeline = ToyPipeline()
    engine = Engine(pipeline, max_batch_requests=1)
    pipeline.on_forward = lambda index, batch: index == 1 and engine.pause_queue("a")
    a1 = engine.submit(params(seed=1, steps=4, prompt="a1"), session_id="a")
    a2 = engine.submit(params(seed=2, steps=4, prompt="a2"), session_id="a")
    b1 = engine.submit(params(seed=3, steps=4, prompt="b1"), session_id="b")
    engine.start()
    try:
        assert isinstance(a1.result(timeout=30), Completed)
        assert isinstance(b1.result(timeout=30), Completed)
        # a1 ran all its 4 steps after the pause came in its 2nd; b1 went next; a2 waits, told why.
        assert forwards_of(pipeline, a1) == [0, 1, 2, 3] and forwards_of(pipeline, b1) == [4, 5, 6, 7]
        assert len(pipeline.forward_log) == 8 and a2.request_id not in pipeline.encoded
        assert queued(a2) == [(2, ""), (3, ""), (2, ""), (2, "session"), (1, "session")]
        [view] = engine.snapshot().requests
        assert (view.request_id, view.state, view.position, view.paused, view.eta_s) == (
            a2.request_id, "waiting", 1, "session", None)
        assert engine.pause_reason("a") == "session" and engine.pause_reason("b") == ""
        assert engine.snapshot().pauses.sessions == frozenset({"a"})
        # A request the paused session adds waits too; another session's runs past it.
        a3 = engine.submit(params(seed=4, steps=2, prompt="a3"), session_id="a")
        b2 = engine.submit(params(seed=5, steps=3, prompt="b2"), session_id="b")
        assert isinstance(b2.result(timeout=30), Completed)
        assert forwards_of(pipeline, b2) == [8, 9, 10] and len(pipeline.forward_log) == 11
        assert queued(a3)[-1] == (2, "session")
        engine.resume_queue("a")
        assert isinstance(a2.result(timeout=30), Completed) and isinstance(a3.result(timeout=30), Completed)
        assert forwards_of(pipeline, a2) == [11, 12, 13, 14] and forwards_of(pipeline, a3) == [15, 16]
        assert queued(a2)[-1] == (1, "") and engine.pause_reason("a") == ""
    finally:
        engine.close()


def test_pausing_with_abort_running_stops_the_running_request_at_the_next_boundary():
    pipeline = ToyPipeline()
    engine = Engine(pipeline, max_batch_requests=4)
    pipeline.on_forward = lambda index, batch: index == 1 and engine.pause_queue("a", abort_running=True)
    a1 = engine.submit(params(seed=1, steps=6, prompt="a1"), session_id="a")
    b1 = engine.submit(params(seed=2, steps=6, prompt="b1"), session_id="b")
    engine.start()
    try:
        final = a1.result(timeout=30)
        assert isinstance(b1.result(timeout=30), Completed)
        assert engine.states_in_memory == 0
    finally:
        engine.close()
    assert isinstance(final, Aborted) and (final.reason, final.cause) == (PAUSE_ABORT_REASON, "cancelled")
    assert forwards_of(pipeline, a1) == [0, 1]  # the forward in flight when it was asked, no more
    assert [len(forward) for forward in pipeline.forward_log] == [2, 2, 1, 1, 1, 1]
    assert a1.request_id not in pipeline.decoded


def test_an_operator_pause_lets_running_requests_finish_and_starts_nothing():
    pipeline = ToyPipeline()
    engine = Engine(pipeline, max_batch_requests=1)
    pipeline.on_forward = lambda index, batch: index == 2 and engine.pause_engine()
    running = engine.submit(params(seed=1, steps=5), session_id="a")
    waiting = engine.submit(params(seed=2, steps=3), session_id="b")
    engine.start()
    try:
        assert isinstance(running.result(timeout=30), Completed)
        assert len(pipeline.forward_log) == 5 and waiting.request_id not in pipeline.encoded
        assert queued(waiting)[-1] == (1, "engine")
        assert engine.pause_reason("b") == "engine" == engine.pause_reason("anyone")
        assert engine.snapshot().pauses.engine and engine.snapshot().requests[0].paused == "engine"
        # A session's own pause and resume can't lift the operator's.
        engine.pause_queue("b")
        engine.resume_queue("b")
        late = engine.submit(params(seed=3, steps=2), session_id="c")
        assert next(late.events(timeout=30)) == Queued(position=2, paused="engine")
        assert len(pipeline.forward_log) == 5
        engine.resume_engine()
        assert isinstance(waiting.result(timeout=30), Completed) and isinstance(late.result(timeout=30), Completed)
        assert forwards_of(pipeline, waiting) == [5, 6, 7] and forwards_of(pipeline, late) == [8, 9]
        assert not engine.snapshot().pauses.engine
    finally:
        engine.close()


def test_an_engine_paused_before_it_starts_runs_nothing_until_resumed():
    pipeline = ToyPipeline()
    engine = Engine(pipeline)
    engine.pause_engine()
    handle = engine.submit(params(steps=3), session_id="a")
    engine.start()
    try:
        assert next(handle.events(timeout=30)) == Queued(position=1, paused="engine")
        assert pipeline.forward_log == [] and pipeline.encoded == []
        engine.resume_engine()
        assert isinstance(handle.result(timeout=30), Completed) and len(pipeline.forward_log) == 3
    finally:
        engine.close()


def test_a_session_reorders_its_own_waiting_requests_and_no_one_elses():
    pipeline = ToyPipeline()
    engine = Engine(pipeline, max_batch_requests=1)
    mine = [engine.submit(params(seed=i, steps=1, prompt=f"a{i}"), session_id="a") for i in range(4)]
    theirs = [engine.submit(params(seed=10 + i, steps=1, prompt=f"b{i}"), session_id="b") for i in range(2)]
    assert engine.move_request(mine[3].request_id, "a") is True  # to the front: a3 a0 a1 a2
    assert engine.move_request(mine[2].request_id, "a", before=mine[1].request_id) is True  # a3 a0 a2 a1
    with pytest.raises(PermissionError, match="belongs to another session"):
        engine.move_request(theirs[1].request_id, "a")
    with pytest.raises(PermissionError, match="belongs to another session"):
        engine.move_request(mine[0].request_id, "a", before=theirs[0].request_id)
    assert engine.move_request("no-such-request", "a") is False
    engine.start()
    try:
        for handle in mine + theirs:
            assert isinstance(handle.result(timeout=30), Completed)
    finally:
        engine.close()
    names = {h.request_id: h.params.prompt for h in mine + theirs}
    # Sessions still take turns; b's own order is untouched.
    assert [names[r] for r in pipeline.encoded] == ["a3", "b0", "a0", "b1", "a2", "a1"]


def test_a_move_is_shown_in_positions_while_the_queue_is_paused():
    engine = Engine(ToyPipeline(), max_batch_requests=1)
    engine.pause_queue("a")
    first, second = (engine.submit(params(seed=i, steps=2), session_id="a") for i in range(2))
    engine.start()
    try:
        engine.move_request(second.request_id, "a", before=first.request_id)
        events = second.events(timeout=30)
        assert [next(events) for _ in range(2)] == [Queued(2, "session"), Queued(1, "session")]
        assert queued(first) == [(1, "session"), (2, "session")]
    finally:
        engine.close()


@pytest.mark.parametrize("include_running", [False, True])
def test_clearing_a_queue_aborts_its_waiting_requests_and_optionally_its_running_one(include_running):
    pipeline = ToyPipeline()
    engine = Engine(pipeline, max_batch_requests=1)
    counted = []
    pipeline.on_forward = lambda index, batch: index == 1 and counted.append(
        engine.clear_queue("a", include_running=include_running))
    a = [engine.submit(params(seed=i, steps=4, prompt=f"a{i}"), session_id="a") for i in range(3)]
    b = engine.submit(params(seed=9, steps=3, prompt="b"), session_id="b")
    engine.start()
    try:
        finals = [handle.result(timeout=30) for handle in a]
        assert isinstance(b.result(timeout=30), Completed)
        assert engine.states_in_memory == 0 and engine.requests_in_flight == 0
    finally:
        engine.close()
    assert counted == [3 if include_running else 2]
    for final in finals[1:]:
        assert isinstance(final, Aborted) and final.reason == CLEAR_REASON
    assert [r for r in pipeline.encoded] == [a[0].request_id, b.request_id]
    if include_running:
        assert isinstance(finals[0], Aborted) and forwards_of(pipeline, a[0]) == [0, 1]
        assert a[0].request_id not in pipeline.decoded and len(pipeline.forward_log) == 5
    else:
        assert isinstance(finals[0], Completed) and forwards_of(pipeline, a[0]) == [0, 1, 2, 3]
        assert len(pipeline.forward_log) == 7


def test_a_paused_request_does_not_join_the_forward_of_another_sessions_request_of_its_kind():
    pipeline = ToyPipeline()
    engine = Engine(pipeline, max_batch_requests=4)
    engine.pause_queue("a")
    held = engine.submit(params(seed=1, steps=3), session_id="a")
    other = engine.submit(params(seed=2, steps=3), session_id="b")  # same batch key, a free slot
    engine.start()
    try:
        assert isinstance(other.result(timeout=30), Completed)
        assert pipeline.forward_log == [(other.request_id,)] * 3 and pipeline.encoded == [other.request_id]
        engine.resume_queue("a")
        assert isinstance(held.result(timeout=30), Completed)
    finally:
        engine.close()


class _AppliedAtOnce:
    """The engine's command queue, where a clear is applied before `put` returns: the engine
    thread winning the race against the clearing thread (seen under load on a replica)."""

    def __init__(self, engine) -> None:
        self.engine, self.inner = engine, engine._commands

    def put(self, command) -> None:
        self.inner.put(command)
        if isinstance(command, AbortSessionRequests):
            deadline = time.monotonic() + 30
            while self.engine.requests_in_flight and time.monotonic() < deadline:
                time.sleep(0.01)

    def get(self, *args, **kwargs):
        return self.inner.get(*args, **kwargs)

    def get_nowait(self):
        return self.inner.get_nowait()


def test_a_clear_counts_the_requests_the_engine_thread_aborts_before_the_call_returns():
    engine = Engine(ToyPipeline(), max_batch_requests=1)
    engine.pause_queue("a")
    held = [engine.submit(params(seed=i, steps=2), session_id="a") for i in range(3)]
    engine._commands = _AppliedAtOnce(engine)
    engine.start()
    try:
        assert [next(handle.events(timeout=30)).paused for handle in held] == ["session"] * 3
        assert engine.clear_queue("a") == 3 and engine.requests_in_flight == 0
        assert [handle.result(timeout=30).reason for handle in held] == [CLEAR_REASON] * 3
    finally:
        engine.close()

"""A caller's pause ends by itself: at `until`, at most the server's `pause_expiry_s` after it was made;
the engine thread wakes then, with no other command, and the queue runs. Watchers hear every change a
caller makes (how the studio keeps pauses across restarts), never an expiry."""

import time

import pytest

from engine import Completed, Engine, PauseState, Pauses, Queued, ServingLimits, Started, pause_end
from pipelines.toy import ToyPipeline
from tests.engine_helpers import params


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_pause_is_gone_from_the_state_once_its_end_has_passed():
    clock = Clock(1000.0)
    pauses = Pauses(clock=clock)
    assert pauses.set_session("a", True, until=1010.0) and pauses.set_session("b", True, until=None)
    assert pauses.set_session("c", True, until=1005.0)
    assert pauses.state.ends == (("a", 1010.0), ("c", 1005.0)) and pauses.seconds_to_next_end() == 5.0
    assert (pauses.state.ends_at("a"), pauses.state.ends_at("b"), pauses.state.next_end) == (1010.0, None, 1005.0)
    clock.now = 1005.0
    assert pauses.state == PauseState(sessions=frozenset({"a", "b"}), ends=(("a", 1010.0),))
    assert (pauses.reason("c"), pauses.reason("a"), pauses.seconds_to_next_end()) == ("", "session", 5.0)
    clock.now = 2000.0
    assert pauses.state.sessions == frozenset({"b"}) and pauses.seconds_to_next_end() is None
    # Pausing again with another end is a change; with the same one it is not.
    assert pauses.set_session("b", True, until=2100.0) is True
    assert pauses.set_session("b", True, until=2100.0) is False


def test_the_end_of_a_pause_is_the_one_asked_for_at_most_the_servers_limit():
    assert pause_end(None, 3600.0, now=100.0) == 3700.0
    assert pause_end(160.0, 3600.0, now=100.0) == 160.0
    assert pause_end(10_000.0, 3600.0, now=100.0) == 3700.0  # capped
    assert pause_end(None, None, now=100.0) is None and pause_end(float("inf"), None, now=1.0) is None
    with pytest.raises(ValueError, match=r"until='soon' must be a time in unix seconds"):
        pause_end("soon", 3600.0)
    with pytest.raises(ValueError, match=r"pause_expiry_s must be a positive number of seconds or None.*got 0"):
        ServingLimits(pause_expiry_s=0)
    assert ServingLimits().pause_expiry_s == 3600.0


def test_the_engine_pauses_a_queue_for_the_servers_expiry_unless_told_a_sooner_end():
    engine = Engine(ToyPipeline(), limits=ServingLimits(pause_expiry_s=60))
    before = time.time()
    engine.pause_queue("a")
    assert before + 60 <= engine.pause_state.ends_at("a") <= time.time() + 60
    engine.pause_queue("b", until=before + 5)
    assert engine.snapshot().pauses.ends_at("b") is None  # published by the engine thread, not started
    assert engine.pause_state.ends_at("b") == before + 5
    with pytest.raises(ValueError, match="until=True must be a time"):
        engine.pause_queue("c", until=True)
    endless = Engine(ToyPipeline(), limits=ServingLimits(pause_expiry_s=None))
    endless.pause_queue("a")
    assert endless.pause_state.sessions == frozenset({"a"}) and endless.pause_state.ends == ()


def test_an_idle_engine_wakes_when_a_pause_ends_and_runs_the_queue():
    pipeline = ToyPipeline()
    engine = Engine(pipeline).start()
    try:
        ends = time.time() + 0.6
        engine.pause_queue("a", until=ends)
        handle = engine.submit(params(steps=2), session_id="a")
        events = handle.events(timeout=10)
        assert next(events) == Queued(position=1, paused="session")
        assert pipeline.forward_log == [] and engine.pause_reason("a") == "session"
        # Nothing else reaches the engine: it wakes by itself at the pause's end.
        assert next(events) == Queued(position=1, paused="")
        started = next(events)
        assert isinstance(started, Started) and time.time() >= ends
        assert isinstance(handle.result(timeout=10), Completed) and time.time() < ends + 5
        assert engine.pause_state.sessions == frozenset() and engine.snapshot().pauses.sessions == frozenset()
    finally:
        engine.close()


def test_watchers_hear_each_change_a_caller_makes_with_the_newest_state():
    engine = Engine(ToyPipeline(), limits=ServingLimits(pause_expiry_s=None))
    heard: list[PauseState] = []
    engine.watch_pauses(heard.append)
    engine.pause_queue("a")
    engine.pause_queue("a")  # no change: not told again
    engine.pause_engine()
    engine.pause_queue("b", until=time.time() + 0.05)
    engine.resume_queue("a")
    engine.resume_engine()
    time.sleep(0.1)
    assert engine.pause_state.sessions == frozenset()  # b's pause ended by itself: no one is told
    assert [(state.engine, sorted(state.sessions)) for state in heard] == [
        (False, ["a"]), (True, ["a"]), (True, ["a", "b"]), (True, ["b"]), (False, ["b"])]


def test_a_watcher_that_fails_does_not_undo_the_pause():
    engine = Engine(ToyPipeline())

    def broken(state):
        raise OSError("disk full")

    engine.watch_pauses(broken)
    engine.pause_queue("a")
    assert engine.pause_reason("a") == "session"

"""A crash of the engine thread is terminal and loud; a close never strands a request."""

import threading

import pytest

from engine import Aborted, Engine, EngineClosedError, Failed
from pipelines.toy import ToyPipeline
from tests.engine_helpers import StepGate, params


def test_a_crashed_engine_fails_every_request_and_refuses_new_ones():
    pipeline = ToyPipeline()
    late = {}

    def submit_during_the_crashing_forward(index, batch):
        if index == 0:  # this forward raises right after: the late request is still a queued command
            late["handle"] = engine.submit(params(seed=9, prompt="late"), session_id="late")

    pipeline.on_forward = submit_during_the_crashing_forward
    engine = Engine(pipeline, max_batch_requests=4)
    running = engine.submit(params(seed=1, steps=6, prompt="running"), session_id="a")
    other = engine.submit(params(seed=2, size=32, steps=6, prompt="waiting, another size"), session_id="b")
    crasher = engine.submit(params(seed=3, steps=6, prompt="[crash] now"), session_id="c")  # shares forward 0
    engine.start()
    try:
        finals = [h.result(timeout=30) for h in (running, other, crasher)]  # the crash has happened by then
        finals.append(late["handle"].result(timeout=30))
        assert engine.wait_stopped(timeout=30)
        assert not engine.is_alive
        assert engine.failure == "the engine stopped after an internal error (EngineCrash: injected crash of the engine thread)"
        with pytest.raises(EngineClosedError, match=r"internal error \(EngineCrash.*no new requests are accepted"):
            engine.submit(params(seed=4), session_id="d")
        assert (engine.requests_in_flight, engine.states_in_memory) == (0, 0)
        assert engine.snapshot().requests == ()
        assert engine.snapshot().stats.finished == {"error": 4}
        assert engine.metrics.errors.labels("engine")._value.get() == 4
    finally:
        engine.close()
    assert pipeline.forward_log == []  # the one forward crashed before it was logged
    assert all(isinstance(f, Failed) and f.stage == "engine" and f.message == engine.failure for f in finals)
    # Each request got exactly one final event.
    for handle in (running, other, crasher, late["handle"]):
        assert sum(isinstance(e, (Failed, Aborted)) for e in handle.events(timeout=5)) == 1


def test_close_of_a_crashed_engine_returns_at_once():
    engine = Engine(ToyPipeline()).start()
    assert isinstance(engine.submit(params(prompt="[crash]")).result(timeout=30), Failed)
    engine.close(timeout=5)
    assert engine.wait_stopped(0) and engine.failure is not None


class _WatchedLock:
    """The engine's admission lock, telling when a thread had to wait for it (another thread held it)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.waiters: list[threading.Thread] = []
        self.changed = threading.Condition()

    def __enter__(self):
        if not self.inner.acquire(blocking=False):
            with self.changed:
                self.waiters.append(threading.current_thread())
                self.changed.notify_all()
            self.inner.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.inner.release()


class _CloseDuringSubmit:
    """Wraps the engine's command queue: when a submission is about to be queued, another
    thread closes the engine. The submission goes on once that close is waiting for the
    engine's lock (the submission is then queued first, as it must be), or, if the close got
    through and queued its stop, once the engine thread has acted on the stop and ended (the
    submission would then be stranded). No timing: the race is run on every machine."""

    def __init__(self, engine: Engine, lock: _WatchedLock, gate: StepGate) -> None:
        self.engine = engine
        self.inner = engine._commands
        self.lock = lock
        self.gate = gate
        self.stop_queued = False
        self.closer: threading.Thread | None = None

    def put(self, command) -> None:
        if type(command).__name__ == "_Stop":
            with self.lock.changed:
                self.inner.put(command)
                self.stop_queued = True
                self.lock.changed.notify_all()
            return
        if type(command).__name__ == "_Submit" and self.closer is None:
            self.closer = threading.Thread(target=self.engine.close)
            self.closer.start()
            with self.lock.changed:
                assert self.lock.changed.wait_for(lambda: self.stop_queued or self.closer in self.lock.waiters, 30), \
                    "the close neither queued its stop nor waited for the engine's lock"
            if self.stop_queued:  # the close went first: let the engine stop before this lands
                self.gate.release()
                assert self.engine.wait_stopped(30), "the engine did not stop"
        self.inner.put(command)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_submit_racing_close_is_answered_not_stranded():
    engine = Engine(ToyPipeline(), max_batch_requests=1)
    gate = StepGate(0)
    engine.pipeline.on_forward = gate
    first = engine.submit(params(seed=1, steps=3), session_id="a")
    engine.start()
    gate.wait()  # the engine is busy inside its first forward
    ledger = engine._ledger  # admission and closing both hold its lock
    lock = ledger._lock = _WatchedLock(ledger._lock)
    engine._commands = commands = _CloseDuringSubmit(engine, lock, gate)
    racing = engine.submit(params(seed=2), session_id="b")
    # The first request is held until the close has queued its stop, so it ends by the stop too
    # (released at once, it could finish its 3 steps first on a busy machine).
    with lock.changed:
        assert lock.changed.wait_for(lambda: commands.stop_queued, 30), "the close never queued its stop"
    gate.release()
    final = racing.result(timeout=30)
    commands.closer.join(30)
    assert isinstance(final, Aborted) and final.cause == "shutdown"
    assert isinstance(first.result(timeout=30), Aborted)
    assert engine.wait_stopped(30) and engine.requests_in_flight == 0


def test_closing_an_engine_that_never_started_ends_its_queued_requests():
    engine = Engine(ToyPipeline())
    handles = [engine.submit(params(seed=i), session_id="s") for i in range(2)]
    engine.close()
    assert [type(h.last_event) for h in handles] == [Aborted, Aborted]
    assert engine.wait_stopped(0) and engine.requests_in_flight == 0
    with pytest.raises(EngineClosedError):
        engine.start()

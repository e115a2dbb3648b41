"""Queue calls with replicas reach every replica even when Serve's broadcast skips one.

Serve's router sends a broadcast to the replicas it holds as available and silently skips one it
finds busy for a moment (ActorUnavailableError): a clear then counted (and cleared) one replica's
requests only. The facade (serve/queue_control.py) asks again, and only, the replicas its board
knows that did not answer, and a replica asked again for a call it already did (its answer lost
on the way) repeats its answer. Here a stand-in for the deployment handle skips a chosen replica once;
the replicas are the real `EngineReplica` queue methods over real local engines. Needs the `serve`
extra.
"""

from __future__ import annotations

from collections import OrderedDict

import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install -e '.[serve]')")

from engine import CLEAR_REASON, Aborted, Engine, GenerationParams  # noqa: E402
from pipelines.toy import ToyPipeline  # noqa: E402
from serve.replica import EngineReplica  # noqa: E402
from serve.replicated_engine import ReplicatedEngine  # noqa: E402
from serve.wire import ReplicaDescription  # noqa: E402


class _Answers:
    def __init__(self, calls) -> None:
        self.calls = calls

    async def results_async(self, timeout_s: float, return_exceptions: bool):
        return [await call for call in self.calls]


class _SkippingHandle:
    """`broadcast(method, ...)` to every replica but those in `skip` (each skipped once), as
    Serve's router does with a replica it finds busy; `sent` logs (method, only, replicas reached)."""

    def __init__(self, replicas: list[EngineReplica]) -> None:
        self.replicas = replicas
        self.skip: set[str] = set()
        self.lose: set[str] = set()  # these run the call, but their answer is lost on the way (once)
        self.sent: list[tuple[str, frozenset | None, list[str]]] = []

    @property
    def describe(self):
        return self

    async def remote(self) -> ReplicaDescription:  # describe.remote(): as every replica answers it
        engine = self.replicas[0].engine
        return ReplicaDescription(
            infos=dict(engine.infos), limits={"toy": engine.limits_for("toy")}, mode=engine.mode,
            max_batch_requests=engine.max_batch_requests, unit_cost=engine.unit_cost, with_unknown_words=frozenset())

    def broadcast(self, method: str, *args, **kwargs) -> _Answers:
        if method == "report":
            return _Answers([replica.report() for replica in self.replicas])
        reached = [replica for replica in self.replicas if replica.replica_id not in self.skip]
        lose, self.skip, self.lose = self.lose, set(), set()
        self.sent.append((method, kwargs.get("only"), [replica.replica_id for replica in reached]))
        return _Answers([self._lost(getattr(replica, method)(*args, **kwargs)) if replica.replica_id in lose
                         else getattr(replica, method)(*args, **kwargs) for replica in reached])

    @staticmethod
    async def _lost(call):
        await call  # the replica did it
        return RuntimeError("the answer was lost on the way")


def _replica(replica_id: str) -> EngineReplica:
    replica = EngineReplica.__new__(EngineReplica)  # without Serve's replica context: only the queue calls
    replica.replica_id, replica.label, replica.device = replica_id, f"replica {replica_id}", "cpu"
    replica.answered = OrderedDict()
    replica.engine = Engine(ToyPipeline(step_delay_s=0.01)).start()
    return replica


@pytest.fixture
def replicas():
    replicas = [_replica("r0"), _replica("r1")]
    handle = _SkippingHandle(replicas)
    facade = ReplicatedEngine(handle, refresh_s=3600, call_timeout_s=5.0).start()  # one report round, at start
    try:
        yield facade, handle, replicas
    finally:
        facade.close()
        for replica in replicas:
            replica.engine.close()


def test_a_clear_that_serve_skips_a_replica_for_is_sent_again_to_that_replica_alone(replicas):
    facade, handle, (r0, r1) = replicas
    handle.skip = {"r1"}
    facade.pause_queue("q")
    assert handle.sent == [("pause_queue", None, ["r0"]), ("pause_queue", frozenset({"r1"}), ["r0", "r1"])]
    assert r0.engine.pause_reason("q") == r1.engine.pause_reason("q") == "session"
    assert r0.engine.pause_state.ends_at("q") == r1.engine.pause_state.ends_at("q") == facade.pause_state.ends_at("q")

    held = [r0.engine.submit(GenerationParams(prompt="held", num_inference_steps=50), session_id="q"),
            r1.engine.submit(GenerationParams(prompt="held", num_inference_steps=50), session_id="q"),
            r1.engine.submit(GenerationParams(prompt="held", num_inference_steps=50), session_id="q")]
    handle.skip, handle.sent = {"r1"}, []
    assert facade.clear_queue("q") == 3  # r0's one, then r1's two when asked again
    assert handle.sent == [("clear_queue", None, ["r0"]), ("clear_queue", frozenset({"r1"}), ["r0", "r1"])]
    assert [request.result(timeout=30) for request in held] == [Aborted(CLEAR_REASON, cause="cancelled")] * 3

    handle.sent = []
    facade.resume_queue("q")  # nothing skipped: one broadcast
    assert handle.sent == [("resume_queue", None, ["r0", "r1"])]
    assert r0.engine.pause_reason("q") == r1.engine.pause_reason("q") == ""


def test_a_replica_gone_from_the_board_is_not_waited_for(replicas):
    facade, handle, (r0, r1) = replicas
    facade._board.forget("r1")  # known dead: the call ends with the replicas that are left
    handle.skip = {"r1"}
    facade.pause_engine()
    assert handle.sent == [("pause_engine", None, ["r0"])]
    assert r0.engine.pause_state.engine and not r1.engine.pause_state.engine
    facade.resume_engine()
    assert not r0.engine.pause_state.engine


def test_a_replica_whose_answer_was_lost_repeats_it_when_asked_again_instead_of_clearing_twice(replicas):
    facade, handle, (r0, r1) = replicas
    facade.pause_queue("q")
    held = [r0.engine.submit(GenerationParams(prompt="held", num_inference_steps=50), session_id="q"),
            r1.engine.submit(GenerationParams(prompt="held", num_inference_steps=50), session_id="q"),
            r1.engine.submit(GenerationParams(prompt="held", num_inference_steps=50), session_id="q")]
    handle.lose, handle.sent = {"r1"}, []
    # r1 cleared its two at the first broadcast; asked again, it repeats "2" (a second clear would say 0).
    assert facade.clear_queue("q") == 3
    assert handle.sent == [("clear_queue", None, ["r0", "r1"]), ("clear_queue", frozenset({"r1"}), ["r0", "r1"])]
    assert [request.result(timeout=30) for request in held] == [Aborted(CLEAR_REASON, cause="cancelled")] * 3
    # A new call is a new call: the next clear counts what is there now.
    assert facade.clear_queue("q") == 0
    facade.resume_queue("q")

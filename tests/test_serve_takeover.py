"""A replica that dies holding a request: the facade runs it again on a live replica, from the
start, or fails it clearly when no replica is left to take it.

The facade's relay (`ReplicatedEngine._stream_events`) against a stand-in for Serve's deployment
handle: replica 0's streams die after a first step, as a killed replica's do (ActorDiedError);
replica 1's streams are a real local engine's events. No cluster, so every path is exact; the
real SIGKILL on a local cluster is in tests/test_serve_replicas.py. Needs the `serve` extra.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install -e '.[serve]')")

from ray.exceptions import ActorDiedError  # noqa: E402

from engine import (  # noqa: E402
    Completed,
    Engine,
    EngineSnapshot,
    EngineStats,
    Failed,
    GenerationParams,
    Progress,
    Queued,
    RequestHandle,
    Started,
)
from pipelines.toy import ToyPipeline  # noqa: E402
from serve.flight import Flight  # noqa: E402
from serve.replicated_engine import MAX_RERUNS, ReplicatedEngine  # noqa: E402
from serve.wire import Admitted, ReplicaReport, event_to_wire  # noqa: E402

STEPS = 3


class _DyingStream:
    """A killed replica's stream: admitted, queued, started, one step, then the actor is gone."""

    def __init__(self, replica: int, params: GenerationParams) -> None:
        self.items = [Admitted(f"engine-{replica}", f"id{replica}", f"replica {replica}"), Queued(1), Started(1),
                      event_to_wire(Progress(1, params.num_inference_steps, 1))]
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.items:
            return self.items.pop(0)
        raise ActorDiedError()


class _LiveStream(_DyingStream):
    """A live replica's stream: a real engine's events for the request."""

    def __init__(self, replica: int, params: GenerationParams, engine: Engine) -> None:
        super().__init__(replica, params)
        self.items = [Admitted(f"engine-{replica}", f"id{replica}", f"replica {replica}")]
        self.events = iter(engine.submit(params, session_id="relayed").events(timeout=60))

    async def __anext__(self):
        if self.items:
            return self.items.pop(0)
        event = await asyncio.to_thread(next, self.events, None)
        if event is None:
            raise StopAsyncIteration
        return event_to_wire(event)


class _Handle:
    """Serve's DeploymentHandle as the relay calls it: `options(stream=True).generate.remote(...)`.
    Replicas in `dying` die holding whatever they are given; the router skips avoided ones."""

    def __init__(self, replicas: int, dying: set[int], engine: Engine) -> None:
        self.replicas, self.dying, self.engine = replicas, dying, engine
        self.streams: list[tuple[int, tuple[str, ...]]] = []  # (replica, the avoid list it was routed with)

    def options(self, stream: bool):
        return self

    @property
    def generate(self):
        return self

    def remote(self, params, session_id, batch_key, avoid):
        replica = next(i for i in range(self.replicas) if f"id{i}" not in avoid)
        self.streams.append((replica, avoid))
        if replica in self.dying:
            return _DyingStream(replica, params)
        return _LiveStream(replica, params, self.engine)


def _report(replica: int) -> ReplicaReport:
    stats = EngineStats(mode="step", max_batch_requests=4, current_batch_size=0, steps_per_s=None, forwards=0)
    return ReplicaReport(replica_id=f"id{replica}", replica=f"replica {replica}", pid=1, device="cpu", clock=0.0,
                         snapshot=EngineSnapshot(taken_at=0.0, requests=(), stats=stats), metrics=b"",
                         alive=True, failure=None)


def _relay(replicas: int, dying: set[int]):
    """Relay one request through a facade whose board has heard from every replica; returns the
    final event, the events its caller saw, the handle's routing log and the facade."""
    local = Engine(ToyPipeline()).start()
    try:
        facade = ReplicatedEngine(_Handle(replicas, dying, local))
        facade._board.update([_report(i) for i in range(replicas)], received_at=0.0)
        prepared = local.prepare(GenerationParams(prompt="a red circle", num_inference_steps=STEPS, seed=7))
        handle = RequestHandle(request_id="ours", session_id="caller", params=prepared.params, _cancel=facade.cancel)
        final = asyncio.run(facade._stream_events(Flight(handle, prepared)))
        expected = local.submit(prepared.params, session_id="alone").result(timeout=60)
    finally:
        local.close()
    return final, handle.history, facade, expected


def _counter(facade: ReplicatedEngine, name: str) -> float:
    line = next(line for line in facade.metrics.exposition().decode().splitlines() if line.startswith(name + " "))
    return float(line.rsplit(" ", 1)[1])


def test_a_request_whose_replica_dies_runs_again_from_the_start_on_a_live_one():
    final, seen, facade, expected = _relay(replicas=2, dying={0})
    assert isinstance(final, Completed) and final.images[0].tobytes() == expected.images[0].tobytes()
    assert facade._handle.streams == [(0, ()), (1, ("id0",))]  # the dead replica avoided
    # The caller saw the first run's step, then the request queued again and every step from 1.
    assert [type(event).__name__ for event in seen] == (
        ["Queued", "Started", "Progress", "Queued", "Started"] + ["Progress"] * STEPS)
    assert [event.step for event in seen if isinstance(event, Progress)] == [1, *range(1, STEPS + 1)]
    assert facade.replica_of("ours") == "replica 1" and facade._board.live_count == 1
    assert (_counter(facade, "stepstudio_replica_rerun_requests_total"),
            _counter(facade, "stepstudio_replica_lost_requests_total")) == (1.0, 0.0)


def test_with_no_replica_left_the_request_fails_naming_the_dead_one():
    final, seen, facade, _ = _relay(replicas=1, dying={0})
    assert final == Failed("replica 0 stopped while serving this request (ActorDiedError) and no other replica is "
                           "up to run it again: submit it again shortly.", stage="replica")
    assert len(facade._handle.streams) == 1 and facade._board.live_count == 0
    assert (_counter(facade, "stepstudio_replica_rerun_requests_total"),
            _counter(facade, "stepstudio_replica_lost_requests_total")) == (0.0, 1.0)


def test_a_request_that_keeps_losing_its_replica_fails_after_a_bounded_number_of_runs():
    replicas = MAX_RERUNS + 2
    final, _, facade, _ = _relay(replicas=replicas, dying=set(range(replicas)))
    assert final == Failed(f"replica {MAX_RERUNS} stopped while serving this request (ActorDiedError) and it has "
                           f"lost {MAX_RERUNS + 1} replicas: submit it again shortly.", stage="replica")
    assert [replica for replica, _ in facade._handle.streams] == list(range(MAX_RERUNS + 1))
    assert (_counter(facade, "stepstudio_replica_rerun_requests_total"),
            _counter(facade, "stepstudio_replica_lost_requests_total")) == (float(MAX_RERUNS), 1.0)

"""The studio's engine when the engines are Serve replicas: an `engine.EngineClient`, as `Engine` is.

    engine = ReplicatedEngine(serve.get_deployment_handle("EngineReplica", "stepstudio")).start()
    handle = engine.submit(GenerationParams(prompt="a red circle"), session_id="tab-1")
    async for event in handle.stream(): ...        # the engine's own events, relayed
    engine.cancel(handle.request_id, "tab-1")       # the replica aborts at its next step boundary
    engine.snapshot(), engine.metrics.exposition()  # every replica (serve/board.py)
    engine.close()                                  # the replicas keep running: Serve owns them

Every member of the interface behaves as on one engine, with these differences:

- `submit`, `prepare` and `prepare_params` cost one round trip to a replica (its engine's
  `prepare` checks the parameters and computes the batch key the router needs, as its repr);
  a ValueError or AdmissionError is raised in the caller as before. Admission (queue,
  per-session count and cost) is the engine's own `AdmissionLedger`, kept here across all
  replicas (the queue holds `max_queue` per live replica), so a session's limit means the same.
- `RequestHandle` is the engine's own class: a relay task (one per request, on this facade's
  own event loop thread) plays the engine thread, emitting each event the replica streams.
- `cancel` (and `handle.cancel()`) cancels the request's downstream stream: the replica's
  generator gets CancelledError and aborts the request at the engine's next step boundary;
  the handle ends with `Aborted("cancelled by the user")` at once.
- A replica that dies hands its requests (running or queued) to the replicas that are up: each
  runs again from the start with its seed (the caller sees it queued again, then its steps from
  1) and ends once, as before; with no replica up it fails with `Failed(..., stage="replica")`
  naming the dead one. Serve starts another, and new requests go to the replicas that are up.
  Nothing waits forever: every call to a replica has a deadline, and a dead replica's streams
  raise at once.
- `snapshot()` and `metrics` are what the replicas reported at most `refresh_s` ago.
- Queue control (pause, resume, move, clear) reaches every replica: serve/queue_control.py says how.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import replace

from ray.exceptions import RayActorError
from ray.serve.exceptions import DeploymentUnavailableError, RequestCancelledError

from engine import (
    FINAL_EVENTS,
    SHUTDOWN_REASON,
    Aborted,
    AdmissionLedger,
    Event,
    Failed,
    GenerationParams,
    ModelSet,
    Pauses,
    PreparedRequest,
    QueueFullError,
    RequestHandle,
    ServingLimits,
    deliver_pending,
)
from pipelines.interface import PipelineInfo
from serve.board import ReplicaBoard, ReplicatedSnapshot
from serve.flight import Flight
from serve.queue_control import ReplicatedQueueControl
from serve.relay_loop import RelayLoop
from serve.remote_pipeline import RemotePipeline
from serve.replicated_metrics import ReplicatedMetrics
from serve.settings import REFRESH_S
from serve.wire import Admitted, Rejected, ReplicaDescription, ReplicaReport, WireProgress, event_from_wire

log = logging.getLogger(__name__)

CANCELLED_REASON = "cancelled by the user"
SERVED_BY_KEPT = 4096  # requests whose replica `replica_of` still knows after they ended
MAX_RERUNS = 3  # times one request runs again after its replica died, before it fails


class ReplicasUnavailableError(QueueFullError):
    """No engine replica answered in time (all busy starting, or being replaced): try again."""


class ReplicatedEngine(ReplicatedQueueControl, RelayLoop):
    def __init__(self, handle, *, refresh_s: float = REFRESH_S, call_timeout_s: float = 10.0,
                 start_timeout_s: float = 600.0) -> None:
        self._handle = handle  # DeploymentHandle of the EngineReplica deployment
        self.refresh_s = refresh_s
        self.call_timeout_s = call_timeout_s  # prepare, describe, unknown_words, each report round
        self.start_timeout_s = start_timeout_s  # the first describe waits for a replica to load its model
        # A replica's report may miss a round or two when it is busy; a dead one is dropped at once.
        self._board = ReplicaBoard(stale_after_s=max(5.0, 4 * refresh_s))
        self.metrics = ReplicatedMetrics(self._board)
        RelayLoop.__init__(self)
        self._description: ReplicaDescription | None = None
        self._refresher: asyncio.Task | None = None
        self._snapshot: ReplicatedSnapshot = self._board.snapshot({})
        self._pauses = Pauses()  # every replica's paused queues, as callers set them (serve/queue_control.py)
        # Every request of ours in flight, and the open door (callers admit, the relay loop releases).
        self._ledger: AdmissionLedger[Flight] = AdmissionLedger(
            self.metrics.requests_rejected, owner="the studio", on_count=self.metrics.requests_in_flight.set)
        # Which replica serves what (written on the relay loop, read by callers and the views).
        self._lock = threading.Lock()
        self._our_ids: dict[str, str] = {}  # replica engine id -> our request id
        self._served_by: OrderedDict[str, str] = OrderedDict()  # our request id -> replica label (recent)
        # Set by start(), from the replicas' description: the models (ModelSet of RemotePipeline) and
        # the default one's, as on an Engine.
        self.models: ModelSet | None = None
        self.pipeline: RemotePipeline | None = None

    # ------------------------------------------------------------------ the EngineClient interface
    def start(self) -> "ReplicatedEngine":
        """Start the relay loop and wait until a replica has described the model."""
        if self._thread.is_alive():
            raise RuntimeError("ReplicatedEngine.start() was already called.")
        self._thread.start()
        self._call(self._start, self.start_timeout_s)
        return self

    @property
    def info(self) -> PipelineInfo:
        """The default model's info."""
        self._described()
        return self.pipeline.info

    @property
    def infos(self) -> dict[str, PipelineInfo]:
        """Every model the replicas serve, by name (the default first)."""
        return dict(self._described().infos)

    @property
    def limits(self) -> ServingLimits:
        """The server's caps for the default model."""
        return self.limits_for(None)

    def limits_for(self, model: str | None) -> ServingLimits:
        """The server's caps as they apply to one model (ValueError for a model not served)."""
        self._described()
        return self._description.limits[self.models.resolve(model)]

    @property
    def mode(self) -> str:
        return self._described().mode

    @property
    def max_batch_requests(self) -> int:
        """Most requests in one forward, on each replica."""
        return self._described().max_batch_requests

    @property
    def unit_cost(self) -> int:
        return self._described().unit_cost

    @property
    def is_alive(self) -> bool:
        """At least one replica's engine runs, and this facade is open."""
        return self._thread.is_alive() and not self._ledger.closed and self._board.live_count > 0

    accepting = property(lambda self: not self._ledger.closed)

    @property
    def failure(self) -> str | None:
        """Why nothing can run now (no replica has reported lately), or None."""
        if self._ledger.closed or self._board.live_count > 0:
            return None
        return f"no engine replica has reported in the last {self._board.stale_after_s:g} s"

    @property
    def replicas(self) -> list[ReplicaReport]:
        """The latest report of every replica up now (label, pid, device, snapshot, ...)."""
        return self._board.reports

    requests_in_flight = property(lambda self: len(self._ledger))

    def replica_of(self, request_id: str) -> str | None:
        """The label of the replica that took a request of ours (the last SERVED_BY_KEPT)."""
        with self._lock:
            return self._served_by.get(request_id)

    def prepare(self, params: GenerationParams) -> PreparedRequest:
        """A replica engine's `prepare` (ValueError): its batch key comes back as its repr."""
        return self._prepared(params)

    def prepare_params(self, params: GenerationParams) -> GenerationParams:
        """Model defaults, a seed, the model's and the server's limits (ValueError), by a replica."""
        return self._prepared(params).params

    def submit(self, params: GenerationParams, session_id: str = "default", *,
               from_waiting_queue: bool = False) -> RequestHandle:
        """Queue a request on the replica the router picks; returns once the studio's admission
        took it. ValueError for bad parameters, AdmissionError when full or closed.
        `from_waiting_queue=True`: as on `Engine.submit`, a refusal for want of room (here also
        "no replica is up") means the caller's request keeps waiting and is not counted."""
        self._ledger.check_open()
        prepared = self._prepared(params, count_unavailable=not from_waiting_queue)
        handle = RequestHandle(request_id=uuid.uuid4().hex, session_id=session_id, params=prepared.params,
                               _cancel=self.cancel)
        flight = Flight(handle, prepared)
        limits = self.limits
        # The queue of every live replica together; a session's count and cost as on one engine.
        limits = replace(limits, max_queue=limits.max_queue * max(1, self._board.live_count))
        with self._ledger.admitting(flight, limits, self.unit_cost, count_no_room=not from_waiting_queue):
            # Scheduled under the ledger's lock: a shutdown (also under it) always comes after.
            self._soon(self._launch, flight)
        return handle

    def cancel(self, request_id: str, session_id: str | None = None, *, admin: bool = False) -> bool:
        """Abort a request at its replica's next step boundary. Non-blocking. Only its own session
        may cancel it (or `admin=True`): PermissionError otherwise. False when unknown or ended."""
        flight = self._ledger.get(request_id)
        if flight is None:
            return False
        if not admin and flight.session_id != session_id:
            raise PermissionError(f"request {request_id[:8]} belongs to another session; it can't be cancelled from here.")
        try:
            self._soon(self._stop_flight, flight, CANCELLED_REASON, "cancelled")
        except RuntimeError:  # the relay loop is closed: the request ended with it
            return False
        return True

    def snapshot(self) -> ReplicatedSnapshot:
        return self._snapshot

    def refresh(self) -> ReplicatedSnapshot:
        """Gather every replica's report now (the views do it every `refresh_s` anyway)."""
        self._call(self._refresh, self.call_timeout_s)
        return self._snapshot

    def shutdown(self, reason: str = SHUTDOWN_REASON) -> None:
        """Stop admission and end every request of ours (Aborted, cause "shutdown"). Non-blocking.
        The replicas keep running; `serve.shutdown()` stops them."""
        def stop() -> None:
            if self._thread.is_alive():
                self._soon(lambda: asyncio.ensure_future(self._stop_all(reason)))
            else:
                self._stopped.set()  # never started

        self._ledger.close(then=stop)

    def close(self, timeout: float = 30.0) -> None:
        self.shutdown()
        if not self._stopped.wait(timeout):
            raise TimeoutError(f"the relay loop did not stop within {timeout} s")

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    # ------------------------------------------------------------------ callers' threads
    def _prepared(self, params: GenerationParams, count_unavailable: bool = True) -> PreparedRequest:
        if self._description is not None and self._board.live_count == 0:
            # Fail fast: the caller may be the studio's event loop, blocked while it waits.
            if count_unavailable:
                self.metrics.requests_rejected.labels("unavailable").inc()
            raise ReplicasUnavailableError("no engine replica is up right now (Serve is starting new ones); "
                                           "try again shortly.")
        try:
            answer = self._call(lambda: self._handle.prepare.remote(params), self.call_timeout_s)
        except (TimeoutError, RayActorError, DeploymentUnavailableError) as error:
            if count_unavailable:
                self.metrics.requests_rejected.labels("unavailable").inc()
            raise ReplicasUnavailableError(
                f"no engine replica answered within {self.call_timeout_s:g} s ({type(error).__name__}); "
                "try again shortly.") from None
        if isinstance(answer, Rejected):  # prepare only checks parameters: always "invalid"
            self.metrics.requests_rejected.labels("invalid").inc()
            raise answer.as_error()
        return answer

    def _release(self, flight: Flight) -> None:
        self._ledger.release([flight])
        if flight.engine_request_id is not None:
            with self._lock:
                self._our_ids.pop(flight.engine_request_id, None)

    def _described(self) -> ReplicaDescription:
        if self._description is None:
            raise RuntimeError("call ReplicatedEngine.start() first: no replica has described the model yet.")
        return self._description

    # ------------------------------------------------------------------ the relay loop
    async def _start(self) -> None:
        description = await self._handle.describe.remote()
        self.models = ModelSet({
            name: RemotePipeline(name, info, self._unknown_words if name in description.with_unknown_words else None)
            for name, info in description.infos.items()})
        self.pipeline = self.models[None]
        self._description = description
        await self._refresh()
        self._refresher = asyncio.ensure_future(self._refresh_forever())

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                await self._refresh()
            except Exception:  # noqa: BLE001 - a bad round must not end the views for good
                log.exception("gathering the replicas' reports failed")

    async def _refresh(self) -> None:
        sent_at = time.perf_counter()
        try:
            answers = await self._handle.broadcast("report").results_async(
                timeout_s=self.call_timeout_s, return_exceptions=True)
        except (TimeoutError, DeploymentUnavailableError):  # no replica now (starting, or being deleted)
            answers = []
        self._board.update([a for a in answers if isinstance(a, ReplicaReport)], received_at=time.perf_counter(),
                           sent_at=sent_at)
        self.metrics.replicas_live.set(self._board.live_count)
        with self._lock:
            our_ids = dict(self._our_ids)
        description = self._description
        snapshot = self._board.snapshot(our_ids, description.mode, description.max_batch_requests)
        self._snapshot = replace(snapshot, pauses=self._pauses.state)
        await self.keep_replicas_paused(self._board.reports)

    def _unknown_words(self, prompt: str, model: str) -> tuple[str, ...]:
        return self._call(lambda: self._handle.unknown_words.remote(prompt, model), self.call_timeout_s)

    def _launch(self, flight: Flight) -> None:
        flight.task = asyncio.ensure_future(self._relay(flight))

    def _stop_flight(self, flight: Flight, reason: str, cause: str) -> None:
        if flight.stop is None:
            flight.stop = (reason, cause)
        if flight.stream is not None:
            flight.stream.cancel()

    async def _relay(self, flight: Flight) -> None:
        """Open the request's stream on a replica and emit its events through the handle."""
        final: Event | None = None
        try:
            final = await self._stream_events(flight)
        except RequestCancelledError:
            reason, cause = flight.stop or (CANCELLED_REASON, "cancelled")
            final = Aborted(reason, cause=cause)
        except asyncio.CancelledError:  # the relay loop itself is stopping
            final = Aborted(SHUTDOWN_REASON, cause="shutdown")
        except Exception as error:  # noqa: BLE001 - whatever broke the stream, the caller gets an answer
            log.exception("the stream of request %s broke", flight.request_id[:8])
            final = Failed(f"the request's stream from {flight.replica or 'its engine replica'} broke "
                           f"({type(error).__name__}: {error})", stage="replica")
        finally:
            self._release(flight)  # the slot is free before the caller sees the end, as on one engine
            flight.handle.emit(final or Failed("the request's stream ended without a result", stage="replica"))
            deliver_pending()

    async def _stream_events(self, flight: Flight) -> Event:
        """Until the final event. A replica that refuses for its own reasons (full, closed, broken)
        is avoided and the next one tried; one that dies holding the request (running or queued)
        is avoided and the request runs again on a live replica, from the start."""
        avoid: list[str] = []
        while True:
            if flight.stop is not None:
                raise RequestCancelledError(flight.request_id)
            try:
                final = await self._stream_once(flight, avoid)
            except RayActorError as error:
                final = self._replica_died(flight, error, avoid)
            if final is not None:
                return final

    async def _stream_once(self, flight: Flight, avoid: list[str]) -> Event | None:
        """One stream from a replica: the final event, or None when the replica refused for its own
        reasons (it is added to `avoid`)."""
        flight.stream = self._handle.options(stream=True).generate.remote(
            flight.prepared.params, session_id=flight.session_id, batch_key=flight.prepared.batch_key,
            avoid=tuple(avoid))
        async for item in flight.stream:
            if isinstance(item, Admitted):
                self._admitted(flight, item)
                continue
            if isinstance(item, Rejected):
                if item.is_replica_trouble and len(avoid) < max(1, len(self._board.reports)):
                    avoid.append(item.replica_id)
                    return None
                return Failed(item.message, stage="admission")
            offset = self._board.clock_offset(flight.replica_id or "")
            if isinstance(item, WireProgress):
                self.metrics.relay_seconds.observe(max(0.0, time.perf_counter() - (item.sent_at + offset)))
            event = event_from_wire(item, offset)
            if isinstance(event, FINAL_EVENTS):
                return self._as_replica_failure(flight, event)
            flight.handle.emit(event)
            deliver_pending()
        return Failed(f"{flight.replica or 'the engine replica'} ended the stream without a result", stage="replica")

    def _admitted(self, flight: Flight, item: Admitted) -> None:
        flight.replica_id, flight.replica, flight.engine_request_id = item.replica_id, item.replica, item.request_id
        with self._lock:
            self._our_ids[item.request_id] = flight.request_id
            self._served_by[flight.request_id] = item.replica
            while len(self._served_by) > SERVED_BY_KEPT:
                self._served_by.popitem(last=False)

    def _as_replica_failure(self, flight: Flight, event: Event) -> Event:
        """A replica's engine crash fails its requests, not the service: say so."""
        if isinstance(event, Failed) and event.stage == "engine":
            return Failed(f"{event.message} ({flight.replica}; the other replicas keep serving)", stage="replica")
        return event

    def _replica_died(self, flight: Flight, error: RayActorError, avoid: list[str]) -> Failed | None:
        """The replica holding `flight` died: None to run it again from the start on a live replica
        (its parameters carry their seed, so it gives the same picture; the caller sees it queued
        again, then its steps from 1), or a Failed when no replica is left to take it."""
        who = flight.replica or "its engine replica"
        if flight.replica_id is not None:
            self._board.forget(flight.replica_id)
            avoid.append(flight.replica_id)
        self._unplace(flight)
        if flight.stream is not None:
            flight.stream.cancel()  # an actor only unreachable for a moment must not run it twice
        flight.reruns += 1
        if self._board.live_count == 0 or flight.reruns > MAX_RERUNS:
            self.metrics.requests_lost.inc()
            why = ("no other replica is up to run it again" if self._board.live_count == 0
                   else f"it has lost {flight.reruns} replicas")
            return Failed(f"{who} stopped while serving this request ({type(error).__name__}) and {why}: "
                          "submit it again shortly.", stage="replica")
        self.metrics.requests_rerun.inc()
        log.warning("%s stopped while serving request %s (%s); running it again on another replica",
                    who, flight.request_id[:8], type(error).__name__)
        return None

    def _unplace(self, flight: Flight) -> None:
        """`flight` is no longer on the replica it was admitted by."""
        if flight.engine_request_id is not None:
            with self._lock:
                self._our_ids.pop(flight.engine_request_id, None)
                self._served_by.pop(flight.request_id, None)
        flight.replica_id = flight.replica = flight.engine_request_id = None

    async def _stop_all(self, reason: str) -> None:
        """Shutdown: abort every request of ours, then end the relay loop."""
        flights = self._ledger.entries()
        for flight in flights:
            self._stop_flight(flight, reason, "shutdown")
        tasks = [f.task for f in flights if f.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=self.call_timeout_s)
        if self._refresher is not None:
            self._refresher.cancel()
            await asyncio.gather(self._refresher, return_exceptions=True)
        self._loop.stop()

"""The embedded engine: one thread that owns the scheduler, the request states and the device.

Other threads talk to it only through a command queue (submit, cancel, stop) and read
what it publishes (request handles' events, snapshots, metrics). Its loop is the three
calls of vLLM's EngineCore.step: schedule -> execute -> update.
"""

from __future__ import annotations

import itertools
import logging
import queue
import random
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, replace

from engine.activity import EngineActivity
from engine.events import RequestHandle, deliver_pending
from engine.limits import EngineClosedError, QueueFullError, ServingLimits, SessionLimitError
from engine.metrics import EngineMetrics
from engine.request import Request, RequestStatus
from engine.runner import ModelRunner
from engine.scheduler import Mode, Scheduler
from engine.snapshot import EngineSnapshot, build_snapshot
from pipelines.interface import PipelineInfo, StepPipeline, resolve_defaults
from pipelines.params import GenerationParams

log = logging.getLogger(__name__)

_SEED_RANGE = 2**32  # random seeds stay short enough to type back in


@dataclass(frozen=True)
class _Submit:
    request: Request


@dataclass(frozen=True)
class _Cancel:
    request_id: str
    reason: str
    requested_at: float


@dataclass(frozen=True)
class _Stop:
    reason: str


class Engine:
    """Serve many generation requests by advancing them one co-batched denoise step at a time.

    >>> engine = Engine(pipeline, mode="step", max_batch=8); engine.start()
    >>> handle = engine.submit(GenerationParams(prompt="a red circle"), session_id="tab-1")
    >>> final = handle.result()          # or: async for event in handle.stream(): ...
    >>> engine.close()
    """

    def __init__(
        self,
        pipeline: StepPipeline,
        mode: Mode = "step",
        max_batch: int = 8,
        limits: ServingLimits | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.limits = limits or ServingLimits()
        self.metrics = EngineMetrics()
        self._scheduler = Scheduler(mode=mode, max_batch=max_batch)
        self._runner = ModelRunner(pipeline)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._stopping = False  # a stop command was applied: the loop ends (engine thread only)
        self._arrivals = itertools.count()
        # Written by callers under the lock (admission control, cancel ownership).
        self._lock = threading.Lock()
        self._owner: dict[str, str] = {}  # unfinished request id -> session id
        self._in_flight_by_session: Counter[str] = Counter()
        # Written by the engine thread only.
        self._activity = EngineActivity()
        self._first_preview_seen: set[str] = set()
        self._snapshot = build_snapshot(self._scheduler, self._activity)

    # ------------------------------------------------------------------ public API
    @property
    def info(self) -> PipelineInfo:
        return self.pipeline.info

    @property
    def mode(self) -> str:
        return self._scheduler.mode

    @property
    def max_batch(self) -> int:
        return self._scheduler.max_batch

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> "Engine":
        if self._thread is not None:
            raise RuntimeError("Engine.start() was already called.")
        self._thread = threading.Thread(target=self._loop, name="stepstudio-engine", daemon=True)
        self._thread.start()
        return self

    def prepare_params(self, params: GenerationParams) -> GenerationParams:
        """Fill in model defaults and a seed, then apply model and server limits (ValueError)."""
        params = resolve_defaults(params, self.pipeline.info.defaults)
        if params.seed is None:
            params = replace(params, seed=random.SystemRandom().randrange(_SEED_RANGE))
        self.pipeline.validate(params)
        self.limits.check(params)
        return params

    def submit(self, params: GenerationParams, session_id: str = "default") -> RequestHandle:
        """Queue a request; returns at once. Raises ValueError for bad parameters and
        AdmissionError (QueueFullError, SessionLimitError, EngineClosedError) when full or closed."""
        try:
            params = self.prepare_params(params)
        except ValueError:
            self.metrics.requests_rejected.labels("invalid").inc()
            raise
        request_id = uuid.uuid4().hex
        with self._lock:
            if self._closed:
                self.metrics.requests_rejected.labels("closed").inc()
                raise EngineClosedError("the engine is shutting down; no new requests are accepted.")
            if len(self._owner) >= self.limits.max_queue:
                self.metrics.requests_rejected.labels("queue_full").inc()
                raise QueueFullError(
                    f"the queue is full ({self.limits.max_queue} requests in flight); try again shortly."
                )
            if self._in_flight_by_session[session_id] >= self.limits.max_per_session:
                self.metrics.requests_rejected.labels("session_limit").inc()
                raise SessionLimitError(
                    f"this session already has {self._in_flight_by_session[session_id]} requests in flight "
                    f"(limit {self.limits.max_per_session}); wait for one to finish or cancel one."
                )
            self._owner[request_id] = session_id
            self._in_flight_by_session[session_id] += 1
        handle = RequestHandle(request_id=request_id, session_id=session_id, params=params, _cancel=self.cancel)
        request = Request(
            request_id=request_id,
            session_id=session_id,
            params=params,
            batch_key=self.pipeline.batch_key(params),
            handle=handle,
            arrival_index=next(self._arrivals),
            submitted_at=time.perf_counter(),
        )
        self.metrics.requests_submitted.inc()
        self._commands.put(_Submit(request))
        return handle

    def cancel(self, request_id: str, session_id: str | None = None, *, admin: bool = False) -> bool:
        """Abort a request at the next step boundary. Non-blocking.

        Only its own session may cancel it (or `admin=True`): PermissionError otherwise.
        Returns False when the request is unknown or already finished."""
        with self._lock:
            owner = self._owner.get(request_id)
        if owner is None:
            return False
        if not admin and owner != session_id:
            raise PermissionError(f"request {request_id[:8]} belongs to another session; it can't be cancelled from here.")
        self._commands.put(_Cancel(request_id, "cancelled by the user", time.perf_counter()))
        return True

    def snapshot(self) -> EngineSnapshot:
        return self._snapshot

    def session_of(self, request_id: str) -> str | None:
        with self._lock:
            return self._owner.get(request_id)

    def close(self, timeout: float = 30.0) -> None:
        """Stop accepting work, end every pending request (Aborted) and stop the thread."""
        with self._lock:
            self._closed = True
        if self._thread is None:
            return
        self._commands.put(_Stop("the engine was shut down"))
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the engine thread did not stop within {timeout} s")

    @property
    def states_in_memory(self) -> int:
        """Request states the runner holds (0 whenever the engine is idle)."""
        return len(self._runner.states)

    # ------------------------------------------------------------------ engine thread
    def _loop(self) -> None:
        try:
            while self._handle_commands(block=not self._scheduler.has_work):
                self.step()
                if self._stopping:  # the stop came in during the step
                    break
        except Exception:  # pragma: no cover - a bug in the engine itself
            log.exception("the engine thread crashed; ending every request")
            self._scheduler.abort_all("the engine stopped after an internal error")
        finally:
            self._runner.free(list(self._runner.states))
            self._activity.phase = "stopped"
            self._publish()

    def _handle_commands(self, block: bool) -> bool:
        """Apply queued commands; False when the engine must stop."""
        try:
            command = self._commands.get() if block else self._commands.get_nowait()
        except queue.Empty:
            return True
        while True:
            if isinstance(command, _Stop):
                self._scheduler.abort_all(command.reason)
                self._runner.free(self._scheduler.take_freed())
                self._drain_submissions(command.reason)
                self._stopping = True
                return False
            if isinstance(command, _Submit):
                self._scheduler.add(command.request)
            elif isinstance(command, _Cancel):
                if self._scheduler.abort(command.request_id, command.reason):
                    self._runner.free(self._scheduler.take_freed())
                    self.metrics.cancel_latency.observe(time.perf_counter() - command.requested_at)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
        self._publish()
        return True

    def _drain_submissions(self, reason: str) -> None:
        """Requests submitted after the stop command but before the thread ended."""
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, _Submit):
                self._scheduler.add(command.request)
                self._scheduler.abort(command.request.request_id, reason)

    def step(self) -> None:
        """One engine step: schedule -> execute -> update. Runs on the engine thread."""
        scheduled = self._scheduler.schedule()
        if scheduled.is_empty:
            return
        for request in scheduled.new:
            self.metrics.admission_latency.observe(request.started_at - request.submitted_at)
        self._activity.phase = "denoise"
        started = time.perf_counter()
        output = self._runner.execute(scheduled)
        self._scheduler.update(output)
        deliver_pending()  # this step's progress and previews go out before the decodes run
        self._observe_first_previews(output, scheduled)
        # Commands that came in during the forward take effect before the decodes: a cancel
        # waits for one forward, never for other requests' VAE decodes as well (and a request
        # cancelled during its last forward is not decoded at all).
        self._handle_commands(block=False)
        decoded = self._runner.decode_denoised()
        if decoded.rows:
            self._scheduler.update(decoded)
        elapsed = time.perf_counter() - started
        self._activity.phase = "idle"

        self.metrics.step_seconds.observe(elapsed)
        if output.batch_size:
            self.metrics.batch_size.observe(output.batch_size)
            self._activity.record_forward(output.batch_size, time.perf_counter())
        times = self._runner.last_times
        self._activity.record_stage("encode_s", times.encode_s)
        self._activity.record_stage("decode_s", times.decode_s)
        if output.batch_size:
            self._activity.record_stage("denoise_step_s", [times.forward_s + times.scheduler_s])
        self._publish()

    def _observe_first_previews(self, output, scheduled) -> None:
        now = time.perf_counter()
        for row in output.rows:
            if row.preview is not None and row.request_id not in self._first_preview_seen:
                self._first_preview_seen.add(row.request_id)
                request = next((r for r in scheduled.batch if r.request_id == row.request_id), None)
                if request is not None:
                    self.metrics.first_preview_latency.observe(now - request.submitted_at)

    def _release(self, finished: list[Request]) -> None:
        """Free the slots and count the outcomes of requests that just ended."""
        with self._lock:
            for request in finished:
                self._owner.pop(request.request_id, None)
                self._in_flight_by_session[request.session_id] -= 1
                if self._in_flight_by_session[request.session_id] <= 0:
                    del self._in_flight_by_session[request.session_id]
        for request in finished:
            status = request.status.name.removeprefix("FINISHED_").lower()
            self._activity.finished[status] += 1
            self.metrics.requests_finished.labels(status).inc()
            self._first_preview_seen.discard(request.request_id)
            if request.status == RequestStatus.FINISHED_COMPLETED:
                self.metrics.request_latency.observe(request.finished_at - request.submitted_at)
            elif request.status == RequestStatus.FINISHED_ERROR:
                self.metrics.errors.labels(getattr(request.final_event, "stage", "engine")).inc()

    # ------------------------------------------------------------------ snapshots
    def _publish(self) -> None:
        """After a step or a batch of commands: release finished requests, publish the
        snapshot and gauges, then send the final events and wake asyncio consumers."""
        finished = self._scheduler.take_finished()
        if finished:
            self._release(finished)
        self._snapshot = build_snapshot(self._scheduler, self._activity)
        self.metrics.queue_depth.set(self._scheduler.num_waiting)
        self.metrics.running.set(self._scheduler.num_running)
        for request in finished:
            request.handle.emit(request.final_event)
        deliver_pending()

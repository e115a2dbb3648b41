"""The embedded engine: one thread that owns the scheduler, the request states and the device.

Other threads talk to it only through a command queue (submit, cancel, stop, and the queue
commands of engine.queue_control: pause, resume, move, clear) and read
what it publishes (request handles' events, snapshots, metrics). Its loop is the three
calls of vLLM's EngineCore.step: schedule -> execute -> update.

Its end is always loud: `close()` / `shutdown()` abort every request (`Aborted`, cause
"shutdown"); a crash of the engine thread itself fails every request (`Failed`, stage
"engine"), closes the engine for good (`submit` raises EngineClosedError) and keeps the
reason in `Engine.failure`, so the process around it can exit with an error.
"""

from __future__ import annotations

import itertools
import logging
import queue
import random
import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import Mapping

from engine.activity import EngineActivity
from engine.admission import AdmissionLedger
from engine.cost import request_cost
from engine.events import Failed, RequestHandle, deliver_pending
from engine.limits import EngineClosedError, ServingLimits
from engine.metrics import EngineMetrics
from engine.models import ModelBatchKey, ModelSet
from engine.pauses import Pauses
from engine.queue_control import QUEUE_COMMANDS, PausesChanged, QueueControl
from engine.request import PreparedRequest, Request, RequestStatus
from engine.runner import ModelRunner
from engine.scheduler import Mode, Scheduler
from engine.snapshot import EngineSnapshot, build_snapshot
from pipelines.interface import PipelineInfo, StepPipeline, resolve_defaults
from pipelines.lora_request import check_loaded_loras
from pipelines.params import GenerationParams
from pipelines.validation import check_image_inputs, check_step_cache, check_supported_size

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


SHUTDOWN_REASON = "the engine was shut down"


class Engine(QueueControl):
    """Serve many generation requests by advancing them one co-batched denoise step at a time.

    >>> engine = Engine(pipeline, mode="step", max_batch_requests=8); engine.start()
    >>> handle = engine.submit(GenerationParams(prompt="a red circle"), session_id="tab-1")
    >>> final = handle.result()          # or: async for event in handle.stream(): ...
    >>> engine.close()

    `max_batch_requests` counts requests per forward; a request with true CFG puts two rows
    in it. `max_batch_tokens` caps the rows x tokens of one forward (engine.cost), so one large
    request and several small ones can share it; None: for each model, `max_batch_requests`
    requests of its default size with CFG (two rows each).
    """

    def __init__(
        self,
        pipeline: StepPipeline | Mapping[str, StepPipeline] | list[StepPipeline],
        mode: Mode = "step",
        max_batch_requests: int = 8,
        limits: ServingLimits | None = None,
        batched_decodes: bool = True,
        max_batch_tokens: int | None = None,
    ) -> None:
        if max_batch_tokens is not None and (isinstance(max_batch_tokens, bool) or not isinstance(max_batch_tokens, int)
                                             or max_batch_tokens < 1):
            raise ValueError(f"max_batch_tokens={max_batch_tokens!r} must be an integer of at least 1 (or None).")
        self.models = ModelSet(pipeline)
        self.pipeline = self.models[None]  # the default model's pipeline
        # The server's caps, resolved per model (an unset max size is each model's own size).
        self._limits = {name: (limits or ServingLimits()).resolved_for(info) for name, info in self.models.infos.items()}
        self.limits = self._limits[self.models.default]
        self.metrics = EngineMetrics()
        self._pauses = Pauses()  # paused queues (engine.queue_control): callers write, the scheduler reads
        # Rows x tokens one forward of each model may hold: by default room for max_batch_requests
        # requests of the model's default size, each with a CFG negative row (so every forward
        # that a row limit alone allowed at that size still fits).
        self.token_budgets = {name: max_batch_tokens or max_batch_requests * 2 * self._default_cost(name).tokens
                              for name in self.models.names}
        self._scheduler = Scheduler(mode=mode, max_batch_requests=max_batch_requests, pauses=self._pauses,
                                    token_budget=lambda key: self.token_budgets.get(getattr(key, "model", None)))
        # Requests that finish in the same step share a VAE decode (False: one each, for comparison).
        self._runner = ModelRunner(self.models.pipelines, batched_decodes=batched_decodes)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stopping = False  # a stop command was applied: the loop ends (engine thread only)
        self._stopped = threading.Event()  # the engine thread has ended (or never started and was closed)
        self._arrivals = itertools.count()
        # The cost of the model's default request: the unit of ServingLimits.max_session_cost.
        self.unit_cost = self._default_cost(self.models.default).total
        # Every unfinished request, by id, and the open door (written by callers and the engine thread).
        self._ledger: AdmissionLedger[Request] = AdmissionLedger(self.metrics.requests_rejected)
        # Written by the engine thread only.
        self._activity = EngineActivity()
        self._first_preview_seen: set[str] = set()
        self._snapshot = build_snapshot(self._scheduler, self._activity)

    def _default_cost(self, model: str):
        """What the model's default request costs (engine.cost)."""
        pipeline = self.models[model]
        default_request = resolve_defaults(GenerationParams(prompt="a default request", model=model),
                                           pipeline.info.defaults)
        return request_cost(pipeline, pipeline.info, default_request)

    # ------------------------------------------------------------------ public API
    @property
    def info(self) -> PipelineInfo:
        """The default model's info."""
        return self.pipeline.info

    @property
    def infos(self) -> dict[str, PipelineInfo]:
        """Every loaded model's info, by name (the default first)."""
        return self.models.infos

    def limits_for(self, model: str | None) -> ServingLimits:
        """The server's caps as they apply to one model (ValueError for a model not loaded)."""
        return self._limits[self.models.resolve(model)]

    @property
    def mode(self) -> str:
        return self._scheduler.mode

    @property
    def max_batch_requests(self) -> int:
        """Most requests in one forward (a CFG request puts two rows in it)."""
        return self._scheduler.max_batch_requests

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._ledger.failure is None

    @property
    def accepting(self) -> bool:
        """Whether `submit` takes new requests (False once shut down or crashed)."""
        return not self._ledger.closed

    @property
    def failure(self) -> str | None:
        """Why the engine thread crashed, or None (it runs, or it was closed normally)."""
        return self._ledger.failure

    def start(self) -> "Engine":
        if self._thread is not None:
            raise RuntimeError("Engine.start() was already called.")
        if self._ledger.closed:
            raise EngineClosedError("this engine was closed; make a new one.")
        self._thread = threading.Thread(target=self._loop, name="stepstudio-engine", daemon=True)
        self._thread.start()
        return self

    def prepare_params(self, params: GenerationParams) -> GenerationParams:
        """Name the model, move a prompt's `<lora:...>` tags into `loras`, fill in the model's
        defaults and a seed, then apply the model's and the server's limits (ValueError)."""
        model = self.models.resolve(params.model)
        pipeline = self.models[model]
        params = params.with_prompt_loras()
        params = resolve_defaults(replace(params, model=model), pipeline.info.defaults)
        if params.seed is None:
            params = replace(params, seed=random.SystemRandom().randrange(_SEED_RANGE))
        pipeline.validate(params)
        info = pipeline.info
        check_supported_size(params, model, info.supported_sizes, info.size_range, info.size_multiple,
                             info.supported_frame_counts)
        check_image_inputs(params, model, pipeline.info.image_inputs)
        check_step_cache(params, model, pipeline.info.step_cache)
        check_loaded_loras(params.loras, model, pipeline.info.loras)
        self._limits[model].check(params)
        return params

    def prepare(self, params: GenerationParams) -> PreparedRequest:
        """`prepare_params`, then the request's batch key and cost: what `submit` admits (ValueError
        for bad parameters). Pure: it runs on the caller's thread."""
        params = self.prepare_params(params)
        pipeline = self.models[params.model]
        # Scoped to the model: different models never share a forward.
        batch_key = ModelBatchKey(params.model, pipeline.batch_key(params))
        hash(batch_key)  # an unhashable key is a pipeline bug: refuse it here, not on the engine thread
        return PreparedRequest(params, batch_key, request_cost(pipeline, pipeline.info, params))

    def submit(self, params: GenerationParams, session_id: str = "default", *,
               from_waiting_queue: bool = False) -> RequestHandle:
        """Queue a request; returns at once. Raises ValueError for bad parameters and
        AdmissionError (QueueFullError, SessionLimitError, EngineClosedError) when full or closed.

        `from_waiting_queue=True`: the caller holds the request in its own queue and submits it
        again when there is room (a workflow run's waiting branches). A QueueFullError or
        SessionLimitError then means "still waiting", not a refused call, so it is not counted
        in `stepstudio_requests_rejected_total`."""
        try:
            prepared = self.prepare(params)
        except ValueError:
            self.metrics.requests_rejected.labels("invalid").inc()
            raise
        request_id = uuid.uuid4().hex
        handle = RequestHandle(request_id=request_id, session_id=session_id, params=prepared.params,
                               _cancel=self.cancel)
        request = Request(
            request_id=request_id,
            session_id=session_id,
            params=prepared.params,
            batch_key=prepared.batch_key,
            handle=handle,
            arrival_index=next(self._arrivals),
            cost=prepared.cost,
            submitted_at=time.perf_counter(),
        )
        with self._ledger.admitting(request, self.limits, self.unit_cost, count_no_room=not from_waiting_queue):
            # Queued under the ledger's lock: a stop command (also queued under it) always comes after.
            self._commands.put(_Submit(request))
        self.metrics.requests_submitted.inc()
        return handle

    def cancel(self, request_id: str, session_id: str | None = None, *, admin: bool = False) -> bool:
        """Abort a request at the next step boundary. Non-blocking.

        Only its own session may cancel it (or `admin=True`): PermissionError otherwise.
        Returns False when the request is unknown or already finished."""
        request = self._ledger.get(request_id)
        if request is None:
            return False
        if not admin and request.session_id != session_id:
            raise PermissionError(f"request {request_id[:8]} belongs to another session; it can't be cancelled from here.")
        self._commands.put(_Cancel(request_id, "cancelled by the user", time.perf_counter()))
        return True

    def snapshot(self) -> EngineSnapshot:
        return self._snapshot

    def shutdown(self, reason: str = SHUTDOWN_REASON) -> None:
        """Stop admission now and abort every request at the next step boundary. Non-blocking:
        `wait_stopped()` or `close()` wait for the thread to end."""
        if not self._ledger.close(then=lambda: self._commands.put(_Stop(reason))):
            return
        if self._thread is None:  # never started: nobody else will end the queued requests
            self._handle_commands(block=False)
            self._stopped.set()

    def close(self, timeout: float = 30.0) -> None:
        """Stop accepting work, end every pending request (Aborted) and stop the thread."""
        self.shutdown()
        if self._thread is None:
            return
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the engine thread did not stop within {timeout} s")

    def wait_stopped(self, timeout: float | None = None) -> bool:
        """Block until the engine thread has ended (closed or crashed); False on timeout."""
        return self._stopped.wait(timeout)

    @property
    def states_in_memory(self) -> int:
        """Request states the runner holds (0 whenever the engine is idle)."""
        return len(self._runner.states)

    @property
    def requests_in_flight(self) -> int:
        """Submitted requests that have not sent their final event yet (0 when idle)."""
        return len(self._ledger)

    # ------------------------------------------------------------------ engine thread
    def _loop(self) -> None:
        try:
            # Block while nothing can step: idle, or everything left waits in paused queues.
            while self._handle_commands(block=not self._scheduler.can_run):
                self._step()
                if self._stopping:  # the stop came in during the step
                    break
        except BaseException as exc:  # noqa: BLE001 - a bug in the engine itself, or an escaped pipeline error
            self._fail_everything(exc)
        finally:
            try:
                self._runner.free(list(self._runner.states))
                self._publish()
            except Exception:  # noqa: BLE001 - never leave wait_stopped() hanging
                log.exception("the engine could not publish its final state")
            self._stopped.set()

    def _handle_commands(self, block: bool) -> bool:
        """Apply queued commands; False when the engine must stop. Blocking, it also wakes when a
        session's pause ends by itself, so that queue runs again at once."""
        try:
            if block:
                command = self._commands.get(timeout=self._pauses.seconds_to_next_end())
            else:
                command = self._commands.get_nowait()
        except queue.Empty:
            if block:  # a pause ended: its waiting requests learn their place (and may start)
                self._apply_queue_command(PausesChanged())
                self._publish()
            return True
        while True:
            if isinstance(command, _Stop):
                self._scheduler.abort_all(command.reason, cause="shutdown")
                self._runner.free(self._scheduler.take_freed())
                self._drain_commands(lambda request: self._scheduler.abort(request.request_id, command.reason, "shutdown"))
                self._stopping = True
                self._publish()
                return False
            if isinstance(command, _Submit):
                self._scheduler.add(command.request)
            elif isinstance(command, _Cancel):
                if self._scheduler.abort(command.request_id, command.reason):
                    self._runner.free(self._scheduler.take_freed())
                    self.metrics.cancel_latency.observe(time.perf_counter() - command.requested_at)
            elif isinstance(command, QUEUE_COMMANDS):
                self._apply_queue_command(command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
        self._publish()
        return True

    def _drain_commands(self, end) -> None:
        """Requests still queued as commands once the engine stops: add each, then `end` it."""
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, _Submit):
                self._scheduler.add(command.request)
                end(command.request)

    def _fail_everything(self, exc: BaseException) -> None:
        """The engine thread is going down: close for good, fail every request, answer everyone."""
        message = f"the engine stopped after an internal error ({type(exc).__name__}: {exc})"
        log.critical("%s; failing every request", message, exc_info=exc)
        self._ledger.close(failure=message)
        try:
            self._drain_commands(lambda request: None)
            self._scheduler.fail_all(message)
            self._publish()
        except Exception:  # noqa: BLE001 - the scheduler itself may be what broke
            log.exception("the scheduler could not end the requests; answering them directly")
        # Whatever the scheduler could not end still gets its final event.
        left = self._ledger.entries()
        for request in left:
            request.final_event = Failed(message, stage="engine")
        self._release(left)
        for request in left:
            request.handle.emit(request.final_event)
        deliver_pending()

    def _step(self) -> None:
        """One engine step: schedule -> execute -> update. Runs on the engine thread."""
        scheduled = self._scheduler.schedule()
        if scheduled.is_empty:
            return
        for request in scheduled.new:
            self.metrics.admission_latency.observe(request.started_at - request.submitted_at)
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

        self.metrics.step_seconds.observe(elapsed)
        if output.batch_size:
            self.metrics.batch_size.observe(output.batch_size)
            self.metrics.forward_rows.observe(output.forward_rows)
            self.metrics.record_skips(output.forward_rows, output.skipped_rows)
            self._activity.record_forward(output.batch_size, time.perf_counter(), output.forward_rows,
                                          output.skipped_rows)
        times = self._runner.last_times
        # One step runs one batch, and a batch never mixes models: every time of it is this model's.
        model = scheduled.batch[0].params.model
        self._activity.record_stage("encode_s", times.encode_s, model)
        self._activity.record_stage("decode_s", times.decode_s, model)
        if output.batch_size:
            self._activity.record_stage("denoise_step_s", [times.forward_s + times.scheduler_s], model)
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
        released = self._ledger.release(finished)
        for request in released:
            status = request.status.name.removeprefix("FINISHED_").lower() if request.status.is_finished else "error"
            self._activity.finished[status] += 1
            if request.status == RequestStatus.FINISHED_COMPLETED:
                self._activity.completed_by_model[request.params.model] += 1
            self.metrics.requests_finished.labels(status).inc()
            self._first_preview_seen.discard(request.request_id)
            if request.status == RequestStatus.FINISHED_COMPLETED:
                self.metrics.request_latency.observe(request.finished_at - request.submitted_at)
            elif isinstance(request.final_event, Failed):
                self.metrics.errors.labels(request.final_event.stage).inc()

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

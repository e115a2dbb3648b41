"""The model runner: executes one scheduled step on the pipeline and owns the request states.

Failure isolation lives here: an exception in any step-protocol method (or a result that
breaks the protocol: None from post_decode, NaN latents) ends only the request it belongs
to. When a batched forward raises, the rows are re-run one by one to find the culprit, and
the healthy rows go on. When a forward runs out of memory, the batch is split in two once;
a half that still does not fit loses its largest request (it fails with an out-of-memory
error) and the rest of that half sit this step out: no row is retried alone.

Imports no torch: it only calls methods of the tensors the pipeline hands it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

from engine.scheduler import RowResult, RunnerOutput, SchedulerOutput
from pipelines.interface import (
    Batch,
    BatchedDecoding,
    BatchedImageEncoding,
    BatchedPromptEncoding,
    RequestState,
    StagedComponents,
    StepPipeline,
)

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

_OUT_OF_MEMORY_TEXTS = ("out of memory", "can't allocate memory")


def is_out_of_memory(exc: BaseException) -> bool:
    """torch.OutOfMemoryError (CUDA, MPS), a CPU allocator failure, or Python's MemoryError."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
    return any(part in text for part in _OUT_OF_MEMORY_TEXTS)


def _failure(request_id: str, stage: str, exc: BaseException) -> RowResult:
    return RowResult(request_id, error=f"{stage} failed: {type(exc).__name__}: {exc}", error_stage=stage)


@dataclass
class StageTimes:
    """Wall time of the last executed step, per stage (for the graph view and metrics)."""

    encode_s: list[float] = field(default_factory=list)  # one per newly admitted request
    forward_s: float = 0.0
    scheduler_s: float = 0.0
    decode_s: list[float] = field(default_factory=list)  # one per finished request
    preview_s: list[float] = field(default_factory=list)


class ModelRunner:
    """Runs each step on the pipeline of the batch's model (a batch never mixes models: the
    model is part of the batch key)."""

    def __init__(self, pipelines: Mapping[str, StepPipeline], batched_decodes: bool = True) -> None:
        self.pipelines = dict(pipelines)
        self.batched_decodes = batched_decodes  # False: one decode per request (benchmarks compare the two)
        self.states: dict[str, RequestState] = {}  # request id -> state; empty when idle
        self.last_times = StageTimes()
        self._denoised: list[RequestState] = []  # finished denoising this step; decoded after the update

    def pipeline_of(self, params) -> StepPipeline:
        """The pipeline of a request's model (its params name it: the engine filled it in)."""
        return self.pipelines[params.model or next(iter(self.pipelines))]

    def free(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.states.pop(request_id, None)

    def execute(self, scheduled: SchedulerOutput) -> RunnerOutput:
        times = StageTimes()
        self.last_times = times
        errors: dict[str, RowResult] = {}

        with _stage(self.pipeline_of(scheduled.new[0].params) if scheduled.new else None):
            shared_encode_s = self._encode_prompts_together(scheduled.new)
            for request in scheduled.new:
                state = RequestState(request_id=request.request_id, params=request.params)
                started = time.perf_counter()
                try:
                    self.pipeline_of(state.params).prepare_encode(state)
                except Exception as exc:  # noqa: BLE001 - isolate the failing request
                    log.exception("prepare_encode failed for %s", request.request_id)
                    errors[request.request_id] = _failure(request.request_id, "prepare_encode", exc)
                    continue
                times.encode_s.append(shared_encode_s + time.perf_counter() - started)
                self.states[request.request_id] = state

        rows = [self.states[r.request_id] for r in scheduled.batch if r.request_id not in errors]
        costs = {r.request_id: r.cost for r in scheduled.batch}
        started = time.perf_counter()
        predictions, forward_errors = self._forward(rows, costs)
        times.forward_s = time.perf_counter() - started
        errors.update(forward_errors)
        # Rows whose request reused its cached residual in this forward (step caching).
        skipped_rows = sum(costs[state.request_id].rows for state in rows
                           if state.request_id in predictions and _skipped_this_step(state))

        results = list(errors.values())
        started = time.perf_counter()
        for state in rows:
            if state.request_id in predictions:  # others failed, or sat this step out (out of memory)
                results.append(self._advance(state, predictions[state.request_id], times))
        times.scheduler_s = time.perf_counter() - started - sum(times.preview_s)

        for row in results:
            if row.error is not None:
                self.states.pop(row.request_id, None)
        return RunnerOutput(
            rows=tuple(results),
            batch_size=len(predictions),
            forward_rows=sum(costs[request_id].rows for request_id in predictions),
            skipped_rows=skipped_rows,
        )

    def decode_denoised(self) -> RunnerOutput:
        """VAE-decode the requests whose last step just ran, and free their states. Requests of a
        pipeline that decodes several at once (`BatchedDecoding`) share its VAE calls.

        Separate from `execute` so the step's progress and previews reach every batch-mate
        before the (comparatively slow) decodes run."""
        finished = [state for state in self._denoised if state.request_id in self.states]  # not cancelled meanwhile
        self._denoised = []
        by_pipeline: dict[int, list[RequestState]] = {}
        for state in finished:
            by_pipeline.setdefault(id(self.pipeline_of(state.params)), []).append(state)
        results = []
        for states in by_pipeline.values():
            pipeline = self.pipeline_of(states[0].params)
            with _stage(pipeline):
                decoded = self._decoded(pipeline, states)
            for state, images, seconds in decoded:
                results.append(self._decode_result(pipeline, state, images, seconds))
                self.states.pop(state.request_id, None)
        return RunnerOutput(rows=tuple(results), batch_size=0)

    def _decoded(self, pipeline: StepPipeline, states: list[RequestState]):
        """(state, its media or the exception, its share of the decode time) for each state: one
        batched call when the pipeline offers it, else (or when it fails) one call each."""
        if self.batched_decodes and len(states) > 1 and isinstance(pipeline, BatchedDecoding):
            started = time.perf_counter()
            try:
                media = pipeline.post_decode_many(states)
                if len(media) != len(states):
                    raise RuntimeError(f"post_decode_many returned {len(media)} results for {len(states)} requests")
            except Exception:  # noqa: BLE001 - each request is decoded, and fails, on its own
                log.warning("batched decode of %d requests failed; decoding them one by one", len(states), exc_info=True)
            else:
                share = (time.perf_counter() - started) / len(states)
                return [(state, images, share) for state, images in zip(states, media)]
        decoded = []
        for state in states:
            started = time.perf_counter()
            try:
                images = pipeline.post_decode(state)
            except Exception as exc:  # noqa: BLE001
                log.exception("post_decode failed for %s", state.request_id)
                images = exc
            decoded.append((state, images, time.perf_counter() - started))
        return decoded

    def _decode_result(self, pipeline: StepPipeline, state: RequestState, images, seconds: float) -> RowResult:
        if not isinstance(images, Exception) and (not isinstance(images, (list, tuple)) or not images):
            images = TypeError(f"post_decode returned {images!r}; a pipeline must return a non-empty list of images")
        if isinstance(images, Exception):
            return _failure(state.request_id, "post_decode", images)
        self.last_times.decode_s.append(seconds)
        return RowResult(
            state.request_id,
            steps_done=state.step_index,
            total_steps=state.total_steps,
            images=tuple(images),
            is_video=pipeline.info.output_kind == "video",
            skipped_steps=tuple(state.skipped_steps),
        )

    # ------------------------------------------------------------------ helpers
    def _encode_prompts_together(self, new) -> float:
        """Several requests join this step: their prompts go through the text encoders in one
        call, and their init images (if two or more have one) through the VAE encoder in one
        call per size. Returns each request's share of that time (for the encode stage time)."""
        pipeline = self.pipeline_of(new[0].params) if new else None  # joiners share the batch's model
        if len(new) < 2:
            return 0.0
        params = [request.params for request in new]
        started = time.perf_counter()
        if isinstance(pipeline, BatchedPromptEncoding):
            try:
                pipeline.encode_prompts(params)
            except Exception:  # noqa: BLE001 - each prepare_encode then encodes, and fails, on its own
                log.warning("batched prompt encoding failed; encoding %d requests one by one", len(new), exc_info=True)
        if isinstance(pipeline, BatchedImageEncoding) and sum(p.init_image is not None for p in params) >= 2:
            try:
                pipeline.encode_images(params)
            except Exception:  # noqa: BLE001 - as above, one by one
                log.warning("batched image encoding failed; encoding %d images one by one", len(new), exc_info=True)
        return (time.perf_counter() - started) / len(new)

    def _forward(self, rows: list[RequestState], costs: dict) -> tuple[dict, dict[str, RowResult]]:
        """One forward for all rows: (predictions, failures) by request id. On an exception,
        one forward per row finds the culprit; out of memory, see `_forward_after_oom`."""
        if not rows:
            return {}, {}
        try:
            return self._checked_forward(rows), {}
        except Exception as exc:  # noqa: BLE001
            if is_out_of_memory(exc):
                log.warning("out of memory in a forward of %d requests; splitting it in two", len(rows))
                return self._forward_after_oom(rows, costs)
            if len(rows) == 1:
                log.exception("denoise_step failed for %s", rows[0].request_id)
                return {}, {rows[0].request_id: _failure(rows[0].request_id, "denoise_step", exc)}
            log.warning("batched denoise_step failed; re-running %d rows one by one", len(rows))
        return self._forward_one_by_one(rows)

    def _forward_one_by_one(self, rows: list[RequestState]) -> tuple[dict, dict[str, RowResult]]:
        predictions, errors = {}, {}
        for state in rows:
            try:
                predictions.update(self._checked_forward([state]))
            except Exception as exc:  # noqa: BLE001
                errors[state.request_id] = _failure(state.request_id, "denoise_step", exc)
        return predictions, errors

    def _forward_after_oom(self, rows: list[RequestState], costs: dict) -> tuple[dict, dict[str, RowResult]]:
        """Two forwards of half the batch each. A half that still runs out of memory fails its
        largest request (by cost per step) and the rest of it sit this step out."""
        predictions, errors = {}, {}
        middle = (len(rows) + 1) // 2
        for half in (rows[:middle], rows[middle:]):
            if not half:
                continue
            try:
                predictions.update(self._checked_forward(half))
            except Exception as exc:  # noqa: BLE001
                if not is_out_of_memory(exc):
                    more_predictions, more_errors = self._forward_one_by_one(half)
                    predictions.update(more_predictions)
                    errors.update(more_errors)
                    continue
                largest = max(half, key=lambda state: costs[state.request_id].per_step)
                cost = costs[largest.request_id]
                errors[largest.request_id] = RowResult(
                    largest.request_id,
                    error=f"denoise_step failed: out of memory ({type(exc).__name__}): this request "
                    f"({cost.rows} rows x {cost.tokens} tokens) was the largest of a forward that did not fit "
                    "on the device; try a smaller size.",
                    error_stage="denoise_step",
                )
                log.warning("out of memory again in half a batch; failed the largest request %s", largest.request_id)
        return predictions, errors

    def _checked_forward(self, rows: list[RequestState]) -> "dict[str, torch.Tensor]":
        output = self.pipeline_of(rows[0].params).denoise_step(Batch(tuple(rows)))
        if len(output) != len(rows):
            raise RuntimeError(
                f"denoise_step returned {len(output)} predictions for a batch of {len(rows)} rows; "
                "a pipeline must return exactly one prediction per row, in row order."
            )
        return {state.request_id: prediction for state, prediction in zip(rows, output)}

    def _advance(self, state: RequestState, prediction: "torch.Tensor", times: StageTimes) -> RowResult:
        request_id = state.request_id
        pipeline = self.pipeline_of(state.params)
        try:
            pipeline.step_scheduler(state, prediction)
            finite = state.latents is None or bool(state.latents.isfinite().all())
        except Exception as exc:  # noqa: BLE001
            log.exception("step_scheduler failed for %s", request_id)
            return _failure(request_id, "step_scheduler", exc)
        if not finite:
            return RowResult(
                request_id,
                error=f"latents became NaN or infinite at step {state.step_index}/{state.total_steps}; "
                "try another seed, fewer steps or a lower guidance scale.",
                error_stage="step_scheduler",
            )

        skipped = tuple(state.skipped_steps)
        if state.is_denoised:
            self._denoised.append(state)  # its image comes next, no preview needed
            return RowResult(request_id, steps_done=state.step_index, total_steps=state.total_steps,
                             skipped_steps=skipped)

        preview = None
        every = state.params.preview_every
        if every and state.step_index % every == 0:
            started = time.perf_counter()
            try:
                preview = pipeline.preview(state)
            except Exception:  # noqa: BLE001 - a preview is a nicety, never fatal
                log.exception("preview failed for %s; continuing without it", request_id)
            times.preview_s.append(time.perf_counter() - started)
        return RowResult(request_id, steps_done=state.step_index, total_steps=state.total_steps, preview=preview,
                         skipped_steps=skipped)


def _skipped_this_step(state: RequestState) -> bool:
    """Whether the forward that just ran reused this request's cached residual (before its step)."""
    return bool(state.skipped_steps) and state.skipped_steps[-1] == state.step_index


def _stage(pipeline: StepPipeline | None):
    """One encode or decode group's stage (StagedComponents): an offloaded text encoder or VAE
    moves to the device once for the whole group."""
    return pipeline.component_stage() if isinstance(pipeline, StagedComponents) else contextlib.nullcontext()

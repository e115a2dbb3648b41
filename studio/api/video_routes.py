"""OpenAI's Videos API on the studio's engine: asynchronous video jobs the official `openai`
client drives unmodified (`client.videos.create / retrieve / list / download_content / delete /
create_and_poll`).

    POST   /v1/videos                          create a job (multipart/form-data, as the openai
                                               client sends it, or JSON) -> the video object
    GET    /v1/videos                          the caller's jobs (after, limit, order)
    GET    /v1/videos/{id}                     status (queued, in_progress, completed, failed) and
                                               progress 0-100 from the engine's denoise steps
    GET    /v1/videos/{id}/content?variant=    the MP4 (video), the poster frame (thumbnail, WEBP)
                                               or every frame in a grid (spritesheet, JPEG)
    DELETE /v1/videos/{id}                     drop the job; a running one is cancelled at the
                                               engine's next step boundary (nothing is decoded)

Duration: `num_frames` (an extension, send it with `extra_body=`) wins; else `seconds` becomes
seconds x the model's fps frames, rounded to the nearest frame count the model takes (Wan:
4k+1; a tie goes to the longer clip); else the model's default. The video object states what
was made: `seconds` is frames / fps, plus `num_frames` and `fps`.

A job is one engine request of the caller's session (the images route's identity), so it
shares forwards with everyone else's requests and counts against the caller's limits; a
studio.tracker `RequestTracker` follows it to its end. Jobs and their files live in memory
(studio.api.video_jobs), which keeps them in the studio's durable store: a job accepted before a
restart answers with its true state after it, and one that had not finished runs again
(studio.store.recovery). Finished videos are also saved by the studio's output store when it saves.
"""

from __future__ import annotations

import atexit
import logging
import math
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable, Literal

import fastapi
import pydantic
from fastapi import Request
from fastapi.responses import JSONResponse, Response

import engine
from pipelines.params import MAX_PROMPT_CHARS, MAX_SEED
from studio.api import errors as http_errors
from studio.api.config import HttpApiConfig
from studio.api.errors import ApiError
from studio.api.image_requests import STEP_CACHE_FIELD
from studio.api.request_bodies import body_kind, parse_size, read_body_in_time, read_form, resolve_model
from studio.api.video_files import MEDIA_TYPES, SUFFIXES, VARIANTS, encode_video_files
from studio.api.video_jobs import VideoError, VideoJob, VideoJobStore, VideoStoreFull
from studio.media import model_fps
from studio.outputs import OutputStore
from studio.store.durable import DurableRequests
from studio.store.store import AcceptedRequest, StudioStore

log = logging.getLogger(__name__)

_FRAMES_RULE = re.compile(r"^(\d+)k\+1$")  # how video families state their frame counts ("4k+1")
_MAX_SECONDS = 3600.0
_LIST_LIMIT = 100


class VideoCreateRequest(pydantic.BaseModel):
    """OpenAI's `videos.create` body plus the diffusion controls it lacks. Multipart fields
    arrive as text and are converted (lax); a JSON body is typed strictly, as the images route's."""

    model_config = pydantic.ConfigDict(strict=True, extra="forbid")

    prompt: str = pydantic.Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    model: str | None = pydantic.Field(default=None, max_length=256)
    seconds: str | float | None = None  # OpenAI sends text ("4"); a number is taken too
    size: str | None = pydantic.Field(default=None, max_length=32)  # "WIDTHxHEIGHT" or "auto"
    input_reference: str | None = None  # refused below with a clear message
    # Extensions (the openai client's `extra_body=`).
    negative_prompt: str | None = pydantic.Field(default=None, max_length=MAX_PROMPT_CHARS)
    num_inference_steps: int | None = None  # checked against the server's range, which it names
    guidance_scale: float | None = pydantic.Field(default=None, ge=0.0, le=100.0, allow_inf_nan=False)
    seed: int | None = pydantic.Field(default=None, ge=0, le=MAX_SEED)
    num_frames: int | None = pydantic.Field(default=None, ge=1)  # the upper bound is the server's
    step_cache: float | None = STEP_CACHE_FIELD


Caller = Callable[[Request], Awaitable[str]]


@dataclass
class VideoJobs:
    """The video jobs and how they end: what the routes and the restart's recovery share."""

    store: VideoJobStore
    durable: DurableRequests
    outputs: OutputStore | None
    files_folder: Path  # where finished jobs' downloads are kept

    async def accept(self, job: VideoJob) -> None:
        """Add a job (its request, `job.handle`, just submitted) and record its request as accepted,
        then follow it to its end: both commits on the store's writer thread, off the event loop,
        done when this returns. VideoStoreFull when the room `make_room` made was taken meanwhile."""
        owner = self.outputs.owners.of_caller(job.owner) if self.outputs is not None and self.outputs.enabled else ""
        await self.durable.accept("video_job", job.handle, owner, self._finish,
                                  video_id=job.id, before=lambda: self.store.add(job))

    def fail(self, job: VideoJob, code: str, message: str, in_same_commit: Callable[[], None] | None = None) -> None:
        self.store.finish(job, error=VideoError(code, message), in_same_commit=in_same_commit)

    def follow(self, job: VideoJob, entry: AcceptedRequest) -> None:
        self.durable.follow(job.handle, entry, self._finish)

    def _finish(self, entry: AcceptedRequest, event: engine.Event) -> None:
        """On the durable finisher's thread: the job's files (or why it failed), its history row
        and its entry's end, in one commit."""
        job = self.store.by_id(entry.video_id)
        if job is None or job.is_finished:
            self.durable.store.finished(entry)  # deleted by its caller meanwhile: nothing to keep
            return
        if not isinstance(event, engine.Completed):  # failed, or cancelled (by an operator)
            error = job.failure or VideoError("cancelled", getattr(event, "reason", "cancelled"))
            self.store.finish(job, error=error, in_same_commit=lambda: self.durable.store.finished(entry))
            return
        try:
            files = encode_video_files(event.images, job.fps, self.files_folder, job.id)
        except Exception as exc:  # noqa: BLE001 - an encoding failure ends this job, never the server
            log.exception("video job %s could not be encoded", job.id)
            error = VideoError("encoding_failed", f"the video could not be encoded: {exc}")
            self.store.finish(job, error=error, in_same_commit=lambda: self.durable.store.finished(entry))
            return

        def end_job(_saved=None) -> None:
            self.store.finish(job, files=files, in_same_commit=lambda: self.durable.store.finished(entry))

        # Saved before it shows as completed; filed under the caller's session, as the gradio
        # endpoints file API callers' results.
        if self.outputs is not None and self.outputs.enabled and entry.owner:
            self.outputs.save(event, entry.owner, in_same_commit=end_job)
        else:
            end_job()


def video_jobs_for(config: HttpApiConfig, outputs: OutputStore | None, durable: DurableRequests | None) -> VideoJobs:
    """The jobs kept in `durable`'s store (a store in memory when None), their files under the outputs
    folder (a temp folder when saving is off)."""
    if durable is None:
        durable = DurableRequests(outputs.index if outputs is not None else StudioStore.open(None))
    if outputs is not None and outputs.enabled:
        folder = outputs.folder / "video-jobs"
    else:
        folder = Path(tempfile.mkdtemp(prefix="stepstudio-video-jobs-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
    store = VideoJobStore(
        max_jobs=config.video_store_max_jobs, max_bytes=config.video_store_max_bytes, ttl_s=config.video_ttl_s,
        max_jobs_per_owner=config.video_jobs_per_caller, store=durable.store,
    )
    return VideoJobs(store, durable, outputs, folder)


def add_video_routes(
    router: fastapi.APIRouter, engine_: engine.EngineClient, config: HttpApiConfig, caller: Caller,
    jobs: VideoJobs,
) -> None:
    """Add the /v1/videos routes to the HTTP API's router. `caller` names the engine session of a
    request (checking its key); `jobs`: where the jobs are kept (video_jobs_for)."""
    store = jobs.store
    poll_after = {"openai-poll-after-ms": str(config.video_poll_after_ms)}
    body_schema = {"content": {"multipart/form-data": {"schema": VideoCreateRequest.model_json_schema()},
                               "application/json": {"schema": VideoCreateRequest.model_json_schema()}}}

    @router.post("/v1/videos", name="stepstudio_videos_create",
                 openapi_extra={"requestBody": {**body_schema, "required": True}})
    async def create(request: Request) -> Response:
        try:
            kind = body_kind(request)
            session = await caller(request)
            job = await _create_job(engine_, config, store, request, kind, session)
            await _accept(jobs, job)  # committed (off the event loop) before the caller hears of it
        except ApiError as error:
            return error.to_response()
        return JSONResponse(_video_json(job, store), headers=poll_after)

    @router.get("/v1/videos", name="stepstudio_videos_list")
    async def list_videos(request: Request, after: str | None = None, limit: str | None = None,
                          order: str | None = None) -> Response:
        try:
            session = await caller(request)
            page = _page(store.jobs_of(session), after, limit, order)
        except ApiError as error:
            return error.to_response()
        data = [_video_json(job, store) for job in page.jobs]
        return JSONResponse({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                             "last_id": data[-1]["id"] if data else None, "has_more": page.has_more})

    @router.get("/v1/videos/{video_id}", name="stepstudio_videos_retrieve")
    async def retrieve(video_id: str, request: Request) -> Response:
        try:
            job = _own_job(store, video_id, await caller(request))
        except ApiError as error:
            return error.to_response()
        return JSONResponse(_video_json(job, store), headers=poll_after)

    @router.get("/v1/videos/{video_id}/content", name="stepstudio_videos_content")
    async def content(video_id: str, request: Request, variant: str = "video") -> Response:
        try:
            job = _own_job(store, video_id, await caller(request))
            if variant not in VARIANTS:
                raise http_errors.invalid_value(
                    f"variant={variant[:40]!r} is not offered: allowed are {', '.join(VARIANTS)}.", "variant")
            if job.files is None:
                raise _not_ready(job)
        except ApiError as error:
            return error.to_response()
        return Response(job.files.variant(variant), media_type=MEDIA_TYPES[variant], headers={
            "Content-Disposition": f'attachment; filename="{job.id}.{SUFFIXES[variant]}"'})

    @router.delete("/v1/videos/{video_id}", name="stepstudio_videos_delete")
    async def delete(video_id: str, request: Request) -> Response:
        try:
            session = await caller(request)
            job = store.remove(video_id, session)
            if job is None:
                raise _unknown_video(video_id, store)
        except ApiError as error:
            return error.to_response()
        job.cancel()  # at the next step boundary; a no-op once the request ended
        return JSONResponse({"id": job.id, "object": "video.deleted", "deleted": True})


# ---------------------------------------------------------------------- create
async def _create_job(
    engine_: engine.EngineClient, config: HttpApiConfig, store: VideoJobStore, request: Request,
    kind: Literal["form", "json"], session: str,
) -> VideoJob:
    body = await read_body_in_time(request, config)
    try:
        if kind == "json":
            ask = VideoCreateRequest.model_validate_json(body)
        else:
            ask = VideoCreateRequest.model_validate(await _form_fields(body, request), strict=False)
    except pydantic.ValidationError as error:
        raise http_errors.from_validation_error(error) from None
    if ask.input_reference is not None:
        raise http_errors.invalid_value(
            "input_reference is not supported: these models make videos from text only.", "input_reference",
            code="unsupported_parameter")
    model = resolve_model(engine_, ask.model, "video", "/v1/videos")
    info = engine_.infos[model]
    fps = model_fps(info)
    width, height = parse_size(ask.size)
    frames = _frames(ask, model, frame_step(info), fps, engine_.limits_for(model).max_frames)
    try:
        engine_.limits_for(model).check_values(ask.num_inference_steps, width, height)  # this server's ranges first
        params = engine.GenerationParams(
            prompt=ask.prompt, negative_prompt=ask.negative_prompt, width=width, height=height, num_frames=frames,
            num_inference_steps=ask.num_inference_steps, guidance_scale=ask.guidance_scale, seed=ask.seed,
            model=model, step_cache=ask.step_cache,
        )
    except ValueError as error:
        raise http_errors.from_engine_value_error(error) from None
    try:
        store.make_room(session)
    except VideoStoreFull as full:
        raise _no_room(full) from None
    try:
        handle = engine_.submit(params, session_id=session)
    except ValueError as error:
        raise http_errors.from_engine_value_error(error) from None
    except engine.AdmissionError as error:
        raise http_errors.from_admission_error(error) from None
    return VideoJob(id=f"video_{handle.request_id}", owner=session, handle=handle, fps=fps, created_at=time.time())


async def _accept(jobs: VideoJobs, job: VideoJob) -> None:
    """The job added and its request accepted; its request cancelled when that fails (the room for it
    was taken while the commits waited: 429, as make_room says; or the store failed)."""
    try:
        await jobs.accept(job)
    except VideoStoreFull as full:
        job.handle.cancel()
        raise _no_room(full) from None
    except BaseException:
        job.handle.cancel()
        raise


def _no_room(full: VideoStoreFull) -> ApiError:
    return ApiError(429, str(full), type="rate_limit_error", code="video_limit", retry_after_s=1)


async def _form_fields(body: bytes, request: Request) -> dict[str, str]:
    form = await read_form(body, request.headers, max_files=4)
    for name in form.files:
        raise http_errors.invalid_value(
            f"{name[:40]} is a file upload; this server makes videos from text only and takes no files.",
            name[:40], code="unsupported_parameter")
    return form.fields


# ---------------------------------------------------------------------- frames and seconds
def frame_step(info) -> int:
    """k in the model's frame rule "k x step + 1" (Wan: 4), from the `frames` the family states in
    its info (the only form the info carries it in, also over replicas); 1 when none is stated."""
    match = _FRAMES_RULE.match(info.extras.get("frames", ""))
    return int(match.group(1)) if match else 1


def _frames(ask: VideoCreateRequest, model: str, step: int, fps: int, max_frames: int) -> int | None:
    """The frame count asked for, checked against the model's rule and the server's limit
    (with the allowed values in the message); None: the model's default."""
    largest = (max_frames - 1) // step * step + 1
    allowed = _allowed_frames(step, largest)
    if ask.num_frames is not None:
        frames = ask.num_frames
        if frames > largest:
            raise http_errors.invalid_value(
                f"num_frames={frames} is above this server's limit for {model}: allowed are {allowed}.", "num_frames")
        if (frames - 1) % step:
            lower = frames - (frames - 1) % step
            raise http_errors.invalid_value(
                f"num_frames={frames} is not a frame count {model} takes (e.g. {lower} or {lower + step}): "
                f"allowed are {allowed}.", "num_frames")
        return frames
    if ask.seconds is None:
        return None
    seconds = _seconds_value(ask.seconds)
    target = seconds * fps
    # The nearest allowed count; a tie (exactly between two) goes to the longer clip.
    frames = max(0, math.floor((target - 1) / step + 0.5)) * step + 1
    if frames > largest:
        raise http_errors.invalid_value(
            f"seconds={ask.seconds!s:.20} is {target:g} frames at {model}'s {fps} fps; this server makes at most "
            f"{largest} frames ({_seconds_text(largest, fps)} s) with it: allowed are seconds up to "
            f"{_seconds_text(largest, fps)} (or num_frames {allowed}).", "seconds")
    return frames


def _seconds_value(seconds: str | float) -> float:
    try:
        value = float(seconds)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= _MAX_SECONDS):
        raise http_errors.invalid_value(
            f"seconds={seconds!s:.20} is not a duration: give a number of seconds above 0, e.g. '4'.", "seconds")
    return value


def _allowed_frames(step: int, largest: int) -> str:
    counts = list(range(1, largest + 1, step))
    shown = ", ".join(map(str, counts)) if len(counts) <= 6 else (
        f"{counts[0]}, {counts[1]}, {counts[2]}, ..., {counts[-2]}, {counts[-1]}")
    rule = f"{step}k+1" if step > 1 else "any count"
    return f"{rule} up to {largest}: {shown}"


def _seconds_text(frames: int, fps: int) -> str:
    return f"{frames / fps:.3f}".rstrip("0").rstrip(".")


# ---------------------------------------------------------------------- reading jobs
def _video_json(job: VideoJob, store: VideoJobStore) -> dict:
    params = job.params
    failure = job.failure
    expires = store.expires_at(job)
    return {
        "id": job.id,
        "object": "video",
        "model": params.model,
        "status": job.status,
        "progress": job.progress,
        "created_at": int(job.created_at),
        "completed_at": int(job.finished_at) if job.finished_at is not None else None,
        "expires_at": int(expires) if expires is not None else None,
        "error": {"code": failure.code, "message": failure.message} if failure is not None else None,
        "prompt": params.prompt,
        "remixed_from_video_id": None,
        "seconds": _seconds_text(params.num_frames, job.fps),
        "size": f"{params.width}x{params.height}",
        # Extensions: what exactly was made.
        "num_frames": params.num_frames,
        "fps": job.fps,
        "seed": params.seed,
        "num_inference_steps": params.num_inference_steps,
        "guidance_scale": params.guidance_scale,
        "negative_prompt": params.negative_prompt,
        "resumed_after_restart": job.restarts > 0,  # run again from step 0 after the studio restarted
    }


def _own_job(store: VideoJobStore, video_id: str, session: str) -> VideoJob:
    job = store.get(video_id, session)
    if job is None:
        raise _unknown_video(video_id, store)
    return job


def _unknown_video(video_id: str, store: VideoJobStore) -> ApiError:
    # Another caller's video is answered like a missing one: ids reveal nothing.
    return ApiError(404, f"video {video_id[:80]!r} does not exist, was deleted or has expired (finished videos are "
                         f"kept {store.ttl_s:g} s).", param="video_id", code="video_not_found")


def _not_ready(job: VideoJob) -> ApiError:
    failure = job.failure
    if failure is not None:
        return ApiError(409, f"video {job.id!r} failed ({failure.code}): {failure.message}; it has no content.",
                        param="video_id", code="video_failed")
    return ApiError(409, f"video {job.id!r} is {job.status} ({job.progress}%); its content can be downloaded once "
                         "its status is 'completed'.", param="video_id", code="video_not_ready")


@dataclass(frozen=True)
class _Page:
    jobs: list[VideoJob]
    has_more: bool


def _page(jobs: list[VideoJob], after: str | None, limit: str | None, order: str | None) -> _Page:
    """OpenAI's cursor pagination over the caller's jobs (newest first by default)."""
    if order not in (None, "asc", "desc"):
        raise http_errors.invalid_value(f"order={order[:20]!r} is not allowed: use 'asc' or 'desc'.", "order")
    count = 20
    if limit is not None:
        count = int(limit) if limit.isdigit() else 0
        if not 1 <= count <= _LIST_LIMIT:
            raise http_errors.invalid_value(f"limit={limit[:20]!r} is not allowed: use 1..{_LIST_LIMIT}.", "limit")
    ordered = jobs if order == "asc" else jobs[::-1]
    if after is not None:
        ids = [job.id for job in ordered]
        if after not in ids:
            raise http_errors.invalid_value(f"after={after[:80]!r} is not one of your videos.", "after")
        ordered = ordered[ids.index(after) + 1:]
    return _Page(ordered[:count], len(ordered) > count)

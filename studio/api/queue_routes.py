"""The HTTP API's queue routes: each caller's own queue, and the operator's pause of the engine.

    GET  /v1/queue                      the caller's queue: paused or not, its requests and their places
                                        (a video job's request carries its "video_id")
    POST /v1/queue/pause                {"abort_running": false}: its queued requests wait (running ones
                                        finish, or are aborted with abort_running)
    POST /v1/queue/resume               its queued requests start again
    POST /v1/queue/clear                {"include_running": false}: abort its queued (and running) requests
    POST /v1/queue/{request_id}/move    {"before": null}: to the front of its queue, or before another of its own
                                        (either may be a video job's id, "video_...")
    GET  /v1/admin/queue                the operator's view: engine paused or not, every queued and running count
    POST /v1/admin/pause                nothing new starts for anyone; running requests finish
    POST /v1/admin/resume

A caller is its key's (or host's) session, as for the images and videos routes; its routes act on
that session only (another session's request id: 404, as a missing one). POST bodies must be JSON
(an empty body is `{}`), so no web page can post to them without asking. The admin routes want
`Authorization: Bearer <the --admin-key>`; without an admin key configured they answer 404 saying
how to turn them on. Every change goes through studio.queue_actions, as on the other front ends.
"""

from __future__ import annotations

import asyncio
import secrets

import fastapi
import pydantic
from fastapi import Request
from fastapi.responses import JSONResponse, Response

import engine
from studio import queue_actions
from studio.api import errors as http_errors
from studio.api.callers import client_host
from studio.api.config import HttpApiConfig
from studio.api.errors import ApiError
from studio.api.request_bodies import check_json_body, read_body_in_time
from studio.api.video_jobs import VideoJobStore
from studio.server.throttle import FailedAttempts, LockedOut


class _Body(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")


class PauseBody(_Body):
    abort_running: pydantic.StrictBool = False


class ClearBody(_Body):
    include_running: pydantic.StrictBool = False


class MoveBody(_Body):
    before: str | None = pydantic.Field(default=None, max_length=64)


def add_queue_routes(router: fastapi.APIRouter, engine_: engine.EngineClient, config: HttpApiConfig, caller,
                     attempts: FailedAttempts, video_jobs: VideoJobStore) -> None:
    """`video_jobs`: the caller's video jobs, whose ids name their requests here too."""
    async def acting(request: Request, body_type: type[_Body] | None, act) -> Response:
        """Who calls, its JSON body checked, then `act(session, body)`, answered as JSON."""
        try:
            session = await caller(request)
            body = None
            if body_type is not None:
                check_json_body(request)
                raw = await read_body_in_time(request, config)
                try:
                    body = body_type.model_validate_json(raw or b"{}")
                except pydantic.ValidationError as error:
                    raise http_errors.from_validation_error(error) from None
            # In a worker thread: a pause is saved (a synced commit) before it is answered, and with
            # replicas each call waits for every replica's answer; neither may hold the event loop.
            return JSONResponse(await asyncio.to_thread(act, session, body))
        except ApiError as error:
            return error.to_response()
        except PermissionError:  # only when the request changed hands between our look and the engine's
            return ApiError(404, "that request is not one of yours.", code="request_not_found").to_response()
        except ValueError as error:
            return http_errors.invalid_value(str(error), None).to_response()

    @router.get("/v1/queue", name="stepstudio_queue")
    async def own_queue(request: Request) -> Response:
        return await acting(request, None, lambda session, _: _own_queue(engine_, session, video_jobs))

    @router.post("/v1/queue/pause", name="stepstudio_queue_pause")
    async def pause(request: Request) -> Response:
        return await acting(request, PauseBody, lambda session, body: queue_actions.pause_own_queue(
            engine_, session, body.abort_running))

    @router.post("/v1/queue/resume", name="stepstudio_queue_resume")
    async def resume(request: Request) -> Response:
        return await acting(request, _Body, lambda session, _: queue_actions.resume_own_queue(engine_, session))

    @router.post("/v1/queue/clear", name="stepstudio_queue_clear")
    async def clear(request: Request) -> Response:
        return await acting(request, ClearBody, lambda session, body: queue_actions.clear_own_queue(
            engine_, session, body.include_running))

    @router.post("/v1/queue/{request_id}/move", name="stepstudio_queue_move")
    async def move(request_id: str, request: Request) -> Response:
        def act(session: str, body: MoveBody) -> dict:
            ids = {}
            for name, value in (("request_id", request_id), ("before", body.before)):
                ids[name] = value if value is None else _request_of_video(video_jobs, value, session)
                if value is not None and not _is_own_request(engine_, ids[name], session):
                    raise _unknown_request(name, value)
            return {**queue_actions.move_own_request(engine_, session, ids["request_id"], ids["before"]),
                    "request_id": request_id}

        return await acting(request, MoveBody, act)

    async def admin(request: Request, act) -> Response:
        try:
            await _check_admin_key(request, config, attempts)
        except ApiError as error:
            return error.to_response()
        await asyncio.to_thread(act)  # saved, or sent to every replica, off the event loop
        return JSONResponse(_engine_queue(engine_))

    @router.get("/v1/admin/queue", name="stepstudio_admin_queue")
    async def admin_queue(request: Request) -> Response:
        return await admin(request, lambda: None)

    @router.post("/v1/admin/pause", name="stepstudio_admin_pause")
    async def admin_pause(request: Request) -> Response:
        return await admin(request, engine_.pause_engine)

    @router.post("/v1/admin/resume", name="stepstudio_admin_resume")
    async def admin_resume(request: Request) -> Response:
        return await admin(request, engine_.resume_engine)


def _own_queue(engine_: engine.EngineClient, session: str, video_jobs: VideoJobStore) -> dict:
    views = [view for view in engine_.snapshot().requests if view.session_id == session]
    videos = {job.handle.request_id: job.id for job in video_jobs.jobs_of(session) if job.handle is not None}
    requests = [{"request_id": v.request_id, "video_id": videos.get(v.request_id), "model": v.model,
                 "prompt": v.prompt, "state": v.state, "step": v.step, "total": v.total, "skipped": v.skipped,
                 "position": v.position, "paused": v.paused} for v in views]
    return {**queue_actions.queue_state(engine_, session), "requests": requests}


def _engine_queue(engine_: engine.EngineClient) -> dict:
    snapshot, state = engine_.snapshot(), engine_.pause_state
    return {"engine_paused": state.engine, "paused_sessions": len(state.sessions),
            "waiting": len(snapshot.waiting), "running": len(snapshot.running),
            "message": "paused: nothing new starts; running requests finish" if state.engine else "running"}


def _request_of_video(video_jobs: VideoJobStore, request_id: str, session: str) -> str:
    """The request of the caller's video job `request_id` names (a "video_..." id), else the id itself."""
    job = video_jobs.get(request_id, session) if request_id.startswith("video_") else None
    return job.handle.request_id if job is not None and job.handle is not None else request_id


def _is_own_request(engine_: engine.EngineClient, request_id: str, session: str) -> bool:
    # Another session's id is answered as a missing one: a caller learns nothing of others' requests.
    return any(v.request_id == request_id and v.session_id == session for v in engine_.snapshot().requests)


def _unknown_request(param: str, request_id: str) -> ApiError:
    return ApiError(404, f"{param}={request_id[:64]!r} is not one of your queued or running requests "
                         "(see GET /v1/queue).", param=param, code="request_not_found")


async def _check_admin_key(request: Request, config: HttpApiConfig, attempts: FailedAttempts) -> None:
    """404 when no admin key is configured; 401 for a missing or wrong one (slowed down per host,
    counted with the callers' wrong keys)."""
    if config.admin_key is None:
        raise ApiError(404, "the admin routes are off: start the studio with --admin-key KEY (or --admin-key-file "
                            "PATH) to pause and resume the engine over HTTP.", code="admin_disabled")
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    given = token.strip() if scheme.lower() == "bearer" else ""

    def check() -> bool:
        return secrets.compare_digest(given.encode(), config.admin_key.encode())

    try:
        if not await attempts.attempt(client_host(request), check):
            raise ApiError(401, "the admin key is required: send 'Authorization: Bearer <the --admin-key>'.",
                           code="invalid_admin_key")
    except LockedOut as locked:
        raise http_errors.too_many_failed_attempts(str(locked), max(1, round(locked.retry_after_s))) from None

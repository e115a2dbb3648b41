"""The HTTP API: OpenAI-compatible image generation, the model list, health and Prometheus metrics.

    POST /v1/images/generations      OpenAI Images request -> PNG images (b64_json or url)
    POST /v1/images/edits            OpenAI Images edit: a picture (and a mask) -> PNG images
                                     (studio.api.edit_routes)
    GET  /v1/images/files/{name}     the PNGs behind response_format="url" (expire after a while)
    /v1/videos[...]                  OpenAI Videos jobs: create, retrieve, list, content, delete
                                     (studio.api.video_routes)
    /v1/queue[...], /v1/admin/...    the caller's own queue (pause, resume, clear, move) and the
                                     operator's pause of the engine (studio.api.queue_routes)
    GET  /v1/models[/{model}]        every loaded model
    GET  /v1/openapi.json            this API's OpenAPI document
    GET  /healthz                    engine alive (details: queue depth, running requests)
    GET  /metrics                    Prometheus text of the engine's metrics
    any other /v1 path or method     404 / 405 in OpenAI's error shape

`build_router(engine)` returns a FastAPI router the studio's app includes. Every request body
must be JSON (or, where files are uploaded, a multipart form a program sent), is size-capped, must
arrive within a time limit, and is validated with strict types before the engine sees it; errors
come back in OpenAI's shape (see `studio.api.errors`). The `n` images of one call are `n` engine
requests submitted together (studio.api.image_results), so they share denoise forwards with each
other and with everyone else's; each is followed by a studio.tracker `RequestTracker`. With API
keys configured, every route but the image files and the health probe wants one, and wrong keys
are slowed down per host (studio.api.callers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import fastapi
import pydantic
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

import engine
from studio.api import errors as http_errors
from studio.api.callers import caller_session
from studio.api.config import HttpApiConfig
from studio.api.edit_routes import add_edit_routes
from studio.api.errors import ApiError
from studio.api.image_files import ImageFileStore
from studio.api.image_requests import ImageGenerationRequest
from studio.api.image_results import checked_n, images_response
from studio.api.queue_routes import add_queue_routes
from studio.api.request_bodies import check_json_body, parse_size, read_body_in_time, resolve_model
from studio.api.video_routes import VideoJobs, add_video_routes, video_jobs_for
from studio.server.throttle import FailedAttempts

if TYPE_CHECKING:
    from studio.outputs import OutputStore

__all__ = ["HttpApiConfig", "ImageGenerationRequest", "build_router"]


def url_images_for(config: HttpApiConfig, outputs: "OutputStore | None") -> ImageFileStore:
    """The `response_format="url"` images: files in <outputs>/url-images/ indexed in the studio's
    store when it saves its outputs (taken back from before a restart here), else in memory."""
    saving = outputs is not None and outputs.enabled
    images = ImageFileStore(
        max_files=config.image_store_max_files, max_bytes=config.image_store_max_bytes, ttl_s=config.image_ttl_s,
        max_files_per_owner=config.image_store_files_per_caller,
        folder=outputs.folder / "url-images" if saving else None, store=outputs.index if saving else None,
    )
    images.load()
    return images


def build_router(
    engine_: engine.EngineClient, config: HttpApiConfig | None = None, attempts: FailedAttempts | None = None,
    outputs: "OutputStore | None" = None, video_jobs: VideoJobs | None = None,
) -> fastapi.APIRouter:
    """The API's routes, bound to one running engine. `attempts` counts wrong keys per host
    (share one with the login page's guard, so both doors count the same guesses); `outputs`
    saves finished videos (None: they are only kept for download); `video_jobs`: where video jobs
    are kept (video_routes.video_jobs_for; None: in memory). The router's `video_jobs` is it."""
    config = config or HttpApiConfig()
    attempts = attempts or FailedAttempts(delay_s=config.failed_key_delay_s, max_failures=config.max_failed_keys)
    images = url_images_for(config, outputs)
    router = fastapi.APIRouter()

    async def caller(request: Request) -> str:
        """The engine session of this caller; checks its key when keys are configured."""
        return await caller_session(request, config, attempts)

    # The body is read and validated by hand (size cap, OpenAI-shaped errors); this documents it.
    body_schema = {"content": {"application/json": {"schema": ImageGenerationRequest.model_json_schema()}}}

    @router.post(
        "/v1/images/generations",
        name="stepstudio_images_generations",
        openapi_extra={"requestBody": {**body_schema, "required": True}},
    )
    async def images_generations(request: Request) -> Response:
        try:
            check_json_body(request)
            session = await caller(request)
            return await _generate_images(engine_, config, images, request, session)
        except ApiError as error:
            return error.to_response()

    @router.get("/v1/images/files/{name}", name="stepstudio_image_file")
    async def image_file(name: str) -> Response:
        # No key needed: the random name is the capability (it works in an <img src>).
        png = images.get(name)
        if png is None:
            return ApiError(
                404, f"image {name[:80]!r} does not exist or has expired (images are kept {config.image_ttl_s:g} s).",
                param="name", code="image_not_found",
            ).to_response()
        return Response(png, media_type="image/png", headers={"Cache-Control": "private, max-age=3600"})

    @router.get("/v1/models")
    async def list_models(request: Request) -> Response:
        try:
            await caller(request)
        except ApiError as error:
            return error.to_response()
        return JSONResponse({"object": "list", "data": [_model_card(name, info) for name, info in engine_.infos.items()]})

    @router.get("/v1/models/{model}")
    async def retrieve_model(model: str, request: Request) -> Response:
        try:
            await caller(request)
        except ApiError as error:
            return error.to_response()
        infos = engine_.infos
        if model not in infos:
            return http_errors.unknown_model(model[:256], tuple(infos)).to_response()
        return JSONResponse(_model_card(model, infos[model]))

    @router.get("/v1/openapi.json", include_in_schema=False)
    async def openapi(request: Request) -> Response:
        try:
            await caller(request)
        except ApiError as error:
            return error.to_response()
        return JSONResponse(request.app.openapi())

    @router.get("/healthz")
    async def healthz(request: Request) -> JSONResponse:
        """For probes: status and liveness to anyone; the details, with a key when keys are set."""
        alive = engine_.is_alive
        body: dict = {"status": "ok" if alive else "unavailable", "engine_alive": alive}
        if not config.api_keys or "authorization" in request.headers:
            try:
                await caller(request)
            except ApiError as error:
                return error.to_response()
            snapshot = engine_.snapshot()
            body.update(
                model=engine_.info.name, mode=engine_.mode, queue_depth=len(snapshot.waiting),
                running=len(snapshot.running), error=engine_.failure,
            )
        return JSONResponse(body, status_code=200 if alive else 503)

    @router.get("/metrics")
    async def metrics(request: Request) -> Response:
        try:
            await caller(request)
        except ApiError as error:
            return error.to_response()
        return Response(engine_.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    add_edit_routes(router, engine_, config, caller, images)
    video_jobs = video_jobs or video_jobs_for(config, outputs, None)
    router.video_jobs = video_jobs  # the restart's recovery resumes its unfinished jobs
    add_video_routes(router, engine_, config, caller, video_jobs)
    add_queue_routes(router, engine_, config, caller, attempts, video_jobs.store)
    known = list(router.routes)

    @router.api_route("/v1/{path:path}", methods=_ALL_METHODS, include_in_schema=False)
    async def unknown_v1_route(request: Request, path: str) -> Response:
        """Any other /v1 path or method: an answer in OpenAI's error shape, not Gradio's."""
        target = request.url.path
        allowed = sorted({m for route in known for m in route.methods if route.path_regex.match(target)})
        if allowed:
            error = ApiError(
                405, f"{request.method} is not allowed on {target[:200]}; use {', '.join(allowed)}.",
                code="method_not_allowed",
            )
            response = error.to_response()
            response.headers["Allow"] = ", ".join(allowed)
            return response
        return ApiError(404, f"Invalid URL ({request.method} {target[:200]}): see GET /v1/openapi.json.",
                        code="unknown_url").to_response()

    return router


_ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


# ---------------------------------------------------------------------- images.generations
async def _generate_images(
    engine_: engine.EngineClient, config: HttpApiConfig, images: ImageFileStore, request: Request, session: str
) -> Response:
    body = await read_body_in_time(request, config)
    try:
        ask = ImageGenerationRequest.model_validate_json(body)
    except pydantic.ValidationError as error:
        raise http_errors.from_validation_error(error) from None
    model = resolve_model(engine_, ask.model, "image", "/v1/images/generations")
    n = checked_n(engine_, config, ask.n)
    width, height = parse_size(ask.size)
    try:
        engine_.limits_for(model).check_values(ask.num_inference_steps, width, height)  # this server's ranges first
        params = ask.params(model, width, height)
    except ValueError as error:
        raise http_errors.from_engine_value_error(error) from None
    return await images_response(engine_, config, images, request, session, params, n, ask.response_format)


def _model_card(name: str, info) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "stepstudio", "family": info.family,
            "output_kind": info.output_kind, "loras": list(info.loras)}


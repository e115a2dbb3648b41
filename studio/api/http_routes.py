"""The HTTP API: OpenAI-compatible image generation, the model list, health and Prometheus metrics.

    POST /v1/images/generations      OpenAI Images request -> PNG images (b64_json or url)
    GET  /v1/images/files/{name}     the PNGs behind response_format="url" (expire after a while)
    /v1/videos[...]                  OpenAI Videos jobs: create, retrieve, list, content, delete
                                     (studio.api.video_routes)
    GET  /v1/models[/{model}]        every loaded model
    GET  /v1/openapi.json            this API's OpenAPI document
    GET  /healthz                    engine alive (details: queue depth, running requests)
    GET  /metrics                    Prometheus text of the engine's metrics
    any other /v1 path or method     404 / 405 in OpenAI's error shape

`build_router(engine)` returns a FastAPI router the studio's app includes. Every request body
must be JSON, is size-capped, must arrive within a time limit, and is validated with strict
types before the engine sees it; errors come back in OpenAI's shape (see `studio.api.errors`).
The `n` images of one call are `n` engine requests submitted together, so they share denoise
forwards with each other and with everyone else's; each is followed by a studio.tracker
`RequestTracker`. With API keys configured, every route but the image files and the health
probe wants one, and wrong keys are slowed down per host (studio.api.callers).
"""

from __future__ import annotations

import asyncio
import base64
import io
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Literal

import fastapi
import pydantic
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

import engine
from pipelines.params import MAX_PROMPT_CHARS, MAX_SEED
from studio.api import errors as http_errors
from studio.api.callers import caller_session
from studio.api.config import HttpApiConfig
from studio.api.errors import ApiError
from studio.api.image_files import ImageFileStore
from studio.api.request_bodies import check_json_body, parse_size, read_body_in_time, resolve_model
from studio.api.video_routes import add_video_routes
from studio.server.throttle import FailedAttempts
from studio.tracker import ABORTED, COMPLETED, FAILED, RequestTracker, Status

if TYPE_CHECKING:
    from PIL import Image

    from studio.outputs import OutputStore

__all__ = ["HttpApiConfig", "ImageGenerationRequest", "build_router"]


class ImageGenerationRequest(pydantic.BaseModel):
    """OpenAI's `images.generate` body plus the diffusion controls it lacks."""

    model_config = pydantic.ConfigDict(strict=True, extra="forbid")

    prompt: str = pydantic.Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    model: str | None = pydantic.Field(default=None, max_length=256)
    n: int | None = pydantic.Field(default=None, ge=1)  # the upper bound is the server's config
    size: str | None = pydantic.Field(default=None, max_length=32)  # "WIDTHxHEIGHT" or "auto"
    response_format: Literal["b64_json", "url"] | None = None
    output_format: Literal["png"] | None = None
    # OpenAI fields this server can't honour: accepted (common clients always send some of them)
    # and ignored. Images are always PNG at the requested size; `user` is not used for anything.
    user: str | None = pydantic.Field(default=None, max_length=256)
    quality: str | None = pydantic.Field(default=None, max_length=32)
    style: str | None = pydantic.Field(default=None, max_length=32)
    background: str | None = pydantic.Field(default=None, max_length=32)
    moderation: str | None = pydantic.Field(default=None, max_length=32)
    output_compression: int | None = pydantic.Field(default=None, ge=0, le=100)
    # Extensions (send them with the openai client's `extra_body=`).
    negative_prompt: str | None = pydantic.Field(default=None, max_length=MAX_PROMPT_CHARS)
    num_inference_steps: int | None = None  # checked against the server's range, which it names
    guidance_scale: float | None = pydantic.Field(default=None, ge=0.0, le=100.0, allow_inf_nan=False)
    seed: int | None = pydantic.Field(default=None, ge=0, le=MAX_SEED)


def build_router(
    engine_: engine.EngineClient, config: HttpApiConfig | None = None, attempts: FailedAttempts | None = None,
    outputs: "OutputStore | None" = None,
) -> fastapi.APIRouter:
    """The API's routes, bound to one running engine. `attempts` counts wrong keys per host
    (share one with the login page's guard, so both doors count the same guesses); `outputs`
    saves finished videos (None: they are only kept for download)."""
    config = config or HttpApiConfig()
    attempts = attempts or FailedAttempts(delay_s=config.failed_key_delay_s, max_failures=config.max_failed_keys)
    images = ImageFileStore(
        max_files=config.image_store_max_files, max_bytes=config.image_store_max_bytes, ttl_s=config.image_ttl_s,
        max_files_per_owner=config.image_store_files_per_caller,
    )
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

    add_video_routes(router, engine_, config, caller, outputs)
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
    n = 1 if ask.n is None else ask.n
    # One caller can never have more images in flight than its session limit allows.
    max_n = min(config.max_images_per_request, engine_.limits.max_per_session)
    if n > max_n:
        raise http_errors.invalid_value(f"n={n} is above this server's limit: allowed is 1..{max_n}.", "n")
    width, height = parse_size(ask.size)
    try:
        engine_.limits_for(model).check_values(ask.num_inference_steps, width, height)  # this server's ranges first
        params = engine.GenerationParams(
            prompt=ask.prompt,
            negative_prompt=ask.negative_prompt,
            width=width,
            height=height,
            num_inference_steps=ask.num_inference_steps,
            guidance_scale=ask.guidance_scale,
            seed=ask.seed,
            model=model,
        )
    except ValueError as error:
        raise http_errors.from_engine_value_error(error) from None

    trackers = _submit_all(engine_, params, n, session)
    finals = await _wait_unless_disconnected(request, trackers)
    if finals is None:  # the client left; nobody reads this
        return Response(status_code=499)
    for final in finals:
        if final.state == FAILED:
            raise http_errors.generation_failed(final.message, engine_failed=final.is_engine_failure)
        if final.state == ABORTED:
            if final.is_shutdown:
                raise http_errors.shutting_down(final.message)
            raise http_errors.generation_aborted(final.message)

    data = []
    for final in finals:
        png = await asyncio.to_thread(_png_bytes, final.result.images[0])  # encoding must not stall the event loop
        item: dict = {"seed": final.result.seed, "revised_prompt": None}
        if ask.response_format == "url":
            item["url"] = _image_url(request, config, images.put(png, owner=session))
        else:
            item["b64_json"] = base64.b64encode(png).decode("ascii")
        data.append(item)
    return JSONResponse({"created": int(time.time()), "data": data, "output_format": "png"})


def _submit_all(
    engine_: engine.EngineClient, params: engine.GenerationParams, n: int, session_id: str
) -> list[RequestTracker]:
    """Submit the n images back to back (seeds seed, seed+1, ...); all or none are queued."""
    trackers: list[RequestTracker] = []
    try:
        for index in range(n):
            # The first submission fills in the model defaults and draws the seed if none was given.
            first = trackers[0].handle if trackers else None
            this = params if first is None else replace(first.params, seed=first.seed + index)
            trackers.append(RequestTracker(engine_.submit(this, session_id=session_id)))
    except (ValueError, engine.AdmissionError) as error:
        for tracker in trackers:
            tracker.cancel()  # the call fails whole
        if isinstance(error, ValueError):
            raise http_errors.from_engine_value_error(error) from None
        raise http_errors.from_admission_error(error) from None
    return trackers


async def _client_disconnected(request: Request) -> None:
    """Returns when the HTTP client goes away (the body is already read, so only a
    disconnect message can arrive): no polling."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _wait_unless_disconnected(request: Request, trackers: list[RequestTracker]) -> list[Status] | None:
    """The final status of every request, in order; None when the client disconnected first.

    Whatever ends the wait early (a disconnect, a failed image, this task being cancelled)
    cancels the requests still in flight (their trackers ask the engine)."""
    waits = {asyncio.ensure_future(tracker.final()): i for i, tracker in enumerate(trackers)}
    disconnected = asyncio.ensure_future(_client_disconnected(request))
    finals: list[Status | None] = [None] * len(trackers)
    try:
        while waits:
            done, _ = await asyncio.wait([*waits, disconnected], return_when=asyncio.FIRST_COMPLETED)
            if disconnected in done:
                return None
            for task in done:
                finals[waits.pop(task)] = task.result()
            if any(final is not None and final.state != COMPLETED for final in finals):
                break  # one image failed: the call fails, so the others would be wasted work
        return finals
    finally:
        disconnected.cancel()
        for task in waits:
            task.cancel()
        for tracker in trackers:
            tracker.cancel()  # now, not when the cancelled waits next run; a no-op for ended ones


def _png_bytes(image: "Image.Image") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _image_url(request: Request, config: HttpApiConfig, name: str) -> str:
    if config.public_base_url:
        return f"{config.public_base_url.rstrip('/')}/v1/images/files/{name}"
    return str(request.url_for("stepstudio_image_file", name=name))


def _model_card(name: str, info) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "stepstudio", "family": info.family,
            "output_kind": info.output_kind}


"""The HTTP API: OpenAI-compatible image generation, the model list, health and Prometheus metrics.

    POST /v1/images/generations      OpenAI Images request -> PNG images (b64_json or url)
    GET  /v1/images/files/{name}     the PNGs behind response_format="url" (expire after a while)
    GET  /v1/models[/{model}]        the loaded model
    GET  /healthz                    engine alive, queue depth, running requests
    GET  /metrics                    Prometheus text of the engine's metrics

`build_router(engine)` returns a FastAPI router the studio's app includes. Every request body
is size-capped and validated with strict types before the engine sees it; errors come back in
OpenAI's shape (see `studio.http_errors`). The `n` images of one call are `n` engine requests
submitted together, so they share denoise forwards with each other and with everyone else's.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import re
import secrets
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

import fastapi
import pydantic
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

import engine
from pipelines.params import MAX_PROMPT_CHARS, MAX_SEED, MAX_STEPS_ABSOLUTE
from studio import http_errors
from studio.http_errors import ApiError
from studio.image_files import ImageFileStore

if TYPE_CHECKING:
    from PIL import Image

_SIZE = re.compile(r"^(\d{1,5})x(\d{1,5})$")


@dataclass(frozen=True)
class HttpApiConfig:
    max_images_per_request: int = 8  # the largest `n`
    max_body_bytes: int = 64 * 1024  # a request body is a few prompts and numbers
    image_ttl_s: float = 3600.0  # how long a response_format="url" image stays fetchable
    image_store_max_files: int = 256
    image_store_max_bytes: int = 256 * 2**20
    # Base of the image URLs when the server sits behind a proxy (default: the request's own).
    public_base_url: str | None = None
    # When set, /v1/ routes require "Authorization: Bearer <one of these>" (401 otherwise).
    # Unset, a bearer token only names the caller's session.
    api_keys: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for name in ("max_images_per_request", "max_body_bytes", "image_store_max_files", "image_store_max_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if not self.image_ttl_s > 0:
            raise ValueError(f"image_ttl_s must be positive, got {self.image_ttl_s!r}.")
        if isinstance(self.api_keys, str) or not all(isinstance(k, str) and k for k in self.api_keys):
            raise ValueError("api_keys must be a set of non-empty strings (a single key goes in a set too).")


class ImageGenerationRequest(pydantic.BaseModel):
    """OpenAI's `images.generate` body plus the diffusion controls it lacks."""

    model_config = pydantic.ConfigDict(strict=True, extra="forbid")

    prompt: str = pydantic.Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    model: str | None = pydantic.Field(default=None, max_length=256)
    n: int | None = pydantic.Field(default=None, ge=1)  # the upper bound is the server's config
    size: str | None = pydantic.Field(default=None, max_length=32)  # "WIDTHxHEIGHT" or "auto"
    response_format: Literal["b64_json", "url"] | None = None
    output_format: Literal["png"] | None = None
    user: str | None = pydantic.Field(default=None, max_length=256)  # accepted for compatibility, unused
    # Extensions (send them with the openai client's `extra_body=`).
    negative_prompt: str | None = pydantic.Field(default=None, max_length=MAX_PROMPT_CHARS)
    num_inference_steps: int | None = pydantic.Field(default=None, ge=1, le=MAX_STEPS_ABSOLUTE)
    guidance_scale: float | None = pydantic.Field(default=None, ge=0.0, le=100.0, allow_inf_nan=False)
    seed: int | None = pydantic.Field(default=None, ge=0, le=MAX_SEED)


def build_router(engine_: engine.Engine, config: HttpApiConfig | None = None) -> fastapi.APIRouter:
    """The API's routes, bound to one running engine."""
    config = config or HttpApiConfig()
    images = ImageFileStore(
        max_files=config.image_store_max_files, max_bytes=config.image_store_max_bytes, ttl_s=config.image_ttl_s
    )
    router = fastapi.APIRouter()

    # The body is read and validated by hand (size cap, OpenAI-shaped errors); this documents it.
    body_schema = {"content": {"application/json": {"schema": ImageGenerationRequest.model_json_schema()}}}

    @router.post(
        "/v1/images/generations",
        name="stepstudio_images_generations",
        openapi_extra={"requestBody": {**body_schema, "required": True}},
    )
    async def images_generations(request: Request) -> Response:
        try:
            _check_api_key(request, config.api_keys)
            return await _generate_images(engine_, config, images, request)
        except ApiError as error:
            return error.to_response()

    @router.get("/v1/images/files/{name}", name="stepstudio_image_file")
    async def image_file(name: str) -> Response:
        # No key needed: the random name is the capability (it works in an <img src>).
        png = images.get(name)
        if png is None:
            return ApiError(
                404, f"image {name!r} does not exist or has expired (images are kept {config.image_ttl_s:g} s).",
                param="name", code="image_not_found",
            ).to_response()
        return Response(png, media_type="image/png", headers={"Cache-Control": "private, max-age=3600"})

    @router.get("/v1/models")
    async def list_models(request: Request) -> Response:
        try:
            _check_api_key(request, config.api_keys)
        except ApiError as error:
            return error.to_response()
        return JSONResponse({"object": "list", "data": [_model_card(engine_)]})

    @router.get("/v1/models/{model}")
    async def retrieve_model(model: str, request: Request) -> Response:
        try:
            _check_api_key(request, config.api_keys)
        except ApiError as error:
            return error.to_response()
        if model != engine_.info.name:
            return http_errors.unknown_model(model, engine_.info.name).to_response()
        return JSONResponse(_model_card(engine_))

    @router.get("/healthz")
    async def healthz() -> JSONResponse:
        snapshot = engine_.snapshot()
        alive = engine_.is_alive
        body = {
            "status": "ok" if alive else "unavailable",
            "engine_alive": alive,
            "model": engine_.info.name,
            "mode": engine_.mode,
            "queue_depth": len(snapshot.waiting),
            "running": len(snapshot.running),
        }
        return JSONResponse(body, status_code=200 if alive else 503)

    @router.get("/metrics")
    async def metrics() -> Response:
        return Response(engine_.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    return router


# ---------------------------------------------------------------------- images.generations
async def _generate_images(
    engine_: engine.Engine, config: HttpApiConfig, images: ImageFileStore, request: Request
) -> Response:
    body = await _read_body(request, config.max_body_bytes)
    try:
        ask = ImageGenerationRequest.model_validate_json(body)
    except pydantic.ValidationError as error:
        raise http_errors.from_validation_error(error) from None
    info = engine_.info
    if ask.model is not None and ask.model != info.name:
        raise http_errors.unknown_model(ask.model, info.name)
    if info.output_kind != "image":
        raise http_errors.invalid_value(
            f"model {info.name!r} makes {info.output_kind}s; /v1/images/generations only serves image models.",
            "model", code="unsupported_model",
        )
    n = 1 if ask.n is None else ask.n
    # One caller can never have more images in flight than its session limit allows.
    max_n = min(config.max_images_per_request, engine_.limits.max_per_session)
    if n > max_n:
        raise http_errors.invalid_value(f"n={n} is above this server's limit: allowed is 1..{max_n}.", "n")
    width, height = _parse_size(ask.size)
    try:
        params = engine.GenerationParams(
            prompt=ask.prompt,
            negative_prompt=ask.negative_prompt,
            width=width,
            height=height,
            num_inference_steps=ask.num_inference_steps,
            guidance_scale=ask.guidance_scale,
            seed=ask.seed,
        )
    except ValueError as error:
        raise http_errors.from_engine_value_error(error) from None

    handles = _submit_all(engine_, params, n, _session_id(request))
    finals = await _wait_unless_disconnected(request, handles)
    if finals is None:  # the client left; nobody reads this
        return Response(status_code=499)
    for final in finals:
        if isinstance(final, engine.Failed):
            raise http_errors.generation_failed(final.message)
        if isinstance(final, engine.Aborted):
            raise http_errors.generation_aborted(final.reason)

    data = []
    for final in finals:
        png = await asyncio.to_thread(_png_bytes, final.images[0])  # encoding must not stall the event loop
        item: dict = {"seed": final.seed, "revised_prompt": None}
        if ask.response_format == "url":
            item["url"] = _image_url(request, config, images.put(png))
        else:
            item["b64_json"] = base64.b64encode(png).decode("ascii")
        data.append(item)
    return JSONResponse({"created": int(time.time()), "data": data, "output_format": "png"})


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 once it passes `limit` bytes (never buffered beyond it)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise http_errors.body_too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise http_errors.body_too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _parse_size(size: str | None) -> tuple[int | None, int | None]:
    if size is None or size == "auto":
        return None, None
    match = _SIZE.match(size)
    if match is None:
        raise http_errors.invalid_value(
            f"size={size!r} is not a size: use 'WIDTHxHEIGHT' in pixels, e.g. '512x512', or 'auto'.", "size"
        )
    return int(match.group(1)), int(match.group(2))


def _bearer_token(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def _check_api_key(request: Request, api_keys: frozenset[str]) -> None:
    if not api_keys:
        return
    token = _bearer_token(request)
    # Compare against every key in constant time: no early exit that leaks which prefix matched.
    matches = [secrets.compare_digest(token.encode(), key.encode()) for key in api_keys] if token else []
    if not any(matches):
        raise http_errors.invalid_api_key()


def _session_id(request: Request) -> str:
    """Who the engine's per-session limits and fairness apply to: the API key, else the host."""
    token = _bearer_token(request)
    if token is not None:
        # Hashed: session ids show in the studio's queue view, API keys must not.
        return "http:key-" + hashlib.sha256(token.encode()).hexdigest()[:16]
    host = request.client.host if request.client else "unknown"
    return f"http:{host}"


def _submit_all(
    engine_: engine.Engine, params: engine.GenerationParams, n: int, session_id: str
) -> list[engine.RequestHandle]:
    """Submit the n images back to back (seeds seed, seed+1, ...); all or none are queued."""
    handles: list[engine.RequestHandle] = []
    try:
        for index in range(n):
            # The first submission fills in the model defaults and draws the seed if none was given.
            this = params if not handles else replace(handles[0].params, seed=handles[0].seed + index)
            handles.append(engine_.submit(this, session_id=session_id))
    except ValueError as error:
        _cancel_all(handles)
        raise http_errors.from_engine_value_error(error) from None
    except engine.AdmissionError as error:
        _cancel_all(handles)
        raise http_errors.from_admission_error(error) from None
    return handles


def _cancel_all(handles: list[engine.RequestHandle]) -> None:
    for handle in handles:
        handle.cancel()  # a no-op for requests that already ended


async def _final_event(handle: engine.RequestHandle) -> engine.Event:
    final = None
    async for final in handle.stream():
        pass
    return final


async def _client_disconnected(request: Request) -> None:
    """Returns when the HTTP client goes away (the body is already read, so only a
    disconnect message can arrive): no polling."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _wait_unless_disconnected(
    request: Request, handles: list[engine.RequestHandle]
) -> list[engine.Event] | None:
    """The final event of every handle, in order; None when the client disconnected first.

    Whatever ends the wait early (a disconnect, a failed image, this task being cancelled)
    aborts the requests still in flight at the engine's next step boundary."""
    waits = {asyncio.ensure_future(_final_event(handle)): i for i, handle in enumerate(handles)}
    disconnected = asyncio.ensure_future(_client_disconnected(request))
    finals: list[engine.Event | None] = [None] * len(handles)
    try:
        while waits:
            done, _ = await asyncio.wait([*waits, disconnected], return_when=asyncio.FIRST_COMPLETED)
            if disconnected in done:
                return None
            for task in done:
                finals[waits.pop(task)] = task.result()
            if any(final is not None and not isinstance(final, engine.Completed) for final in finals):
                break  # one image failed: the call fails, so the others would be wasted work
        return finals
    finally:
        disconnected.cancel()
        for task in waits:
            task.cancel()
        _cancel_all([handle for handle, final in zip(handles, finals) if final is None])


def _png_bytes(image: "Image.Image") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _image_url(request: Request, config: HttpApiConfig, name: str) -> str:
    if config.public_base_url:
        return f"{config.public_base_url.rstrip('/')}/v1/images/files/{name}"
    return str(request.url_for("stepstudio_image_file", name=name))


def _model_card(engine_: engine.Engine) -> dict:
    info = engine_.info
    return {"id": info.name, "object": "model", "created": 0, "owned_by": "stepstudio", "family": info.family}

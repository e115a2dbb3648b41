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
forwards with each other and with everyone else's. With API keys configured, every route but
the image files and the health probe wants one, and wrong keys are slowed down per host.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import math
import re
import secrets
import time
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal, Mapping

import fastapi
import pydantic
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import ClientDisconnect

import engine
from pipelines.params import MAX_PROMPT_CHARS, MAX_SEED
from studio.api import errors as http_errors
from studio.api.errors import ApiError
from studio.api.image_files import ImageFileStore
from studio.server.throttle import FailedAttempts, LockedOut

if TYPE_CHECKING:
    from PIL import Image

    from studio.outputs import OutputStore

_SIZE = re.compile(r"^(\d{1,5})x(\d{1,5})$")
_KEY_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


@dataclass(frozen=True)
class HttpApiConfig:
    max_images_per_request: int = 8  # the largest `n`
    max_body_bytes: int = 64 * 1024  # a request body is a few prompts and numbers
    body_timeout_s: float = 10.0  # a body that has not fully arrived by then is refused (408)
    image_ttl_s: float = 3600.0  # how long a response_format="url" image stays fetchable
    image_store_max_files: int = 256
    image_store_max_bytes: int = 256 * 2**20
    image_store_files_per_caller: int = 32  # one caller can't push the others' images out
    # Base of the image URLs when the server sits behind a proxy (default: the request's own).
    public_base_url: str | None = None
    # API keys by caller name, e.g. {"alice": "sk-..."} (a set of keys works too; each is then
    # named by a short hash of itself). When given, /v1/ routes, /metrics and /v1/openapi.json
    # require "Authorization: Bearer <key>" (401 otherwise) and each key is its own session,
    # "http:key:<name>". Without keys the API is open and every caller from one host is one
    # session, "http:host:<address>" (a bearer token names nothing: anyone could make one up).
    api_keys: Mapping[str, str] | frozenset[str] = field(default_factory=dict)
    # Wrong keys, per client host: each costs this long, and this many in a minute lock the
    # host out for a minute (429).
    failed_key_delay_s: float = 1.0
    max_failed_keys: int = 10
    # /v1/videos jobs (studio.api.video_jobs): a finished video stays downloadable this long; the
    # store holds at most this many jobs and bytes, one caller at most video_jobs_per_caller.
    video_ttl_s: float = 3600.0
    video_store_max_jobs: int = 128
    video_store_max_bytes: int = 256 * 2**20
    video_jobs_per_caller: int = 16
    video_poll_after_ms: int = 250  # what retrieve tells the openai client's poll loop to wait

    def __post_init__(self) -> None:
        for name in (
            "max_images_per_request", "max_body_bytes", "image_store_max_files", "image_store_max_bytes",
            "image_store_files_per_caller", "max_failed_keys", "video_store_max_jobs", "video_store_max_bytes",
            "video_jobs_per_caller", "video_poll_after_ms",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        for name in ("image_ttl_s", "body_timeout_s", "video_ttl_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}.")
        if not self.failed_key_delay_s >= 0:
            raise ValueError(f"failed_key_delay_s must be >= 0, got {self.failed_key_delay_s!r}.")
        object.__setattr__(self, "api_keys", MappingProxyType(_named_keys(self.api_keys)))


def _named_keys(api_keys: Mapping[str, str] | frozenset[str]) -> dict[str, str]:
    """{name: key}, checked: names are short words, keys non-empty and distinct."""
    if isinstance(api_keys, str):
        raise ValueError("api_keys must be a {name: key} mapping or a set of keys, not one string.")
    if not isinstance(api_keys, Mapping):
        if not all(isinstance(key, str) and key for key in api_keys):
            raise ValueError("api_keys must hold non-empty strings.")
        api_keys = {"key-" + hashlib.sha256(key.encode()).hexdigest()[:12]: key for key in api_keys}
    named = dict(api_keys)
    for name, key in named.items():
        if not isinstance(name, str) or not _KEY_NAME.fullmatch(name):
            raise ValueError(f"API key name {name!r} is not allowed: use 1-64 letters, digits, '.', '_' or '-'.")
        if not isinstance(key, str) or not key:
            raise ValueError(f"the API key of {name!r} must be a non-empty string.")
    if len(set(named.values())) != len(named):
        raise ValueError("two API key names share one key: give every caller its own key.")
    return named


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
    engine_: engine.Engine, config: HttpApiConfig | None = None, attempts: FailedAttempts | None = None,
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
        return _session_id(request, await _key_name(request, config, attempts))

    # The body is read and validated by hand (size cap, OpenAI-shaped errors); this documents it.
    body_schema = {"content": {"application/json": {"schema": ImageGenerationRequest.model_json_schema()}}}

    @router.post(
        "/v1/images/generations",
        name="stepstudio_images_generations",
        openapi_extra={"requestBody": {**body_schema, "required": True}},
    )
    async def images_generations(request: Request) -> Response:
        try:
            _check_json_body(request)
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

    from studio.api.video_routes import (
        add_video_routes,  # here: video_api imports this module's helpers
    )

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
    engine_: engine.Engine, config: HttpApiConfig, images: ImageFileStore, request: Request, session: str
) -> Response:
    body = await _read_body_in_time(request, config)
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
    width, height = _parse_size(ask.size)
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

    handles = _submit_all(engine_, params, n, session)
    finals = await _wait_unless_disconnected(request, handles)
    if finals is None:  # the client left; nobody reads this
        return Response(status_code=499)
    for final in finals:
        if isinstance(final, engine.Failed):
            raise http_errors.generation_failed(final.message, engine_failed=final.stage == "engine")
        if isinstance(final, engine.Aborted):
            if final.cause == "shutdown":
                raise http_errors.shutting_down(final.reason)
            raise http_errors.generation_aborted(final.reason)

    data = []
    for final in finals:
        png = await asyncio.to_thread(_png_bytes, final.images[0])  # encoding must not stall the event loop
        item: dict = {"seed": final.seed, "revised_prompt": None}
        if ask.response_format == "url":
            item["url"] = _image_url(request, config, images.put(png, owner=session))
        else:
            item["b64_json"] = base64.b64encode(png).decode("ascii")
        data.append(item)
    return JSONResponse({"created": int(time.time()), "data": data, "output_format": "png"})


async def _read_body_in_time(request: Request, config: HttpApiConfig) -> bytes:
    """The body, within the size limit (413) and the time limit (408)."""
    try:
        return await asyncio.wait_for(_read_body(request, config.max_body_bytes), config.body_timeout_s)
    except asyncio.TimeoutError:
        raise http_errors.body_timeout(config.body_timeout_s) from None


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 once it passes `limit` bytes (never buffered beyond it)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise http_errors.body_too_large(limit)
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise http_errors.body_too_large(limit)
            chunks.append(chunk)
    except ClientDisconnect:  # the caller hung up mid-body: nobody to answer, nothing to log
        raise http_errors.body_cut_short() from None
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


def _check_json_body(request: Request) -> None:
    """Only JSON bodies: a web page can send text/plain or a form to any site without asking
    (no CORS preflight), so accepting those would let any page start generations here."""
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        raise http_errors.unsupported_media_type(media)


async def _key_name(request: Request, config: HttpApiConfig, attempts: FailedAttempts) -> str | None:
    """The name of the caller's API key; None when the API needs no key. A wrong key costs
    the caller's host a delay (and, repeated, a lockout): see studio.server.throttle."""
    if not config.api_keys:
        return None
    token = _bearer_token(request)
    found: list[str] = []

    def check() -> bool:
        # Compare against every key in constant time: no early exit that leaks which prefix matched.
        given = (token or "").encode()
        matches = [name for name, key in config.api_keys.items() if secrets.compare_digest(given, key.encode())]
        found.extend(matches)
        return token is not None and bool(matches)

    try:
        if not await attempts.attempt(_client_host(request), check):
            raise http_errors.invalid_api_key()
    except LockedOut as locked:
        raise http_errors.too_many_failed_attempts(str(locked), math.ceil(locked.retry_after_s)) from None
    return found[0]


def _client_host(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def _session_id(request: Request, key_name: str | None) -> str:
    """Who the engine's per-session limits and fairness apply to: the API key's name when keys
    are configured, else the caller's host. Never a string the caller chooses freely, and never
    one of the studio page's sessions (those start with "ui:")."""
    if key_name is not None:
        return f"http:key:{key_name}"
    return f"http:host:{_client_host(request)}"


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


def _model_card(name: str, info) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "stepstudio", "family": info.family,
            "output_kind": info.output_kind}


def resolve_model(engine_: engine.Engine, requested: str | None, kind: str, route: str) -> str:
    """The loaded model a request of `route` goes to: the one named (404 when it is not loaded,
    400 when it makes the other kind of media), else the first loaded model of `kind`."""
    infos = engine_.infos
    of_kind = [name for name, info in infos.items() if info.output_kind == kind]
    if requested is not None and requested not in infos:
        raise http_errors.unknown_model(requested, tuple(infos))
    if requested is not None and requested in of_kind:
        return requested
    if requested is None and of_kind:
        return of_kind[0]
    others = ", ".join(f"{name} ({info.output_kind})" for name, info in infos.items())
    allowed = f"use one of: {', '.join(of_kind)}" if of_kind else f"none of the loaded models does ({others})"
    what = f"model {requested!r} makes {infos[requested].output_kind}s" if requested else f"no {kind} model is loaded"
    raise http_errors.invalid_value(f"{what}; {route} serves {kind} models: {allowed}.", "model",
                                    code="unsupported_model")

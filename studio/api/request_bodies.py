"""Reading what an HTTP API request asks for: its body (JSON only, size- and time-capped), its
size ("WIDTHxHEIGHT") and the loaded model it goes to. Errors come back in OpenAI's shape."""

from __future__ import annotations

import asyncio
import re

from fastapi import Request
from starlette.requests import ClientDisconnect

import engine
from studio.api import errors as http_errors
from studio.api.config import HttpApiConfig

_SIZE = re.compile(r"^(\d{1,5})x(\d{1,5})$")


def is_json_media(media: str) -> bool:
    """`media`: a Content-Type without its parameters, lower case."""
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def check_json_body(request: Request) -> None:
    """Only JSON bodies: a web page can send text/plain or a form to any site without asking
    (no CORS preflight), so accepting those would let any page start generations here."""
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if not is_json_media(media):
        raise http_errors.unsupported_media_type(media)


async def read_body_in_time(request: Request, config: HttpApiConfig) -> bytes:
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


def parse_size(size: str | None) -> tuple[int | None, int | None]:
    if size is None or size == "auto":
        return None, None
    match = _SIZE.match(size)
    if match is None:
        raise http_errors.invalid_value(
            f"size={size!r} is not a size: use 'WIDTHxHEIGHT' in pixels, e.g. '512x512', or 'auto'.", "size"
        )
    return int(match.group(1)), int(match.group(2))


def resolve_model(engine_: engine.EngineClient, requested: str | None, kind: str, route: str) -> str:
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

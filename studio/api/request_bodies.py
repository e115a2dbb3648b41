"""Reading what an HTTP API request asks for: its body (size- and time-capped; JSON, or a
multipart form a program sent), its size ("WIDTHxHEIGHT") and the loaded model it goes to.
Errors come back in OpenAI's shape."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from typing import Literal

from fastapi import Request
from starlette.datastructures import Headers, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
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


def body_kind(request: Request, json_too: bool = True) -> Literal["form", "json"]:
    """multipart/form-data (as the openai client sends uploads) or, when `json_too`, JSON. A
    browser page on another site can post a multipart form here without asking (no CORS
    preflight); browsers say where a request comes from (Sec-Fetch-Site, Origin), and such a form
    is refused. A program (the openai client, curl) sends neither header, or its own origin."""
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media == "multipart/form-data":
        origin = request.headers.get("origin")
        own = f"{request.url.scheme}://{request.headers.get('host', '')}"
        if request.headers.get("sec-fetch-site") in ("cross-site", "same-site") or origin not in (None, own):
            raise http_errors.ApiError(
                403, "a form posted from another web site is refused: send the request from a program "
                     f"(e.g. the openai client){' or as JSON' if json_too else ''}.", code="cross_site_request")
        return "form"
    if json_too and is_json_media(media):
        return "json"
    shown = repr(media[:100]) if media else "none"
    allowed = "multipart/form-data (as the openai client does)" + (" or application/json" if json_too else "")
    raise http_errors.ApiError(415, f"Content-Type {shown} is not accepted: send {allowed}.",
                               code="unsupported_media_type")


async def read_body_in_time(request: Request, config: HttpApiConfig, upload: bool = False) -> bytes:
    """The body, within the size limit (413) and the time limit (408). `upload`: a body that
    carries pictures, held to `config.max_upload_body_bytes` instead of the text routes' limit."""
    if upload:
        limit = config.max_upload_body_bytes
        too_large = http_errors.body_too_large(limit, f"pictures are limited to {config.max_upload_bytes} bytes each")
    else:
        limit = config.max_body_bytes
        too_large = http_errors.body_too_large(limit)
    try:
        return await asyncio.wait_for(_read_body(request, limit, too_large), config.body_timeout_s)
    except asyncio.TimeoutError:
        raise http_errors.body_timeout(config.body_timeout_s) from None


async def _read_body(request: Request, limit: int, too_large: http_errors.ApiError) -> bytes:
    """The body, refused with 413 once it passes `limit` bytes (never buffered beyond it)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
    except ClientDisconnect:  # the caller hung up mid-body: nobody to answer, nothing to log
        raise http_errors.body_cut_short() from None
    return b"".join(chunks)


@dataclasses.dataclass(frozen=True)
class FormBody:
    """A multipart body: its text fields (each given once) and its files' bytes by field name."""

    fields: dict[str, str]
    files: dict[str, list[bytes]]
    # Fields of a list of objects, in order, as the openai client sends them (`loras[][name]`).
    repeated: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    def with_lists(self, name: str) -> dict:
        """The text fields, with `name` a list of objects: from its JSON text (`loras='[...]'`),
        or from the client's `name[][key]` fields (each object gives every key once, in order)."""
        values: dict = dict(self.fields)
        if name in values:
            try:
                values[name] = json.loads(values[name])
            except ValueError:
                raise http_errors.invalid_value(f"{name} must be a JSON list of objects, e.g. "
                                                '[{"name": "outline", "scale": 1}].', name) from None
        prefix = f"{name}[]["
        keys = {key[len(prefix):-1]: items for key, items in self.repeated.items() if key.startswith(prefix)}
        if keys:
            counts = {len(items) for items in keys.values()}
            if len(counts) != 1 or name in values:
                raise http_errors.invalid_value(f"{name}: give every object each of {', '.join(keys)} once.", name)
            values[name] = [dict(zip(keys, row)) for row in zip(*keys.values())]
        return values


async def read_form(body: bytes, headers: Headers, max_files: int) -> FormBody:
    """Parse a multipart body already read (and size-capped) by `read_body_in_time`."""
    async def stream():
        yield body

    try:
        form = await MultiPartParser(headers, stream(), max_files=max_files, max_fields=64).parse()
    except MultiPartException as error:
        raise http_errors.invalid_value(f"the multipart body could not be read: {error}.", None,
                                        code="invalid_body") from None
    fields: dict[str, str] = {}
    files: dict[str, list[bytes]] = {}
    repeated: dict[str, list[str]] = {}
    try:
        for name, value in form.multi_items():
            if isinstance(value, UploadFile):
                files.setdefault(name, []).append(await value.read())
                continue
            if "[]" in name:
                repeated.setdefault(name, []).append(value)
                continue
            if name in fields:
                raise http_errors.invalid_value(f"{name[:40]} is given twice.", name[:40])
            fields[name] = value
    finally:
        await form.close()
    return FormBody(fields, files, repeated)


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

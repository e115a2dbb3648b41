"""What the images routes (generations, edits) do once a request is read: submit its `n` images
as `n` engine requests together (seeds seed, seed+1, ...), so they share denoise forwards with each
other and with everyone else's; follow each with a studio.tracker `RequestTracker`; and answer
with OpenAI's images response (b64_json, or a URL into the image file store)."""

from __future__ import annotations

import asyncio
import base64
import io
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from fastapi import Request
from fastapi.responses import JSONResponse, Response

import engine
from studio.api import errors as http_errors
from studio.api.config import HttpApiConfig
from studio.api.image_files import ImageFileStore
from studio.tracker import ABORTED, COMPLETED, FAILED, RequestTracker, Status

if TYPE_CHECKING:
    from PIL import Image


def checked_n(engine_: engine.EngineClient, config: HttpApiConfig, n: int | None) -> int:
    """How many images a call asks for, within this server's limit (400 naming `n`)."""
    n = 1 if n is None else n
    # One caller can never have more images in flight than its session limit allows.
    max_n = min(config.max_images_per_request, engine_.limits.max_per_session)
    if n > max_n:
        raise http_errors.invalid_value(f"n={n} is above this server's limit: allowed is 1..{max_n}.", "n")
    return n


async def images_response(
    engine_: engine.EngineClient, config: HttpApiConfig, images: ImageFileStore, request: Request, session: str,
    params: engine.GenerationParams, n: int, response_format: str | None,
    renamed: dict[str, str] | None = None,
) -> Response:
    """Run `n` images of `params` in the caller's session and answer with all of them (or the
    first failure). `renamed`: how this route names fields in errors (see errors.from_engine_value_error)."""
    trackers = _submit_all(engine_, params, n, session, renamed)
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
        png = await asyncio.to_thread(png_bytes, final.result.images[0])  # encoding must not stall the event loop
        # skipped_steps: the steps that reused the request's cached residual (step caching)
        item: dict = {"seed": final.result.seed, "revised_prompt": None,
                      "skipped_steps": len(final.result.skipped_steps)}
        if response_format == "url":
            # A kept image's file is written and synced: off the event loop too.
            item["url"] = _image_url(request, config, await asyncio.to_thread(images.put, png, session))
        else:
            item["b64_json"] = base64.b64encode(png).decode("ascii")
        data.append(item)
    return JSONResponse({"created": int(time.time()), "data": data, "output_format": "png"})


def _submit_all(
    engine_: engine.EngineClient, params: engine.GenerationParams, n: int, session_id: str,
    renamed: dict[str, str] | None,
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
            raise http_errors.from_engine_value_error(error, renamed) from None
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


def png_bytes(image: "Image.Image") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _image_url(request: Request, config: HttpApiConfig, name: str) -> str:
    if config.public_base_url:
        return f"{config.public_base_url.rstrip('/')}/v1/images/files/{name}"
    return str(request.url_for("stepstudio_image_file", name=name))

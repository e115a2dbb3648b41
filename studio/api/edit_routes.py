"""OpenAI's Images edit API on the studio's engine, as the official `openai` client sends it:
`client.images.edit(image=..., mask=..., prompt=..., n=..., size=..., response_format=...)`.

    POST /v1/images/edits     multipart/form-data -> PNG images (b64_json or url), like
                              /v1/images/generations

The form: `image` (one picture: PNG, JPEG or WEBP; the client names it `image[]` when given a
list, and a list of more than one is refused), optional `mask` (a picture of the image's size
whose fully transparent pixels are the ones to edit, OpenAI's convention), `prompt`, `n`, `size`
(absent or "auto": the image's size; else the image must have that size) and `response_format`;
extensions as more form fields (the client's `extra_body=`): `strength` (0..1, how much is
redrawn), `seed`, `num_inference_steps`, `guidance_scale`, `negative_prompt`, `model`.

An edit is an image-to-image (with a mask: inpainting) engine request: it shares forwards with
text-to-image requests of its size. Everything else (callers and keys, sessions, admission, `n`
as seeds seed, seed+1, ..., the answer, the error shape) is the generations route's
(studio.api.image_results). Bad pictures get a 400 naming `image` or `mask`: not a picture, too
large (bytes: `HttpApiConfig.max_upload_bytes` each, 8 MiB; pixels: the server's largest size a
side), a size the model can't make, a mask of another size than the image. A body beyond two
pictures and the text fields is refused unread (413), one that comes too slowly with a 408.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

import fastapi
import pydantic
from fastapi import Request
from fastapi.responses import Response

import engine
from pipelines.params import MAX_SIZE_ABSOLUTE
from studio.api import errors as http_errors
from studio.api.config import HttpApiConfig
from studio.api.errors import ApiError
from studio.api.image_files import ImageFileStore
from studio.api.image_requests import ImageEditRequest
from studio.api.image_results import checked_n, images_response
from studio.api.request_bodies import FormBody, body_kind, parse_size, read_body_in_time, read_form, resolve_model
from studio.pictures import as_init_image, check_same_size, mask_from_transparency, open_upload

ROUTE = "/v1/images/edits"
# Enough to name a list of images sent where one is taken, rather than failing the parse.
_MAX_FILES = 8
_FILE_FIELDS = ("image", "image[]", "mask")

Caller = Callable[[Request], Awaitable[str]]


def add_edit_routes(
    router: fastapi.APIRouter, engine_: engine.EngineClient, config: HttpApiConfig, caller: Caller,
    images: ImageFileStore,
) -> None:
    """Add POST /v1/images/edits to the HTTP API's router; `images` keeps the url responses' PNGs."""
    schema = ImageEditRequest.model_json_schema()
    schema["properties"] = {
        "image": {"type": "string", "format": "binary"}, "mask": {"type": "string", "format": "binary"},
        **schema["properties"],
    }
    schema["required"] = ["image", *schema.get("required", [])]
    body_schema = {"content": {"multipart/form-data": {"schema": schema}}}

    @router.post(ROUTE, name="stepstudio_images_edits",
                 openapi_extra={"requestBody": {**body_schema, "required": True}})
    async def images_edits(request: Request) -> Response:
        try:
            body_kind(request, json_too=False)
            session = await caller(request)
            return await _edit_images(engine_, config, images, request, session)
        except ApiError as error:
            return error.to_response()


async def _edit_images(
    engine_: engine.EngineClient, config: HttpApiConfig, images: ImageFileStore, request: Request, session: str
) -> Response:
    body = await read_body_in_time(request, config, upload=True)
    form = await read_form(body, request.headers, max_files=_MAX_FILES)
    picture, mask_file = _the_files(form)
    try:
        ask = ImageEditRequest.model_validate(form.with_lists("loras"), strict=False)
    except pydantic.ValidationError as error:
        raise http_errors.from_validation_error(error) from None
    if ask.stream:
        raise http_errors.invalid_value("stream=true is not supported: this server answers with the finished "
                                        "images only.", "stream", code="unsupported_parameter")
    model = resolve_model(engine_, ask.model, "image", ROUTE)
    n = checked_n(engine_, config, ask.n)
    width, height = parse_size(ask.size)
    limits = engine_.limits_for(model)
    # A size taken from the picture is the picture's fault when the model can't make it.
    renamed = {"width": "image", "height": "image"} if width is None else None
    try:
        image, mask = await asyncio.to_thread(
            _pictures, picture, mask_file, limits.max_size or MAX_SIZE_ABSOLUTE, config.max_upload_bytes)
        if width is None:
            width, height = image.size
        limits.check_values(ask.num_inference_steps, width, height)  # this server's ranges first
        params = ask.params(model, width, height, init_image=image, strength=ask.strength, mask_image=mask)
    except ValueError as error:
        raise http_errors.from_engine_value_error(error, renamed) from None
    return await images_response(engine_, config, images, request, session, params, n, ask.response_format, renamed)


def _the_files(form: FormBody) -> tuple[bytes, bytes | None]:
    """The one picture and the optional mask of the form (400 naming the field otherwise)."""
    for name in form.files:
        if name not in _FILE_FIELDS:
            raise http_errors.invalid_value(f"{name[:40]} is a file this server does not take: send `image` and, "
                                            "optionally, `mask`.", name[:40], code="unsupported_parameter")
    for name in _FILE_FIELDS:
        if name in form.fields:
            raise http_errors.invalid_value(f"{name} must be a file upload (a picture), not a text field.",
                                            name.removesuffix("[]"), code="invalid_type")
    pictures = form.files.get("image", []) + form.files.get("image[]", [])
    if not pictures:
        raise http_errors.ApiError(400, "image is required: upload the picture to edit (PNG, JPEG or WEBP).",
                                   param="image", code="missing_required_parameter")
    if len(pictures) > 1:
        raise http_errors.invalid_value(f"{len(pictures)} images were sent; this server edits one picture per "
                                        "call: send one.", "image")
    masks = form.files.get("mask", [])
    if len(masks) > 1:
        raise http_errors.invalid_value(f"{len(masks)} masks were sent: send one.", "mask")
    return pictures[0], masks[0] if masks else None


def _pictures(picture: bytes, mask_file: bytes | None, max_side: int, max_bytes: int):
    """The decoded init image (RGB) and mask (the engine's "L", white = repaint), or ParamErrors
    naming init_image / mask_image. Runs in a worker thread: decoding must not stall the loop."""
    image = open_upload(picture, "init_image", max_side, max_bytes)
    if mask_file is None:
        return as_init_image(image), None
    mask = open_upload(mask_file, "mask_image", max_side, max_bytes)
    check_same_size(image, mask)
    return as_init_image(image), mask_from_transparency(mask)

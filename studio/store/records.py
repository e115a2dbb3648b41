"""A request's parameters as the database keeps them: JSON for the fields, PNG for its pictures.

    text, init_png, mask_png = params_record(params)
    params = params_from_record(text, init_png, mask_png)    # equal to the original

PNG is lossless, so a resumed image-to-image request starts from exactly the picture it was sent.
"""

from __future__ import annotations

import io
import json
from dataclasses import asdict, fields, replace

from PIL import Image

from engine import GenerationParams
from pipelines.lora_request import LoraUse

_PICTURES = ("init_image", "mask_image")


def params_record(params: GenerationParams) -> tuple[str, bytes | None, bytes | None]:
    values = {item.name: getattr(params, item.name) for item in fields(params) if item.name not in _PICTURES}
    values["loras"] = [asdict(use) for use in params.loras]
    return json.dumps(values), _png(params.init_image), _png(params.mask_image)


def params_from_record(text: str, init_png: bytes | None, mask_png: bytes | None) -> GenerationParams:
    values = json.loads(text)
    loras = tuple(LoraUse(**use) for use in values.pop("loras", ()))
    params = GenerationParams(**values, loras=loras)
    if init_png is None:
        return params
    return replace(params, init_image=_picture(init_png), mask_image=None if mask_png is None else _picture(mask_png))


def _png(image: Image.Image | None) -> bytes | None:
    if image is None:
        return None
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _picture(png: bytes) -> Image.Image:
    with Image.open(io.BytesIO(png)) as image:
        image.load()
        return image.copy()

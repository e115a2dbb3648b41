"""Pictures that callers upload to start a request from (the edits route, /image_to_image):
decoded within limits, and masks turned into the engine's convention.

Limits: at most `max_bytes` bytes (the front end's setting); then, checked on the file's header
before any pixel is decoded (so a small file that claims a huge picture costs nothing): PNG,
JPEG or WEBP only; each side at most the server's largest request size for the model (an image
is the request's size, so a larger one could never run); at most `MAX_UPLOAD_PIXELS` pixels in
any case.

Masks: the engine takes an "L" image, white = repaint (diffusers' convention).
`mask_from_transparency` reads OpenAI's convention (the mask's fully transparent pixels are the
ones to edit); `mask_from_white` reads a black-and-white picture as it is.
"""

from __future__ import annotations

import io
import warnings

from PIL import Image

from pipelines.errors import ParamError

FORMATS = ("PNG", "JPEG", "WEBP")
MAX_UPLOAD_BYTES = 8 * 2**20  # one picture (the HTTP API's setting: HttpApiConfig.max_upload_bytes)
MAX_UPLOAD_PIXELS = 4096 * 4096
_SHOWN_NAME = {"init_image": "image", "mask_image": "mask"}


def open_upload(data: bytes, field: str, max_side: int, max_bytes: int) -> Image.Image:
    """The uploaded picture, decoded, in its own mode (a mask's alpha is kept). `field`: the
    GenerationParams field it becomes ("init_image" or "mask_image"), named in every error."""
    name = _SHOWN_NAME.get(field, field)
    if not data:
        raise ParamError(field, f"{name} is an empty file: send a PNG, JPEG or WEBP picture.")
    if len(data) > max_bytes:
        raise ParamError(field, f"{name} is {len(data)} bytes; this server takes pictures of at most {max_bytes} "
                                "bytes: send a smaller file.")
    largest = f"this server takes pictures of at most {min(max_side, 4096)} pixels a side: make it smaller"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=FORMATS)
    except (Image.DecompressionBombWarning, Image.DecompressionBombError):
        raise ParamError(field, f"{name} claims far more pixels than {largest}.") from None
    except (Image.UnidentifiedImageError, OSError):
        raise ParamError(field, f"{name} is not a picture this server reads ({len(data)} bytes): "
                                f"send a PNG, JPEG or WEBP file.") from None
    width, height = image.size
    if width > max_side or height > max_side or width * height > MAX_UPLOAD_PIXELS:
        raise ParamError(field, f"{name} is {width}x{height} pixels; {largest}.")
    try:
        image.load()
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        raise ParamError(field, f"{name} could not be decoded ({image.format}: {error}): the file is damaged "
                                "or cut short.") from None
    return image


def as_init_image(image: Image.Image) -> Image.Image:
    """The picture to start from: RGB (an alpha channel is dropped, the colours under it kept)."""
    return image if image.mode == "RGB" else image.convert("RGB")


def has_transparency(image: Image.Image) -> bool:
    return image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in image.info


def mask_from_transparency(mask: Image.Image) -> Image.Image:
    """OpenAI's mask -> the engine's: fully transparent (alpha 0) -> 255 (repaint), else 0 (keep)."""
    if not has_transparency(mask):
        raise ParamError("mask_image", f"mask has no transparency (a {mask.mode} picture): the pixels to edit are "
                                       "the fully transparent ones (alpha 0), so send a PNG with an alpha channel.")
    alpha = mask.convert("RGBA").getchannel("A")
    return alpha.point(lambda value: 255 if value == 0 else 0)


def mask_from_white(mask: Image.Image) -> Image.Image:
    """A black-and-white mask as the engine takes it: white = repaint, black = keep (grey is between)."""
    return mask if mask.mode == "L" else mask.convert("L")


def check_same_size(image: Image.Image, mask: Image.Image) -> None:
    if mask.size != image.size:
        raise ParamError("mask_image", f"mask is {mask.width}x{mask.height} but image is {image.width}x{image.height}: "
                                       "the mask must be the image's size.")

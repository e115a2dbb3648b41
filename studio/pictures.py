"""Pictures that start a request: uploaded by callers (the edits route, /image_to_image), carried
in a workflow as data URLs (its Load image and painted Mask nodes), or made by an earlier stage;
decoded within limits, sized for the request, and masks turned into the engine's convention.

Limits: at most `max_bytes` bytes (the front end's setting); then, checked on the file's header
before any pixel is decoded (so a small file that claims a huge picture costs nothing): PNG,
JPEG or WEBP only; each side at most the server's largest request size for the model (an image
is the request's size, so a larger one could never run); at most `MAX_UPLOAD_PIXELS` pixels in
any case.

Masks: the engine takes an "L" image, white = repaint (diffusers' convention).
`mask_from_transparency` reads OpenAI's convention (the mask's fully transparent pixels are the
ones to edit); `mask_from_white` reads a black-and-white picture as it is; a `MaskSpec` (a
rectangle, or a picture) is drawn at the size of the request it is for.

Sizes: a picture a stage starts from is resized (Lanczos) to the request's size, which is the
picture's own size times the Upscale factors on the way, rounded to the model's size multiple
(`start_size`), unless the sampler is given a size.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import warnings
from dataclasses import dataclass

from PIL import Image

from pipelines.errors import ParamError

FORMATS = ("PNG", "JPEG", "WEBP")
MAX_UPLOAD_BYTES = 8 * 2**20  # one picture (the HTTP API's setting: HttpApiConfig.max_upload_bytes)
MAX_UPLOAD_PIXELS = 4096 * 4096
MAX_UPLOAD_SIDE = 4096
# A picture as a data URL: base64 makes 4 characters of 3 bytes, plus the "data:image/...;base64," head.
MAX_DATA_URL_CHARS = 4 * -(-MAX_UPLOAD_BYTES // 3) + 64
_DATA_URL = re.compile(r"data:image/(png|jpeg|jpg|webp);base64,", re.IGNORECASE)
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


# ---------------------------------------------------------------------------- data URLs
def is_data_url(text: object) -> bool:
    return isinstance(text, str) and text[:5].lower() == "data:"


def data_url_bytes(text: str, name: str) -> bytes:
    """The file inside a picture's data URL (`data:image/png;base64,...`). ValueError naming `name`."""
    head = _DATA_URL.match(text[:40])
    if head is None:
        raise ValueError(f"{name} is not a picture's data URL: it must start with data:image/png;base64, "
                         "(or jpeg, webp).")
    if len(text) > MAX_DATA_URL_CHARS:
        raise ValueError(f"{name} is {len(text)} characters long as a data URL; pictures are limited to "
                         f"{MAX_UPLOAD_BYTES} bytes ({MAX_DATA_URL_CHARS} characters): use a smaller one.")
    try:
        return base64.b64decode(text[head.end():], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{name}'s data URL is not valid base64.") from None


def picture_data_url(image: Image.Image) -> str:
    """A picture as a PNG data URL (what a workflow's Load image node carries)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


# ---------------------------------------------------------------------------- sizes
def start_size(size: tuple[int, int], scale: float, multiple: int) -> tuple[int, int]:
    """The size of a request that starts from a picture of `size`, enlarged `scale` times: each
    side rounded to the nearest multiple of the model's `multiple` (at least one multiple)."""
    return tuple(max(multiple, round(side * scale / multiple) * multiple) for side in size)


def sized(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """The picture at `size` (Lanczos, as an upscaler would), RGB."""
    image = as_init_image(image)
    return image if image.size == tuple(size) else image.resize(tuple(size), Image.LANCZOS)


# ---------------------------------------------------------------------------- masks
@dataclass(frozen=True)
class MaskSpec:
    """Which part of a picture to repaint, drawn at the size of the request that uses it: a
    rectangle (`box`: x, y, width, height in that request's pixels, clipped to it) or a picture
    (`picture`: "L", white = repaint, resized to the request). `invert` swaps repaint and keep."""

    box: tuple[int, int, int, int] | None = None
    picture: Image.Image | None = None
    invert: bool = False

    def __post_init__(self) -> None:
        if (self.box is None) == (self.picture is None):
            raise ValueError("a MaskSpec is a box or a picture (one of them).")

    def render(self, size: tuple[int, int]) -> Image.Image:
        if self.picture is not None:
            mask = mask_from_white(self.picture)
            mask = mask if mask.size == tuple(size) else mask.resize(tuple(size), Image.NEAREST)
        else:
            x, y, width, height = self.box
            mask = Image.new("L", tuple(size), 0)
            mask.paste(255, (x, y, x + width, y + height))
        return mask.point(lambda value: 255 - value) if self.invert else mask

"""Reading a node's field values into request parameters: what a node's type `read`s (see
`studio.workflows.nodes`), as `Reading`s that the compiler combines into branches.

Reading a node only parses (numbers may arrive as text, sizes as "64x64", sweeps as comma
lists, pictures as data URLs) and bounds its fan-out; whether a value suits the loaded model is
the engine's rule, asked through `ValueReader.check` (pipelines.params, pipelines.validation,
engine.limits). A node with inputs (Upscale, Mask) reads what its links bring through
`ValueReader.linked`; a Sampler's output is its branches, which the compiler makes.
Pure: imports neither gradio nor torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol

from PIL import Image

from pipelines.errors import ParamError
from pipelines.lora_request import LoraUse
from studio.pictures import (
    MAX_UPLOAD_BYTES,
    MAX_UPLOAD_SIDE,
    MaskSpec,
    data_url_bytes,
    has_transparency,
    is_data_url,
    mask_from_transparency,
    open_upload,
)
from studio.workflows.ports import SWEEPABLE, PortType

MAX_FAN_OUT_VALUES = 256  # values in one fan-out node
UPSCALE_RANGE = (0.25, 4.0)
MAX_MASK_SIDE = 8192


@dataclass(frozen=True)
class Reading:
    """One value a node puts on its output, and how a grid labels it."""

    value: Any
    label: str


@dataclass(frozen=True)
class StartImage:
    """A picture a sampler starts from, as it flows along `image` links: a Load image's picture
    (in its own mode, so a Mask can read its alpha), or the result of an earlier branch; `scale`:
    the Upscale factors on the way, multiplied; `sized_by`: the (node, field) that set its size
    (named when the size is refused)."""

    picture: Image.Image | None = field(default=None, compare=False)
    branch: int | None = None
    scale: float = 1.0
    sized_by: tuple[str, str] | None = None


class ValueReader(Protocol):
    """What a node's `read` reports to (the compiler implements it, for one node and one model)."""

    default_model: str
    node_id: str  # the node being read

    def fail(self, field: str, message: str) -> None:
        """Note a problem at one of the node's fields."""

    def check(self, at: str | None = None, **values: Any) -> bool:
        """The engine's rules for these GenerationParams values on the model being read for. A refusal
        becomes a problem at `at`, or at the node field that sets the refused field; False then."""

    def linked(self, port: str) -> list[Reading] | None:
        """What the link into one of the node's inputs brings (None: the input is not linked)."""

    def picture_file(self, name: str) -> bytes:
        """A saved result's file by its name in the outputs folder, when it is the caller's own;
        ValueError saying why not."""


Read = Callable[[dict[str, Any], ValueReader], list[Reading]]


def read_number(reader: ValueReader, field: str, raw: object, whole: bool) -> float | int | None:
    value = raw
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            reader.fail(field, f"{raw!r:.40} is not a number.")
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        reader.fail(field, f"{raw!r:.40} is not a finite number.")
        return None
    if whole:
        if float(value) != int(value):
            reader.fail(field, f"{raw!r:.40} must be a whole number.")
            return None
        return int(value)
    return float(value)


def _checked(reader: ValueReader, field: str, value: Any, label: str, **params: Any) -> Reading | None:
    if value is None or not reader.check(at=field, **params):
        return None
    return Reading(value, label)


def _number(param: str, whole: bool) -> Callable[[ValueReader, str, object], Reading | None]:
    """A reader of one number that sets the GenerationParams field `param`."""
    def read(reader: ValueReader, field: str, raw: object) -> Reading | None:
        value = read_number(reader, field, raw, whole=whole)
        label = "" if value is None else str(value) if whole else f"{value:g}"
        return _checked(reader, field, value, label, **{param: value})
    return read


_steps, _frames = _number("num_inference_steps", whole=True), _number("num_frames", whole=True)
_guidance, _strength = _number("guidance_scale", whole=False), _number("strength", whole=False)
_whole_seed = _number("seed", whole=True)
_step_cache = _number("step_cache", whole=False)


def _seed(reader: ValueReader, field: str, raw: object) -> Reading | None:
    if read_number(reader, field, raw, whole=True) == -1:
        return Reading(None, "random")  # the sampler's random seed, drawn when the run starts
    return _whole_seed(reader, field, raw)


def _scheduler(reader: ValueReader, field: str, raw: object) -> Reading | None:
    if not isinstance(raw, str):
        reader.fail(field, f"must be a scheduler name, got {type(raw).__name__}.")
        return None
    text = raw.strip()
    if text in ("", "default"):
        return Reading(None, "default")
    return _checked(reader, field, text, text, scheduler=text)


def _model(reader: ValueReader, field: str, raw: object) -> Reading | None:
    text = raw.strip() if isinstance(raw, str) else raw
    if text in ("", "default", None):
        return Reading(reader.default_model, reader.default_model)
    return _checked(reader, field, text, str(text), model=text)


def _size_pair(reader: ValueReader, field: str | None, width: int | None, height: int | None) -> Reading | None:
    """Each side on its own (reported at `field`, or at the node's width / height), then the pair."""
    width_ok = width is not None and reader.check(at=field, width=width)
    height_ok = height is not None and reader.check(at=field, height=height)
    if not (width_ok and height_ok) or not reader.check(at=field, width=width, height=height):
        return None
    return Reading((width, height), f"{width}x{height}")


def _size_text(reader: ValueReader, field: str, raw: object) -> Reading | None:
    width_text, sep, height_text = str(raw).strip().lower().partition("x")
    if not sep:
        reader.fail(field, f"{raw!r:.40} is not a size: write WIDTHxHEIGHT, e.g. 64x64.")
        return None
    width, height = read_number(reader, field, width_text, whole=True), read_number(reader, field, height_text, whole=True)
    return _size_pair(reader, field, width, height)


def _text(param: str) -> Callable[[ValueReader, str, object], Reading | None]:
    def read(reader: ValueReader, field: str, raw: object) -> Reading | None:
        return _checked(reader, field, raw, str(raw), **{param: raw})
    return read


def _lora_scale(reader: ValueReader, field: str, raw: object) -> Reading | None:
    value = read_number(reader, field, raw, whole=False)
    if value is None:
        return None
    try:
        LoraUse("scale", value)
    except ParamError as error:
        reader.fail(field, error.message.replace("LoRA 'scale' has scale", "scale"))
        return None
    return Reading(value, f"{value:g}")


# How one value of each port type is read from a node field (a value node's, or one item of a Sweep).
VALUE_OF_PORT: dict[str, Callable[[ValueReader, str, object], Reading | None]] = {
    PortType.PROMPT: _text("prompt"),
    PortType.NEGATIVE_PROMPT: _text("negative_prompt"),
    PortType.STEPS: _steps,
    PortType.GUIDANCE: _guidance,
    PortType.SEED: _seed,
    PortType.SIZE: _size_text,
    PortType.SCHEDULER: _scheduler,
    PortType.FRAMES: _frames,
    PortType.MODEL: _model,
    PortType.STRENGTH: _strength,
    PortType.LORA_SCALE: _lora_scale,
    PortType.STEP_CACHE: _step_cache,
}


def one_value(port: str, field: str) -> Read:
    """The `read` of a value node: one value of type `port`, from its field `field`."""
    def read(values: dict[str, Any], reader: ValueReader) -> list[Reading]:
        reading = VALUE_OF_PORT[port](reader, field, values[field])
        return [] if reading is None else [reading]
    return read


def read_size(values: dict[str, Any], reader: ValueReader) -> list[Reading]:
    width = read_number(reader, "width", values["width"], whole=True)
    height = read_number(reader, "height", values["height"], whole=True)
    reading = _size_pair(reader, None, width, height)
    return [] if reading is None else [reading]


def read_prompt_list(values: dict[str, Any], reader: ValueReader) -> list[Reading]:
    text = values["prompts"]
    if not isinstance(text, str):
        reader.fail("prompts", f"must be text, got {type(text).__name__}.")
        return []
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        reader.fail("prompts", "has no prompt: write one prompt per line.")
        return []
    if len(lines) > MAX_FAN_OUT_VALUES:
        reader.fail("prompts", f"has {len(lines)} prompts; at most {MAX_FAN_OUT_VALUES} are allowed.")
        return []
    readings = [_checked(reader, "prompts", line, line, prompt=line) for line in lines]
    return [] if None in readings else readings


def read_seed_batch(values: dict[str, Any], reader: ValueReader) -> list[Reading]:
    start = read_number(reader, "start", values["start"], whole=True)
    start_ok = start is not None and reader.check(seed=start)
    count = read_number(reader, "count", values["count"], whole=True)
    if count is not None and not 1 <= count <= MAX_FAN_OUT_VALUES:
        reader.fail("count", f"{count} is out of range: allowed is 1..{MAX_FAN_OUT_VALUES}.")
        return []
    if not start_ok or count is None or not reader.check(at="count", seed=start + count - 1):  # the last seed
        return []
    return [Reading(start + i, str(start + i)) for i in range(count)]


def sweep_output_type(values: dict[str, Any]) -> str | None:
    """A Sweep's output type is the setting it varies (None while that setting is invalid)."""
    param = values.get("param")
    return param if isinstance(param, str) and param in SWEEPABLE else None


def read_sweep(values: dict[str, Any], reader: ValueReader) -> list[Reading]:
    param = sweep_output_type(values)
    if param is None:
        reader.fail("param", f"{values['param']!r:.40} can't be swept; choose one of: {', '.join(SWEEPABLE)}.")
        return []
    raw = values["values"]
    if not isinstance(raw, str):
        raw = ", ".join(str(v) for v in raw) if isinstance(raw, list) else str(raw)
    items = [item.strip() for item in raw.replace("\n", ",").split(",") if item.strip()]
    if not items:
        reader.fail("values", f"lists no {param} value: write them separated by commas.")
        return []
    if len(items) > MAX_FAN_OUT_VALUES:
        reader.fail("values", f"lists {len(items)} values; at most {MAX_FAN_OUT_VALUES} are allowed.")
        return []
    readings = [VALUE_OF_PORT[param](reader, "values", item) for item in items]
    return [] if None in readings else readings


# ---------------------------------------------------------------------------- LoRA adapters
def read_lora(values: dict[str, Any], reader: ValueReader) -> list[Reading]:
    """The adapters linked in (earlier LoRA nodes), plus this one at each of its scales: its own
    field's, or every value a Sweep links into `scale` (a fan-out)."""
    name = values["name"].strip() if isinstance(values["name"], str) else values["name"]
    if not name:
        reader.fail("name", "names no adapter: choose one the model has loaded.")
        return []
    try:
        LoraUse(name)
    except ParamError as error:
        reader.fail("name", error.message)
        return []
    scales = reader.linked("scale")
    if scales is None:
        scale = _lora_scale(reader, "scale", values["scale"])
        scales = [] if scale is None else [scale]
    before = reader.linked(PortType.LORA) or [Reading((), "")]
    readings = []
    for earlier in before:
        for scale in scales:
            loras = earlier.value + (LoraUse(name, scale.value),)
            label = " ".join(f"{use.name}:{use.scale:g}" for use in loras)
            if not reader.check(at="name", loras=loras):
                return []
            readings.append(Reading(loras, label))
    return readings


# ---------------------------------------------------------------------------- pictures
def _picture(reader: ValueReader, field: str, raw: object, what: str) -> Image.Image | None:
    """A picture field's value: a data URL, or the name of one of the caller's saved results."""
    if not isinstance(raw, str) or not raw.strip():
        reader.fail(field, f"has no picture: {what}.")
        return None
    try:
        data = data_url_bytes(raw, field) if is_data_url(raw) else reader.picture_file(raw.strip())
        return open_upload(data, field, MAX_UPLOAD_SIDE, MAX_UPLOAD_BYTES)
    except ValueError as error:  # ParamError too: its text names the field
        reader.fail(field, str(error))
        return None


def read_load_image(values: dict[str, Any], reader: ValueReader) -> list[Reading]:
    picture = _picture(reader, "image", values["image"], "upload one, drop one on the node or pick a saved result")
    if picture is None:
        return []
    return [Reading(StartImage(picture=picture, sized_by=(reader.node_id, "image")), f"{picture.width}x{picture.height}")]


def read_upscale(values: dict[str, Any], reader: ValueReader) -> list[Reading]:
    factor = read_number(reader, "factor", values["factor"], whole=False)
    low, high = UPSCALE_RANGE
    if factor is not None and not low <= factor <= high:
        reader.fail("factor", f"{factor:g} is out of range: allowed is {low:g}..{high:g}.")
        return []
    if factor is None:
        return []
    return [Reading(replace(reading.value, scale=reading.value.scale * factor, sized_by=(reader.node_id, "factor")),
                    reading.label) for reading in reader.linked(PortType.IMAGE) or ()]


MASK_SOURCES = ("rectangle", "alpha", "painted")


def read_mask(values: dict[str, Any], reader: ValueReader) -> list[Reading]:
    source, invert = values["source"], values["invert"] == "yes"
    if source == "rectangle":
        box = [read_number(reader, name, values[name], whole=True) for name in ("x", "y", "width", "height")]
        for name, value, low in zip(("x", "y", "width", "height"), box, (0, 0, 1, 1)):
            if value is not None and not low <= value <= MAX_MASK_SIDE:
                reader.fail(name, f"{value} is out of range: allowed is {low}..{MAX_MASK_SIDE} (pixels of the picture).")
                return []
        return [] if None in box else [Reading(MaskSpec(box=tuple(box), invert=invert), "rectangle")]
    if source == "painted":
        picture = _picture(reader, "painted", values["painted"], "paint the part to repaint (Paint…)")
        return [] if picture is None else [Reading(MaskSpec(picture=picture.convert("L"), invert=invert), "painted")]
    if source != "alpha":
        reader.fail("source", f"{source!r:.30} is not a mask source; choose one of: {', '.join(MASK_SOURCES)}.")
        return []
    linked = reader.linked(PortType.IMAGE)
    if linked is None:
        reader.fail("image", "a mask from alpha needs a picture: link a Load image with transparent pixels.")
        return []
    readings = []
    for reading in linked:
        picture = reading.value.picture
        if picture is None or not has_transparency(picture):
            reader.fail("image", "a mask from alpha needs a Load image whose picture has transparent pixels "
                                 "(a PNG with an alpha channel).")
            return []
        readings.append(Reading(MaskSpec(picture=mask_from_transparency(picture), invert=invert), "alpha"))
    return readings

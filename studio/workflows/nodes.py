"""The node types of a workflow, each one self-describing definition: its ports, its fields, the
GenerationParams fields each of its fields sets, and how it reads its values.

The browser editor draws its palette from `node_type_specs()`, the compiler reads every node
through its type's `read`, and the Simple tab builds its form's nodes with `NodeType.node`.

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

MAX_FAN_OUT_VALUES = 256  # values in one fan-out node
UPSCALE_RANGE = (0.25, 4.0)
MAX_MASK_SIDE = 8192


class PortType:
    """What flows along a link. Only equal types may be linked."""

    PROMPT = "prompt"
    NEGATIVE_PROMPT = "negative_prompt"
    SEED = "seed"
    SIZE = "size"
    STEPS = "steps"
    GUIDANCE = "guidance"
    SCHEDULER = "scheduler"
    FRAMES = "frames"  # a video's frame count
    MODEL = "model"  # which loaded model makes the branch
    STRENGTH = "strength"  # how much of a picture a sampler redraws (0..1)
    IMAGES = "images"  # a sampler's branches: their previews, images and settings
    IMAGE = "image"  # a picture to start from: a Load image's, an Upscale's, or a sampler's results
    MASK = "mask"  # which part of the picture to repaint
    LORA = "lora"  # the LoRA adapters a sampler runs with (LoRA nodes, chained)
    LORA_SCALE = "lora_scale"  # a LoRA node's scale, swept


def accepts(input_type: str, output_type: str | None) -> bool:
    """Whether an input of `input_type` takes a link from an output of `output_type`: the same
    type, or a sampler's images into a picture input (one stage feeding the next)."""
    return output_type == input_type or (input_type == PortType.IMAGE and output_type == PortType.IMAGES)


# The GenerationParams fields a value of each port type sets.
PARAMS_OF_PORT = {
    PortType.PROMPT: ("prompt",), PortType.NEGATIVE_PROMPT: ("negative_prompt",), PortType.SEED: ("seed",),
    PortType.SIZE: ("width", "height"), PortType.STEPS: ("num_inference_steps",),
    PortType.GUIDANCE: ("guidance_scale",), PortType.SCHEDULER: ("scheduler",), PortType.FRAMES: ("num_frames",),
    PortType.MODEL: ("model",), PortType.STRENGTH: ("strength",), PortType.LORA: ("loras",),
    PortType.LORA_SCALE: ("loras",),
}
# What a Sweep node may vary: its `param` value decides its output type.
SWEEPABLE = (PortType.GUIDANCE, PortType.STEPS, PortType.SCHEDULER, PortType.SIZE, PortType.SEED, PortType.FRAMES,
             PortType.MODEL, PortType.STRENGTH, PortType.LORA_SCALE)
# A Grid's axes name a sampler input that a fan-out node feeds (or an earlier stage's, inherited).
GRID_AXES = ("auto", PortType.PROMPT, PortType.NEGATIVE_PROMPT, PortType.SEED, PortType.SIZE, PortType.STEPS,
             PortType.GUIDANCE, PortType.SCHEDULER, PortType.FRAMES, PortType.MODEL, PortType.STRENGTH, PortType.LORA)


# ---------------------------------------------------------------------------- reading values
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
}


def _one_value(port: str, field: str) -> Read:
    def read(values: dict[str, Any], reader: ValueReader) -> list[Reading]:
        reading = VALUE_OF_PORT[port](reader, field, values[field])
        return [] if reading is None else [reading]
    return read


def _read_size(values: dict[str, Any], reader: ValueReader) -> list[Reading]:
    width = read_number(reader, "width", values["width"], whole=True)
    height = read_number(reader, "height", values["height"], whole=True)
    reading = _size_pair(reader, None, width, height)
    return [] if reading is None else [reading]


def _read_prompt_list(values: dict[str, Any], reader: ValueReader) -> list[Reading]:
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


def _read_seed_batch(values: dict[str, Any], reader: ValueReader) -> list[Reading]:
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


def _read_sweep(values: dict[str, Any], reader: ValueReader) -> list[Reading]:
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
def _read_lora(values: dict[str, Any], reader: ValueReader) -> list[Reading]:
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


def _read_load_image(values: dict[str, Any], reader: ValueReader) -> list[Reading]:
    picture = _picture(reader, "image", values["image"], "upload one, drop one on the node or pick a saved result")
    if picture is None:
        return []
    return [Reading(StartImage(picture=picture, sized_by=(reader.node_id, "image")), f"{picture.width}x{picture.height}")]


def _read_upscale(values: dict[str, Any], reader: ValueReader) -> list[Reading]:
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


def _read_mask(values: dict[str, Any], reader: ValueReader) -> list[Reading]:
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


# ---------------------------------------------------------------------------- the types
@dataclass(frozen=True)
class Port:
    name: str
    type: str | None  # None: the value of the node's field `typed_by` is the type (the Sweep node)
    required: bool = False
    typed_by: str | None = None

    @property
    def accepts(self) -> tuple[str, ...]:
        """The output types an input takes (see `accepts`)."""
        return tuple(t for t in (self.type, PortType.IMAGES) if accepts(self.type, t))


@dataclass(frozen=True)
class Field:
    """One editable value of a node. `kind` tells the editor which control to draw; `sets` names the
    GenerationParams fields it sets (so an engine refusal of one of them is shown at this field)."""

    name: str
    kind: str  # "text" | "lines" | "int" | "float" | "choice" | "scheduler" | "model" | "picture" | "mask"
    default: Any
    label: str
    choices: tuple[str, ...] = ()
    help: str = ""
    sets: tuple[str, ...] = ()
    step: float | None = None  # a number field's step in the editor (None: the editor's own)


@dataclass(frozen=True)
class NodeType:
    name: str
    title: str
    category: str  # "values" | "fan-out" | "pictures" | "sampler" | "outputs"
    description: str
    inputs: tuple[Port, ...] = ()
    outputs: tuple[Port, ...] = ()
    fields: tuple[Field, ...] = ()
    read: Read | None = None  # the values it puts on its output (value and fan-out nodes)
    # What the editor draws inside the node while a run goes: "branch_bars" (a step bar per
    # branch), "previews" (each branch's latest preview), "results" (finished images), "grid".
    live_view: str | None = None

    @property
    def picture_fields(self) -> tuple[str, ...]:
        """The fields that hold a picture (a data URL): larger than other values, and counted apart."""
        return tuple(f.name for f in self.fields if f.kind in ("picture", "mask"))

    def input(self, name: str) -> Port | None:
        return next((port for port in self.inputs if port.name == name), None)

    def output(self, name: str) -> Port | None:
        return next((port for port in self.outputs if port.name == name), None)

    @property
    def is_fan_out(self) -> bool:
        return self.category == "fan-out"

    def default_values(self) -> dict[str, Any]:
        return {f.name: f.default for f in self.fields}

    def port_type(self, port: Port, values: dict[str, Any]) -> str | None:
        """A port's type: its own, or the value of the field that types it (None while that value is
        not one of the field's choices)."""
        if port.typed_by is None:
            return port.type
        field = next(f for f in self.fields if f.name == port.typed_by)
        value = values.get(port.typed_by)
        return value if isinstance(value, str) and value in field.choices else None

    def field_for(self, param: str) -> str | None:
        """The field that sets a GenerationParams field (None: no field of this node does)."""
        return next((f.name for f in self.fields if param in f.sets), None)

    def node(self, node_id: str, **values: Any) -> dict:
        """A node of this type as workflow JSON: its fields' defaults, replaced by `values`."""
        unknown = set(values) - {f.name for f in self.fields}
        if unknown:
            raise TypeError(f"a {self.title} node has no field {', '.join(sorted(unknown))}.")
        return {"id": node_id, "type": self.name, "values": {**self.default_values(), **values}}


def _value_node(name: str, title: str, port_type: str, fields: tuple[Field, ...], description: str,
                read: Read | None = None) -> NodeType:
    fields = tuple(replace(f, sets=f.sets or PARAMS_OF_PORT[port_type]) for f in fields)
    return NodeType(name, title, "values", description, outputs=(Port(port_type, port_type),), fields=fields,
                    read=read or _one_value(port_type, fields[0].name))


# Every value type (a LoRA's scale goes into a LoRA node), the pictures, then the adapters.
SAMPLER_INPUTS = tuple(Port(port, port, required=port == PortType.PROMPT) for port in PARAMS_OF_PORT
                       if port not in (PortType.LORA, PortType.LORA_SCALE)) + (
    Port(PortType.IMAGE, PortType.IMAGE), Port(PortType.MASK, PortType.MASK), Port(PortType.LORA, PortType.LORA))

NODE_TYPES: dict[str, NodeType] = {
    node_type.name: node_type
    for node_type in (
        _value_node("prompt", "Prompt", PortType.PROMPT,
                    (Field("text", "lines", "", "Prompt"),), "The text to draw."),
        _value_node("negative_prompt", "Negative prompt", PortType.NEGATIVE_PROMPT,
                    (Field("text", "lines", "", "Negative prompt"),), "What to steer away from (CFG models)."),
        _value_node("seed", "Seed", PortType.SEED,
                    (Field("seed", "int", -1, "Seed", help="-1: a random seed, the same for every branch"),),
                    "The noise seed."),
        _value_node("size", "Size", PortType.SIZE,
                    (Field("width", "int", 64, "Width", sets=("width",)),
                     Field("height", "int", 64, "Height", sets=("height",))), "Image size in pixels.", _read_size),
        _value_node("steps", "Steps", PortType.STEPS,
                    (Field("steps", "int", 20, "Steps"),), "Denoise steps."),
        _value_node("guidance", "Guidance", PortType.GUIDANCE,
                    (Field("scale", "float", 3.0, "Guidance scale"),), "Guidance scale."),
        _value_node("scheduler", "Scheduler", PortType.SCHEDULER,
                    (Field("name", "scheduler", "", "Scheduler", help="empty: the model's own"),),
                    "The noise scheduler."),
        _value_node("frames", "Frames", PortType.FRAMES,
                    (Field("frames", "int", 9, "Frames", help="video models only"),), "A video's frame count."),
        _value_node("model", "Model", PortType.MODEL,
                    (Field("name", "model", "", "Model", help="empty: the studio's default model"),),
                    "Which loaded model makes the branch."),
        _value_node("strength", "Strength", PortType.STRENGTH,
                    (Field("strength", "float", 0.6, "Strength", help="0 keeps the picture, 1 redraws it from noise",
                           step=0.05),),
                    "How much of its picture a sampler redraws."),
        NodeType("lora", "LoRA", "values",
                 "A LoRA adapter the sampler runs with, at a scale; chain LoRA nodes for several, sweep the scale "
                 "with a Sweep into `scale`. Rows with different adapters still share one forward.",
                 inputs=(Port(PortType.LORA, PortType.LORA), Port("scale", PortType.LORA_SCALE)),
                 outputs=(Port(PortType.LORA, PortType.LORA),),
                 fields=(Field("name", "lora", "", "Adapter", help="one the model has loaded", sets=("loras",)),
                         Field("scale", "float", 1.0, "Scale", help="1 = as trained, 0 = off; -4..4", step=0.1,
                               sets=("loras",))),
                 read=_read_lora),
        NodeType("load_image", "Load image", "pictures",
                 "A picture to start from: upload one, drop one on the node, or pick a saved result.",
                 outputs=(Port(PortType.IMAGE, PortType.IMAGE),),
                 fields=(Field("image", "picture", "", "Picture", sets=("init_image",)),), read=_read_load_image),
        NodeType("mask", "Mask", "pictures",
                 "Which part of the picture a sampler repaints: a rectangle (pixels of the sampler's picture), "
                 "the transparent part of a Load image, or painted.",
                 inputs=(Port(PortType.IMAGE, PortType.IMAGE),), outputs=(Port(PortType.MASK, PortType.MASK),),
                 fields=(Field("source", "choice", "rectangle", "From", choices=MASK_SOURCES),
                         Field("x", "int", 0, "X"), Field("y", "int", 0, "Y"),
                         Field("width", "int", 32, "Width"), Field("height", "int", 32, "Height"),
                         Field("invert", "choice", "no", "Invert", choices=("no", "yes")),
                         Field("painted", "mask", "", "Painted", help="white = repaint", sets=("mask_image",))),
                 read=_read_mask),
        NodeType("upscale", "Upscale", "pictures",
                 "Enlarges a picture (Lanczos) before the next sampler redraws it: the hires fix.",
                 inputs=(Port(PortType.IMAGE, PortType.IMAGE, required=True),),
                 outputs=(Port(PortType.IMAGE, PortType.IMAGE),),
                 fields=(Field("factor", "float", 2.0, "Factor", step=0.25, help="0.25..4; the size is rounded to the model's "
                                                                      "multiple", sets=("width", "height")),),
                 read=_read_upscale),
        NodeType("prompt_list", "Prompt list", "fan-out", "One branch per line.",
                 outputs=(Port(PortType.PROMPT, PortType.PROMPT),),
                 fields=(Field("prompts", "lines", "", "Prompts, one per line", sets=("prompt",)),),
                 read=_read_prompt_list),
        NodeType("seed_batch", "Seed batch", "fan-out", "One branch per seed: start, start+1, ...",
                 outputs=(Port(PortType.SEED, PortType.SEED),),
                 fields=(Field("start", "int", 0, "First seed", sets=("seed",)), Field("count", "int", 4, "Count")),
                 read=_read_seed_batch),
        NodeType("sweep", "Sweep", "fan-out", "One branch per value of one setting.",
                 outputs=(Port("values", None, typed_by="param"),),
                 fields=(Field("param", "choice", PortType.GUIDANCE, "Setting", choices=SWEEPABLE),
                         Field("values", "text", "1, 3, 5", "Values",
                               help="comma separated; sizes as WIDTHxHEIGHT; models by name",
                               sets=tuple(p for port in SWEEPABLE for p in PARAMS_OF_PORT[port]))),
                 read=_read_sweep),
        NodeType("sampler", "Sampler", "sampler",
                 "Denoises one engine request per combination of its inputs' values.",
                 inputs=SAMPLER_INPUTS, outputs=(Port(PortType.IMAGES, PortType.IMAGES),), live_view="branch_bars"),
        NodeType("image_output", "Image output", "outputs", "The finished images of every branch.",
                 inputs=(Port(PortType.IMAGES, PortType.IMAGES, required=True),), live_view="results"),
        NodeType("live_preview", "Live preview", "outputs", "Every branch's preview while it denoises.",
                 inputs=(Port(PortType.IMAGES, PortType.IMAGES, required=True),), live_view="previews"),
        NodeType("grid", "Grid", "outputs", "An X/Y plot of the branches, labelled with the swept values.",
                 inputs=(Port(PortType.IMAGES, PortType.IMAGES, required=True),),
                 fields=(Field("x", "choice", "auto", "X axis", choices=GRID_AXES),
                         Field("y", "choice", "auto", "Y axis", choices=GRID_AXES)), live_view="grid"),
    )
}


def node_type_specs(field_defaults: dict[str, dict[str, Any]] | None = None) -> list[dict]:
    """The node types as JSON for the browser editor (its palette, ports and fields).

    `field_defaults`: node type -> {field: value} replacing the built-in defaults, so a new
    Size or Steps node starts at the loaded model's own defaults."""
    field_defaults = field_defaults or {}
    specs = []
    for node_type in NODE_TYPES.values():
        overrides = field_defaults.get(node_type.name, {})
        specs.append({
            "name": node_type.name,
            "title": node_type.title,
            "category": node_type.category,
            "description": node_type.description,
            "inputs": [{"name": p.name, "type": p.type, "required": p.required, "accepts": list(p.accepts)}
                       for p in node_type.inputs],
            "outputs": [{"name": p.name, "type": p.type, "typed_by": p.typed_by} for p in node_type.outputs],
            "live_view": node_type.live_view,
            "fields": [{"name": f.name, "kind": f.kind, "default": overrides.get(f.name, f.default), "label": f.label,
                        "choices": list(f.choices), "help": f.help, "step": f.step} for f in node_type.fields],
        })
    return specs

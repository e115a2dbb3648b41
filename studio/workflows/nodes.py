"""The node types of a workflow, each one self-describing definition: its ports, its fields, the
GenerationParams fields each of its fields sets, and how it reads its values.

The browser editor draws its palette from `node_type_specs()`, the compiler reads every node
through its type's `read`, and the Simple tab builds its form's nodes with `NodeType.node`.

Reading a node only parses (numbers may arrive as text, sizes as "64x64", sweeps as comma
lists) and bounds its fan-out; whether a value suits the loaded model is the engine's rule,
asked through `ValueReader.check` (pipelines.params, pipelines.validation, engine.limits).
Pure: imports neither gradio nor torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Protocol

MAX_FAN_OUT_VALUES = 256  # values in one fan-out node


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
    IMAGES = "images"  # a sampler's branches: their previews, images and settings


# The GenerationParams fields a value of each port type sets.
PARAMS_OF_PORT = {
    PortType.PROMPT: ("prompt",), PortType.NEGATIVE_PROMPT: ("negative_prompt",), PortType.SEED: ("seed",),
    PortType.SIZE: ("width", "height"), PortType.STEPS: ("num_inference_steps",),
    PortType.GUIDANCE: ("guidance_scale",), PortType.SCHEDULER: ("scheduler",), PortType.FRAMES: ("num_frames",),
    PortType.MODEL: ("model",),
}
# What a Sweep node may vary: its `param` value decides its output type.
SWEEPABLE = (PortType.GUIDANCE, PortType.STEPS, PortType.SCHEDULER, PortType.SIZE, PortType.SEED, PortType.FRAMES,
             PortType.MODEL)
# A Grid's axes name a sampler input that a fan-out node feeds.
GRID_AXES = ("auto", PortType.PROMPT, PortType.NEGATIVE_PROMPT, PortType.SEED, PortType.SIZE, PortType.STEPS,
             PortType.GUIDANCE, PortType.SCHEDULER, PortType.FRAMES, PortType.MODEL)


# ---------------------------------------------------------------------------- reading values
@dataclass(frozen=True)
class Reading:
    """One value a node puts on its output, and how a grid labels it."""

    value: Any
    label: str


class ValueReader(Protocol):
    """What a node's `read` reports to (the compiler implements it, for one node and one model)."""

    default_model: str

    def fail(self, field: str, message: str) -> None:
        """Note a problem at one of the node's fields."""

    def check(self, at: str | None = None, **values: Any) -> bool:
        """The engine's rules for these GenerationParams values on the model being read for. A refusal
        becomes a problem at `at`, or at the node field that sets the refused field; False then."""


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


def _steps(reader: ValueReader, field: str, raw: object) -> Reading | None:
    value = read_number(reader, field, raw, whole=True)
    return _checked(reader, field, value, str(value), num_inference_steps=value)


def _guidance(reader: ValueReader, field: str, raw: object) -> Reading | None:
    value = read_number(reader, field, raw, whole=False)
    return _checked(reader, field, value, f"{value:g}" if value is not None else "", guidance_scale=value)


def _seed(reader: ValueReader, field: str, raw: object) -> Reading | None:
    value = read_number(reader, field, raw, whole=True)
    if value == -1:
        return Reading(None, "random")  # the sampler's random seed, drawn when the run starts
    return _checked(reader, field, value, str(value), seed=value)


def _frames(reader: ValueReader, field: str, raw: object) -> Reading | None:
    value = read_number(reader, field, raw, whole=True)
    return _checked(reader, field, value, str(value), num_frames=value)


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


# ---------------------------------------------------------------------------- the types
@dataclass(frozen=True)
class Port:
    name: str
    type: str | None  # None: the value of the node's field `typed_by` is the type (the Sweep node)
    required: bool = False
    typed_by: str | None = None


@dataclass(frozen=True)
class Field:
    """One editable value of a node. `kind` tells the editor which control to draw; `sets` names the
    GenerationParams fields it sets (so an engine refusal of one of them is shown at this field)."""

    name: str
    kind: str  # "text" | "lines" | "int" | "float" | "choice" | "scheduler" | "model"
    default: Any
    label: str
    choices: tuple[str, ...] = ()
    help: str = ""
    sets: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeType:
    name: str
    title: str
    category: str  # "values" | "fan-out" | "sampler" | "outputs"
    description: str
    inputs: tuple[Port, ...] = ()
    outputs: tuple[Port, ...] = ()
    fields: tuple[Field, ...] = ()
    read: Read | None = None  # the values it puts on its output (value and fan-out nodes)
    # What the editor draws inside the node while a run goes: "branch_bars" (a step bar per
    # branch), "previews" (each branch's latest preview), "results" (finished images), "grid".
    live_view: str | None = None

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


SAMPLER_INPUTS = tuple(Port(port, port, required=port == PortType.PROMPT) for port in PARAMS_OF_PORT)

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
            "inputs": [{"name": p.name, "type": p.type, "required": p.required} for p in node_type.inputs],
            "outputs": [{"name": p.name, "type": p.type, "typed_by": p.typed_by} for p in node_type.outputs],
            "live_view": node_type.live_view,
            "fields": [{"name": f.name, "kind": f.kind, "default": overrides.get(f.name, f.default), "label": f.label,
                        "choices": list(f.choices), "help": f.help} for f in node_type.fields],
        })
    return specs

"""The node types of a workflow, each one self-describing definition: its ports, its fields, the
GenerationParams fields each of its fields sets, and how it reads its values (the readers are in
`studio.workflows.readers`; what flows along links, in `studio.workflows.ports`).

The browser editor draws its palette from `node_type_specs()`, the compiler reads every node
through its type's `read`, and the Simple tab builds its form's nodes with `NodeType.node`.
Pure: imports neither gradio nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from studio.workflows.ports import PARAMS_OF_PORT, SWEEPABLE, PortType, accepts
from studio.workflows.readers import (
    MASK_SOURCES,
    Read,
    one_value,
    read_load_image,
    read_lora,
    read_mask,
    read_prompt_list,
    read_seed_batch,
    read_size,
    read_sweep,
    read_upscale,
)

# A Grid's axes name a sampler input that a fan-out node feeds (or an earlier stage's, inherited).
GRID_AXES = ("auto", PortType.PROMPT, PortType.NEGATIVE_PROMPT, PortType.SEED, PortType.SIZE, PortType.STEPS,
             PortType.GUIDANCE, PortType.SCHEDULER, PortType.FRAMES, PortType.MODEL, PortType.STRENGTH, PortType.LORA,
             PortType.STEP_CACHE)


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
                    read=read or one_value(port_type, fields[0].name))


# Every value type (a LoRA's scale goes into a LoRA node), the pictures, the adapters, then step
# caching (last, so the earlier inputs keep the places saved editors and tests know them by).
SAMPLER_INPUTS = tuple(Port(port, port, required=port == PortType.PROMPT) for port in PARAMS_OF_PORT
                       if port not in (PortType.LORA, PortType.LORA_SCALE, PortType.STEP_CACHE)) + (
    Port(PortType.IMAGE, PortType.IMAGE), Port(PortType.MASK, PortType.MASK), Port(PortType.LORA, PortType.LORA),
    Port(PortType.STEP_CACHE, PortType.STEP_CACHE))

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
                     Field("height", "int", 64, "Height", sets=("height",))), "Image size in pixels.", read_size),
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
                 read=read_lora),
        _value_node("step_cache", "Step cache", PortType.STEP_CACHE,
                    (Field("threshold", "float", 0.3, "Threshold",
                           help="0 = off; higher skips more steps (FLUX and Wan models)", step=0.05),),
                    "Step caching: a step whose model output barely changes reuses most of the last one."),
        NodeType("load_image", "Load image", "pictures",
                 "A picture to start from: upload one, drop one on the node, or pick a saved result.",
                 outputs=(Port(PortType.IMAGE, PortType.IMAGE),),
                 fields=(Field("image", "picture", "", "Picture", sets=("init_image",)),), read=read_load_image),
        NodeType("mask", "Mask", "pictures",
                 "Which part of the picture a sampler repaints: a rectangle (pixels of the sampler's picture), "
                 "the transparent part of a Load image, or painted.",
                 inputs=(Port(PortType.IMAGE, PortType.IMAGE),), outputs=(Port(PortType.MASK, PortType.MASK),),
                 fields=(Field("source", "choice", "rectangle", "From", choices=MASK_SOURCES),
                         Field("x", "int", 0, "X"), Field("y", "int", 0, "Y"),
                         Field("width", "int", 32, "Width"), Field("height", "int", 32, "Height"),
                         Field("invert", "choice", "no", "Invert", choices=("no", "yes")),
                         Field("painted", "mask", "", "Painted", help="white = repaint", sets=("mask_image",))),
                 read=read_mask),
        NodeType("upscale", "Upscale", "pictures",
                 "Enlarges a picture (Lanczos) before the next sampler redraws it: the hires fix.",
                 inputs=(Port(PortType.IMAGE, PortType.IMAGE, required=True),),
                 outputs=(Port(PortType.IMAGE, PortType.IMAGE),),
                 fields=(Field("factor", "float", 2.0, "Factor", step=0.25, help="0.25..4; the size is rounded to the model's "
                                                                      "multiple", sets=("width", "height")),),
                 read=read_upscale),
        NodeType("prompt_list", "Prompt list", "fan-out", "One branch per line.",
                 outputs=(Port(PortType.PROMPT, PortType.PROMPT),),
                 fields=(Field("prompts", "lines", "", "Prompts, one per line", sets=("prompt",)),),
                 read=read_prompt_list),
        NodeType("seed_batch", "Seed batch", "fan-out", "One branch per seed: start, start+1, ...",
                 outputs=(Port(PortType.SEED, PortType.SEED),),
                 fields=(Field("start", "int", 0, "First seed", sets=("seed",)), Field("count", "int", 4, "Count")),
                 read=read_seed_batch),
        NodeType("sweep", "Sweep", "fan-out", "One branch per value of one setting.",
                 outputs=(Port("values", None, typed_by="param"),),
                 fields=(Field("param", "choice", PortType.GUIDANCE, "Setting", choices=SWEEPABLE),
                         Field("values", "text", "1, 3, 5", "Values",
                               help="comma separated; sizes as WIDTHxHEIGHT; models by name",
                               sets=tuple(p for port in SWEEPABLE for p in PARAMS_OF_PORT[port]))),
                 read=read_sweep),
        NodeType("sampler", "Sampler", "sampler",
                 "Denoises one engine request per combination of its inputs' values.",
                 inputs=SAMPLER_INPUTS, outputs=(Port(PortType.IMAGES, PortType.IMAGES),), live_view="branch_bars"),
        NodeType("image_output", "Image output", "outputs",
                 "Every branch's image: its live preview while it denoises, then its result.",
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

"""Workflows as data: the node types, and a workflow's nodes and links parsed from JSON.

A workflow is JSON (version 1):

    {"version": 1,
     "nodes": [{"id": "1", "type": "prompt", "values": {"text": "a red circle"}, "position": [40, 60]},
               {"id": "2", "type": "sampler", "values": {}, "position": [320, 60]}],
     "links": [{"from": {"node": "1", "port": "prompt"}, "to": {"node": "2", "port": "prompt"}}]}

Every port has a type; a link joins an output to an input of the same type, and an input takes
at most one link. The node types are the single source of truth: the browser editor draws its
palette from `node_type_specs()`, and `studio.workflows.compiler` checks and expands a workflow.

Pure: imports neither gradio nor torch, so it is tested on its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pipelines.params import MAX_PROMPT_CHARS

WORKFLOW_VERSION = 1
# Bounds on what one workflow may hold: a hand-built graph has tens of nodes. The byte limit holds
# however a workflow arrives: JSON text by its UTF-8 bytes, a decoded object by its compact JSON.
MAX_WORKFLOW_BYTES = 256 * 1024
MAX_WORKFLOW_DEPTH = 16  # lists and objects inside each other; the format itself needs 5
MAX_NODES = 200
MAX_LINKS = 400
MAX_ID_CHARS = 64
# The longest node value (text, or anything else as JSON): a prompt's own limit (GenerationParams),
# as a prompt is the longest thing a node field holds.
MAX_VALUE_CHARS = MAX_PROMPT_CHARS


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


# What a Sweep node may vary: its `param` value decides its output type.
SWEEPABLE = (PortType.GUIDANCE, PortType.STEPS, PortType.SCHEDULER, PortType.SIZE, PortType.SEED, PortType.FRAMES,
             PortType.MODEL)
# A Grid's axes name a sampler input that a fan-out node feeds.
GRID_AXES = ("auto", PortType.PROMPT, PortType.NEGATIVE_PROMPT, PortType.SEED, PortType.SIZE, PortType.STEPS,
             PortType.GUIDANCE, PortType.SCHEDULER, PortType.FRAMES, PortType.MODEL)


@dataclass(frozen=True)
class Port:
    name: str
    type: str | None  # None: decided by the node's `param` value (the Sweep node)
    required: bool = False


@dataclass(frozen=True)
class Field:
    """One editable value of a node. `kind` tells the editor which control to draw."""

    name: str
    kind: str  # "text" | "lines" | "int" | "float" | "choice" | "scheduler" | "model"
    default: Any
    label: str
    choices: tuple[str, ...] = ()
    help: str = ""


@dataclass(frozen=True)
class NodeType:
    name: str
    title: str
    category: str  # "values" | "fan-out" | "sampler" | "outputs"
    description: str
    inputs: tuple[Port, ...] = ()
    outputs: tuple[Port, ...] = ()
    fields: tuple[Field, ...] = ()

    def input(self, name: str) -> Port | None:
        return next((port for port in self.inputs if port.name == name), None)

    def output(self, name: str) -> Port | None:
        return next((port for port in self.outputs if port.name == name), None)

    @property
    def is_fan_out(self) -> bool:
        return self.category == "fan-out"

    def default_values(self) -> dict[str, Any]:
        return {f.name: f.default for f in self.fields}


def _value_node(name: str, title: str, port_type: str, fields: tuple[Field, ...], description: str) -> NodeType:
    return NodeType(name, title, "values", description, outputs=(Port(port_type, port_type),), fields=fields)


SAMPLER_INPUTS = (
    Port(PortType.PROMPT, PortType.PROMPT, required=True),
    Port(PortType.NEGATIVE_PROMPT, PortType.NEGATIVE_PROMPT),
    Port(PortType.SEED, PortType.SEED),
    Port(PortType.SIZE, PortType.SIZE),
    Port(PortType.STEPS, PortType.STEPS),
    Port(PortType.GUIDANCE, PortType.GUIDANCE),
    Port(PortType.SCHEDULER, PortType.SCHEDULER),
    Port(PortType.FRAMES, PortType.FRAMES),
    Port(PortType.MODEL, PortType.MODEL),
)

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
                    (Field("width", "int", 64, "Width"), Field("height", "int", 64, "Height")), "Image size in pixels."),
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
                 fields=(Field("prompts", "lines", "", "Prompts, one per line"),)),
        NodeType("seed_batch", "Seed batch", "fan-out", "One branch per seed: start, start+1, ...",
                 outputs=(Port(PortType.SEED, PortType.SEED),),
                 fields=(Field("start", "int", 0, "First seed"), Field("count", "int", 4, "Count"))),
        NodeType("sweep", "Sweep", "fan-out", "One branch per value of one setting.",
                 outputs=(Port("values", None),),
                 fields=(Field("param", "choice", PortType.GUIDANCE, "Setting", choices=SWEEPABLE),
                         Field("values", "text", "1, 3, 5", "Values",
                               help="comma separated; sizes as WIDTHxHEIGHT; models by name"))),
        NodeType("sampler", "Sampler", "sampler",
                 "Denoises one engine request per combination of its inputs' values.",
                 inputs=SAMPLER_INPUTS, outputs=(Port(PortType.IMAGES, PortType.IMAGES),)),
        NodeType("image_output", "Image output", "outputs", "The finished images of every branch.",
                 inputs=(Port(PortType.IMAGES, PortType.IMAGES, required=True),)),
        NodeType("live_preview", "Live preview", "outputs", "Every branch's preview while it denoises.",
                 inputs=(Port(PortType.IMAGES, PortType.IMAGES, required=True),)),
        NodeType("grid", "Grid", "outputs", "An X/Y plot of the branches, labelled with the swept values.",
                 inputs=(Port(PortType.IMAGES, PortType.IMAGES, required=True),),
                 fields=(Field("x", "choice", "auto", "X axis", choices=GRID_AXES),
                         Field("y", "choice", "auto", "Y axis", choices=GRID_AXES))),
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
            "outputs": [{"name": p.name, "type": p.type} for p in node_type.outputs],
            "fields": [{"name": f.name, "kind": f.kind, "default": overrides.get(f.name, f.default), "label": f.label,
                        "choices": list(f.choices), "help": f.help} for f in node_type.fields],
        })
    return specs


# ---------------------------------------------------------------------------- problems
@dataclass(frozen=True)
class Problem:
    """One thing wrong with a workflow, located at a node (and port or field) when it has one."""

    message: str
    node_id: str | None = None
    port: str | None = None

    def __str__(self) -> str:
        where = ""
        if self.node_id is not None:
            where = f"node {self.node_id}"
            if self.port:
                where += f", port {self.port!r}"
            where += ": "
        return where + self.message


class WorkflowError(ValueError):
    """The workflow can't run; `problems` lists every reason (nothing was submitted)."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = tuple(problems)
        count = len(self.problems)
        head = f"the workflow has {count} problem{'s' * (count != 1)}: "
        super().__init__(head + "; ".join(str(p) for p in self.problems))

    def as_dicts(self) -> list[dict]:
        return [{"node": p.node_id, "port": p.port, "message": p.message} for p in self.problems]


# ---------------------------------------------------------------------------- the graph
@dataclass(frozen=True)
class Node:
    id: str
    type: str
    values: dict[str, Any] = field(default_factory=dict, hash=False)
    position: tuple[float, float] = (0.0, 0.0)


@dataclass(frozen=True)
class Endpoint:
    node: str
    port: str


@dataclass(frozen=True)
class Link:
    source: Endpoint  # an output port
    target: Endpoint  # an input port


@dataclass(frozen=True)
class Workflow:
    nodes: dict[str, Node] = field(hash=False)
    links: tuple[Link, ...]
    version: int = WORKFLOW_VERSION

    def to_json(self) -> dict:
        return {
            "version": self.version,
            "nodes": [{"id": n.id, "type": n.type, "values": dict(n.values), "position": list(n.position)}
                      for n in self.nodes.values()],
            "links": [{"from": {"node": link.source.node, "port": link.source.port},
                       "to": {"node": link.target.node, "port": link.target.port}} for link in self.links],
        }


def _node_id(value: object) -> str | None:
    """Ids may be strings or integers in JSON; both become strings."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    text = str(value)
    return text if 0 < len(text) <= MAX_ID_CHARS else None


def _endpoint(raw: object, which: str, index: int, problems: list[Problem]) -> Endpoint | None:
    if not isinstance(raw, dict) or _node_id(raw.get("node")) is None or not isinstance(raw.get("port"), str):
        problems.append(Problem(f"link {index}: {which!r} must be {{\"node\": ID, \"port\": NAME}}, got {raw!r:.80}"))
        return None
    return Endpoint(_node_id(raw["node"]), raw["port"])


def _position(raw: object) -> tuple[float, float]:
    if isinstance(raw, (list, tuple)) and len(raw) == 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in raw
    ):
        return float(raw[0]), float(raw[1])
    return 0.0, 0.0


# ---------------------------------------------------------------------------- size
_SLICE_CHARS = 1 << 16


def _utf8_bytes(text: str) -> int:
    """UTF-8 bytes of `text`. str.isascii() is O(1) in CPython, so ASCII text is not copied;
    other text is encoded a slice at a time (never a second copy of a large text)."""
    if text.isascii():
        return len(text)
    return sum(len(text[start:start + _SLICE_CHARS].encode("utf-8", "surrogatepass"))
               for start in range(0, len(text), _SLICE_CHARS))


def _too_deep() -> WorkflowError:
    return WorkflowError([Problem(
        f"the workflow nests lists and objects more than {MAX_WORKFLOW_DEPTH} levels deep; "
        f"at most {MAX_WORKFLOW_DEPTH} are allowed.")])


def _check_depth(value: object) -> None:
    """Refuse lists and objects nested more than MAX_WORKFLOW_DEPTH deep (WorkflowError). Walks with
    its own stack, so no nesting recurses it."""
    containers = (dict, list, tuple)
    pending = [(value, 1)] if isinstance(value, containers) else []
    while pending:
        item, depth = pending.pop()
        if depth > MAX_WORKFLOW_DEPTH:
            raise _too_deep()
        members = item.values() if isinstance(item, dict) else item
        pending.extend((member, depth + 1) for member in members if isinstance(member, containers))


def json_bytes(value: object) -> int:
    """The UTF-8 bytes of `value`'s compact JSON (no spaces, characters as they are). The depth
    is checked first, as json.dumps recurses once per level; the text is built once."""
    _check_depth(value)
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:  # a set, a circular list, an int of 4300+ digits ...
        raise WorkflowError([Problem(f"the workflow is not JSON data ({exc}).")]) from None
    return _utf8_bytes(text)


def _value_problem(node_id: str, name: object, value: object) -> Problem | None:
    """A node value longer than a prompt may be (text by its characters, others by their JSON)."""
    size = len(value) if isinstance(value, str) else json_bytes(value)
    if size <= MAX_VALUE_CHARS:
        return None
    what = "characters long" if isinstance(value, str) else "characters long as JSON"
    return Problem(f"is {size} {what}; at most {MAX_VALUE_CHARS} are allowed.", node_id, str(name)[:MAX_ID_CHARS])


def _check_size(size: int, measured_as: str) -> None:
    if size > MAX_WORKFLOW_BYTES:
        raise WorkflowError([Problem(f"the workflow is {size} bytes{measured_as}; at most {MAX_WORKFLOW_BYTES} "
                                     "are allowed.")])


def parse_workflow(source: str | bytes | dict) -> Workflow:
    """A Workflow from JSON text or an already-decoded dict. Raises WorkflowError listing every
    structural problem: not JSON, too large (text by its UTF-8 bytes, an object by its compact
    JSON), nested too deep, a node value too long, wrong version, unknown node types, links to
    missing nodes or ports, an input linked twice."""
    if isinstance(source, (str, bytes)):
        _check_size(len(source) if isinstance(source, bytes) else _utf8_bytes(source), "")
        try:
            source = json.loads(source)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise WorkflowError([Problem(f"the workflow is not valid JSON ({exc}).")]) from None
        except RecursionError:  # nested far past the depth limit
            raise _too_deep() from None
        _check_depth(source)
    else:
        _check_size(json_bytes(source), " as compact JSON")
    if not isinstance(source, dict):
        raise WorkflowError([Problem(
            f"a workflow is a JSON object with version, nodes and links; got {type(source).__name__}.")])
    version = source.get("version")
    if version != WORKFLOW_VERSION:
        raise WorkflowError([Problem(f"version={version!r} is not supported: use {WORKFLOW_VERSION}.")])
    raw_nodes, raw_links = source.get("nodes"), source.get("links", [])
    if not isinstance(raw_nodes, list) or not isinstance(raw_links, list):
        raise WorkflowError([Problem("nodes and links must be JSON lists.")])
    if len(raw_nodes) > MAX_NODES or len(raw_links) > MAX_LINKS:
        raise WorkflowError([Problem(
            f"the workflow has {len(raw_nodes)} nodes and {len(raw_links)} links; "
            f"at most {MAX_NODES} nodes and {MAX_LINKS} links are allowed.")])

    problems: list[Problem] = []
    nodes: dict[str, Node] = {}
    for index, raw in enumerate(raw_nodes):
        if not isinstance(raw, dict) or _node_id(raw.get("id")) is None:
            problems.append(Problem(f"node {index} needs an id (a string or number of 1..{MAX_ID_CHARS} characters)."))
            continue
        node_id = _node_id(raw["id"])
        node_type = raw.get("type")
        if node_id in nodes:
            problems.append(Problem("two nodes have this id.", node_id))
            continue
        if not isinstance(node_type, str) or node_type not in NODE_TYPES:  # a list can't even be looked up
            problems.append(Problem(
                f"unknown node type {node_type!r:.40}; known types are: {', '.join(NODE_TYPES)}.", node_id))
            continue
        values = raw.get("values", {})
        if not isinstance(values, dict):
            problems.append(Problem(f"values must be a JSON object, got {type(values).__name__}.", node_id))
            continue
        for name, value in values.items():
            problem = _value_problem(node_id, name, value)
            if problem is not None:
                problems.append(problem)  # the node still counts, so its links are checked
        merged = NODE_TYPES[node_type].default_values()
        merged.update({k: v for k, v in values.items() if k in merged})
        nodes[node_id] = Node(node_id, node_type, merged, _position(raw.get("position")))

    links: list[Link] = []
    linked_inputs: set[Endpoint] = set()
    for index, raw in enumerate(raw_links):
        if not isinstance(raw, dict):
            problems.append(Problem(f"link {index} must be a JSON object with 'from' and 'to'."))
            continue
        source_end = _endpoint(raw.get("from"), "from", index, problems)
        target_end = _endpoint(raw.get("to"), "to", index, problems)
        if source_end is None or target_end is None:
            continue
        ok = True
        for end, side in ((source_end, "output"), (target_end, "input")):
            node = nodes.get(end.node)
            if node is None:
                problems.append(Problem(f"link {index} refers to node {end.node!r:.70}, which does not exist."))
                ok = False
                continue
            node_type = NODE_TYPES[node.type]
            ports = node_type.outputs if side == "output" else node_type.inputs
            if not any(p.name == end.port for p in ports):
                names = ", ".join(p.name for p in ports) or "none"
                problems.append(Problem(f"{node_type.title} has no {side} {end.port!r:.40} ({side}s: {names}).",
                                        end.node, end.port))
                ok = False
        if not ok:
            continue
        if target_end in linked_inputs:
            problems.append(Problem("this input has more than one link; an input takes one.",
                                    target_end.node, target_end.port))
            continue
        linked_inputs.add(target_end)
        links.append(Link(source_end, target_end))
    if problems:
        raise WorkflowError(problems)
    return Workflow(nodes=nodes, links=tuple(links))

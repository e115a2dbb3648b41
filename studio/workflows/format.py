"""Workflows as data: a workflow's nodes and links parsed from JSON, and its problems.

A workflow is JSON (version 1):

    {"version": 1,
     "nodes": [{"id": "1", "type": "prompt", "values": {"text": "a red circle"}, "position": [40, 60]},
               {"id": "2", "type": "sampler", "values": {}, "position": [320, 60]}],
     "links": [{"from": {"node": "1", "port": "prompt"}, "to": {"node": "2", "port": "prompt"}}]}

A node may also have a "color", and the workflow "groups": what the editor draws, kept with the
workflow and never read by the compiler (`studio.workflows.layout`). A node with "bypass": true
passes its inputs through (`studio.workflows.bypass`).

Every port has a type; a link joins an output to an input of the same type, and an input takes
at most one link. The node types (`studio.workflows.nodes`) say which ports and fields each
node has; `studio.workflows.compiler` checks and expands a workflow.

Pure: imports neither gradio nor torch, so it is tested on its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pipelines.params import MAX_PROMPT_CHARS
from studio.pictures import MAX_DATA_URL_CHARS
from studio.workflows.layout import Group, parse_color, parse_groups
from studio.workflows.nodes import NODE_TYPES

WORKFLOW_VERSION = 1
# Bounds on what one workflow may hold: a hand-built graph has tens of nodes. The byte limits hold
# however a workflow arrives: JSON text by its UTF-8 bytes, a decoded object by its compact JSON.
# Pictures (Load image, a painted Mask: data URLs) are counted apart: the graph without them is at
# most MAX_WORKFLOW_BYTES, each picture at most MAX_PICTURE_CHARS, and everything together at most
# MAX_WORKFLOW_WITH_PICTURES_BYTES.
MAX_WORKFLOW_BYTES = 256 * 1024
MAX_PICTURE_CHARS = MAX_DATA_URL_CHARS  # an 8 MiB picture as a data URL
MAX_WORKFLOW_WITH_PICTURES_BYTES = 32 * 2**20
# A saved PNG's `workflow` text keeps its pictures while it stays under this size (Pillow reads
# texts up to 1 MiB back: PngImagePlugin.MAX_TEXT_CHUNK); above it, the pictures are left out.
MAX_SAVED_WORKFLOW_CHARS = 900 * 1024
MAX_WORKFLOW_DEPTH = 16  # lists and objects inside each other; the format itself needs 5
MAX_NODES = 200
MAX_LINKS = 400
MAX_ID_CHARS = 64
# The longest node value (text, or anything else as JSON): a prompt's own limit (GenerationParams),
# as a prompt is the longest thing a node field holds.
MAX_VALUE_CHARS = MAX_PROMPT_CHARS


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
    color: str | None = None  # the editor's colour for the node ("#rrggbb"); the compiler ignores it
    bypass: bool = False  # passes its inputs through instead of running (studio.workflows.bypass)

    def to_json(self) -> dict:
        node = {"id": self.id, "type": self.type, "values": dict(self.values), "position": list(self.position)}
        if self.color is not None:
            node["color"] = self.color
        if self.bypass:
            node["bypass"] = True
        return node


def output_type(node: Node, port_name: str) -> str | None:
    """The type of a node's output port (a Sweep's: its setting; None while that is not valid)."""
    node_type = NODE_TYPES[node.type]
    port = node_type.output(port_name)
    return None if port is None else node_type.port_type(port, node.values)


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
    groups: tuple[Group, ...] = ()  # the editor's titled frames (studio.workflows.layout)

    def to_json(self) -> dict:
        workflow = {
            "version": self.version,
            "nodes": [node.to_json() for node in self.nodes.values()],
            "links": [{"from": {"node": link.source.node, "port": link.source.port},
                       "to": {"node": link.target.node, "port": link.target.port}} for link in self.links],
        }
        if self.groups:
            workflow["groups"] = [group.to_json() for group in self.groups]
        return workflow


def link_json(source: str, port: str, target: str, target_port: str | None = None) -> dict:
    """A link as workflow JSON: from an output port to an input port (of the same name by default)."""
    return {"from": {"node": source, "port": port}, "to": {"node": target, "port": target_port or port}}


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


def _value_problem(node_id: str, name: object, value: object, limit: int) -> Problem | None:
    """A node value longer than `limit` (a prompt's, or a picture's), text by its characters,
    others by their JSON."""
    size = len(value) if isinstance(value, str) else json_bytes(value)
    if size <= limit:
        return None
    what = "characters long" if isinstance(value, str) else "characters long as JSON"
    return Problem(f"is {size} {what}; at most {limit} are allowed.", node_id, str(name)[:MAX_ID_CHARS])


def _check_size(size: int, measured_as: str, limit: int = MAX_WORKFLOW_BYTES) -> None:
    if size > limit:
        raise WorkflowError([Problem(f"the workflow is {size} bytes{measured_as}; at most {limit} are allowed.")])


def _picture_values(source: dict) -> list[tuple[dict, str]]:
    """(values object, field) of every picture a decoded workflow carries (a Load image's, a
    painted Mask's), found by the node types' picture fields."""
    found = []
    nodes = source.get("nodes")
    for raw in nodes if isinstance(nodes, list) else ():
        node_type = NODE_TYPES.get(raw.get("type")) if isinstance(raw, dict) and isinstance(raw.get("type"), str) else None
        values = raw.get("values") if node_type is not None else None
        if isinstance(values, dict):
            found += [(values, name) for name in node_type.picture_fields if isinstance(values.get(name), str)]
    return found


def _without_pictures(source: dict) -> tuple[dict, int]:
    """The workflow with every picture value emptied (a copy of what changes), and how many there were."""
    pictures = _picture_values(source)
    if not pictures:
        return source, 0
    emptied = {id(values): {**values, **{name: "" for v, name in pictures if v is values}} for values, _ in pictures}
    nodes = [{**raw, "values": emptied[id(raw["values"])]} if isinstance(raw, dict) and id(raw.get("values")) in emptied
             else raw for raw in source["nodes"]]
    return {**source, "nodes": nodes}, len(pictures)


def for_saving(workflow: dict) -> dict:
    """The workflow as a saved PNG's `workflow` text carries it: whole while its JSON is at most
    MAX_SAVED_WORKFLOW_CHARS, else with its pictures left out (their Load image nodes then ask for
    a picture when the workflow is opened) and `pictures_left_out` saying how many."""
    if len(json.dumps(workflow, ensure_ascii=False)) <= MAX_SAVED_WORKFLOW_CHARS:
        return workflow
    emptied, count = _without_pictures(workflow)
    return {**emptied, "pictures_left_out": count} if count else workflow


def _decoded_within_limits(source: str | bytes | dict) -> object:
    """JSON text decoded, or a decoded object as it is, once its size and depth are within the
    limits: everything at most MAX_WORKFLOW_WITH_PICTURES_BYTES, the graph without its pictures at
    most MAX_WORKFLOW_BYTES (WorkflowError naming the size otherwise)."""
    if isinstance(source, (str, bytes)):
        size = len(source) if isinstance(source, bytes) else _utf8_bytes(source)
        measured_as = ""
        _check_size(size, measured_as, MAX_WORKFLOW_WITH_PICTURES_BYTES)
        try:
            source = json.loads(source)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            _check_size(size, measured_as)  # too large to be a workflow without pictures anyway
            raise WorkflowError([Problem(f"the workflow is not valid JSON ({exc}).")]) from None
        except RecursionError:  # nested far past the depth limit
            raise _too_deep() from None
        _check_depth(source)
    else:
        size, measured_as = json_bytes(source), " as compact JSON"
        _check_size(size, measured_as, MAX_WORKFLOW_WITH_PICTURES_BYTES)
    if isinstance(source, dict):
        graph, pictures = _without_pictures(source)
        if pictures:
            size, measured_as = json_bytes(graph), " as compact JSON without its pictures"
        _check_size(size, measured_as)
    return source


def parse_workflow(source: str | bytes | dict) -> Workflow:
    """A Workflow from JSON text or an already-decoded dict. Raises WorkflowError listing every
    structural problem: not JSON, too large (text by its UTF-8 bytes, an object by its compact
    JSON), nested too deep, a node value too long, wrong version, unknown node types, links to
    missing nodes or ports, an input linked twice."""
    source = _decoded_within_limits(source)
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
        pictures = NODE_TYPES[node_type].picture_fields
        for name, value in values.items():
            problem = _value_problem(node_id, name, value, MAX_PICTURE_CHARS if name in pictures else MAX_VALUE_CHARS)
            if problem is not None:
                problems.append(problem)  # the node still counts, so its links are checked
        color, color_problem = parse_color(raw.get("color"), "the node's")
        if color_problem:
            problems.append(Problem(color_problem, node_id))
        bypass = raw.get("bypass", False)
        if not isinstance(bypass, bool):
            problems.append(Problem(f"bypass must be true or false (or left out), got {bypass!r:.40}.", node_id))
        merged = NODE_TYPES[node_type].default_values()
        merged.update({k: v for k, v in values.items() if k in merged})
        nodes[node_id] = Node(node_id, node_type, merged, _position(raw.get("position")), color, bypass is True)

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
    groups, group_problems = parse_groups(source.get("groups"))
    problems += [Problem(message) for message in group_problems]
    if problems:
        raise WorkflowError(problems)
    return Workflow(nodes=nodes, links=tuple(links), groups=groups)

"""Compile a workflow into the engine requests its Sampler nodes make ("branches").

    compiled = compile_workflow(parse_workflow(text), WorkflowLimits(max_steps=100, ...))
    compiled.branches   # one GenerationParams per combination of each sampler's input values

A value node (Prompt, Seed, Steps, ...) gives one value; a fan-out node (Prompt list, Seed batch,
Sweep) gives several. A Sampler makes one branch per combination: the product of the fan-outs
that reach it, in the order of its inputs (prompt, negative prompt, seed, size, steps, guidance,
scheduler). Inputs left unlinked take the model's defaults. A sampler without a seed input (or
with a Seed of -1) uses ONE random seed for all of its branches, picked when the run starts, so
the cells of an X/Y plot differ only in what was swept.

Everything is checked before anything runs, and every problem names its node and port or field:
cycles, wrong link types, missing required inputs, values outside the loaded model's limits,
more branches than allowed. Pure: imports neither gradio nor torch.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Any, Callable

from pipelines.params import (
    MAX_FRAMES_ABSOLUTE,
    MAX_PROMPT_CHARS,
    MAX_SEED,
    MIN_SIZE,
    GenerationParams,
)
from studio.workflows.format import (
    NODE_TYPES,
    SAMPLER_INPUTS,
    SWEEPABLE,
    Node,
    PortType,
    Problem,
    Workflow,
    WorkflowError,
)

DEFAULT_MAX_BRANCHES = 64
MAX_FAN_OUT_VALUES = 256  # values in one fan-out node
MAX_GUIDANCE = 100.0


@dataclass(frozen=True)
class ModelLimits:
    """What one loaded model and the server allow for it; values outside are refused at compile time."""

    name: str = "default"
    max_steps: int = 100
    max_size: int = 1024
    size_multiple: int = 8
    schedulers: tuple[str, ...] = ()  # names a Scheduler node may use (empty: only the default)
    uses_negative_prompt: bool = True
    makes_video: bool = False
    sizes: tuple[tuple[int, int], ...] = ()  # the only sizes the model serves (empty: any multiple)

    def __post_init__(self) -> None:
        for name in ("max_steps", "max_size", "size_multiple"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")


@dataclass(frozen=True)
class WorkflowLimits:
    """The loaded models' limits (the first model is the default) and the branches a run may make."""

    models: tuple[ModelLimits, ...] = (ModelLimits(),)
    max_branches: int = DEFAULT_MAX_BRANCHES

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("WorkflowLimits needs at least one model.")
        value = self.max_branches
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"max_branches must be a positive integer, got {value!r}.")

    @property
    def default(self) -> ModelLimits:
        return self.models[0]

    def model(self, name: str) -> ModelLimits:
        return next(limits for limits in self.models if limits.name == name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(limits.name for limits in self.models)

    def scope(self, limits: ModelLimits, what: str) -> str:
        """How a range message names its limit: ' for this server' with one model, ' for <model>' with several."""
        return f" for {what}" if len(self.models) == 1 else f" for {limits.name}"


@dataclass(frozen=True)
class AxisValue:
    """Where a branch sits along one fan-out: the sampler input, the value's index and its label."""

    input: str
    index: int
    label: str


@dataclass(frozen=True)
class Branch:
    index: int  # position in the run, 0-based
    sampler: str  # node id
    params: GenerationParams  # unset fields = the model's defaults; seed None = the sampler's random seed
    axes: tuple[AxisValue, ...]  # one per fan-out input of the sampler, in input order
    # GenerationParams field -> (node id, field of that node) that set it, to name them in errors
    sources: tuple[tuple[str, tuple[str, str]], ...] = ()

    def source_of(self, field_name: str) -> tuple[str, str | None]:
        """(node id, port or field) that set a GenerationParams field; the sampler when none did."""
        return dict(self.sources).get(field_name, (self.sampler, None))

    @property
    def label(self) -> str:
        return ", ".join(f"{axis.input} {axis.label}" for axis in self.axes) or "single"


@dataclass(frozen=True)
class GridLayout:
    """An X/Y plot of one sampler's branches: cells[row][col] is a branch index (None: no branch)."""

    node_id: str
    sampler: str
    x_axis: str | None
    y_axis: str | None
    columns: tuple[str, ...]
    rows: tuple[str, ...]
    cells: tuple[tuple[int | None, ...], ...]


@dataclass(frozen=True)
class CompiledWorkflow:
    workflow: Workflow
    branches: tuple[Branch, ...]
    grids: tuple[GridLayout, ...]
    node_branches: dict[str, tuple[int, ...]]  # every node -> the branches it takes part in

    def branches_of(self, node_id: str) -> tuple[Branch, ...]:
        return tuple(self.branches[i] for i in self.node_branches.get(node_id, ()))


# ---------------------------------------------------------------------------- values
@dataclass(frozen=True)
class _Value:
    value: Any
    label: str


class _ValueReader:
    """Reads a node's field values (numbers may arrive as text from the editor), noting problems.
    `limits` are the limits of the model the values are read for."""

    def __init__(self, node: Node, problems: list[Problem], limits: ModelLimits, workflow_limits: WorkflowLimits) -> None:
        self.node = node
        self.problems = problems
        self.limits = limits
        self.workflow_limits = workflow_limits

    def scope(self, what: str) -> str:
        return self.workflow_limits.scope(self.limits, what)

    def fail(self, name: str, message: str) -> None:
        problem = Problem(message, self.node.id, name)
        if problem not in self.problems:  # a value read for several models fails once
            self.problems.append(problem)

    def number(self, name: str, raw: object, whole: bool) -> float | int | None:
        value = raw
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                self.fail(name, f"{raw!r:.40} is not a number.")
                return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self.fail(name, f"{raw!r:.40} is not a finite number.")
            return None
        if whole:
            if float(value) != int(value):
                self.fail(name, f"{raw!r:.40} must be a whole number.")
                return None
            return int(value)
        return float(value)

    def bounded(self, name: str, raw: object, low: float, high: float, whole: bool, what: str = "") -> Any:
        value = self.number(name, raw, whole)
        if value is None:
            return None
        if not low <= value <= high:
            high_text = f"{high:g}" if isinstance(high, float) else str(high)
            self.fail(name, f"{value:g} is out of range{what}: allowed is {low:g}..{high_text}.")
            return None
        return value

    def text(self, name: str, raw: object, required: bool) -> str | None:
        if not isinstance(raw, str):
            self.fail(name, f"must be text, got {type(raw).__name__}.")
            return None
        if required and not raw.strip():
            self.fail(name, "is empty: write a prompt.")
            return None
        if len(raw) > MAX_PROMPT_CHARS:
            self.fail(name, f"is {len(raw)} characters long; at most {MAX_PROMPT_CHARS} are allowed.")
            return None
        return raw


def _steps(reader: _ValueReader, name: str, raw: object) -> _Value | None:
    value = reader.bounded(name, raw, 1, reader.limits.max_steps, whole=True, what=reader.scope("this server"))
    return None if value is None else _Value(value, str(value))


def _guidance(reader: _ValueReader, name: str, raw: object) -> _Value | None:
    value = reader.bounded(name, raw, 0.0, MAX_GUIDANCE, whole=False)
    return None if value is None else _Value(value, f"{value:g}")


def _seed(reader: _ValueReader, name: str, raw: object) -> _Value | None:
    value = reader.bounded(name, raw, -1, MAX_SEED, whole=True)
    if value is None:
        return None
    return _Value(None, "random") if value < 0 else _Value(value, str(value))


def _side(reader: _ValueReader, name: str, raw: object) -> int | None:
    limits = reader.limits
    value = reader.bounded(name, raw, max(MIN_SIZE, limits.size_multiple), limits.max_size, whole=True,
                           what=reader.scope("this model and server"))
    if value is not None and value % limits.size_multiple:
        lower = max(limits.size_multiple, value - value % limits.size_multiple)
        scope = "" if len(reader.workflow_limits.models) == 1 else f" ({limits.name})"
        reader.fail(name, f"{value} is not a multiple of {limits.size_multiple}{scope} (e.g. {lower} or "
                          f"{lower + limits.size_multiple}).")
        return None
    return value


def _size_text(reader: _ValueReader, name: str, raw: object) -> _Value | None:
    text = str(raw).strip().lower()
    width_text, sep, height_text = text.partition("x")
    if not sep:
        reader.fail(name, f"{raw!r:.40} is not a size: write WIDTHxHEIGHT, e.g. 64x64.")
        return None
    width, height = _side(reader, name, width_text), _side(reader, name, height_text)
    return _size_pair(reader, name, width, height)


def _size_pair(reader: _ValueReader, name: str, width: int | None, height: int | None) -> _Value | None:
    if width is None or height is None:
        return None
    sizes = reader.limits.sizes
    if sizes and (width, height) not in sizes:
        allowed = ", ".join(f"{w}x{h}" for w, h in sizes)
        model = "this model" if len(reader.workflow_limits.models) == 1 else reader.limits.name
        reader.fail(name, f"{width}x{height} is not a size {model} makes: allowed {'sizes are' if len(sizes) > 1 else 'is'} "
                          f"{allowed}.")
        return None
    return _Value((width, height), f"{width}x{height}")


def _scheduler(reader: _ValueReader, name: str, raw: object) -> _Value | None:
    if not isinstance(raw, str):
        reader.fail(name, f"must be a scheduler name, got {type(raw).__name__}.")
        return None
    text = raw.strip()
    if text in ("", "default"):
        return _Value(None, "default")
    schedulers = reader.limits.schedulers
    if text not in schedulers:
        allowed = ", ".join(schedulers) or "none besides the default"
        model = "this model" if len(reader.workflow_limits.models) == 1 else reader.limits.name
        reader.fail(name, f"{text!r:.40} is not a scheduler {model} offers; allowed are: {allowed} "
                          "(or leave it empty for the model's own).")
        return None
    return _Value(text, text)


def _frames(reader: _ValueReader, name: str, raw: object) -> _Value | None:
    value = reader.bounded(name, raw, 1, MAX_FRAMES_ABSOLUTE, whole=True)
    if value is not None and value != 1 and not reader.limits.makes_video:
        reader.fail(name, f"{reader.limits.name} makes still images: frames must be 1 (or leave frames unlinked).")
        return None
    return None if value is None else _Value(value, str(value))


def _model(reader: _ValueReader, name: str, raw: object) -> _Value | None:
    text = raw.strip() if isinstance(raw, str) else raw
    if text in ("", "default", None):
        return _Value(reader.workflow_limits.default.name, reader.workflow_limits.default.name)
    if text not in reader.workflow_limits.names:
        reader.fail(name, f"{text!r:.60} is not a loaded model; loaded: {', '.join(reader.workflow_limits.names)}.")
        return None
    return _Value(text, text)


_PARSERS: dict[str, Callable[[_ValueReader, str, object], _Value | None]] = {
    PortType.STEPS: _steps,
    PortType.GUIDANCE: _guidance,
    PortType.SEED: _seed,
    PortType.SIZE: _size_text,
    PortType.SCHEDULER: _scheduler,
    PortType.FRAMES: _frames,
    PortType.MODEL: _model,
}


def sweep_output_type(node: Node) -> str | None:
    """A Sweep's output type is the setting it varies (None while that setting is invalid)."""
    param = node.values.get("param")
    return param if param in SWEEPABLE else None


def output_type(node: Node, port_name: str) -> str | None:
    port = NODE_TYPES[node.type].output(port_name)
    if port is None:
        return None
    return sweep_output_type(node) if port.type is None else port.type


def _node_values(node: Node, reader: _ValueReader) -> list[_Value]:
    """The values a value or fan-out node puts on its output, read for one model (empty when a
    value is invalid)."""
    values = node.values
    if node.type in ("prompt", "negative_prompt"):
        text = reader.text("text", values["text"], required=node.type == "prompt")
        return [] if text is None else [_Value(text, text)]
    if node.type == "size":
        width, height = _side(reader, "width", values["width"]), _side(reader, "height", values["height"])
        pair = _size_pair(reader, "width", width, height)
        return [] if pair is None else [pair]
    if node.type in ("seed", "steps", "guidance", "scheduler", "frames", "model"):
        name = NODE_TYPES[node.type].fields[0].name
        value = _PARSERS[node.type](reader, name, values[name])
        return [] if value is None else [value]
    if node.type == "prompt_list":
        text = reader.text("prompts", values["prompts"], required=False)
        if text is None:
            return []
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if not lines:
            reader.fail("prompts", "has no prompt: write one prompt per line.")
        elif len(lines) > MAX_FAN_OUT_VALUES:
            reader.fail("prompts", f"has {len(lines)} prompts; at most {MAX_FAN_OUT_VALUES} are allowed.")
            return []
        return [_Value(line, line) for line in lines]
    if node.type == "seed_batch":
        start = reader.bounded("start", values["start"], 0, MAX_SEED, whole=True)
        count = reader.bounded("count", values["count"], 1, MAX_FAN_OUT_VALUES, whole=True)
        if start is None or count is None:
            return []
        if start + count - 1 > MAX_SEED:
            reader.fail("count", f"seeds {start}..{start + count - 1} go past the largest seed {MAX_SEED}.")
            return []
        return [_Value(start + i, str(start + i)) for i in range(count)]
    if node.type == "sweep":
        param = sweep_output_type(node)
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
        parsed = [_PARSERS[param](reader, "values", item) for item in items]
        return [] if None in parsed else parsed
    return []


# ---------------------------------------------------------------------------- graph checks
def _find_cycle(workflow: Workflow) -> list[str] | None:
    """Node ids along one cycle of links, or None."""
    successors: dict[str, list[str]] = {node_id: [] for node_id in workflow.nodes}
    for link in workflow.links:
        successors[link.source.node].append(link.target.node)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node_id: str) -> list[str] | None:
        state[node_id] = 1
        path.append(node_id)
        for successor in successors[node_id]:
            if state.get(successor) == 1:
                return path[path.index(successor):] + [successor]
            if successor not in state:
                found = visit(successor)
                if found:
                    return found
        path.pop()
        state[node_id] = 2
        return None

    for node_id in workflow.nodes:
        if node_id not in state:
            found = visit(node_id)
            if found:
                return found
    return None


def _check_link_types(workflow: Workflow, problems: list[Problem]) -> None:
    for link in workflow.links:
        source, target = workflow.nodes[link.source.node], workflow.nodes[link.target.node]
        have = output_type(source, link.source.port)
        want = NODE_TYPES[target.type].input(link.target.port).type
        if have is None:
            continue  # an invalid Sweep setting is reported on the Sweep itself
        if have != want:
            problems.append(Problem(
                f"gets {have!r} from node {source.id} ({NODE_TYPES[source.type].title}) but takes {want!r}.",
                target.id, link.target.port))


def _input_sources(workflow: Workflow) -> dict[tuple[str, str], Node]:
    """(node id, input port) -> the node feeding it."""
    return {(link.target.node, link.target.port): workflow.nodes[link.source.node] for link in workflow.links}


# ---------------------------------------------------------------------------- compile
def compile_workflow(workflow: Workflow, limits: WorkflowLimits | None = None) -> CompiledWorkflow:
    """Check the whole workflow and expand its branches. Raises WorkflowError naming every problem."""
    limits = limits or WorkflowLimits()
    problems: list[Problem] = []
    cycle = _find_cycle(workflow)
    if cycle:
        raise WorkflowError([Problem(f"the links form a cycle: {' -> '.join(cycle)}.", cycle[0])])
    _check_link_types(workflow, problems)
    sources = _input_sources(workflow)

    for node in workflow.nodes.values():
        for port in NODE_TYPES[node.type].inputs:
            if port.required and (node.id, port.name) not in sources:
                problems.append(Problem(f"this input is required: link a {port.type} output to it.", node.id, port.name))
    node_values = _read_values(workflow, sources, limits, problems)

    samplers = [node for node in workflow.nodes.values() if node.type == "sampler"]
    if not samplers:
        problems.append(Problem("the workflow has no Sampler node, so it makes nothing: add one."))
    counts = {
        sampler.id: math.prod(len(node_values[sources[(sampler.id, p.name)].id]) or 1
                              for p in SAMPLER_INPUTS if (sampler.id, p.name) in sources)
        for sampler in samplers
    }
    total = sum(counts.values())
    if total > limits.max_branches:
        for sampler_id, count in counts.items():
            problems.append(Problem(
                f"makes {count} branches; with the other samplers the run would make {total}, "
                f"more than the limit of {limits.max_branches} (--max-branches).", sampler_id))
    if problems:
        raise WorkflowError(problems)

    branches: list[Branch] = []
    node_branches: dict[str, list[int]] = {node_id: [] for node_id in workflow.nodes}
    for sampler in samplers:
        linked = [(p.name, sources[(sampler.id, p.name)]) for p in SAMPLER_INPUTS if (sampler.id, p.name) in sources]
        choices = [list(enumerate(node_values[source.id])) for _, source in linked]
        branch_sources = tuple((field_name, (source.id, _source_field(source, field_name)))
                               for input_name, source in linked for field_name in _FIELDS_OF_INPUT[input_name])
        for combination in itertools.product(*choices):
            fields: dict[str, Any] = {}
            axes = []
            for (input_name, source), (value_index, value) in zip(linked, combination):
                fields[input_name] = value.value
                if NODE_TYPES[source.type].is_fan_out:
                    axes.append(AxisValue(input_name, value_index, value.label))
            index = len(branches)
            branches.append(Branch(index, sampler.id, _params(fields, limits.default.name), tuple(axes), branch_sources))
            for _, source in linked:
                node_branches[source.id].append(index)
            node_branches[sampler.id].append(index)

    grids = []
    for node in workflow.nodes.values():
        if NODE_TYPES[node.type].category != "outputs":
            continue
        sampler = sources[(node.id, PortType.IMAGES)]
        node_branches[node.id] = list(node_branches[sampler.id])
        if node.type == "grid":
            grid = _grid_layout(node, sampler.id, [branches[i] for i in node_branches[sampler.id]], problems)
            if grid is not None:
                grids.append(grid)
    if problems:
        raise WorkflowError(problems)
    return CompiledWorkflow(workflow, tuple(branches), tuple(grids),
                            {node_id: tuple(indices) for node_id, indices in node_branches.items()})


# A sampler input -> the GenerationParams fields it sets.
_FIELDS_OF_INPUT = {
    PortType.PROMPT: ("prompt",), PortType.NEGATIVE_PROMPT: ("negative_prompt",), PortType.SEED: ("seed",),
    PortType.SIZE: ("width", "height"), PortType.STEPS: ("num_inference_steps",),
    PortType.GUIDANCE: ("guidance_scale",), PortType.SCHEDULER: ("scheduler",), PortType.FRAMES: ("num_frames",),
    PortType.MODEL: ("model",),
}


def _source_field(node: Node, field_name: str) -> str:
    """The field of a value or fan-out node that set a GenerationParams field (for error messages)."""
    if node.type == "size":
        return field_name  # width / height
    if node.type == "seed_batch":
        return "start"
    if node.type == "sweep":
        return "values"
    return NODE_TYPES[node.type].fields[0].name if NODE_TYPES[node.type].fields else field_name


def _params(fields: dict[str, Any], default_model: str) -> GenerationParams:
    size = fields.get(PortType.SIZE)
    return GenerationParams(
        prompt=fields[PortType.PROMPT],
        negative_prompt=fields.get(PortType.NEGATIVE_PROMPT),
        width=size[0] if size else None,
        height=size[1] if size else None,
        num_inference_steps=fields.get(PortType.STEPS),
        guidance_scale=fields.get(PortType.GUIDANCE),
        seed=fields.get(PortType.SEED),
        scheduler=fields.get(PortType.SCHEDULER),
        num_frames=fields.get(PortType.FRAMES),
        model=fields.get(PortType.MODEL, default_model),
    )


def _read_values(workflow: Workflow, sources: dict[tuple[str, str], Node], limits: WorkflowLimits,
                 problems: list[Problem]) -> dict[str, list[_Value]]:
    """Every node's values, read for the models of the samplers it feeds (each value must suit
    every one of them); a node feeding no sampler is read for the default model."""

    def read(node: Node, model: ModelLimits) -> list[_Value]:
        return _node_values(node, _ValueReader(node, problems, model, limits))

    models_of: dict[str, list[str]] = {}
    for node in workflow.nodes.values():
        if node.type == "sampler":
            source = sources.get((node.id, PortType.MODEL))
            models_of[node.id] = [v.value for v in read(source, limits.default)] if source else [limits.default.name]
    used_with: dict[str, list[str]] = {}
    for (target, port), source in sources.items():
        for model in models_of.get(target, ()):
            if model not in used_with.setdefault(source.id, []):
                used_with[source.id].append(model)
            if port == PortType.NEGATIVE_PROMPT and not limits.model(model).uses_negative_prompt:
                who = "this model" if len(limits.models) == 1 else model
                problem = Problem(f"{who} takes no negative prompt: remove the link.", target, port)
                if problem not in problems:
                    problems.append(problem)
    values = {}
    for node in workflow.nodes.values():
        readings = [read(node, limits.model(model)) for model in used_with.get(node.id) or [limits.default.name]]
        values[node.id] = readings[0]  # the same values for every model, when none failed
    return values


def with_run_settings(branch: Branch, seed: int, preview_every: int) -> GenerationParams:
    """The branch's parameters as submitted: the sampler's random seed where none was set."""
    params = branch.params
    return replace(params, seed=seed if params.seed is None else params.seed, preview_every=preview_every)


def _grid_layout(node: Node, sampler_id: str, branches: list[Branch], problems: list[Problem]) -> GridLayout | None:
    """Columns: the X axis's values; rows: the Y axis's values (and any further fan-out, combined)."""
    swept = [axis.input for axis in branches[0].axes] if branches else []
    chosen = {}
    for name in ("x", "y"):
        value = node.values.get(name, "auto")
        if value != "auto" and value not in swept:
            available = ", ".join(swept) or "none (link a fan-out node to the sampler)"
            problems.append(Problem(f"{value!r:.30} is not swept by sampler {sampler_id}; swept inputs: {available}.",
                                    node.id, name))
            return None
        chosen[name] = None if value == "auto" else value
    remaining = [name for name in swept if name not in chosen.values()]
    x_axis = chosen["x"] or (remaining.pop(0) if remaining else None)
    if x_axis == chosen["y"]:
        problems.append(Problem("X and Y are the same input: choose two different ones.", node.id, "y"))
        return None
    y_axes = ([chosen["y"]] if chosen["y"] else []) + [name for name in remaining if name != x_axis]

    def position(branch: Branch, axes: list[str]) -> tuple[int, ...]:
        by_input = {axis.input: axis for axis in branch.axes}
        return tuple(by_input[name].index for name in axes)

    def label(branch: Branch, axes: list[str]) -> str:
        by_input = {axis.input: axis for axis in branch.axes}
        return " · ".join(by_input[name].label for name in axes)

    x_axes = [x_axis] if x_axis else []
    column_keys: dict[tuple, str] = {}
    row_keys: dict[tuple, str] = {}
    for branch in branches:
        column_keys.setdefault(position(branch, x_axes), label(branch, x_axes))
        row_keys.setdefault(position(branch, y_axes), label(branch, y_axes))
    columns, rows = sorted(column_keys), sorted(row_keys)
    cells = [[None] * len(columns) for _ in rows]
    for branch in branches:
        cells[rows.index(position(branch, y_axes))][columns.index(position(branch, x_axes))] = branch.index
    return GridLayout(
        node_id=node.id,
        sampler=sampler_id,
        x_axis=x_axis,
        y_axis=" · ".join(y_axes) or None,
        columns=tuple(column_keys[key] for key in columns),
        rows=tuple(row_keys[key] for key in rows),
        cells=tuple(tuple(row) for row in cells),
    )

"""Compile a workflow into the engine requests its Sampler nodes make ("branches").

    compiled = compile_workflow(parse_workflow(text), WorkflowLimits((ModelLimits(max_steps=100, ...),)))
    compiled.branches   # one GenerationParams per combination of each sampler's input values

A value node (Prompt, Seed, Steps, ...) gives one value; a fan-out node (Prompt list, Seed batch,
Sweep) gives several. A Sampler makes one branch per combination: the product of the fan-outs
that reach it, in the order of its inputs (prompt, negative prompt, seed, size, steps, guidance,
scheduler). Inputs left unlinked take the model's defaults. A sampler without a seed input (or
with a Seed of -1) uses ONE random seed for all of its branches, picked when the run starts, so
the cells of an X/Y plot differ only in what was swept.

Everything is checked before anything runs, and every problem names its node and port or field:
cycles, wrong link types, missing required inputs, more branches than allowed, and each node's
values against the loaded models. The compiler owns the graph checks; a value is judged by the
engine's own rules (ParamError names the GenerationParams field, which the node type maps to
its field), once per node rather than once per branch. Pure: imports neither gradio nor torch.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Any

from engine.limits import ServingLimits
from pipelines.errors import ParamError
from pipelines.params import MAX_FRAMES_ABSOLUTE, GenerationParams, check_field
from pipelines.validation import (
    check_model_name,
    check_scheduler_name,
    check_side,
    check_size_in,
    check_still_frames,
)
from studio.workflows.format import Node, Problem, Workflow, WorkflowError
from studio.workflows.nodes import (
    NODE_TYPES,
    PARAMS_OF_PORT,
    SAMPLER_INPUTS,
    PortType,
    Reading,
)

DEFAULT_MAX_BRANCHES = 64


@dataclass(frozen=True)
class ModelLimits:
    """What one loaded model and the server allow for it, so a value it refuses is reported at its node
    before anything runs. The rules are the engine's own (pipelines.params, pipelines.validation,
    engine.limits); the model family's own check runs when the run prepares each branch."""

    name: str = "default"
    max_steps: int = 100
    max_size: int = 1024
    size_multiple: int = 8
    schedulers: tuple[str, ...] = ()  # names a Scheduler node may use (empty: only the default)
    uses_negative_prompt: bool = True
    makes_video: bool = False
    sizes: tuple[tuple[int, int], ...] = ()  # the only sizes the model serves (empty: any multiple)
    max_frames: int = MAX_FRAMES_ABSOLUTE

    def __post_init__(self) -> None:
        for name in ("max_steps", "max_size", "size_multiple", "max_frames"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")

    def check(self, values: dict[str, Any], name_in_caps: bool = False) -> None:
        """These GenerationParams values (any subset) against the engine's rules, in the order its front
        doors use: the server's caps (its range in the message), the absolute ranges, then the model's
        own. Raises ParamError naming the field; `name_in_caps`: a cap's message names this model."""
        caps = {name: values[name] for name in ("num_inference_steps", "width", "height", "num_frames")
                if name in values}
        try:
            ServingLimits(max_steps=self.max_steps, max_size=self.max_size, max_frames=self.max_frames
                          ).check_values(**caps)
        except ParamError as error:
            raise ParamError(error.field, f"{self.name}: {error}") if name_in_caps else error from None
        for name, value in values.items():
            check_field(name, value)
        for name in ("width", "height"):
            if name in values:
                check_side(name, values[name], self.name, self.size_multiple)
        if "num_frames" in values and not self.makes_video:
            check_still_frames(values["num_frames"], self.name)
        if values.get("scheduler") is not None:
            check_scheduler_name("scheduler", values["scheduler"], self.schedulers)
        if "width" in values and "height" in values:
            check_size_in(values["width"], values["height"], self.name, self.sizes)


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


# ---------------------------------------------------------------------------- values
class _NodeReader:
    """Reads one node's values for one model (its type's `read`), noting problems at the node's fields."""

    def __init__(self, node: Node, problems: list[Problem], limits: ModelLimits, workflow_limits: WorkflowLimits) -> None:
        self.node = node
        self.problems = problems
        self.limits = limits
        self.workflow_limits = workflow_limits
        self.default_model = workflow_limits.default.name

    def fail(self, field: str, message: str) -> None:
        problem = Problem(message, self.node.id, field)
        if problem not in self.problems:  # a value read for several models fails once
            self.problems.append(problem)

    def check(self, at: str | None = None, **values: Any) -> bool:
        try:
            if "model" in values:
                check_field("model", values["model"])
                check_model_name(values.pop("model"), self.workflow_limits.names)
            self.limits.check(values, name_in_caps=len(self.workflow_limits.models) > 1)
        except ParamError as error:
            self.fail(at or NODE_TYPES[self.node.type].field_for(error.field) or error.field, error.message)
            return False
        return True


def output_type(node: Node, port_name: str) -> str | None:
    node_type = NODE_TYPES[node.type]
    port = node_type.output(port_name)
    return None if port is None else node_type.port_type(port, node.values)


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
        branch_sources = tuple((param, (source.id, NODE_TYPES[source.type].field_for(param)))
                               for input_name, source in linked for param in PARAMS_OF_PORT[input_name])
        for combination in itertools.product(*choices):
            fields: dict[str, Any] = {}
            axes = []
            for (input_name, source), (value_index, value) in zip(linked, combination):
                fields[input_name] = value.value
                if NODE_TYPES[source.type].is_fan_out:
                    axes.append(AxisValue(input_name, value_index, value.label))
            index = len(branches)
            try:
                params = _params(fields, limits.default.name)
            except ParamError as error:  # a rule no node's own check asked (each value was checked alone)
                problem = Problem(error.message, *dict(branch_sources).get(error.field, (sampler.id, None)))
                if problem not in problems:
                    problems.append(problem)
                continue
            branches.append(Branch(index, sampler.id, params, tuple(axes), branch_sources))
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
                 problems: list[Problem]) -> dict[str, list[Reading]]:
    """Every node's values, read for the models of the samplers it feeds (each value must suit
    every one of them); a node feeding no sampler is read for the default model."""

    def read(node: Node, model: ModelLimits) -> list[Reading]:
        node_type = NODE_TYPES[node.type]
        return node_type.read(node.values, _NodeReader(node, problems, model, limits)) if node_type.read else []

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

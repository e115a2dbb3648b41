"""Compile a workflow into the engine requests its Sampler nodes make ("branches").

    compiled = compile_workflow(parse_workflow(text), WorkflowLimits((ModelLimits(max_steps=100, ...),)))
    compiled.branches   # one GenerationParams per combination of each sampler's input values

A Sampler makes one branch per combination of its inputs' values, stages included
(`studio.workflows.branches` says how); the loaded models' limits are `studio.workflows.limits`.

Everything is checked before anything runs, and every problem names its node and port or field:
cycles, wrong link types, missing required inputs, more branches than allowed, and each node's
values against the loaded models. The compiler owns the graph checks; a value is judged by the
engine's own rules (ParamError names the GenerationParams field, which the node type maps to
its field), once per node rather than once per branch. Pure: imports neither gradio nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from studio.workflows.branches import Branch, Expansion
from studio.workflows.bypass import without_bypassed
from studio.workflows.format import Node, Problem, Workflow, WorkflowError, output_type
from studio.workflows.limits import WorkflowLimits
from studio.workflows.nodes import NODE_TYPES, Port
from studio.workflows.ports import PortType, accepts


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

    def descendants(self, index: int) -> list[int]:
        """The branches of later stages that start, directly or not, from branch `index`'s image."""
        found = []
        for branch in self.branches[index + 1:]:  # a stage's branches come after its parents'
            if branch.parent is not None and (branch.parent == index or branch.parent in found):
                found.append(branch.index)
        return found


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


def _named(node: Node) -> str:
    """A node as the user sees it: its title, and its id in the workflow JSON ("Sampler (node 2)")."""
    return f"{NODE_TYPES[node.type].title} (node {node.id})"


def _check_link_types(workflow: Workflow, problems: list[Problem]) -> None:
    for link in workflow.links:
        source, target = workflow.nodes[link.source.node], workflow.nodes[link.target.node]
        have = output_type(source, link.source.port)
        want = NODE_TYPES[target.type].input(link.target.port).type
        if have is None:
            continue  # an invalid Sweep setting is reported on the Sweep itself
        if not accepts(want, have):
            problems.append(Problem(
                f"gets {have!r} from {_named(source)} but takes {want!r}.",
                target.id, link.target.port))


def _input_sources(workflow: Workflow) -> dict[tuple[str, str], Node]:
    """(node id, input port) -> the node feeding it."""
    return {(link.target.node, link.target.port): workflow.nodes[link.source.node] for link in workflow.links}


def _missing_input(node: Node, port: Port, fed_by: Node | None) -> Problem:
    """A required input without a link, or whose link came from a bypassed node (passing nothing it takes)."""
    if fed_by is not None and fed_by.bypass:
        return Problem(f"this input is required, and {_named(fed_by)}, which feeds it, is bypassed and passes no "
                       f"{port.type} through: stop bypassing it, or link another {port.type} output here.",
                       node.id, port.name)
    return Problem(f"this input is required: link a {port.type} output to it.", node.id, port.name)


# ---------------------------------------------------------------------------- compile
def compile_workflow(workflow: Workflow, limits: WorkflowLimits | None = None,
                     picture_files: Callable[[str], bytes] | None = None) -> CompiledWorkflow:
    """Check the whole workflow and expand its branches. Raises WorkflowError naming every problem.
    `picture_files`: a saved result's bytes by its name, for Load image nodes that name one (the
    caller's own results only; without it, only data URLs are read). Bypassed nodes are passed
    through first (`studio.workflows.bypass`); the result keeps the workflow as sent."""
    limits = limits or WorkflowLimits()
    problems: list[Problem] = []
    cycle = _find_cycle(workflow)
    if cycle:
        named = " -> ".join(_named(workflow.nodes[node_id]) for node_id in cycle)
        raise WorkflowError([Problem(f"the links form a cycle: {named}.", cycle[0])])
    sent, workflow = workflow, without_bypassed(workflow)
    _check_link_types(workflow, problems)
    sources, sent_sources = _input_sources(workflow), _input_sources(sent)

    for node in workflow.nodes.values():
        for port in NODE_TYPES[node.type].inputs:
            if port.required and (node.id, port.name) not in sources:
                problems.append(_missing_input(node, port, sent_sources.get((node.id, port.name))))
    if not any(node.type == "sampler" for node in workflow.nodes.values()):
        bypassed = [_named(node) for node in sent.nodes.values() if node.type == "sampler"]
        problems.append(Problem(
            f"every Sampler is bypassed ({', '.join(bypassed)}), so the workflow makes nothing: stop bypassing one."
            if bypassed else "the workflow has no Sampler node, so it makes nothing: add one."))
    expansion = Expansion(workflow, sources, limits, problems, picture_files)
    expansion.run()
    if expansion.total > limits.max_branches:
        for sampler_id, count in expansion.counts.items():
            problems.append(Problem(
                f"makes {count} branches; with the other samplers the run would make {expansion.total}, "
                f"more than the limit of {limits.max_branches} (--max-branches).", sampler_id))
    if problems:
        raise WorkflowError(problems)

    branches, node_branches = expansion.branches, expansion.node_branches
    # Sampler inputs a bypass took out (fed by a bypassed node, or a bypassed sampler's): a Grid axis
    # naming one is taken as auto, not refused (the X/Y example with its steps Sweep bypassed is a
    # one-row plot of the guidance values; a Grid of a bypassed stage 2 plots stage 1).
    unswept = {port for (target, port), source in sent_sources.items()
               if sent.nodes[target].type == "sampler" and (source.bypass or sent.nodes[target].bypass)}
    grids = []
    for node in workflow.nodes.values():
        if NODE_TYPES[node.type].category != "outputs":
            continue
        sampler = sources[(node.id, PortType.IMAGES)]
        node_branches[node.id] = list(node_branches[sampler.id])
        if node.type == "grid":
            grid = _grid_layout(node, sampler.id, [branches[i] for i in node_branches[sampler.id]], problems, unswept)
            if grid is not None:
                grids.append(grid)
    if problems:
        raise WorkflowError(problems)
    # A bypassed node takes part in no branch; it is still one of the run's nodes (its badge empty).
    return CompiledWorkflow(sent, tuple(branches), tuple(grids),
                            {node_id: tuple(node_branches.get(node_id, ())) for node_id in sent.nodes})


def _grid_layout(node: Node, sampler_id: str, branches: list[Branch], problems: list[Problem],
                 unswept: frozenset[str] | set[str] = frozenset()) -> GridLayout | None:
    """Columns: the X axis's values; rows: the Y axis's values (and any further fan-out, combined).
    An axis naming an input in `unswept` (fed by a bypassed node) that nothing sweeps is taken as auto."""
    swept = [axis.input for axis in branches[0].axes] if branches else []
    chosen = {}
    for name in ("x", "y"):
        value = node.values.get(name, "auto")
        if isinstance(value, str) and value in unswept and value not in swept:
            value = "auto"
        if value != "auto" and value not in swept:
            available = ", ".join(swept) or "none (link a fan-out node to the sampler)"
            problems.append(Problem(f"{value!r:.30} is not swept by sampler {sampler_id}; swept inputs: {available}.",
                                    node.id, name))
            return None
        chosen[name] = None if value == "auto" else value
    remaining = [name for name in swept if name not in chosen.values()]
    x_axis = chosen["x"] or (remaining.pop(0) if remaining else None)
    if x_axis is not None and x_axis == chosen["y"]:  # both unset (nothing swept) is a one-cell grid
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

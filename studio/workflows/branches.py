"""A workflow's branches: the engine requests its Sampler nodes make, and how the compiler
expands each sampler into them (`Expansion`).

A value node (Prompt, Seed, Steps, ...) gives one value; a fan-out node (Prompt list, Seed batch,
Sweep) gives several. A Sampler makes one branch per combination: the product of the fan-outs
that reach it, in the order of its inputs (prompt, negative prompt, seed, size, steps, guidance,
scheduler). Inputs left unlinked take the model's defaults. A sampler without a seed input (or
with a Seed of -1) uses ONE random seed for all of its branches, picked when the run starts, so
the cells of an X/Y plot differ only in what was swept.

Stages: a Sampler's `images` output may feed another Sampler's `image` input (directly, or through
Upscale). The later sampler then makes one branch per branch of the earlier one times its own
fan-outs; each such branch names its `parent` (`Branch.start`), whose finished image it starts
from, and carries the parent's axes after its own (so a grid of stage 2 can be laid out by a
sweep of stage 1). A Load image gives one picture. A branch that starts from a picture takes the
picture's size (times the Upscale factors, rounded to the model's multiple) unless a Size is linked.
Pure: imports neither gradio nor torch.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from PIL import Image

from pipelines.errors import ParamError
from pipelines.params import GenerationParams, check_field
from pipelines.validation import check_model_name
from studio.pictures import MaskSpec, start_size
from studio.workflows.format import Node, Problem, Workflow
from studio.workflows.limits import ModelLimits, WorkflowLimits
from studio.workflows.nodes import NODE_TYPES, SAMPLER_INPUTS
from studio.workflows.ports import PARAMS_OF_PORT, PortType
from studio.workflows.readers import Reading, StartImage


@dataclass(frozen=True)
class AxisValue:
    """Where a branch sits along one fan-out: the sampler input, the value's index and its label."""

    input: str
    index: int
    label: str


@dataclass(frozen=True)
class BranchStart:
    """Where a branch's picture comes from (image to image): a Load image's `picture`, or the
    finished image of the branch `parent` (an earlier stage); enlarged `scale` times and rounded
    to the model's size `multiple` unless the branch has a size; `mask`: what to repaint."""

    picture: Image.Image | None = field(default=None, compare=False)
    parent: int | None = None
    scale: float = 1.0
    multiple: int = 8
    mask: MaskSpec | None = field(default=None, compare=False)

    def size_from(self, size: tuple[int, int]) -> tuple[int, int]:
        """The request's size for a picture of `size`."""
        return start_size(size, self.scale, self.multiple)


@dataclass(frozen=True)
class Branch:
    index: int  # position in the run, 0-based
    sampler: str  # node id
    params: GenerationParams  # unset fields = the model's defaults; seed None = the sampler's random seed
    axes: tuple[AxisValue, ...]  # one per fan-out input of the sampler, then the earlier stage's
    # GenerationParams field -> (node id, field of that node) that set it, to name them in errors
    sources: tuple[tuple[str, tuple[str, str]], ...] = ()
    start: BranchStart | None = None  # the picture it starts from (None: from noise)

    @property
    def parent(self) -> int | None:
        """The branch of an earlier stage whose image this one starts from."""
        return None if self.start is None else self.start.parent

    def source_of(self, field_name: str) -> tuple[str, str | None]:
        """(node id, port or field) that set a GenerationParams field; the sampler when none did."""
        return dict(self.sources).get(field_name, (self.sampler, None))

    @property
    def label(self) -> str:
        return ", ".join(f"{axis.input} {axis.label}" for axis in self.axes) or "single"


def with_run_settings(branch: Branch, seed: int, preview_every: int) -> GenerationParams:
    """The branch's parameters as submitted: the sampler's random seed where none was set."""
    params = branch.params
    return replace(params, seed=seed if params.seed is None else params.seed, preview_every=preview_every)


# ---------------------------------------------------------------------------- values
class _NodeReader:
    """Reads one node's values for one model (its type's `read`), noting problems at the node's fields."""

    def __init__(self, node: Node, expansion: "Expansion", limits: ModelLimits) -> None:
        self.node = node
        self.node_id = node.id
        self.expansion = expansion
        self.problems = expansion.problems
        self.limits = limits
        self.workflow_limits = expansion.limits
        self.default_model = expansion.limits.default.name

    def linked(self, port: str) -> list[Reading] | None:
        source = self.expansion.sources.get((self.node.id, port))
        return None if source is None else self.expansion.readings.get(source.id, [])

    def picture_file(self, name: str) -> bytes:
        if self.expansion.picture_files is None:
            raise ValueError(f"{name!r:.80} is not a data URL, and this run reads no saved results by name: "
                             "send the picture as a data URL (data:image/png;base64,...).")
        return self.expansion.picture_files(name)

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


def _topological(workflow: Workflow) -> list[Node]:
    """The nodes, each after every node that feeds it (the workflow's own order among equals)."""
    waiting = {node_id: 0 for node_id in workflow.nodes}
    feeds: dict[str, list[str]] = {node_id: [] for node_id in workflow.nodes}
    for link in workflow.links:
        waiting[link.target.node] += 1
        feeds[link.source.node].append(link.target.node)
    ready = [node_id for node_id, count in waiting.items() if count == 0]
    order = []
    while ready:
        node_id = ready.pop(0)
        order.append(workflow.nodes[node_id])
        for target in feeds[node_id]:
            waiting[target] -= 1
            if waiting[target] == 0:
                ready.append(target)
    return order


# A sampler's inputs in the order its branches combine them: the picture (one branch per picture an
# earlier stage made) outermost, then the settings, then the mask.
_COMBINED_INPUTS = (PortType.IMAGE,) + tuple(p.name for p in SAMPLER_INPUTS
                                             if p.name not in (PortType.IMAGE, PortType.MASK)) + (PortType.MASK,)


class Expansion:
    """Reads every node in link order and expands each Sampler into its branches as it is reached,
    so a sampler's branches are the picture values of the next stage."""

    def __init__(self, workflow: Workflow, sources: dict[tuple[str, str], Node], limits: WorkflowLimits,
                 problems: list[Problem], picture_files: Callable[[str], bytes] | None) -> None:
        self.workflow, self.sources, self.limits, self.problems = workflow, sources, limits, problems
        self.picture_files = picture_files
        self.readings: dict[str, list[Reading]] = {}
        self.fan: dict[str, int] = {}  # how many values each node puts out (a sampler: its branch count)
        self.counts: dict[str, int] = {}  # each sampler's branch count
        self.total = 0
        self.branches: list[Branch] = []
        self.node_branches: dict[str, list[int]] = {node_id: [] for node_id in workflow.nodes}
        self.models_of: dict[str, list[str]] = {}
        self.used_with: dict[str, list[str]] = {}

    def run(self) -> None:
        self._models()
        for node in _topological(self.workflow):
            if node.type == "sampler":
                self._expand(node)
                continue
            self.readings[node.id] = self._read(node)
            image_source = self.sources.get((node.id, PortType.IMAGE))
            passes_on = node.type == "upscale" and image_source is not None  # one value per picture it gets
            self.fan[node.id] = self.fan.get(image_source.id, 0) if passes_on else len(self.readings[node.id])

    # ------------------------------------------------------------------ reading
    def reader(self, node: Node, model: ModelLimits) -> _NodeReader:
        return _NodeReader(node, self, model)

    def _read(self, node: Node, model: ModelLimits | None = None) -> list[Reading]:
        """A node's values, read for every model of the samplers it feeds (each value must suit each
        of them); a node that feeds no sampler is read for the default model."""
        node_type = NODE_TYPES[node.type]
        if node_type.read is None:
            return []
        if model is not None:
            return node_type.read(node.values, self.reader(node, model))
        models = self.used_with.get(node.id) or [self.limits.default.name]
        readings = [node_type.read(node.values, self.reader(node, self.limits.model(name))) for name in models]
        return readings[0]  # the same values for every model, when none failed

    def _models(self) -> None:
        """Which models each sampler makes its branches with, and so each of its sources is read for."""
        for node in self.workflow.nodes.values():
            if node.type == "sampler":
                source = self.sources.get((node.id, PortType.MODEL))
                self.models_of[node.id] = ([v.value for v in self._read(source, self.limits.default)] if source
                                           else [self.limits.default.name])
        for (target, port), source in self.sources.items():
            for model in self.models_of.get(target, ()):
                if model not in self.used_with.setdefault(source.id, []):
                    self.used_with[source.id].append(model)
                limits = self.limits.model(model)
                if port == PortType.NEGATIVE_PROMPT and not limits.uses_negative_prompt:
                    who = "this model" if len(self.limits.models) == 1 else model
                    self._problem(f"{who} takes no negative prompt: remove the link.", target, port)
                for port_name, field_name, what in ((PortType.IMAGE, "init_image", "pictures to start from"),
                                                    (PortType.MASK, "mask_image", "masks")):
                    if port == port_name and field_name not in limits.image_inputs:
                        who = "this model" if len(self.limits.models) == 1 else model
                        self._problem(f"{who} takes no {what}: remove the link.", target, port)

    def _problem(self, message: str, node_id: str | None, port: str | None = None) -> None:
        problem = Problem(message, node_id, port)
        if problem not in self.problems:
            self.problems.append(problem)

    # ------------------------------------------------------------------ samplers
    def _expand(self, sampler: Node) -> None:
        linked = [(name, self.sources[(sampler.id, name)]) for name in _COMBINED_INPUTS
                  if (sampler.id, name) in self.sources]
        count = math.prod(self.fan.get(source.id, 0) or 1 for _, source in linked)
        self.counts[sampler.id] = self.fan[sampler.id] = count
        self.total += count
        self.readings[sampler.id] = []
        names = {name for name, _ in linked}
        for port, what in ((PortType.MASK, "a mask"), (PortType.STRENGTH, "a strength")):
            if port in names and PortType.IMAGE not in names:
                self._problem(f"{what} needs a picture to redraw: link an image input too.", sampler.id, port)
        if self.problems or self.total > self.limits.max_branches:
            return  # counted only: nothing runs, and later branches would be read for nothing
        sources = self._branch_sources(sampler, linked)
        for combination in itertools.product(*[list(enumerate(self.readings[source.id])) for _, source in linked]):
            self._add_branch(sampler, linked, combination, sources)
        members = self._members(sampler)
        for branch in self.branches:
            if branch.sampler == sampler.id:
                for node_id in members:
                    self.node_branches[node_id].append(branch.index)
        self.readings[sampler.id] = [Reading(StartImage(branch=b.index), b.label)
                                     for b in self.branches if b.sampler == sampler.id]

    def _branch_sources(self, sampler: Node, linked: list[tuple[str, Node]]) -> tuple:
        """GenerationParams field -> (node, field) that sets it, for the sampler's branches."""
        sources = [(param, (source.id, NODE_TYPES[source.type].field_for(param)))
                   for input_name, source in linked for param in PARAMS_OF_PORT.get(input_name, ())]
        for input_name, field_name in ((PortType.IMAGE, "init_image"), (PortType.MASK, "mask_image")):
            if input_name in dict(linked):
                sources.append((field_name, (sampler.id, input_name)))
        image = self.readings.get(dict(linked)[PortType.IMAGE].id) if PortType.IMAGE in dict(linked) else None
        if image and PortType.SIZE not in dict(linked):  # the picture sets the size
            sized_by = image[0].value.sized_by or (sampler.id, PortType.IMAGE)
            sources += [("width", sized_by), ("height", sized_by)]
        return tuple(sources)

    def _add_branch(self, sampler: Node, linked: list[tuple[str, Node]], combination: tuple, sources: tuple) -> None:
        fields: dict[str, Any] = {}
        own_axes, inherited, start, mask = [], [], None, None
        for (input_name, source), (value_index, value) in zip(linked, combination):
            if input_name == PortType.IMAGE:
                start = value.value
                if start.branch is not None:
                    inherited = list(self.branches[start.branch].axes)
            elif input_name == PortType.MASK:
                mask = value.value
            else:
                fields[input_name] = value.value
                if NODE_TYPES[source.type].is_fan_out or len(self.readings.get(source.id, ())) > 1:
                    own_axes.append(AxisValue(input_name, value_index, value.label))
        own = {axis.input for axis in own_axes}
        parent_sampler = self.branches[start.branch].sampler if start is not None and start.branch is not None else ""
        axes = own_axes + [replace(axis, input=f"{axis.input} (node {parent_sampler})") if axis.input in own else axis
                           for axis in inherited]
        model = fields.get(PortType.MODEL, self.limits.default.name)
        branch_start = None
        if start is not None:
            multiple = self.limits.model(model).size_multiple
            branch_start = BranchStart(start.picture, start.branch, start.scale, multiple, mask)
            if PortType.SIZE not in fields and start.picture is not None:  # known now: check it now
                fields[PortType.SIZE] = branch_start.size_from(start.picture.size)
                if not self._size_ok(fields[PortType.SIZE], model, start.sized_by or (sampler.id, PortType.IMAGE)):
                    return
        try:
            params = _params(fields, self.limits.default.name)
        except ParamError as error:  # a rule no node's own check asked (each value was checked alone)
            self._problem(error.message, *dict(sources).get(error.field, (sampler.id, None)))
            return
        self.branches.append(Branch(len(self.branches), sampler.id, params, tuple(axes), sources, branch_start))

    def _size_ok(self, size: tuple[int, int], model: str, at: tuple[str, str]) -> bool:
        try:
            self.limits.model(model).check({"width": size[0], "height": size[1]},
                                           name_in_caps=len(self.limits.models) > 1)
        except ParamError as error:
            self._problem(f"the picture makes a {size[0]}x{size[1]} request: {error.message}", *at)
            return False
        return True

    def _members(self, sampler: Node) -> list[str]:
        """The sampler and every node upstream of it up to the samplers before it: the nodes its
        branches take part in."""
        members, pending = [sampler.id], [sampler.id]
        while pending:
            node_id = pending.pop()
            for port in NODE_TYPES[self.workflow.nodes[node_id].type].inputs:
                source = self.sources.get((node_id, port.name))
                if source is not None and source.type != "sampler" and source.id not in members:
                    members.append(source.id)
                    pending.append(source.id)
        return members


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
        strength=fields.get(PortType.STRENGTH),
        step_cache=fields.get(PortType.STEP_CACHE),
        loras=fields.get(PortType.LORA, ()),
    )

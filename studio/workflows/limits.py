"""What the loaded models and the server allow a workflow: each model's limits, and how many
branches one run may make.

The compiler (`studio.workflows.compiler`) reads every node's values against these before
anything runs, so a value a model refuses is reported at its node. Pure: imports neither gradio
nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine import ServingLimits
from pipelines.errors import ParamError
from pipelines.lora_request import check_loaded_loras
from pipelines.params import MAX_FRAMES_ABSOLUTE, check_field
from pipelines.validation import (
    check_frame_count_in,
    check_scheduler_name,
    check_side,
    check_side_in,
    check_size_in,
    check_still_frames,
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
    size_range: tuple[int, int] | None = None  # its smallest and largest side (None: any multiple)
    max_frames: int = MAX_FRAMES_ABSOLUTE
    frame_counts: tuple[int, ...] = ()  # the only lengths a video model's card allows (empty: any)
    image_inputs: tuple[str, ...] = ()  # "init_image", "mask_image": the pictures it can start from
    loras: tuple[str, ...] = ()  # the LoRA adapters loaded for it

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
                check_side_in(name, values[name], self.name, self.size_range, self.size_multiple)
        if "num_frames" in values and not self.makes_video:
            check_still_frames(values["num_frames"], self.name)
        if values.get("num_frames") is not None and self.makes_video:
            check_frame_count_in(values["num_frames"], self.name, self.frame_counts)
        if values.get("scheduler") is not None:
            check_scheduler_name("scheduler", values["scheduler"], self.schedulers)
        if "width" in values and "height" in values:
            check_size_in(values["width"], values["height"], self.name, self.sizes)
        if "loras" in values:
            check_loaded_loras(values["loras"], self.name, self.loras)


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

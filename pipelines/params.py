"""What a user asks for: the validated, immutable parameters of one generation request.

`GenerationParams` is the contract between the engine and every pipeline. It checks
everything that does not depend on the model (types, ranges, NaN); the pipeline's
`validate()` adds model-specific limits (size multiples, frame counts) and the engine
adds the server's configured caps (max steps, max size).

Fields left as `None` mean "the model's default"; `StepPipeline.resolve_defaults`
fills them in before the request is queued, so a queued request is always complete.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from pipelines.errors import ParamError

# Absolute sanity bounds. Servers configure tighter caps (see engine.limits.ServingLimits).
MAX_PROMPT_CHARS = 2000
MAX_STEPS_ABSOLUTE = 1000
MIN_SIZE = 8
MAX_SIZE_ABSOLUTE = 8192
MAX_FRAMES_ABSOLUTE = 1024
MAX_SEED = 2**63 - 1
MAX_MODEL_CHARS = 200


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ParamError(name, f"{name} must be an integer, got {value!r} ({type(value).__name__}).")
    if not low <= value <= high:
        raise ParamError(name, f"{name}={value} is out of range: allowed is {low}..{high}.")


def _check_prompt(name: str, text: object) -> None:
    if name == "prompt" and not isinstance(text, str):
        raise ParamError(name, f"prompt must be a string, got {type(text).__name__}.")
    if text is None:
        return
    if not isinstance(text, str):
        raise ParamError(name, f"{name} must be a string or None, got {type(text).__name__}.")
    if name == "prompt" and not text.strip():
        raise ParamError(name, "prompt is empty: describe the image you want, e.g. 'a red circle'.")
    if len(text) > MAX_PROMPT_CHARS:
        raise ParamError(name, f"{name} is {len(text)} characters long; at most {MAX_PROMPT_CHARS} are allowed.")


def _check_guidance(name: str, g: object) -> None:
    if isinstance(g, bool) or not isinstance(g, (int, float)):
        raise ParamError(name, f"guidance_scale must be a number, got {g!r}.")
    if not math.isfinite(g) or not 0.0 <= g <= 100.0:
        raise ParamError(name, f"guidance_scale={g} is not allowed: use a finite number in 0..100.")


def _check_scheduler(name: str, scheduler: object) -> None:
    if not isinstance(scheduler, str):
        raise ParamError(name, f"scheduler must be a name (string) or None, got {scheduler!r}.")


def _check_model(name: str, model: object) -> None:
    if not isinstance(model, str) or not 0 < len(model) <= MAX_MODEL_CHARS:
        raise ParamError(name, f"model must be a loaded model's name (1..{MAX_MODEL_CHARS} characters) or None, "
                               f"got {model!r:.60}.")


def _integer_in(low: int, high: int):
    return lambda name, value: _check_int(name, value, low, high)


# Each field's model-independent rule; None (the model's default) passes every optional field.
_FIELD_RULES = {
    "prompt": _check_prompt,
    "negative_prompt": _check_prompt,
    "width": _integer_in(MIN_SIZE, MAX_SIZE_ABSOLUTE),
    "height": _integer_in(MIN_SIZE, MAX_SIZE_ABSOLUTE),
    "num_frames": _integer_in(1, MAX_FRAMES_ABSOLUTE),
    "num_inference_steps": _integer_in(1, MAX_STEPS_ABSOLUTE),
    "guidance_scale": _check_guidance,
    "seed": _integer_in(0, MAX_SEED),
    "preview_every": _integer_in(0, MAX_STEPS_ABSOLUTE),
    "scheduler": _check_scheduler,
    "model": _check_model,
}
_REQUIRED = ("prompt", "preview_every")


def check_field(name: str, value: object) -> None:
    """The model-independent rule for one GenerationParams field (types, ranges, NaN): raises a
    ParamError naming the field. The workflow compiler checks one node's value with it."""
    if value is None and name not in _REQUIRED:
        return
    _FIELD_RULES[name](name, value)


@dataclass(frozen=True)
class GenerationParams:
    prompt: str
    negative_prompt: str | None = None
    width: int | None = None
    height: int | None = None
    num_frames: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    seed: int | None = None
    # Send a live preview every this many steps (0 = never).
    preview_every: int = 0
    # Name of a noise scheduler the pipeline offers (None = the checkpoint's default).
    scheduler: str | None = None
    # Which loaded model makes it (None = the engine's default model; the engine fills it in).
    model: str | None = None

    def __post_init__(self) -> None:
        for item in fields(self):
            check_field(item.name, getattr(self, item.name))

    @property
    def is_complete(self) -> bool:
        """True once the model defaults and the seed have been filled in."""
        return None not in (
            self.width, self.height, self.num_frames, self.num_inference_steps, self.guidance_scale, self.seed
        )

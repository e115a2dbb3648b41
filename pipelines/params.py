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
from dataclasses import dataclass

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
        raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__}).")
    if not low <= value <= high:
        raise ValueError(f"{name}={value} is out of range: allowed is {low}..{high}.")


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
        if not isinstance(self.prompt, str):
            raise ValueError(f"prompt must be a string, got {type(self.prompt).__name__}.")
        if not self.prompt.strip():
            raise ValueError("prompt is empty: describe the image you want, e.g. 'a red circle'.")
        if len(self.prompt) > MAX_PROMPT_CHARS:
            raise ValueError(
                f"prompt is {len(self.prompt)} characters long; at most {MAX_PROMPT_CHARS} are allowed."
            )
        if self.negative_prompt is not None:
            if not isinstance(self.negative_prompt, str):
                raise ValueError(
                    f"negative_prompt must be a string or None, got {type(self.negative_prompt).__name__}."
                )
            if len(self.negative_prompt) > MAX_PROMPT_CHARS:
                raise ValueError(
                    f"negative_prompt is {len(self.negative_prompt)} characters long; "
                    f"at most {MAX_PROMPT_CHARS} are allowed."
                )
        for name in ("width", "height"):
            value = getattr(self, name)
            if value is not None:
                _check_int(name, value, MIN_SIZE, MAX_SIZE_ABSOLUTE)
        if self.num_frames is not None:
            _check_int("num_frames", self.num_frames, 1, MAX_FRAMES_ABSOLUTE)
        if self.num_inference_steps is not None:
            _check_int("num_inference_steps", self.num_inference_steps, 1, MAX_STEPS_ABSOLUTE)
        if self.guidance_scale is not None:
            g = self.guidance_scale
            if isinstance(g, bool) or not isinstance(g, (int, float)):
                raise ValueError(f"guidance_scale must be a number, got {g!r}.")
            if not math.isfinite(g) or not 0.0 <= g <= 100.0:
                raise ValueError(f"guidance_scale={g} is not allowed: use a finite number in 0..100.")
        if self.seed is not None:
            _check_int("seed", self.seed, 0, MAX_SEED)
        _check_int("preview_every", self.preview_every, 0, MAX_STEPS_ABSOLUTE)
        if self.scheduler is not None and not isinstance(self.scheduler, str):
            raise ValueError(f"scheduler must be a name (string) or None, got {self.scheduler!r}.")
        if self.model is not None and (not isinstance(self.model, str) or not 0 < len(self.model) <= MAX_MODEL_CHARS):
            raise ValueError(f"model must be a loaded model's name (1..{MAX_MODEL_CHARS} characters) or None, "
                             f"got {self.model!r:.60}.")

    @property
    def is_complete(self) -> bool:
        """True once the model defaults and the seed have been filled in."""
        return None not in (
            self.width, self.height, self.num_frames, self.num_inference_steps, self.guidance_scale, self.seed
        )

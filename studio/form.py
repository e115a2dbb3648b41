"""The generate form as a caller filled it in (the page's fields, `/generate`'s and
`/image_to_image`'s inputs), read into the engine's GenerationParams: numbers sent as text are
parsed, and a bad field is named."""

from __future__ import annotations

import math
from dataclasses import dataclass

from typing import TYPE_CHECKING

from engine import EngineClient, GenerationParams
from pipelines.lora_request import loras_from_json

if TYPE_CHECKING:
    from PIL import Image

RANDOM_SEED = -1  # API value meaning "pick a random seed"


def _parsed(name: str, value: object) -> object:
    """API callers may send numbers as text ("64", "NaN"): parse them, name the field if not."""
    if not isinstance(value, str):
        return value
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {value!r}.") from None


def whole_number(name: str, value: object) -> int | None:
    """A form/API number as an int (None stays None = the model default)."""
    if value is None or value == "":
        return None
    value = _parsed(name, value)
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a whole number, got {value!r}.")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    raise ValueError(f"{name} must be a whole number, got {value!r}.")


def number(name: str, value: object) -> float | None:
    if value is None or value == "":
        return None
    value = _parsed(name, value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}.")
    return float(value)


def chosen_seed(seed: object) -> int | None:
    """None or a negative seed means random (the engine picks one and reports it)."""
    value = whole_number("seed", seed)
    return None if value is None or value < 0 else value


@dataclass(frozen=True)
class FormValues:
    """The generate form as the user filled it in (raw Gradio values)."""

    prompt: str
    negative_prompt: str | None = None
    width: object = None
    height: object = None
    steps: object = None
    guidance_scale: object = None
    seed: object = RANDOM_SEED
    model: object = None  # a loaded model's name; None or "" = the default model
    num_frames: object = None  # video models; None or 0 = the model's default
    # Image to image: the decoded picture to start from (RGB; the request takes its size when
    # width and height are not given), how much is redrawn (0..1; None or "" = the model's
    # default) and an optional mask ("L", white = repaint). See studio.pictures.
    init_image: "Image.Image | None" = None
    strength: object = None
    mask_image: "Image.Image | None" = None
    # LoRA adapters: a list of {"name", "scale"} (None: none besides a prompt's <lora:...> tags).
    loras: object = None
    # Step caching's threshold (0 = off; None or "" = the model's default).
    step_cache: object = None

    def model_name(self, engine: EngineClient) -> str:
        """The loaded model this form asks for (ValueError naming the loaded ones)."""
        if self.model is not None and not isinstance(self.model, str):
            raise ValueError(f"model must be a model's name (text), got {type(self.model).__name__}.")
        return engine.models.resolve(self.model or None)

    def to_params(self, preview_every: int, engine: EngineClient) -> GenerationParams:
        """Raises ValueError naming the bad field."""
        model = self.model_name(engine)
        negative = self.negative_prompt if engine.infos[model].uses_negative_prompt else None
        frames = whole_number("num_frames", self.num_frames)
        width, height = whole_number("width", self.width), whole_number("height", self.height)
        steps = whole_number("steps", self.steps)
        engine.limits_for(model).check_values(steps, width, height, frames or None)  # this server's ranges first
        return GenerationParams(
            prompt=self.prompt if isinstance(self.prompt, str) else "",
            negative_prompt=negative if negative else None,
            width=width,
            height=height,
            num_inference_steps=steps,
            guidance_scale=number("guidance_scale", self.guidance_scale),
            seed=chosen_seed(self.seed),
            preview_every=preview_every,
            num_frames=frames or None,
            model=model,
            init_image=self.init_image,
            strength=number("strength", self.strength),
            mask_image=self.mask_image,
            loras=loras_from_json(self.loras),
            step_cache=number("step_cache", self.step_cache),
        )

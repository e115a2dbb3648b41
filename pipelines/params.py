"""What a user asks for: the validated, immutable parameters of one generation request.

`GenerationParams` is the contract between the engine and every pipeline. It checks
everything that does not depend on the model (types, ranges, NaN); the pipeline's
`validate()` adds model-specific limits (size multiples, frame counts) and the engine
adds the server's configured caps (max steps, max size).

Fields left as `None` mean "the model's default"; `StepPipeline.resolve_defaults`
fills them in before the request is queued, so a queued request is always complete.

A request may start from an image (image-to-image) and repaint only part of it (inpainting):
`init_image` (PIL RGB), `strength` (0..1, diffusers' meaning: the last `steps * strength`
steps run, from the matching timestep; see `start_step`) and `mask_image` (PIL "L", white =
repaint). Equality, hashing and repr see the images' content digests, never their pixels;
`__dict__` holds the constructor's fields only, so `GenerationParams(**p.__dict__)` still works.
Treat the images as frozen too: a request's image is read when it runs.
Without width/height, a request with an init image takes the image's size.

`loras` names LoRA adapters loaded for the model, each with a scale; A1111's `<lora:NAME:SCALE>`
tags in a prompt become entries of it when the engine prepares the request (`with_prompt_loras`).

`step_cache` is the request's step-caching threshold (pipelines/step_cache.py): 0 runs every step
in full, a larger value lets more steps reuse the model's last output; None takes the model's default.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, fields

from PIL import Image

from pipelines.errors import ParamError
from pipelines.lora_request import LoraUse, check_loras, split_prompt_tags

# Absolute sanity bounds. Servers configure tighter caps (see engine.limits.ServingLimits).
MAX_PROMPT_CHARS = 2000
MAX_STEPS_ABSOLUTE = 1000
MIN_SIZE = 8
MAX_SIZE_ABSOLUTE = 8192
MAX_FRAMES_ABSOLUTE = 1024
MAX_SEED = 2**63 - 1
MAX_MODEL_CHARS = 200
MAX_STEP_CACHE = 1.0  # a relative change of the model's first block: past 1 every step would be skipped


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


def _check_strength(name: str, strength: object) -> None:
    if isinstance(strength, bool) or not isinstance(strength, (int, float)):
        raise ParamError(name, f"strength must be a number in 0..1 or None, got {strength!r:.60}.")
    if not math.isfinite(strength) or not 0.0 <= strength <= 1.0:
        raise ParamError(name, f"strength={strength} is not allowed: use a number in 0..1 "
                               "(0 keeps the image, 1 redraws it from noise).")


def _check_step_cache(name: str, threshold: object) -> None:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
        raise ParamError(name, f"step_cache must be a number (a threshold) or None, got {threshold!r:.60}.")
    if not math.isfinite(threshold) or not 0.0 <= threshold <= MAX_STEP_CACHE:
        raise ParamError(name, f"step_cache={threshold} is not allowed: use a threshold in 0..{MAX_STEP_CACHE:g} "
                               "(0 = off; higher skips more steps, e.g. 0.05).")


def _image_in_mode(mode: str, meaning: str):
    def check(name: str, image: object) -> None:
        if not isinstance(image, Image.Image):
            raise ParamError(name, f"{name} must be a PIL image ({meaning}) or None, got {type(image).__name__}.")
        if image.mode != mode:
            raise ParamError(name, f"{name} is a {image.mode!r} image; it must be {mode!r} ({meaning}): "
                                   f"convert it with image.convert({mode!r}).")
        for side, value in zip(("width", "height"), image.size):
            if not MIN_SIZE <= value <= MAX_SIZE_ABSOLUTE:
                raise ParamError(name, f"{name} is {image.width}x{image.height}; its {side} must be in "
                                       f"{MIN_SIZE}..{MAX_SIZE_ABSOLUTE} pixels.")

    return check


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
    "init_image": _image_in_mode("RGB", "the picture to start from"),
    "strength": _check_strength,
    "mask_image": _image_in_mode("L", "white = repaint, black = keep"),
    "loras": lambda name, value: check_loras(value),
    "step_cache": _check_step_cache,
}
_REQUIRED = ("prompt", "preview_every")


def check_field(name: str, value: object) -> None:
    """The model-independent rule for one GenerationParams field (types, ranges, NaN): raises a
    ParamError naming the field. The workflow compiler checks one node's value with it."""
    if value is None and name not in _REQUIRED:
        return
    _FIELD_RULES[name](name, value)


def image_digest(image: Image.Image) -> str:
    """What identifies an image's content: its size and a hash of its mode and pixels."""
    digest = hashlib.sha256(f"{image.mode}{image.size}".encode())
    digest.update(image.tobytes())
    return f"{image.width}x{image.height}:{digest.hexdigest()[:24]}"


def start_step(num_inference_steps: int, strength: float) -> int:
    """The index of the first step a request that starts from an image runs: diffusers'
    `get_timesteps`, float arithmetic included: the steps that run are steps * strength rounded
    UP (10 steps at 0.25 start at step 7, so 3 run; at 0.01, 1 runs; at 0, none)."""
    init_steps = min(num_inference_steps * strength, num_inference_steps)
    return int(max(num_inference_steps - init_steps, 0))


def _request_size_text(width: int | None, height: int | None, image: Image.Image) -> str:
    return f"{image.width if width is None else width}x{image.height if height is None else height}"


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
    # Start from this picture (PIL RGB, the request's size) instead of pure noise.
    init_image: Image.Image | None = field(default=None, repr=False, compare=False)
    # How much of the schedule runs on the init image (0..1); None = the model's default.
    strength: float | None = None
    # Repaint only the white part of the init image (PIL "L", the same size).
    mask_image: Image.Image | None = field(default=None, repr=False, compare=False)
    # LoRA adapters loaded for the model, each with its scale (pipelines/lora_request.py).
    loras: tuple[LoraUse, ...] = ()
    # Step caching (pipelines/step_cache.py): a step whose first block changed less than this since
    # the last step computed reuses the rest of the model's output; 0 = off, None = the model's default.
    step_cache: float | None = None

    def __post_init__(self) -> None:
        for item in fields(self):
            check_field(item.name, getattr(self, item.name))
        self._check_images()

    # The images' content digests stand in for their pixels in equality, hashing and repr.
    @property
    def init_image_digest(self) -> str | None:
        return None if self.init_image is None else image_digest(self.init_image)

    @property
    def mask_image_digest(self) -> str | None:
        return None if self.mask_image is None else image_digest(self.mask_image)

    def _identity(self) -> tuple:
        values = tuple(getattr(self, item.name) for item in fields(self) if item.compare)
        return values + (self.init_image_digest, self.mask_image_digest)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def __repr__(self) -> str:
        shown = [f"{item.name}={getattr(self, item.name)!r}" for item in fields(self) if item.repr]
        shown += [f"{name}=<{digest}>" for name, digest in (("init_image", self.init_image_digest),
                                                             ("mask_image", self.mask_image_digest)) if digest]
        return f"{type(self).__name__}({', '.join(shown)})"

    def _check_images(self) -> None:
        """A mask needs an image, and both have the request's size (when it is given)."""
        image, mask = self.init_image, self.mask_image
        if mask is not None and image is None:
            raise ParamError("mask_image", "mask_image needs an init_image: a mask says which part of an image "
                                           "to repaint.")
        if image is None:
            return
        wanted = _request_size_text(self.width, self.height, image)
        if wanted != f"{image.width}x{image.height}":
            raise ParamError("init_image", f"init_image is {image.width}x{image.height}; this request is {wanted}: "
                                           f"resize it or ask for {image.width}x{image.height}.")
        if mask is not None and mask.size != image.size:
            raise ParamError("mask_image", f"mask_image is {mask.width}x{mask.height}; init_image is "
                                           f"{image.width}x{image.height}: they must be the same size.")

    def with_prompt_loras(self) -> "GenerationParams":
        """A1111's `<lora:NAME:SCALE>` tags moved out of the prompt into `loras` (after the ones
        already there; an adapter named twice is a ParamError)."""
        from dataclasses import replace

        prompt, tagged = split_prompt_tags(self.prompt)
        if not tagged:
            return self
        if not prompt:
            raise ParamError("prompt", "the prompt holds only LoRA tags: describe the image too, "
                                       "e.g. 'a red circle <lora:NAME:1>'.")
        return replace(self, prompt=prompt, loras=self.loras + tagged)

    @property
    def denoise_steps(self) -> int | None:
        """The denoise steps this request runs (before the noise scheduler's own extras, e.g.
        PNDM's one more): all of them from noise, the last ones from an init image."""
        steps = self.num_inference_steps
        if steps is None or self.init_image is None or self.strength is None:
            return steps
        return steps - start_step(steps, self.strength)

    @property
    def is_complete(self) -> bool:
        """True once the model defaults and the seed have been filled in."""
        return None not in (
            self.width, self.height, self.num_frames, self.num_inference_steps, self.guidance_scale, self.seed
        )

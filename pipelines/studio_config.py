"""`stepstudio.json`: the serving defaults a model folder may carry next to `model_index.json`.

Every key is optional. A folder without the file is served with its family's defaults.

    height, width, num_inference_steps, guidance_scale, negative_prompt   ModelDefaults
    num_frames, fps                                                       ModelDefaults of video models
    max_sequence_length                                                   text length of the T5 encoder
    example_prompts                                                       shown in the studio
    vocabulary                                                            the only words the model knows;
                                                                          prompts are lower-cased
    sizes ["64x64", ...]                                                  the only sizes served (default: any)
    frame_counts [9, 13, ...]                                             a video model's only frame counts served
                                                                          (default: any its VAE takes)
    size_range [MIN, MAX]                                                 each side from MIN to MAX pixels (in the
                                                                          family's multiples; default: any)
    step_cache                                                            the step-caching threshold of a request
                                                                          that does not say (default 0: off)
    preview_rgb_factors [C][3], preview_rgb_bias [3]                      latent -> RGB preview in [0, 1],
                                                                          on normalized latents
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from pipelines.interface import ModelDefaults

FILE_NAME = "stepstudio.json"

_WORD = re.compile(r"[a-z0-9']+")


@dataclass(frozen=True)
class StudioConfig:
    height: int | None = None
    width: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    negative_prompt: str | None = None
    num_frames: int | None = None
    fps: int | None = None
    max_sequence_length: int | None = None
    example_prompts: tuple[str, ...] = ()
    vocabulary: frozenset[str] = frozenset()
    preview_rgb_factors: tuple[tuple[float, ...], ...] | None = None
    preview_rgb_bias: tuple[float, ...] | None = None
    # The sizes the model makes well (its card's), as (width, height); empty: any size its family allows.
    sizes: tuple[tuple[int, int], ...] = ()
    # The smallest and largest side the model makes well, in pixels; None: any its family allows.
    size_range: tuple[int, int] | None = None
    # The frame counts a video model makes well (its card's); empty: any its VAE takes.
    frame_counts: tuple[int, ...] = ()
    step_cache: float | None = None

    def model_defaults(
        self,
        width: int,
        height: int,
        num_inference_steps: int,
        guidance_scale: float,
        negative_prompt: str | None = None,
        num_frames: int = 1,
        fps: int | None = None,
    ) -> ModelDefaults:
        """The serving defaults: this file's values where set, else the family's (the arguments)."""
        return ModelDefaults(
            width=self.width or width,
            height=self.height or height,
            num_inference_steps=self.num_inference_steps or num_inference_steps,
            guidance_scale=guidance_scale if self.guidance_scale is None else self.guidance_scale,
            negative_prompt=negative_prompt if self.negative_prompt is None else self.negative_prompt,
            num_frames=self.num_frames or num_frames,
            fps=self.fps or fps,
            example_prompts=tuple(self.example_prompts),
            step_cache=self.step_cache or 0.0,
        )

    def unknown_words(self, prompt: str) -> list[str]:
        """Words of `prompt` outside the vocabulary, in order, without repeats ([] without a vocabulary)."""
        if not self.vocabulary:
            return []
        unknown: list[str] = []
        for word in _WORD.findall(prompt.lower()):
            if word not in self.vocabulary and word not in unknown:
                unknown.append(word)
        return unknown


def _typed(path: Path, data: dict, key: str, kind: type | tuple[type, ...]):
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ValueError(f"{path}: {key}={value!r} must be {names}.")
    return value


def read_studio_config(folder: Path) -> StudioConfig:
    """The folder's stepstudio.json, or an empty StudioConfig when it has none."""
    path = Path(folder) / FILE_NAME
    if not path.is_file():
        return StudioConfig()
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}).") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}.")

    factors = _typed(path, data, "preview_rgb_factors", list)
    bias = _typed(path, data, "preview_rgb_bias", list)
    if (factors is None) != (bias is None):
        raise ValueError(f"{path}: preview_rgb_factors and preview_rgb_bias must be given together.")
    if factors is not None:
        if not factors or any(not isinstance(row, list) or len(row) != 3 for row in factors) or len(bias) != 3:
            raise ValueError(
                f"{path}: preview_rgb_factors must be a list of [r, g, b] rows (one per latent channel) "
                f"and preview_rgb_bias one [r, g, b]; got {len(factors)} rows and a bias of length {len(bias)}."
            )
        factors = tuple(tuple(float(v) for v in row) for row in factors)
        bias = tuple(float(v) for v in bias)

    guidance = _typed(path, data, "guidance_scale", (int, float))
    step_cache = _typed(path, data, "step_cache", (int, float))
    if step_cache is not None and not 0 <= step_cache <= 1:
        raise ValueError(f"{path}: step_cache={step_cache!r} must be a threshold in 0..1 (0 = off).")
    sizes = []
    for text in _typed(path, data, "sizes", list) or ():
        width, sep, height = str(text).lower().partition("x")
        if not (sep and width.isdigit() and height.isdigit() and int(width) > 0 and int(height) > 0):
            raise ValueError(f"{path}: sizes must be a list of \"WIDTHxHEIGHT\" texts like \"64x64\", got {text!r}.")
        sizes.append((int(width), int(height)))
    size_range = _typed(path, data, "size_range", list)
    if size_range is not None and not (len(size_range) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                     and v > 0 for v in size_range)
                                       and size_range[0] <= size_range[1]):
        raise ValueError(f"{path}: size_range must be [MIN, MAX] pixels with 0 < MIN <= MAX, got {size_range!r}.")
    frame_counts = _typed(path, data, "frame_counts", list) or []
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in frame_counts):
        raise ValueError(f"{path}: frame_counts must be a list of positive whole numbers like [9, 13], "
                         f"got {frame_counts!r}.")
    return StudioConfig(
        height=_typed(path, data, "height", int),
        width=_typed(path, data, "width", int),
        num_inference_steps=_typed(path, data, "num_inference_steps", int),
        guidance_scale=None if guidance is None else float(guidance),
        negative_prompt=_typed(path, data, "negative_prompt", str),
        num_frames=_typed(path, data, "num_frames", int),
        fps=_typed(path, data, "fps", int),
        max_sequence_length=_typed(path, data, "max_sequence_length", int),
        example_prompts=tuple(_typed(path, data, "example_prompts", list) or ()),
        vocabulary=frozenset(word.lower() for word in (_typed(path, data, "vocabulary", list) or ())),
        preview_rgb_factors=factors,
        preview_rgb_bias=bias,
        sizes=tuple(sizes),
        size_range=None if size_range is None else (size_range[0], size_range[1]),
        frame_counts=tuple(frame_counts),
        step_cache=None if step_cache is None else float(step_cache),
    )

"""The bodies of the images routes: OpenAI's `images.generate` and `images.edit` fields plus the
diffusion controls they lack (send those with the openai client's `extra_body=`).

`/v1/images/generations` takes JSON, typed strictly; `/v1/images/edits` takes a multipart form,
whose fields arrive as text and are converted (pydantic's lax mode), its files apart.
"""

from __future__ import annotations

from typing import Literal

import pydantic

from pipelines.lora_request import MAX_LORA_NAME_CHARS, MAX_LORA_SCALE, MIN_LORA_SCALE, LoraUse
from pipelines.params import MAX_PROMPT_CHARS, MAX_SEED, MAX_STEP_CACHE, GenerationParams

# Step caching's threshold (pipelines/step_cache.py): 0 = off; absent = the model's default.
STEP_CACHE_FIELD = pydantic.Field(default=None, ge=0.0, le=MAX_STEP_CACHE, allow_inf_nan=False)


class LoraBody(pydantic.BaseModel):
    """One adapter a request runs with: a name GET /v1/models lists for the model, and a scale."""

    model_config = pydantic.ConfigDict(strict=True, extra="forbid")

    name: str = pydantic.Field(min_length=1, max_length=MAX_LORA_NAME_CHARS)
    scale: float = pydantic.Field(default=1.0, ge=MIN_LORA_SCALE, le=MAX_LORA_SCALE, allow_inf_nan=False)


class _ImageRequest(pydantic.BaseModel):
    """What both images routes take."""

    model_config = pydantic.ConfigDict(strict=True, extra="forbid")

    prompt: str = pydantic.Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    model: str | None = pydantic.Field(default=None, max_length=256)
    n: int | None = pydantic.Field(default=None, ge=1)  # the upper bound is the server's config
    size: str | None = pydantic.Field(default=None, max_length=32)  # "WIDTHxHEIGHT" or "auto"
    response_format: Literal["b64_json", "url"] | None = None
    output_format: Literal["png"] | None = None
    # OpenAI fields this server can't honour: accepted (common clients always send some of them)
    # and ignored. Images are always PNG at the requested size; `user` is not used for anything.
    user: str | None = pydantic.Field(default=None, max_length=256)
    quality: str | None = pydantic.Field(default=None, max_length=32)
    background: str | None = pydantic.Field(default=None, max_length=32)
    output_compression: int | None = pydantic.Field(default=None, ge=0, le=100)
    # Extensions.
    negative_prompt: str | None = pydantic.Field(default=None, max_length=MAX_PROMPT_CHARS)
    num_inference_steps: int | None = None  # checked against the server's range, which it names
    guidance_scale: float | None = pydantic.Field(default=None, ge=0.0, le=100.0, allow_inf_nan=False)
    seed: int | None = pydantic.Field(default=None, ge=0, le=MAX_SEED)
    # LoRA adapters loaded for the model, each with its scale (also: <lora:NAME:SCALE> in the prompt).
    loras: list[LoraBody] | None = pydantic.Field(default=None, max_length=64)
    step_cache: float | None = STEP_CACHE_FIELD

    def params(self, model: str, width: int | None, height: int | None, **images) -> GenerationParams:
        """The engine request this body asks for (`images`: an edit's init_image, strength and
        mask_image). Raises the engine's ValueError (a ParamError naming the field)."""
        return GenerationParams(
            prompt=self.prompt,
            negative_prompt=self.negative_prompt,
            width=width,
            height=height,
            num_inference_steps=self.num_inference_steps,
            guidance_scale=self.guidance_scale,
            seed=self.seed,
            model=model,
            loras=tuple(LoraUse(lora.name, lora.scale) for lora in self.loras or ()),
            step_cache=self.step_cache,
            **images,
        )


class ImageGenerationRequest(_ImageRequest):
    """OpenAI's `images.generate` body plus the diffusion controls it lacks."""

    style: str | None = pydantic.Field(default=None, max_length=32)
    moderation: str | None = pydantic.Field(default=None, max_length=32)


class ImageEditRequest(_ImageRequest):
    """The text fields of OpenAI's `images.edit` form (the files `image` and `mask` come apart).
    `size` absent or "auto": the image's own size."""

    input_fidelity: str | None = pydantic.Field(default=None, max_length=32)  # accepted, ignored
    safety_identifier: str | None = pydantic.Field(default=None, max_length=256)  # accepted, ignored
    stream: bool | None = None  # streamed partial images are not offered: true is refused
    # How much of the image is redrawn, 0..1 (diffusers' meaning: that share of the steps run,
    # from the matching noise level); absent: the model's default.
    strength: float | None = pydantic.Field(default=None, ge=0.0, le=1.0, allow_inf_nan=False)

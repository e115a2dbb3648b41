"""Stable Diffusion XL (`StableDiffusionXLPipeline`) as a step pipeline.

Same step loop as Stable Diffusion 1.x (pipelines/stable_diffusion.py); SDXL adds two text
encoders whose pooled embedding and "added time ids" (original size, crop, target size)
condition the UNet. Both are per row, so requests with different prompts and sizes-as-
conditioning share a forward; only the latent shape must match.

Differences from `__call__`, on purpose: no refiner hand-off (`denoising_end`), no
`guidance_rescale`, and original size / crop / target size are the request's own
height and width with a (0, 0) crop, which is `__call__`'s default.

From an init image and mask: as `StableDiffusionXLImg2ImgPipeline` and
`StableDiffusionXLInpaintPipeline` (the step loop's part is SD's). Their added time ids are
text-to-image's for a base checkpoint: the aesthetic-score ids replace the target size only
when the pipeline's config says `requires_aesthetics_score` (the refiner, whose
`StableDiffusionXLImg2ImgPipeline` folder this family does not load). The image latents are
normalized with the VAE's latents_mean / latents_std when it has them, as img2img and every
decode do (the inpaint pipeline scales only).
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple, Sequence

import torch
from diffusers import StableDiffusionXLPipeline

from pipelines.cfg import Row
from pipelines.interface import RequestState
from pipelines.params import GenerationParams
from pipelines.prompt_cache import split_rows
from pipelines.stable_diffusion import StableDiffusionStepPipeline, UNetRequestExtra
from pipelines.studio_config import StudioConfig

# Latent -> RGB preview factors for the SDXL 4-channel latent space (as used by ComfyUI).
SDXL_LATENT_RGB_FACTORS = (
    (0.3651, 0.4232, 0.4341),
    (-0.2533, -0.0042, 0.1068),
    (0.1076, 0.1111, -0.0362),
    (-0.3165, -0.2492, -0.2188),
)
SDXL_LATENT_RGB_BIAS = (0.1084, -0.0175, -0.0011)


class SDXLText(NamedTuple):
    embeds: torch.Tensor  # [1, 77, both encoders' widths], the UNet's encoder_hidden_states
    pooled: torch.Tensor  # [1, projection_dim], the second encoder's pooled output


class StableDiffusionXLStepPipeline(StableDiffusionStepPipeline):
    """SDXL base driven one co-batched denoise step at a time."""

    family = "stable-diffusion-xl"
    label = "SDXL"
    diffusers_class = StableDiffusionXLPipeline
    default_guidance_scale = 5.0
    default_strength = 0.3  # StableDiffusionXLImg2ImgPipeline's
    latent_rgb_factors = SDXL_LATENT_RGB_FACTORS
    latent_rgb_bias = SDXL_LATENT_RGB_BIAS

    def __init__(self, pipe, device, name, studio: StudioConfig | None = None, scheduler: str | None = None) -> None:
        # The SDXL VAE overflows in float16: __call__ upcasts it around every decode when its
        # config says force_upcast; keeping it in float32 once gives the same pixels.
        if pipe.vae.dtype == torch.float16 and pipe.vae.config.force_upcast:
            pipe.vae.to(dtype=torch.float32)
        super().__init__(pipe, device, name, studio, scheduler)

    @classmethod
    def _load_kwargs(cls, path, dtype) -> dict:
        return {}  # SDXL pipelines have no safety checker to leave out

    # ---------------------------------------------------------------- texts
    def _negative_text(self, params: GenerationParams) -> str | None:
        # __call__ zeroes the unconditional embeddings instead when no negative prompt is
        # given and the checkpoint asks for it (force_zeros_for_empty_prompt).
        if params.negative_prompt is None and self.pipe.config.force_zeros_for_empty_prompt:
            return None
        return params.negative_prompt or ""

    def _unconditional(self, positive: SDXLText) -> SDXLText:
        return SDXLText(torch.zeros_like(positive.embeds), torch.zeros_like(positive.pooled))

    @torch.no_grad()
    def _encode_texts(self, texts: list[str]) -> list[SDXLText]:
        """encode_prompt (both text encoders) for several texts at once, one entry per text."""
        prompt_embeds, _, pooled, _ = self.pipe.encode_prompt(
            prompt=texts, device=self.device, num_images_per_prompt=1, do_classifier_free_guidance=False
        )
        return [SDXLText(*row) for row in split_rows(len(texts), prompt_embeds, pooled)]

    def _embeds_of(self, text: SDXLText) -> torch.Tensor:
        return text.embeds

    # ---------------------------------------------------------------- added conditioning
    def _request_extra(self, state: RequestState) -> UNetRequestExtra:
        params, pooled = state.params, state.conditioning.positive.pooled
        if self.pipe.text_encoder_2 is None:
            projection_dim = int(pooled.shape[-1])
        else:
            projection_dim = self.pipe.text_encoder_2.config.projection_dim
        size = (params.height, params.width)
        time_ids = self.pipe._get_add_time_ids(
            original_size=size, crops_coords_top_left=(0, 0), target_size=size, dtype=pooled.dtype,
            text_encoder_projection_dim=projection_dim,
        ).to(self.device)
        # __call__'s negative time ids are these too when no negative sizes are given.
        return replace(super()._request_extra(state), time_ids=time_ids)

    def _added_cond_kwargs(self, rows: Sequence[Row]) -> dict[str, torch.Tensor]:
        return {
            "text_embeds": torch.cat([row.text.pooled for row in rows]),
            "time_ids": torch.cat([row.state.extra.time_ids for row in rows]),
        }

    # ---------------------------------------------------------------- init image and decode
    def _image_latents(self, state: RequestState, encoding) -> torch.Tensor:
        """prepare_latents' VAE encoding (the VAE may run in float32): sampled, then normalized."""
        latents = encoding.sample(generator=state.generator).to(self.device, self._latents_dtype(state))
        statistics = self._latent_statistics(latents)
        if statistics is None:
            return self.vae.config.scaling_factor * latents
        mean, std = statistics
        return (latents - mean) * self.vae.config.scaling_factor / std

    def _vae_latents(self, state: RequestState) -> torch.Tensor:
        config = self.vae.config
        latents = state.latents.to(self.vae.dtype)
        statistics = self._latent_statistics(latents)
        if statistics is None:
            return latents / config.scaling_factor
        mean, std = statistics
        return latents * std / config.scaling_factor + mean

    def _latent_statistics(self, latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The VAE's per-channel latents_mean and latents_std, when its config has both."""
        config = self.vae.config
        if getattr(config, "latents_mean", None) is None or getattr(config, "latents_std", None) is None:
            return None
        return tuple(torch.tensor(values).view(1, 4, 1, 1).to(latents.device, latents.dtype)
                     for values in (config.latents_mean, config.latents_std))

    def _decoded(self, image: torch.Tensor) -> torch.Tensor:
        return image if self.pipe.watermark is None else self.pipe.watermark.apply_watermark(image)

"""Stable Diffusion XL (`StableDiffusionXLPipeline`) as a step pipeline.

Same step loop as Stable Diffusion 1.x (pipelines/stable_diffusion.py); SDXL adds two text
encoders whose pooled embedding and "added time ids" (original size, crop, target size)
condition the UNet. Both are per row, so requests with different prompts and sizes-as-
conditioning share a forward; only the latent shape and CFG on/off must match.

Differences from `__call__`, on purpose: no refiner hand-off (`denoising_end`), no
`guidance_rescale`, and original size / crop / target size are the request's own
height and width with a (0, 0) crop, which is `__call__`'s default.
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import StableDiffusionXLPipeline
from PIL import Image

from pipelines.interface import RequestState
from pipelines.loader import LoadOptions, load_diffusers_pipeline
from pipelines.params import GenerationParams
from pipelines.prompt_cache import split_rows
from pipelines.stable_diffusion import StableDiffusionStepPipeline, UNetConditioning
from pipelines.studio_config import StudioConfig, read_studio_config

# Latent -> RGB preview factors for the SDXL 4-channel latent space (as used by ComfyUI).
SDXL_LATENT_RGB_FACTORS = (
    (0.3651, 0.4232, 0.4341),
    (-0.2533, -0.0042, 0.1068),
    (0.1076, 0.1111, -0.0362),
    (-0.3165, -0.2492, -0.2188),
)
SDXL_LATENT_RGB_BIAS = (0.1084, -0.0175, -0.0011)


class StableDiffusionXLStepPipeline(StableDiffusionStepPipeline):
    """SDXL base driven one co-batched denoise step at a time."""

    family = "stable-diffusion-xl"
    default_guidance_scale = 5.0
    latent_rgb_factors = SDXL_LATENT_RGB_FACTORS
    latent_rgb_bias = SDXL_LATENT_RGB_BIAS
    sets_scheduler_begin_index = True

    def __init__(
        self,
        pipe,
        name: str,
        device: torch.device,
        default_scheduler: str | None = None,
        studio: StudioConfig | None = None,
    ) -> None:
        # The SDXL VAE overflows in float16: __call__ upcasts it around every decode when its
        # config says force_upcast; keeping it in float32 once gives the same pixels.
        if pipe.vae.dtype == torch.float16 and pipe.vae.config.force_upcast:
            pipe.vae.to(dtype=torch.float32)
        super().__init__(pipe, name, device, default_scheduler, studio)

    @classmethod
    def from_pretrained(cls, path: str | Path, options: LoadOptions) -> "StableDiffusionXLStepPipeline":
        pipe, device = load_diffusers_pipeline(StableDiffusionXLPipeline, Path(path), options, "SDXL")
        return cls(pipe, Path(path).name, device, options.scheduler, read_studio_config(Path(path)))

    def _encode_conditioning(self, params: GenerationParams, cfg: bool) -> UNetConditioning:
        (prompt_embeds, pooled), *negative = self.prompt_cache.encode_many(self._texts(params))
        negative_embeds = negative_pooled = None
        if cfg:  # no negative text encoded means zeroed unconditional embeddings (see _negative_text)
            negative_embeds, negative_pooled = (
                negative[0] if negative else (torch.zeros_like(prompt_embeds), torch.zeros_like(pooled))
            )
        if self.pipe.text_encoder_2 is None:
            projection_dim = int(pooled.shape[-1])
        else:
            projection_dim = self.pipe.text_encoder_2.config.projection_dim
        size = (params.height, params.width)
        time_ids = self.pipe._get_add_time_ids(
            size, (0, 0), size, dtype=prompt_embeds.dtype, text_encoder_projection_dim=projection_dim
        ).to(self.device)
        return UNetConditioning(
            prompt_embeds=prompt_embeds.to(self.device),
            negative_prompt_embeds=negative_embeds.to(self.device) if cfg else None,
            guidance_scale=float(params.guidance_scale),
            timestep_cond=self._timestep_cond(params.guidance_scale, prompt_embeds.dtype),
            text_embeds=pooled.to(self.device),
            negative_text_embeds=negative_pooled.to(self.device) if cfg else None,
            time_ids=time_ids,
            negative_time_ids=time_ids,  # __call__'s default when no negative sizes are given
        )

    def _negative_text(self, params: GenerationParams) -> str | None:
        # __call__ zeroes the unconditional embeddings instead when no negative prompt is
        # given and the checkpoint asks for it (force_zeros_for_empty_prompt).
        if params.negative_prompt is None and self.pipe.config.force_zeros_for_empty_prompt:
            return None
        return params.negative_prompt or ""

    @torch.no_grad()
    def _encode_texts(self, texts: list[str]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """encode_prompt (both text encoders) for several texts at once, one entry per text."""
        prompt_embeds, _, pooled, _ = self.pipe.encode_prompt(
            prompt=texts, device=self.device, num_images_per_prompt=1, do_classifier_free_guidance=False
        )
        return split_rows(len(texts), prompt_embeds, pooled)

    def _added_cond_kwargs(self, conds: list[UNetConditioning], cfg: bool) -> dict[str, torch.Tensor]:
        text_embeds = torch.cat([c.text_embeds for c in conds])
        time_ids = torch.cat([c.time_ids for c in conds])
        if cfg:
            text_embeds = torch.cat([torch.cat([c.negative_text_embeds for c in conds]), text_embeds])
            time_ids = torch.cat([torch.cat([c.negative_time_ids for c in conds]), time_ids])
        return {"text_embeds": text_embeds, "time_ids": time_ids}

    @torch.no_grad()
    def post_decode(self, state: RequestState) -> list[Image.Image]:
        vae = self.vae
        latents = state.latents.to(vae.dtype)
        config = vae.config
        if getattr(config, "latents_mean", None) is not None and getattr(config, "latents_std", None) is not None:
            mean = torch.tensor(config.latents_mean).view(1, 4, 1, 1).to(latents.device, latents.dtype)
            std = torch.tensor(config.latents_std).view(1, 4, 1, 1).to(latents.device, latents.dtype)
            latents = latents * std / config.scaling_factor + mean
        else:
            latents = latents / config.scaling_factor
        image = vae.decode(latents, return_dict=False)[0]
        if self.pipe.watermark is not None:
            image = self.pipe.watermark.apply_watermark(image)
        return self.pipe.image_processor.postprocess(image, output_type="pil")

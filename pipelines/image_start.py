"""Requests that start from an image (img2img, inpaint): diffusers' img2img/inpaint logic once,
for every family (a part of pipelines/diffusers_step.DiffusersStepPipeline).

`get_timesteps` (the last steps of the schedule, from `_start_step`), the initial latents = the
image noised to the first of them, and after every step the inpaint blend of the unmasked part
(diffusers' inpaint pipelines with a text-to-image denoiser: FluxInpaintPipeline,
StableDiffusionInpaintPipeline on a 4-channel UNet). A family says what differs:
`_image_latents`, `_mask_latents`, and where needed `_noise`, `_noised_latents`, `_start_step`.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from PIL import Image

from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution

from pipelines.interface import RequestState
from pipelines.params import GenerationParams, start_step


class ImageStart:
    """Uses the pipeline's `pipe`, `vae`, `device`, `image_cache` (pipelines.image_encoding) and
    `_initial_latents`."""

    def encode_images(self, params: Sequence[GenerationParams]) -> None:
        """The init images of requests joining the same step, VAE-encoded together (per size)."""
        with torch.no_grad():
            self.image_cache.encode_many(params)

    def _encode_images(self, images: list[Image.Image], height: int, width: int) -> list[Any]:
        """ONE VAE encoder call over same-size images: each one's latent distribution."""
        pixels = self.pipe.image_processor.preprocess(images, height=height, width=width)
        with self.placement.using("vae"):
            moments = self.vae.encode(pixels.to(self.device, self.vae.dtype)).latent_dist.parameters
        return [DiagonalGaussianDistribution(row) for row in moments.split(1)]

    def _latents_from_image(self, state: RequestState) -> torch.Tensor:
        """The init image's latents noised to the first timestep that runs; with a mask, what
        the blend after each step needs is kept. The generator draws as diffusers': image, noise."""
        params, extra = state.params, state.extra
        image_latents = self._image_latents(state, self.image_cache.encode(params))
        noise = self._noise(state)
        if params.mask_image is not None:
            extra.image_latents, extra.noise, extra.mask = image_latents, noise, self._mask_latents(state)
        return self._noised_latents(state, image_latents, noise, state.timesteps[:1])

    def _image_latents(self, state: RequestState, encoding: Any) -> torch.Tensor:
        """The init image's latents in the layout of state.latents, sampled from the request's
        own generator and normalized as the family's img2img pipeline does."""
        raise NotImplementedError(f"{type(self).__name__} does not start from an image.")

    def _start_step(self, params: GenerationParams) -> int:
        """The first step a request from an init image runs (diffusers' `get_timesteps` t_start;
        SD and SDXL round the other way and override this)."""
        return start_step(params.num_inference_steps, params.strength)

    def _noise(self, state: RequestState) -> torch.Tensor:
        """The request's raw noise in the latents' layout (init_noise_sigma 1: the flow families)."""
        return self._initial_latents(state)

    def _noised_latents(self, state: RequestState, image_latents, noise, timestep: torch.Tensor) -> torch.Tensor:
        """The image latents noised to `timestep` (shape [1]) by the request's own scheduler."""
        return state.noise_scheduler.add_noise(image_latents, noise, timestep)

    def _mask_latents(self, state: RequestState) -> torch.Tensor:
        """The mask in the latents' layout, 1 = repaint, as the family's inpaint pipeline makes it."""
        raise NotImplementedError(f"{type(self).__name__} does not inpaint.")

    def _inpaint_blend(self, state: RequestState) -> torch.Tensor:
        """After a step: the unmasked part back to the image, noised to the next timestep (the
        clean image after the last step), as diffusers' inpaint loops do."""
        extra = state.extra
        keep = extra.image_latents
        if not state.is_denoised:
            next_timestep = state.timesteps[state.step_index : state.step_index + 1]
            keep = self._noised_latents(state, keep, extra.noise, next_timestep)
        return (1 - extra.mask) * keep + extra.mask * state.latents

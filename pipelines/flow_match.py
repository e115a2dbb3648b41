"""The flow-matching families' shared base: FLUX, SD3, Qwen-Image and Wan.

What flow matching adds to `DiffusersStepPipeline` (pipelines/diffusers_step.py), once:
- the checkpoint's own noise scheduler is the only one offered (the families' sigmas and
  shifts assume it), named after its class;
- the resolution-dependent shift `mu` of dynamic shifting, from the request's image tokens;
- the predicted x0 for previews: x_t = (1 - sigma) x0 + sigma noise and v = noise - x0, so
  x0 = x_t - sigma v (neither FlowMatchEuler nor flow UniPC returns pred_original_sample);
- an init image is noised with `scale_noise` (the same x_t), not the DDPM-type `add_noise`.
"""

from __future__ import annotations

import numpy as np
import torch

from pipelines.diffusers_step import DiffusersStepPipeline
from pipelines.interface import RequestState
from pipelines.params import GenerationParams

# Our names for the flow-matching noise schedulers the supported checkpoints ship.
SCHEDULER_NAMES = {
    "FlowMatchEulerDiscreteScheduler": "flow-match-euler",
    "UniPCMultistepScheduler": "unipc",  # Wan's, on flow sigmas (prediction_type="flow_prediction")
}


class FlowMatchStepPipeline(DiffusersStepPipeline):
    def _offered_schedulers(self, checkpoint_scheduler) -> tuple[str, ...]:
        class_name = type(checkpoint_scheduler).__name__
        return (SCHEDULER_NAMES.get(class_name, class_name),)

    def _image_shift(self, scheduler, image_seq_len: int) -> float:
        """`mu` of dynamic shifting: linear in the image tokens between the config's two points
        (diffusers' calculate_shift)."""
        config = scheduler.config
        base_len, max_len = config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096)
        base_shift, max_shift = config.get("base_shift", 0.5), config.get("max_shift", 1.15)
        slope = (max_shift - base_shift) / (max_len - base_len)
        return image_seq_len * slope + (base_shift - slope * base_len)

    def _shifted_timesteps(self, scheduler, params: GenerationParams, image_seq_len: int) -> torch.Tensor:
        """FluxPipeline's and QwenImagePipeline's schedule: sigmas 1 .. 1/steps, shifted by `mu`."""
        steps = params.num_inference_steps
        sigmas = None if scheduler.config.get("use_flow_sigmas") else np.linspace(1.0, 1 / steps, steps)
        scheduler.set_timesteps(
            num_inference_steps=None if sigmas is not None else steps,
            device=self.device,
            sigmas=sigmas,
            mu=self._image_shift(scheduler, image_seq_len),
        )
        return scheduler.timesteps

    def _stock_latents(self, state: RequestState, channels: int, dtype: torch.dtype, **extra):
        """The stock pipeline's prepare_latents for one request, from the request's own generator."""
        params = state.params
        return self.pipe.prepare_latents(
            batch_size=1,
            num_channels_latents=channels,
            height=params.height,
            width=params.width,
            dtype=dtype,
            device=self.device,
            generator=state.generator,
            **extra,
        )

    # ------------------------------------------------------------------ latents packed in 2x2 patches
    # (FLUX and Qwen-Image: their pipelines' prepare_latents packs, _unpack_latents undoes it)
    def _packed_tokens(self, params: GenerationParams) -> int:
        patch = self.vae_scale_factor * 2
        return (params.height // patch) * (params.width // patch)

    def _unpacked(self, packed: torch.Tensor, params: GenerationParams) -> torch.Tensor:
        return self.pipe._unpack_latents(
            latents=packed, height=params.height, width=params.width, vae_scale_factor=self.vae_scale_factor
        )

    def _noised_latents(self, state: RequestState, image_latents, noise, timestep: torch.Tensor) -> torch.Tensor:
        """Flow matching: sigma * noise + (1 - sigma) * image, at the scheduler's current sigma."""
        return state.noise_scheduler.scale_noise(image_latents, timestep, noise)

    def _predicted_x0(self, state: RequestState, latents, prediction, output) -> torch.Tensor:
        index = state.extra.begin_index + state.step_index
        sigma = state.noise_scheduler.sigmas[index].to(latents.device, latents.dtype)
        return latents - sigma * prediction

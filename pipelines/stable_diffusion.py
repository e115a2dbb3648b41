"""Stable Diffusion 1.x / 2.x (`StableDiffusionPipeline`) as a step pipeline.

Reads top to bottom like `StableDiffusionPipeline.__call__`, cut at the step boundaries; the
shared half (per-request scheduler, CFG layout, scheduler step, previews) is in
pipelines/diffusers_step.py:

    texts            encode_prompt (CLIP) through the prompt cache; with CFG the negative
                     prompt too ("" when none, as __call__)
    timesteps        the request's OWN scheduler, picked by name (GenerationParams.scheduler)
    latents          noise from the request's own generator x the scheduler's init_noise_sigma;
                     from an init image as StableDiffusionImg2ImgPipeline: the image's VAE
                     latents (a sample from the same generator), noised with `add_noise` to
                     the first timestep that runs (`int(steps * strength)` of them)
    mask             as StableDiffusionInpaintPipeline with a 4-channel UNet: after every step
                     the unmasked latents go back to the image's, noised to the next timestep
                     (the blend is in the shared base)
    forward          ONE UNet forward for every row of the CFG layout, each row's latents
                     scaled by its own scheduler
    post_decode      VAE decode, postprocess to PIL

A request's image equals `StableDiffusionPipeline.__call__` with the same seed and settings
(see tests/test_stable_diffusion_pipeline.py), and from an image the img2img / inpaint
pipeline's (tests/test_img2img_sd.py). Differences from `__call__`, on purpose:
- The safety checker is not loaded (it is a separate model a local checkpoint often lacks,
  and offline it can't be fetched); images are returned as decoded, like `safety_checker=None`.
- `guidance_rescale`, `clip_skip`, IP-adapters and `denoising_end` are not offered.
- Inpainting blends the latents of a text-to-image UNet (4 input channels); the 9-channel
  inpainting UNets (mask and masked image as extra input channels) are not offered.

`pipelines/sdxl.py` extends this class for SDXL (pooled embeddings and added time ids).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import torch
from diffusers import (
    DDIMScheduler,
    DPMSolverMultistepScheduler,
    EulerAncestralDiscreteScheduler,
    EulerDiscreteScheduler,
    PNDMScheduler,
    StableDiffusionPipeline,
    UniPCMultistepScheduler,
)
from diffusers.image_processor import VaeImageProcessor
from diffusers.utils.torch_utils import randn_tensor

from pipelines.cfg import Row
from pipelines.diffusers_step import DiffusersStepPipeline, RequestExtra
from pipelines.errors import ParamError
from pipelines.interface import RequestState
from pipelines.latent_preview import (
    LatentRgbProjection,
    projection_for,
    published_projection,
)
from pipelines.params import GenerationParams
from pipelines.prompt_cache import split_rows
from pipelines.studio_config import StudioConfig
from pipelines.validation import check_scheduler_name

# Noise schedulers a request may pick by name: diffusers class + config overrides.
# Each is built with `from_config(checkpoint scheduler config)`, so the checkpoint's
# noise schedule (betas, prediction type, timestep spacing) carries over.
NOISE_SCHEDULERS: dict[str, tuple[type, dict[str, Any]]] = {
    "euler": (EulerDiscreteScheduler, {}),
    "euler-a": (EulerAncestralDiscreteScheduler, {}),
    "dpm++2m": (DPMSolverMultistepScheduler, {"algorithm_type": "dpmsolver++", "solver_order": 2}),
    "dpm++2m-karras": (
        DPMSolverMultistepScheduler,
        {"algorithm_type": "dpmsolver++", "solver_order": 2, "use_karras_sigmas": True},
    ),
    "unipc": (UniPCMultistepScheduler, {}),
    "ddim": (DDIMScheduler, {}),
    "pndm": (PNDMScheduler, {}),
}

# Latent -> RGB for previews of the predicted x0, for the SD 1.x/2.x 4-channel latent space
# (the factors ComfyUI and others publish): rgb in [-1, 1] = latent @ FACTORS + BIAS.
SD_LATENT_RGB_FACTORS = (
    (0.3512, 0.2297, 0.3227),
    (0.3250, 0.4974, 0.2350),
    (-0.2829, 0.1762, 0.2721),
    (-0.2120, -0.2616, -0.7177),
)
SD_LATENT_RGB_BIAS = (0.0, 0.0, 0.0)


@dataclass(frozen=True)
class UNetBatchKey:
    """Rows share a UNet forward only with the same latent shape. Guidance scale, CFG,
    steps, seed, prompt and noise scheduler are per row."""

    width: int
    height: int


@dataclass
class UNetRequestExtra(RequestExtra):
    # The guidance embedding of guidance-distilled UNets (which never run CFG rows).
    timestep_cond: torch.Tensor | None = None
    time_ids: torch.Tensor | None = None  # SDXL's added time ids, for both of a request's rows


def _scheduler_name_of(scheduler) -> str:
    """Our name for a checkpoint's own scheduler (e.g. SD 1.5's PNDM is "pndm"), else its class."""
    for name, (scheduler_class, overrides) in NOISE_SCHEDULERS.items():
        if type(scheduler) is scheduler_class and not overrides:
            return name
    return type(scheduler).__name__


class StableDiffusionStepPipeline(DiffusersStepPipeline):
    """Stable Diffusion 1.x / 2.x driven one co-batched denoise step at a time."""

    family = "stable-diffusion"
    label = "Stable Diffusion"
    diffusers_class = StableDiffusionPipeline
    image_inputs = ("init_image", "mask_image")
    default_guidance_scale = 7.5
    default_strength = 0.8  # StableDiffusionImg2ImgPipeline's
    latent_rgb_factors = SD_LATENT_RGB_FACTORS
    latent_rgb_bias = SD_LATENT_RGB_BIAS

    def __init__(self, pipe, device, name, studio: StudioConfig | None = None, scheduler: str | None = None) -> None:
        super().__init__(pipe, device, name, studio, scheduler)
        self.unet = self.denoiser
        self.vae_scale_factor = pipe.vae_scale_factor
        # Pristine templates: requests get deep copies, never these objects themselves.
        self._scheduler_templates = {
            name: scheduler_class.from_config(pipe.scheduler.config, **overrides)
            for name, (scheduler_class, overrides) in NOISE_SCHEDULERS.items()
        }
        sample_size = self.unet.config.sample_size
        if not isinstance(sample_size, int):
            sample_size = sample_size[0]
        size = sample_size * self.vae_scale_factor
        self.preview_projection = self._preview_projection()
        # The inpaint pipelines' mask: grayscale, binarized at 0.5, not normalized to -1..1.
        self.mask_processor = VaeImageProcessor(
            vae_scale_factor=self.vae_scale_factor, do_normalize=False, do_binarize=True, do_convert_grayscale=True
        )
        defaults = self.studio.model_defaults(size, size, num_inference_steps=30,
                                              guidance_scale=self.default_guidance_scale)
        self.info = self._pipeline_info(
            replace(defaults, strength=self.default_strength), size_multiple=self.vae_scale_factor
        )
        # The checkpoint's own scheduler by our name when it has one (SD 1.5's PNDM is "pndm").
        self.info.extras["default_scheduler"] = scheduler or _scheduler_name_of(pipe.scheduler)

    @classmethod
    def _load_kwargs(cls, path: Path, dtype: torch.dtype) -> dict[str, Any]:
        return {"safety_checker": None, "requires_safety_checker": False}

    def _denoiser(self, pipe) -> torch.nn.Module:
        return pipe.unet

    def _offered_schedulers(self, checkpoint_scheduler) -> tuple[str, ...]:
        return tuple(NOISE_SCHEDULERS)

    def batch_key(self, params: GenerationParams) -> UNetBatchKey:
        return UNetBatchKey(params.width, params.height)

    def validate(self, params: GenerationParams) -> None:
        super().validate(params)
        steps, strength = params.num_inference_steps, params.strength
        if params.init_image is not None and strength is not None and steps is not None \
                and self._start_step(params) >= steps:
            raise ParamError(
                "strength",
                f"strength={strength} with num_inference_steps={steps} runs no denoise step: "
                f"{self.label} runs int(steps x strength) steps; raise the strength or the steps.",
            )

    # ---------------------------------------------------------------- texts
    def _uses_cfg(self, params: GenerationParams) -> bool:
        # As diffusers' do_classifier_free_guidance: guidance-distilled UNets take the
        # scale as an embedding instead of a second, unconditional row.
        return params.guidance_scale > 1 and self.unet.config.time_cond_proj_dim is None

    @torch.no_grad()
    def _encode_texts(self, texts: list[str]) -> list[torch.Tensor]:
        """Each text as a prompt: diffusers encodes a negative prompt the same way."""
        prompt_embeds, _ = self.pipe.encode_prompt(
            prompt=texts, device=self.device, num_images_per_prompt=1, do_classifier_free_guidance=False
        )
        return [embeds for (embeds,) in split_rows(len(texts), prompt_embeds)]

    # ---------------------------------------------------------------- timesteps and latents
    def _scheduler_template(self, params: GenerationParams):
        name = params.scheduler or self.default_scheduler
        if name is None:
            return self._checkpoint_scheduler
        check_scheduler_name("scheduler", name, self.schedulers)
        return self._scheduler_templates[name]

    def _set_timesteps(self, scheduler, params: GenerationParams) -> torch.Tensor:
        scheduler.set_timesteps(params.num_inference_steps, device=self.device)
        return scheduler.timesteps

    def _request_extra(self, state: RequestState) -> UNetRequestExtra:
        return UNetRequestExtra(timestep_cond=self._timestep_cond(state.params.guidance_scale))

    def _initial_latents(self, state: RequestState) -> torch.Tensor:
        return self._noise(state) * state.noise_scheduler.init_noise_sigma  # read after set_timesteps

    def _noise(self, state: RequestState) -> torch.Tensor:
        params = state.params
        shape = (1, self.unet.config.in_channels, params.height // self.vae_scale_factor,
                 params.width // self.vae_scale_factor)
        return randn_tensor(shape, generator=state.generator, device=self.device, dtype=self._latents_dtype(state))

    def _latents_dtype(self, state: RequestState) -> torch.dtype:
        return self._embeds_of(state.conditioning.positive).dtype  # __call__'s prompt_embeds.dtype

    # ---------------------------------------------------------------- from an init image
    def _start_step(self, params: GenerationParams) -> int:
        """StableDiffusion(XL)Img2ImgPipeline's get_timesteps: int() BEFORE the subtraction, so
        int(steps * strength) steps run (4 steps at 0.6: 2; FLUX and SD3 would run 3)."""
        steps = params.num_inference_steps
        return max(steps - min(int(steps * params.strength), steps), 0)

    def _image_latents(self, state: RequestState, encoding) -> torch.Tensor:
        """prepare_latents' VAE encoding: a sample from the request's generator, scaled."""
        latents = self.vae.config.scaling_factor * encoding.sample(generator=state.generator)
        return latents.to(self.device, self._latents_dtype(state))

    def _noised_latents(self, state: RequestState, image_latents, noise, timestep: torch.Tensor) -> torch.Tensor:
        params = state.params
        if state.step_index == 0 and params.mask_image is not None and params.strength == 1.0:
            # StableDiffusion(XL)InpaintPipeline at full strength starts from pure noise, as
            # text-to-image does; its blends after each step still noise the image.
            return noise * state.noise_scheduler.init_noise_sigma
        return super()._noised_latents(state, image_latents, noise, timestep)

    def _mask_latents(self, state: RequestState) -> torch.Tensor:
        """prepare_mask_latents: the binarized mask, nearest-resized to the latent grid."""
        params = state.params
        height, width = params.height // self.vae_scale_factor, params.width // self.vae_scale_factor
        mask = self.mask_processor.preprocess(params.mask_image, height=params.height, width=params.width)
        mask = torch.nn.functional.interpolate(mask, size=(height, width))
        # The inpaint pipeline also VAE-encodes the masked image with the request's generator
        # (a 4-channel UNet never reads it): draw that sample's noise so that a stochastic
        # scheduler's steps get the same random numbers as in __call__.
        randn_tensor((1, self.vae.config.latent_channels, height, width), generator=state.generator,
                     device=self.device, dtype=self.vae.dtype)
        return mask.to(self.device, self._latents_dtype(state))

    # ---------------------------------------------------------------- forward
    def _forward(self, denoiser: torch.nn.Module, rows: Sequence[Row]) -> torch.Tensor:
        states = [row.state for row in rows]
        extras = [state.extra for state in states]
        return denoiser(
            torch.cat([s.noise_scheduler.scale_model_input(s.latents, s.current_timestep) for s in states]),
            # float32: requests with different schedulers have int or float timesteps
            torch.stack([s.current_timestep.to(self.device, torch.float32) for s in states]),
            encoder_hidden_states=torch.cat([self._embeds_of(row.text) for row in rows]),
            timestep_cond=None if extras[0].timestep_cond is None else torch.cat([e.timestep_cond for e in extras]),
            added_cond_kwargs=self._added_cond_kwargs(rows),
            return_dict=False,
        )[0]

    def _embeds_of(self, text) -> torch.Tensor:
        """The UNet's encoder_hidden_states in a text row."""
        return text

    def _added_cond_kwargs(self, rows: Sequence[Row]) -> dict[str, torch.Tensor] | None:
        return None

    # ---------------------------------------------------------------- x0, decode and preview
    def _predicted_x0(self, state: RequestState, latents, prediction, output) -> torch.Tensor | None:
        predicted_x0 = getattr(output, "pred_original_sample", None)
        if predicted_x0 is None:  # DPM++, UniPC and PNDM work in alpha space
            predicted_x0 = self._x0_from_alphas(state.noise_scheduler, state.current_timestep, latents, prediction)
        return predicted_x0

    def _vae_latents(self, state: RequestState) -> torch.Tensor:
        return state.latents / self.vae.config.scaling_factor

    def _preview_projection(self) -> LatentRgbProjection:
        """The family's published factors for its 4-channel latents, unless the model folder's
        stepstudio.json gives its own (or the VAE is unusual: then a fitted map)."""
        if self.studio.preview_rgb_factors is None and self.vae.config.latent_channels == len(self.latent_rgb_factors):
            return published_projection(self.latent_rgb_factors, self.latent_rgb_bias, f"{self.family}-vae")
        return projection_for(self.vae, self.studio, self.vae_scale_factor)

    # ---------------------------------------------------------------- helpers
    def _timestep_cond(self, guidance_scale: float) -> torch.Tensor | None:
        if self.unet.config.time_cond_proj_dim is None:
            return None
        scale = torch.tensor(guidance_scale - 1).repeat(1)
        embedding = self.pipe.get_guidance_scale_embedding(w=scale, embedding_dim=self.unet.config.time_cond_proj_dim)
        return embedding.to(device=self.device, dtype=self.unet.dtype)  # prompt_embeds' dtype in __call__

    @staticmethod
    def _x0_from_alphas(scheduler, timestep, latents: torch.Tensor, prediction: torch.Tensor) -> torch.Tensor | None:
        """x0 for schedulers whose step output lacks it."""
        alphas_cumprod = getattr(scheduler, "alphas_cumprod", None)
        if alphas_cumprod is None:
            return None
        index = min(max(int(round(float(timestep))), 0), len(alphas_cumprod) - 1)
        alpha = alphas_cumprod[index].to(latents.device, torch.float32)
        x, pred = latents.float(), prediction.float()
        kind = scheduler.config.prediction_type
        if kind == "epsilon":
            x0 = (x - (1 - alpha).sqrt() * pred) / alpha.sqrt()
        elif kind == "v_prediction":
            x0 = alpha.sqrt() * x - (1 - alpha).sqrt() * pred
        else:  # "sample"
            x0 = pred
        return x0.to(latents.dtype)

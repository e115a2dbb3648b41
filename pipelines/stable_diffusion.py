"""Stable Diffusion 1.x / 2.x (`StableDiffusionPipeline`) as a step pipeline.

The diffusers pipeline is loaded as usual and its pieces are reused (`encode_prompt`,
`image_processor`, `vae`, `unet`); only the denoise loop is ours, so that every request
advances one step at a time with its OWN noise scheduler and generator and many requests
share one UNet forward. A request's image equals `StableDiffusionPipeline.__call__` with the
same seed and settings (see tests/test_stable_diffusion_pipeline.py).

Differences from `__call__`, on purpose:
- The safety checker is not loaded (it is a separate model a local checkpoint often lacks,
  and offline it can't be fetched); images are returned as decoded, like `safety_checker=None`.
- `guidance_rescale`, `clip_skip`, IP-adapters and `denoising_end` are not offered.

`pipelines/sdxl.py` extends this class for SDXL (pooled embeddings and added time ids).
"""

from __future__ import annotations

import copy
import functools
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
from diffusers.utils.torch_utils import randn_tensor
from PIL import Image

from pipelines.attention import select_attention_backend
from pipelines.interface import Batch, PipelineInfo, RequestState
from pipelines.latent_preview import LatentRgbProjection, projection_for
from pipelines.loader import LoadOptions, load_diffusers_pipeline
from pipelines.params import GenerationParams
from pipelines.prompt_cache import BatchedPromptEncoder, PromptEmbeddingCache, split_rows
from pipelines.validation import check_image_params, check_scheduler_name
from pipelines.studio_config import StudioConfig, read_studio_config

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
    """Rows share a UNet forward only with the same latent shape and the same CFG layout.
    Guidance scale, steps, seed, prompt and noise scheduler are per row."""

    width: int
    height: int
    classifier_free_guidance: bool


@dataclass
class UNetConditioning:
    """What prepare_encode computes once per request; every tensor has a batch dim of 1."""

    prompt_embeds: torch.Tensor
    negative_prompt_embeds: torch.Tensor | None  # set when CFG is on
    guidance_scale: float
    timestep_cond: torch.Tensor | None = None  # guidance embedding of guidance-distilled UNets
    # SDXL only: pooled text embeddings and added time ids, for the cond and uncond rows.
    text_embeds: torch.Tensor | None = None
    negative_text_embeds: torch.Tensor | None = None
    time_ids: torch.Tensor | None = None
    negative_time_ids: torch.Tensor | None = None


@dataclass
class UNetRequestExtra:
    predicted_x0: torch.Tensor | None = None  # after the last step, for previews only


@functools.lru_cache(maxsize=None)
def _step_accepts(scheduler_class: type) -> tuple[bool, bool]:
    """(accepts eta, accepts generator): not every scheduler's step takes them."""
    names = set(inspect.signature(scheduler_class.step).parameters)
    return "eta" in names, "generator" in names


def _scheduler_name_of(scheduler) -> str:
    """Our name for a checkpoint's own scheduler (e.g. SD 1.5's PNDM is "pndm"), else its class."""
    for name, (scheduler_class, overrides) in NOISE_SCHEDULERS.items():
        if type(scheduler) is scheduler_class and not overrides:
            return name
    return type(scheduler).__name__


class StableDiffusionStepPipeline(BatchedPromptEncoder):
    """Stable Diffusion 1.x / 2.x driven one co-batched denoise step at a time."""

    family = "stable-diffusion"
    default_guidance_scale = 7.5
    latent_rgb_factors = SD_LATENT_RGB_FACTORS
    latent_rgb_bias = SD_LATENT_RGB_BIAS
    # StableDiffusionXLPipeline pins the scheduler's begin index to 0; the SD 1.x one doesn't.
    sets_scheduler_begin_index = False

    def __init__(
        self,
        pipe,
        name: str,
        device: torch.device,
        default_scheduler: str | None = None,
        studio: StudioConfig | None = None,
    ) -> None:
        self.pipe = pipe
        self.unet = pipe.unet
        self.vae = pipe.vae
        self.device = device
        self.vae_scale_factor = pipe.vae_scale_factor
        if default_scheduler is not None:
            check_scheduler_name("scheduler", default_scheduler, tuple(NOISE_SCHEDULERS))
        self.default_scheduler = default_scheduler
        # Pristine templates: requests get deep copies, never these objects themselves.
        self._checkpoint_scheduler = copy.deepcopy(pipe.scheduler)
        self.prompt_cache = PromptEmbeddingCache(self._encode_texts)
        self.attention_backend = select_attention_backend(self.unet, device, self.unet.dtype)
        self._scheduler_templates = {
            name: scheduler_class.from_config(pipe.scheduler.config, **overrides)
            for name, (scheduler_class, overrides) in NOISE_SCHEDULERS.items()
        }
        sample_size = self.unet.config.sample_size
        if not isinstance(sample_size, int):
            sample_size = sample_size[0]
        size = sample_size * self.vae_scale_factor
        studio = studio or StudioConfig()
        self.preview_projection = self._preview_projection(studio)
        self.info = PipelineInfo(
            name=name,
            family=self.family,
            output_kind="image",
            defaults=studio.model_defaults(size, num_inference_steps=30, guidance_scale=self.default_guidance_scale),
            uses_negative_prompt=True,
            size_multiple=self.vae_scale_factor,
            schedulers=tuple(NOISE_SCHEDULERS),
            extras={
                "default_scheduler": default_scheduler or _scheduler_name_of(pipe.scheduler),
                "preview": self.preview_projection.source,
                "attention": self.attention_backend,
            },
        )

    @classmethod
    def from_pretrained(cls, path: str | Path, options: LoadOptions) -> "StableDiffusionStepPipeline":
        pipe, device = load_diffusers_pipeline(
            StableDiffusionPipeline, Path(path), options, "Stable Diffusion", safety_checker=None,
            requires_safety_checker=False,
        )
        return cls(pipe, Path(path).name, device, options.scheduler, read_studio_config(Path(path)))

    # ---------------------------------------------------------------- protocol
    def validate(self, params: GenerationParams) -> None:
        check_image_params(params, self.info.name, self.vae_scale_factor, tuple(NOISE_SCHEDULERS))

    def batch_key(self, params: GenerationParams) -> UNetBatchKey:
        return UNetBatchKey(params.width, params.height, self._uses_cfg(params.guidance_scale))

    @torch.no_grad()
    def prepare_encode(self, state: RequestState) -> None:
        params = state.params
        cfg = self._uses_cfg(params.guidance_scale)
        state.conditioning = self._encode_conditioning(params, cfg)

        scheduler = copy.deepcopy(self._scheduler_template(params.scheduler))
        scheduler.set_timesteps(params.num_inference_steps, device=self.device)
        if self.sets_scheduler_begin_index and hasattr(scheduler, "set_begin_index"):
            scheduler.set_begin_index(0)
        state.noise_scheduler = scheduler
        state.timesteps = scheduler.timesteps
        state.step_index = 0

        # The same generator then drives the stochastic schedulers' noise, as in __call__.
        state.generator = torch.Generator(device=self.device).manual_seed(params.seed)
        shape = (
            1,
            self.unet.config.in_channels,
            params.height // self.vae_scale_factor,
            params.width // self.vae_scale_factor,
        )
        noise = randn_tensor(
            shape, generator=state.generator, device=self.device, dtype=state.conditioning.prompt_embeds.dtype
        )
        state.latents = noise * scheduler.init_noise_sigma  # read after set_timesteps
        state.extra = UNetRequestExtra()

    @torch.no_grad()
    def denoise_step(self, batch: Batch) -> list[torch.Tensor]:
        states = batch.states
        cfg = states[0].conditioning.negative_prompt_embeds is not None  # equal for all: batch key
        conds = [s.conditioning for s in states]
        latent_input = torch.cat([s.noise_scheduler.scale_model_input(s.latents, s.current_timestep) for s in states])
        timesteps = torch.stack([s.current_timestep.to(self.device, torch.float32) for s in states])
        text = torch.cat([c.prompt_embeds for c in conds])
        added = self._added_cond_kwargs(conds, cfg)
        timestep_cond = None
        if conds[0].timestep_cond is not None:
            timestep_cond = torch.cat([c.timestep_cond for c in conds])
        if cfg:
            # All unconditional rows first, then all conditional rows: for one request this
            # is exactly __call__'s torch.cat([negative, positive]).
            latent_input = torch.cat([latent_input, latent_input])
            timesteps = torch.cat([timesteps, timesteps])
            text = torch.cat([torch.cat([c.negative_prompt_embeds for c in conds]), text])

        noise_pred = self.unet(
            latent_input,
            timesteps,
            encoder_hidden_states=text,
            timestep_cond=timestep_cond,
            added_cond_kwargs=added,
            return_dict=False,
        )[0]

        if not cfg:
            return list(noise_pred.split(1))
        uncond, cond = noise_pred.chunk(2)
        return [
            u + c.guidance_scale * (t - u)  # a Python float per row, as __call__ does
            for u, t, c in zip(uncond.split(1), cond.split(1), conds)
        ]

    @torch.no_grad()
    def step_scheduler(self, state: RequestState, prediction: torch.Tensor) -> None:
        scheduler = state.noise_scheduler
        timestep = state.current_timestep
        accepts_eta, accepts_generator = _step_accepts(type(scheduler))
        kwargs: dict[str, Any] = {}
        if accepts_eta:
            kwargs["eta"] = 0.0
        if accepts_generator:
            kwargs["generator"] = state.generator
        output = scheduler.step(prediction, timestep, state.latents, **kwargs)
        if state.params.preview_every:
            predicted_x0 = getattr(output, "pred_original_sample", None)
            if predicted_x0 is None:
                predicted_x0 = self._x0_from_alphas(scheduler, timestep, state.latents, prediction)
            state.extra.predicted_x0 = predicted_x0
        state.latents = output.prev_sample
        state.step_index += 1

    @torch.no_grad()
    def post_decode(self, state: RequestState) -> list[Image.Image]:
        latents = state.latents / self.vae.config.scaling_factor
        image = self.vae.decode(latents, return_dict=False, generator=state.generator)[0]
        return self.pipe.image_processor.postprocess(image, output_type="pil", do_denormalize=[True])

    @torch.no_grad()
    def preview(self, state: RequestState) -> Image.Image | None:
        x0 = state.extra.predicted_x0 if state.extra is not None else None
        if x0 is None:
            return None
        return self.preview_projection.render(x0)

    # ---------------------------------------------------------------- model-specific pieces
    def _encode_conditioning(self, params: GenerationParams, cfg: bool) -> UNetConditioning:
        (prompt_embeds,), *negative = self.prompt_cache.encode_many(self._texts(params))
        return UNetConditioning(
            prompt_embeds=prompt_embeds,
            negative_prompt_embeds=negative[0][0] if cfg else None,
            guidance_scale=float(params.guidance_scale),
            timestep_cond=self._timestep_cond(params.guidance_scale, prompt_embeds.dtype),
        )

    def _texts(self, params: GenerationParams) -> list[str]:
        """The prompt, and with CFG the text of the unconditional row (if one is encoded)."""
        negative = self._negative_text(params)
        if self._uses_cfg(params.guidance_scale) and negative is not None:
            return [params.prompt, negative]
        return [params.prompt]

    def _negative_text(self, params: GenerationParams) -> str | None:
        return params.negative_prompt or ""  # __call__ encodes "" when there is no negative prompt

    @torch.no_grad()
    def _encode_texts(self, texts: list[str]) -> list[tuple[torch.Tensor, ...]]:
        """encode_prompt for several texts at once (each as a prompt: diffusers encodes a
        negative prompt the same way), split back into one entry per text."""
        prompt_embeds, _ = self.pipe.encode_prompt(texts, self.device, 1, False)
        return split_rows(len(texts), prompt_embeds)

    def _added_cond_kwargs(self, conds: list[UNetConditioning], cfg: bool) -> dict[str, torch.Tensor] | None:
        return None

    # ---------------------------------------------------------------- helpers
    def _preview_projection(self, studio: StudioConfig) -> LatentRgbProjection:
        """The family's published factors for its 4-channel latents, unless the model folder's
        stepstudio.json gives its own (or the VAE is unusual: then a fitted map)."""
        if studio.preview_rgb_factors is None and self.vae.config.latent_channels == len(self.latent_rgb_factors):
            factors = torch.tensor(self.latent_rgb_factors) / 2.0  # [-1, 1] -> [0, 1]
            bias = (torch.tensor(self.latent_rgb_bias) + 1.0) / 2.0
            return LatentRgbProjection(factors, bias, f"{self.family}-vae")
        return projection_for(self.vae, studio, self.vae_scale_factor)

    def _uses_cfg(self, guidance_scale: float) -> bool:
        # As diffusers' do_classifier_free_guidance: guidance-distilled UNets take the
        # scale as an embedding instead of a second, unconditional row.
        return guidance_scale > 1 and self.unet.config.time_cond_proj_dim is None

    def _timestep_cond(self, guidance_scale: float, dtype: torch.dtype) -> torch.Tensor | None:
        if self.unet.config.time_cond_proj_dim is None:
            return None
        scale = torch.tensor(guidance_scale - 1).repeat(1)
        embedding = self.pipe.get_guidance_scale_embedding(scale, embedding_dim=self.unet.config.time_cond_proj_dim)
        return embedding.to(device=self.device, dtype=dtype)

    def _scheduler_template(self, name: str | None):
        name = name or self.default_scheduler
        if name is None:
            return self._checkpoint_scheduler
        check_scheduler_name("scheduler", name, tuple(NOISE_SCHEDULERS))
        return self._scheduler_templates[name]

    @staticmethod
    def _x0_from_alphas(scheduler, timestep, latents: torch.Tensor, prediction: torch.Tensor) -> torch.Tensor | None:
        """x0 for schedulers whose step output lacks it (DPM++, UniPC, PNDM work in alpha space)."""
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

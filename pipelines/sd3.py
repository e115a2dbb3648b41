"""Stable Diffusion 3 / 3.5 as a step pipeline: diffusers' StableDiffusion3Pipeline pieces, our own step loop.

Reads top to bottom like `StableDiffusion3Pipeline.__call__`, cut at the step boundaries; the
shared half is in pipelines/diffusers_step.py and pipelines/flow_match.py:

    texts            encode_prompt: two CLIPs + T5 joint text, and the negative prompt for CFG,
                     through the prompt cache
    timesteps        the checkpoint's shift (and this image size's `mu` if it shifts dynamically)
    latents          prepare_latents from the request's own generator; from an init image as
                     StableDiffusion3Img2ImgPipeline, with a mask as StableDiffusion3InpaintPipeline
                     (a 16-channel transformer: the blend after each step is in the shared base)
    forward          ONE joint-transformer forward for every row of the CFG layout
    post_decode      un-normalize, VAE decode, postprocess to PIL

CFG is on when guidance_scale > 1 (SD3's rule); a missing negative prompt is "" as in
diffusers. Rows carry their own timestep and guidance scale, and the text length is fixed
(CLIP length + max_sequence_length T5 tokens). A forward whose rows differ in size runs packed
(pipelines/sd3_packed.py), so the batch key holds no size; where packing can't keep rows apart
(another attention backend or processor) the key is the image size (and that length).
Skip-layer guidance (SD3.5 medium's optional extra forward) is not offered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch
from diffusers import StableDiffusion3Pipeline
from diffusers.image_processor import VaeImageProcessor

from pipelines import sd3_packed
from pipelines.cfg import Row
from pipelines.diffusers_step import text_length
from pipelines.flow_match import FlowMatchStepPipeline
from pipelines.interface import RequestState
from pipelines.latent_preview import projection_for
from pipelines.params import GenerationParams
from pipelines.prompt_cache import split_rows
from pipelines.studio_config import StudioConfig

MAX_SEQUENCE_LENGTH = 512  # StableDiffusion3Pipeline's limit for the T5 prompt
DEFAULT_SEQUENCE_LENGTH = 256  # StableDiffusion3Pipeline's default


@dataclass(frozen=True)
class SD3BatchKey:
    height: int | None  # None (with width): any size, rows of different sizes run packed
    width: int | None
    max_sequence_length: int


class SD3Text(NamedTuple):
    embeds: torch.Tensor  # [1, CLIP length + max_sequence_length, joint_attention_dim]
    pooled: torch.Tensor  # [1, pooled_projection_dim]


class SD3StepPipeline(FlowMatchStepPipeline):
    """A Stable Diffusion 3 checkpoint driven one denoise step at a time (see the module docstring)."""

    family = "sd3"
    label = "Stable Diffusion 3"
    diffusers_class = StableDiffusion3Pipeline
    packed_model = sd3_packed.SD3
    image_inputs = ("init_image", "mask_image")

    def __init__(self, pipe, device, name, studio: StudioConfig | None = None, scheduler: str | None = None) -> None:
        super().__init__(pipe, device, name, studio, scheduler)
        self.vae_scale_factor = pipe.vae_scale_factor
        self.patch_size = pipe.patch_size
        self.max_sequence_length = text_length(self.studio, DEFAULT_SEQUENCE_LENGTH, MAX_SEQUENCE_LENGTH, self.label)
        self.preview_projection = projection_for(self.vae, self.studio, self.vae_scale_factor)
        # StableDiffusion3InpaintPipeline's: the mask binarized at 0.5.
        self.mask_processor = VaeImageProcessor(
            vae_scale_factor=self.vae_scale_factor, vae_latent_channels=self.vae.config.latent_channels,
            do_normalize=False, do_binarize=True, do_convert_grayscale=True,
        )
        size = pipe.default_sample_size * self.vae_scale_factor
        self.info = self._pipeline_info(
            # StableDiffusion3Pipeline's own defaults: 1024^2 for SD3, 28 steps, guidance 7.
            self.studio.model_defaults(size, size, num_inference_steps=28, guidance_scale=7.0),
            size_multiple=self.vae_scale_factor * self.patch_size,
            guidance="CFG when guidance_scale > 1 (negative prompt rows share the forward)",
            max_sequence_length=str(self.max_sequence_length),
            shift=str(pipe.scheduler.config.get("shift")),
        )

    def batch_key(self, params: GenerationParams) -> SD3BatchKey:
        if self.packs:
            return SD3BatchKey(height=None, width=None, max_sequence_length=self.max_sequence_length)
        return SD3BatchKey(height=params.height, width=params.width, max_sequence_length=self.max_sequence_length)

    def _packable(self, denoiser: torch.nn.Module) -> bool:
        return sd3_packed.packs(denoiser)

    def _row_shape(self, row: Row) -> tuple:
        return tuple(row.state.latents.shape), tuple(row.text.embeds.shape)

    def _packed_row(self, row: Row) -> sd3_packed.SD3Row:
        return sd3_packed.SD3Row(latents=row.state.latents, timestep=row.state.current_timestep,
                                 embeds=row.text.embeds, pooled=row.text.pooled)

    # ------------------------------------------------------------------ texts
    def _uses_cfg(self, params: GenerationParams) -> bool:
        return params.guidance_scale > 1.0

    @torch.no_grad()
    def _encode_texts(self, texts: list[str]) -> list[SD3Text]:
        """Each text as a prompt: diffusers encodes a negative prompt the same way."""
        prompt_embeds, _, pooled, _ = self.pipe.encode_prompt(
            prompt=texts,
            prompt_2=None,
            prompt_3=None,
            device=self.device,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
        )
        return [SD3Text(*row) for row in split_rows(len(texts), prompt_embeds, pooled)]

    # ------------------------------------------------------------------ timesteps and latents
    def _set_timesteps(self, scheduler, params: GenerationParams) -> torch.Tensor:
        mu = None
        if scheduler.config.get("use_dynamic_shifting", None):
            patch = self.vae_scale_factor * self.patch_size
            mu = self._image_shift(scheduler, (params.height // patch) * (params.width // patch))
        scheduler.set_timesteps(params.num_inference_steps, device=self.device, **({} if mu is None else {"mu": mu}))
        return scheduler.timesteps

    def _initial_latents(self, state: RequestState) -> torch.Tensor:
        return self._stock_latents(state, self.denoiser.config.in_channels, state.conditioning.positive.embeds.dtype)

    # ------------------------------------------------------------------ from an init image
    def _image_latents(self, state: RequestState, encoding) -> torch.Tensor:
        """StableDiffusion3Img2ImgPipeline's prepare_latents: a sample from the request's generator."""
        latents = encoding.sample(generator=state.generator)
        latents = (latents - self.vae.config.shift_factor) * self.vae.config.scaling_factor
        return latents.to(self.device, state.conditioning.positive.embeds.dtype)

    def _mask_latents(self, state: RequestState) -> torch.Tensor:
        """StableDiffusion3InpaintPipeline's prepare_mask_latents: nearest to the latent grid."""
        params = state.params
        mask = self.mask_processor.preprocess(params.mask_image, height=params.height, width=params.width)
        size = (params.height // self.vae_scale_factor, params.width // self.vae_scale_factor)
        return torch.nn.functional.interpolate(mask, size=size).to(self.device, state.conditioning.positive.embeds.dtype)

    # ------------------------------------------------------------------ forward
    def _forward(self, denoiser: torch.nn.Module, rows: Sequence[Row]) -> torch.Tensor:
        return denoiser(
            hidden_states=torch.cat([row.state.latents for row in rows]),
            # per row, in the scheduler's 0..1000 scale as SD3 expects
            timestep=torch.stack([row.state.current_timestep for row in rows]),
            encoder_hidden_states=torch.cat([row.text.embeds for row in rows]),
            pooled_projections=torch.cat([row.text.pooled for row in rows]),
            return_dict=False,
        )[0]

    # ------------------------------------------------------------------ decode
    def _vae_latents(self, state: RequestState) -> torch.Tensor:
        return ((state.latents / self.vae.config.scaling_factor) + self.vae.config.shift_factor).to(self.vae.device)

"""FLUX.1 as a step pipeline: diffusers' FluxPipeline pieces, our own step loop.

Reads top to bottom like `FluxPipeline.__call__`, cut at the step boundaries; the shared
half (per-request scheduler, CFG layout, scheduler step, previews) is in
pipelines/diffusers_step.py and pipelines/flow_match.py:

    texts            encode_prompt (CLIP pooled + T5) through the prompt cache; the negative
                     prompt too for true CFG
    timesteps        sigmas 1 .. 1/steps, shifted by this image size's `mu`
    latents          prepare_latents from the request's own generator (packed 2x2); from an
                     init image as FluxImg2ImgPipeline (the image's VAE latents, sampled, then
                     noise), with a mask as FluxInpaintPipeline (the blend is in the shared base)
    forward          ONE transformer forward for every row of the CFG layout
    post_decode      unpack, un-normalize, VAE decode, postprocess to PIL

Guidance, with our one `guidance_scale` knob:
- guidance-distilled checkpoints (FLUX.1-dev style, `transformer.config.guidance_embeds`)
  get it as the embedded guidance of each row; there is no negative prompt.
- the others (FLUX.1-schnell style, and the built-in model) use it as FluxPipeline's
  `true_cfg_scale`: true CFG is on when it is > 1 and the request has a negative prompt.

Co-batching: Flux's `img_ids`/`txt_ids` are shared 2-D tensors, so diffusers' forward can't mix
resolutions or text lengths. A forward whose rows differ in size runs packed instead
(pipelines/flux_packed.py: the rows' tokens end to end, attention within each row), so the batch
key holds no size at all. Where packing can't keep rows apart (another attention backend, custom
or fused attention processors) the key is (height, width, max_sequence_length), as diffusers'
forward needs. Guidance scales and CFG are per row, so they are not in the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch
from diffusers import FluxPipeline
from diffusers.image_processor import VaeImageProcessor
from PIL import Image

from pipelines.cfg import Row
from pipelines.diffusers_step import RequestExtra, text_length
from pipelines.flow_match import FlowMatchStepPipeline
from pipelines.flux_packed import FLUX, FluxRow
from pipelines.interface import RequestState
from pipelines.latent_preview import projection_for
from pipelines.params import GenerationParams
from pipelines.prompt_cache import split_rows
from pipelines.step_cache import BlockStack
from pipelines.studio_config import StudioConfig

MAX_SEQUENCE_LENGTH = 512  # FluxPipeline's limit for the T5 prompt


@dataclass(frozen=True)
class FluxBatchKey:
    height: int | None  # None (with width): any size, rows of different sizes run packed
    width: int | None
    max_sequence_length: int


class FluxText(NamedTuple):
    embeds: torch.Tensor  # [1, max_sequence_length, joint_attention_dim] (T5)
    pooled: torch.Tensor  # [1, pooled_projection_dim] (CLIP)
    text_ids: torch.Tensor  # [max_sequence_length, 3], zeros


@dataclass
class FluxRequestExtra(RequestExtra):
    latent_image_ids: torch.Tensor | None = None  # [image tokens, 3], the same for every request of this size


def _modulated_input(block: torch.nn.Module, inputs: dict) -> torch.Tensor:
    """The first block's image tokens after its timestep modulation (AdaLayerNormZero), for TeaCache."""
    return block.norm1(inputs["hidden_states"], emb=inputs["temb"])[0]


class FluxStepPipeline(FlowMatchStepPipeline):
    """A FLUX.1 checkpoint driven one denoise step at a time (see the module docstring)."""

    family = "flux"
    label = "FLUX"
    diffusers_class = FluxPipeline
    image_inputs = ("init_image", "mask_image")
    # Step caching: the double-stream blocks, then the single-stream ones; each takes and returns
    # the text and image streams (FluxTransformer2DModel.forward).
    packed_model = FLUX
    block_stack = BlockStack(
        lists=("transformer_blocks", "single_transformer_blocks"),
        returns=("encoder_hidden_states", "hidden_states"),
        row_inputs=("hidden_states", "encoder_hidden_states", "temb"),
        modulated_input=_modulated_input,
    )

    def __init__(self, pipe, device, name, studio: StudioConfig | None = None, scheduler: str | None = None) -> None:
        super().__init__(pipe, device, name, studio, scheduler)
        self.vae_scale_factor = pipe.vae_scale_factor
        self.guidance_embeds = bool(self.denoiser.config.guidance_embeds)
        # FLUX.1-dev was trained with 512 T5 tokens, schnell with 256; never more than the tokenizer holds.
        default_length = MAX_SEQUENCE_LENGTH if self.guidance_embeds else 256
        tokenizer_limit = getattr(pipe.tokenizer_2, "model_max_length", None)
        if isinstance(tokenizer_limit, int) and 0 < tokenizer_limit < default_length:
            default_length = tokenizer_limit
        self.max_sequence_length = text_length(self.studio, default_length, MAX_SEQUENCE_LENGTH, self.label)
        self.preview_projection = projection_for(self.vae, self.studio, self.vae_scale_factor)
        # FluxInpaintPipeline's: the mask binarized at 0.5, on the packed grid.
        self.mask_processor = VaeImageProcessor(
            vae_scale_factor=self.vae_scale_factor * 2, vae_latent_channels=self.vae.config.latent_channels,
            do_normalize=False, do_binarize=True, do_convert_grayscale=True,
        )
        # Without stepstudio.json: FLUX.1-dev's recommended 28 steps at guidance 3.5; a schnell-style
        # model is distilled for 4 steps without CFG (guidance 0, as in diffusers' schnell example).
        size = pipe.default_sample_size * self.vae_scale_factor  # 1024 for FLUX.1
        defaults = self.studio.model_defaults(
            size, size, num_inference_steps=28 if self.guidance_embeds else 4,
            guidance_scale=3.5 if self.guidance_embeds else 0.0,
        )
        self.info = self._pipeline_info(
            defaults,
            size_multiple=self.vae_scale_factor * 2,  # latents are packed in 2x2 patches
            uses_negative_prompt=not self.guidance_embeds,
            guidance="embedded guidance (guidance-distilled)" if self.guidance_embeds
            else "true CFG when guidance_scale > 1 and a negative prompt is given",
            max_sequence_length=str(self.max_sequence_length),
        )

    def _packable(self, denoiser: torch.nn.Module) -> bool:
        attentions = [m for m in denoiser.modules() if hasattr(m, "processor")]
        return all(type(m.processor).__name__ == "FluxAttnProcessor" and not getattr(m, "fused_projections", False)
                   for m in attentions)

    def batch_key(self, params: GenerationParams) -> FluxBatchKey:
        if self.packs:
            return FluxBatchKey(height=None, width=None, max_sequence_length=self.max_sequence_length)
        return FluxBatchKey(height=params.height, width=params.width, max_sequence_length=self.max_sequence_length)

    # ------------------------------------------------------------------ texts
    def _uses_cfg(self, params: GenerationParams) -> bool:
        return not self.guidance_embeds and params.guidance_scale > 1.0 and params.negative_prompt is not None

    @torch.no_grad()
    def _encode_texts(self, texts: list[str]) -> list[FluxText]:
        prompt_embeds, pooled, text_ids = self.pipe.encode_prompt(
            prompt=texts, prompt_2=None, device=self.device, max_sequence_length=self.max_sequence_length
        )
        return [FluxText(embeds, pooled_row, text_ids) for embeds, pooled_row in split_rows(len(texts), prompt_embeds, pooled)]

    # ------------------------------------------------------------------ timesteps and latents
    def _set_timesteps(self, scheduler, params: GenerationParams) -> torch.Tensor:
        return self._shifted_timesteps(scheduler, params, self._packed_tokens(params))

    def _request_extra(self, state: RequestState) -> FluxRequestExtra:
        return FluxRequestExtra()

    def _initial_latents(self, state: RequestState) -> torch.Tensor:
        channels = self.denoiser.config.in_channels // 4  # before 2x2 packing
        latents, state.extra.latent_image_ids = self._stock_latents(
            state, channels, state.conditioning.positive.embeds.dtype
        )
        return latents

    # ------------------------------------------------------------------ from an init image
    def _image_latents(self, state: RequestState, encoding) -> torch.Tensor:
        """FluxImg2ImgPipeline's _encode_vae_image (a sample from the request's generator), packed."""
        latents = encoding.sample(generator=state.generator)
        latents = (latents - self.vae.config.shift_factor) * self.vae.config.scaling_factor
        return self._packed(latents.to(self.device, state.conditioning.positive.embeds.dtype))

    def _mask_latents(self, state: RequestState) -> torch.Tensor:
        """FluxInpaintPipeline's prepare_mask_latents: nearest to the latent grid, every channel, packed."""
        params = state.params
        mask = self.mask_processor.preprocess(params.mask_image, height=params.height, width=params.width)
        height, width = (2 * (side // (self.vae_scale_factor * 2)) for side in (params.height, params.width))
        mask = torch.nn.functional.interpolate(mask, size=(height, width))
        mask = mask.to(self.device, state.conditioning.positive.embeds.dtype)
        return self._packed(mask.repeat(1, self.denoiser.config.in_channels // 4, 1, 1))

    def _packed(self, latents: torch.Tensor) -> torch.Tensor:
        batch, channels, height, width = latents.shape
        return self.pipe._pack_latents(latents, batch, channels, height, width)

    # ------------------------------------------------------------------ forward
    def _forward(self, denoiser: torch.nn.Module, rows: Sequence[Row]) -> torch.Tensor:
        hidden_states = torch.cat([row.state.latents for row in rows])
        # Per-row timestep, cast like FluxPipeline (latents' dtype, then / 1000).
        timestep = torch.stack([row.state.current_timestep for row in rows]).to(hidden_states.device, hidden_states.dtype)
        guidance = None
        if self.guidance_embeds:
            scales = [row.state.conditioning.guidance_scale for row in rows]
            guidance = torch.tensor(scales, device=hidden_states.device, dtype=torch.float32)
        return denoiser(
            hidden_states=hidden_states,
            timestep=timestep / 1000,
            guidance=guidance,
            pooled_projections=torch.cat([row.text.pooled for row in rows]),
            encoder_hidden_states=torch.cat([row.text.embeds for row in rows]),
            txt_ids=rows[0].text.text_ids,  # equal for every row: the batch key fixes the text length
            img_ids=rows[0].state.extra.latent_image_ids,  # and the image size
            joint_attention_kwargs={},
            return_dict=False,
        )[0]

    def _row_shape(self, row: Row) -> tuple:
        # Packed latents ([1, tokens, C]) hide the grid: 64x96 and 96x64 have as many tokens but
        # not the same image ids, so they can't share one stacked forward's img_ids.
        params = row.state.params
        return tuple(row.state.latents.shape), tuple(row.text.embeds.shape), (params.height, params.width)

    def _packed_row(self, row: Row) -> FluxRow:
        state = row.state
        return FluxRow(latents=state.latents, timestep=state.current_timestep.to(state.latents.dtype) / 1000,
                       pooled=row.text.pooled, embeds=row.text.embeds, text_ids=row.text.text_ids,
                       image_ids=state.extra.latent_image_ids, guidance=row.state.conditioning.guidance_scale)

    # ------------------------------------------------------------------ decode and preview
    def _vae_latents(self, state: RequestState) -> torch.Tensor:
        latents = self._unpacked(state.latents, state.params)
        return ((latents / self.vae.config.scaling_factor) + self.vae.config.shift_factor).to(self.device)

    def _render_preview(self, x0: torch.Tensor, params: GenerationParams) -> Image.Image:
        """The predicted x0 on the latent grid (height / vae_scale_factor), linearly mapped to RGB."""
        return self.preview_projection.render(self._unpacked(x0, params)[0])

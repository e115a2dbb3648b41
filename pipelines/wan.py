"""Wan 2.1 / 2.2 text-to-video (`WanPipeline`) as a step pipeline: UMT5, `WanTransformer3DModel`,
`AutoencoderKLWan`.

Reads top to bottom like `WanPipeline.__call__`, cut at the step boundaries; the shared half
(per-request scheduler, CFG layout, scheduler step, previews) is in pipelines/diffusers_step.py
and pipelines/flow_match.py:

    texts            encode_prompt (UMT5), zero-padded to max_sequence_length, through the prompt
                     cache; with CFG the negative prompt too ("" when none, as __call__)
    timesteps        the checkpoint's scheduler (flow UniPC for the released models), unshifted
                     by image size
    latents          prepare_latents in float32 from the request's own generator:
                     [1, C, (frames - 1) / temporal factor + 1, h, w]
    forward          ONE transformer forward for every row of the CFG layout (__call__ runs the
                     negative prompt as a second forward); Wan 2.2: one forward per expert
    post_decode      un-normalize (latents_mean / latents_std), VAE decode, the frames as PIL

Wan 2.2's two experts: `transformer` denoises timesteps >= boundary_ratio x num_train_timesteps
(high noise), `transformer_2` the rest. Rows of one step may be on either side of the boundary
(requests at different steps): each expert runs one forward over its rows, within the same
`denoise_step`. The guidance scale is the same for both experts (__call__'s default
`guidance_scale_2`).

Co-batching: every text row has max_sequence_length tokens and every row its own timestep. A
forward whose videos differ in size or frame count runs packed (pipelines/wan_packed.py: each row's
video tokens end to end, attention within each row), so the batch key holds no shape. Where packing
can't keep rows apart (another attention backend, image-conditioned or fused attention, Wan 2.2
TI2V's per-patch timesteps) the key is the latent shape: frames, height and width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from diffusers import WanPipeline
from PIL import Image

from pipelines import wan_packed
from pipelines.attention import select_attention_backend
from pipelines.cfg import Row
from pipelines.diffusers_step import text_length
from pipelines.flow_match import FlowMatchStepPipeline
from pipelines.interface import Batch, RequestState
from pipelines.params import GenerationParams
from pipelines.prompt_cache import split_rows
from pipelines.step_cache import BlockStack
from pipelines.studio_config import StudioConfig
from pipelines.validation import check_video_params
from pipelines.wan_vae import unnormalized, wan_vae_projection

MAX_SEQUENCE_LENGTH = 512  # WanPipeline.__call__'s default (and the released models' text length)
FPS = 16  # the frame rate the released Wan 2.1 / 2.2 A14B videos are exported at


@dataclass(frozen=True)
class WanBatchKey:
    num_frames: int | None  # None (with height and width): any shape, rows of different shapes run packed
    height: int | None
    width: int | None


def _modulated_input(block: torch.nn.Module, inputs: dict) -> torch.Tensor:
    """The first block's tokens after its timestep modulation (WanTransformerBlock's self-attention
    input), for TeaCache; temb is [B, 6, D], or [B, tokens, 6, D] for Wan 2.2 TI2V."""
    temb = inputs["temb"].float()
    table = block.scale_shift_table if temb.ndim == 3 else block.scale_shift_table.unsqueeze(0)
    shift, scale = (table + temb).chunk(6, dim=temb.ndim - 2)[:2]
    if temb.ndim == 4:
        shift, scale = shift.squeeze(2), scale.squeeze(2)
    return block.norm1(inputs["hidden_states"].float()) * (1 + scale) + shift


class WanStepPipeline(FlowMatchStepPipeline):
    """A Wan text-to-video checkpoint driven one co-batched denoise step at a time."""

    family = "wan"
    label = "Wan"
    diffusers_class = WanPipeline
    output_kind = "video"
    # Step caching: one list of blocks, each taking and returning the video tokens
    # (WanTransformer3DModel.forward).
    packed_model = wan_packed.WAN
    block_stack = BlockStack(
        lists=("blocks",),
        returns=("hidden_states",),
        row_inputs=("hidden_states", "encoder_hidden_states", "temb"),
        modulated_input=_modulated_input,
    )

    def __init__(self, pipe, device, name, studio: StudioConfig | None = None, scheduler: str | None = None) -> None:
        if pipe.transformer is None:
            raise ValueError(f"{name}: this Wan checkpoint has no `transformer`; stepstudio needs one.")
        if (pipe.config.boundary_ratio is None) != (pipe.transformer_2 is None):
            raise ValueError(
                f"{name}: boundary_ratio={pipe.config.boundary_ratio} with transformer_2="
                f"{type(pipe.transformer_2).__name__}; Wan 2.2 checkpoints have both, Wan 2.1 checkpoints neither."
            )
        super().__init__(pipe, device, name, studio, scheduler)
        self.low_noise_expert = pipe.transformer_2
        self.boundary_timestep = None
        if pipe.config.boundary_ratio is not None:
            self.boundary_timestep = pipe.config.boundary_ratio * pipe.scheduler.config.num_train_timesteps
            select_attention_backend(self.low_noise_expert, device, self.low_noise_expert.dtype)
        self.vae_scale_factor = pipe.vae_scale_factor_spatial
        self.temporal_factor = pipe.vae_scale_factor_temporal
        _, patch_height, patch_width = self.denoiser.config.patch_size
        # __call__ refuses sides that are not multiples of 16, and patchifies latents.
        size_multiple = math.lcm(16, self.vae_scale_factor * patch_height, self.vae_scale_factor * patch_width)
        self.max_sequence_length = text_length(self.studio, MAX_SEQUENCE_LENGTH, MAX_SEQUENCE_LENGTH, self.label)
        self.preview_projection = wan_vae_projection(self.vae, self.studio, self.vae_scale_factor)
        self.info = self._pipeline_info(
            # WanPipeline.__call__'s own defaults: 81 frames of 832x480, 50 steps, guidance 5.
            self.studio.model_defaults(832, 480, num_inference_steps=50, guidance_scale=5.0, num_frames=81, fps=FPS),
            size_multiple=size_multiple,
            guidance="CFG when guidance_scale > 1 (negative prompt rows share the forward)",
            max_sequence_length=str(self.max_sequence_length),
            experts="2 (boundary at timestep %g)" % self.boundary_timestep if self.boundary_timestep else "1",
            frames=f"{self.temporal_factor}k+1",
        )

    @property
    def denoisers(self) -> tuple[torch.nn.Module, ...]:
        return (self.denoiser,) if self.low_noise_expert is None else (self.denoiser, self.low_noise_expert)

    def validate(self, params: GenerationParams) -> None:
        check_video_params(params, self.label, self.info.size_multiple, self.schedulers, self.temporal_factor)

    def batch_key(self, params: GenerationParams) -> WanBatchKey:
        if self.packs:
            return WanBatchKey(num_frames=None, height=None, width=None)
        return WanBatchKey(num_frames=params.num_frames, height=params.height, width=params.width)

    def _packable(self, denoiser: torch.nn.Module) -> bool:
        return not self.pipe.config.expand_timesteps and wan_packed.packs(denoiser)

    def _row_shape(self, row: Row) -> tuple:
        return tuple(row.state.latents.shape), tuple(row.text.shape)

    def _packed_row(self, row: Row) -> wan_packed.WanRow:
        return wan_packed.WanRow(latents=row.state.latents.to(self.denoiser.dtype), timestep=row.state.current_timestep,
                                 text=row.text)

    # ------------------------------------------------------------------ texts
    def _uses_cfg(self, params: GenerationParams) -> bool:
        return params.guidance_scale > 1.0

    @torch.no_grad()
    def _encode_texts(self, texts: list[str]) -> list[torch.Tensor]:
        prompt_embeds, _ = self.pipe.encode_prompt(
            prompt=texts,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
            device=self.device,
            dtype=self.denoiser.dtype,  # __call__ casts them to the transformer's dtype
        )
        return [embeds for (embeds,) in split_rows(len(texts), prompt_embeds)]

    # ------------------------------------------------------------------ timesteps and latents
    def _set_timesteps(self, scheduler, params: GenerationParams) -> torch.Tensor:
        scheduler.set_timesteps(params.num_inference_steps, device=self.device)
        return scheduler.timesteps

    def _initial_latents(self, state: RequestState) -> torch.Tensor:
        # float32 as __call__: the transformer gets a cast copy each step.
        return self._stock_latents(
            state, self.denoiser.config.in_channels, torch.float32, num_frames=state.params.num_frames
        )

    # ------------------------------------------------------------------ forward
    def _expert(self, state: RequestState) -> torch.nn.Module:
        """Wan 2.2: the high-noise expert at or above the boundary timestep, else the low-noise one."""
        if self.boundary_timestep is None or state.current_timestep >= self.boundary_timestep:
            return self.denoiser
        return self.low_noise_expert

    @torch.no_grad()
    def denoise_step(self, batch: Batch) -> list[torch.Tensor]:
        """One forward per expert that has rows in this step (one for Wan 2.1)."""
        by_expert: dict[int, tuple[torch.nn.Module, list[RequestState]]] = {}
        for state in batch.states:
            expert = self._expert(state)
            by_expert.setdefault(id(expert), (expert, []))[1].append(state)
        predictions: dict[str, torch.Tensor] = {}
        for expert, states in by_expert.values():
            predictions.update(zip((s.request_id for s in states), self._guided_forward(states, expert)))
        return [predictions[state.request_id] for state in batch.states]

    def _forward(self, denoiser: torch.nn.Module, rows: Sequence[Row]) -> torch.Tensor:
        latents = torch.cat([row.state.latents for row in rows])
        timestep = torch.stack([row.state.current_timestep for row in rows])
        if self.pipe.config.expand_timesteps:  # Wan 2.2 TI2V: one timestep per latent patch, as __call__
            patches = torch.ones_like(latents[0, 0, :, ::2, ::2], dtype=torch.float32)
            timestep = torch.stack([(patches * row.state.current_timestep).flatten() for row in rows])
        return denoiser(
            hidden_states=latents.to(denoiser.dtype),
            timestep=timestep,
            encoder_hidden_states=torch.cat([row.text for row in rows]),
            attention_kwargs=None,
            return_dict=False,
        )[0]

    # ------------------------------------------------------------------ decode and preview
    def _vae_latents(self, state: RequestState) -> torch.Tensor:
        return unnormalized(self.vae, state.latents)

    def _decode_latents(self, latents: torch.Tensor, output_type: str) -> list:
        """WanPipeline's decode of rows of latents: per row, the frames as PIL images ("pil"), or an
        array [frames, height, width, 3] in [0, 1] ("np")."""
        video = self.vae.decode(latents, return_dict=False)[0]
        frames = self.pipe.video_processor.postprocess_video(video, output_type=output_type)
        return [frames[row] for row in range(len(latents))]

    def _render_preview(self, x0: torch.Tensor, params: GenerationParams) -> list[Image.Image]:
        """Every latent frame of the predicted x0, linearly mapped to RGB (one pixel per latent
        cell; a latent frame stands for `temporal_factor` video frames)."""
        return [self.preview_projection.render(x0[0, :, index]) for index in range(x0.shape[2])]

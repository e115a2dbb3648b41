"""Qwen-Image (`QwenImagePipeline`) as a step pipeline: flow matching with true CFG.

Reads top to bottom like `QwenImagePipeline.__call__`, cut at the step boundaries; the shared
half is in pipelines/diffusers_step.py and pipelines/flow_match.py:

    texts            encode_prompt (Qwen2.5-VL) through the prompt cache; each text keeps its
                     own token count
    timesteps        sigmas 1 .. 1/steps, shifted by this image size's `mu`
    latents          prepare_latents from the request's own generator (packed 2x2)
    forward          ONE transformer forward for every row of the CFG layout; `__call__` runs
                     the negative prompt as a second forward
    guide            CFG, then rescaled to the conditional prediction's norm, per row
    post_decode      unpack, un-normalize (Wan VAE statistics), VAE decode, postprocess to PIL

Prompts have different token counts, so text rows are zero-padded to the longest and masked
(`encoder_hidden_states_mask`): the transformer attends to real tokens only, and text
positions (RoPE) don't move with padding. `guidance_scale` is `__call__`'s `true_cfg_scale`:
CFG runs only when guidance_scale > 1 AND a negative prompt is given (the default negative
prompt is " ", as Qwen-Image's model card uses). Guidance-distilled variants
(`guidance_embeds=True`) are not supported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from diffusers import QwenImagePipeline
from PIL import Image

from pipelines.cfg import Row
from pipelines.flow_match import FlowMatchStepPipeline
from pipelines.interface import RequestState
from pipelines.params import GenerationParams
from pipelines.studio_config import StudioConfig
from pipelines.wan_vae import unnormalized, wan_vae_projection

MAX_SEQUENCE_LENGTH = 512  # __call__'s default prompt token limit


@dataclass(frozen=True)
class QwenImageBatchKey:
    """Rows share a forward with the same image size (RoPE image shapes are shared).
    Guidance scale, CFG, prompt lengths, steps and seed are per row."""

    width: int
    height: int


def pad_text_rows(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Stack [1, L_i, D] text rows into [N, max L, D] with zero padding, and the mask of real
    tokens; no mask when every row has the same length (exactly what __call__ passes then)."""
    longest = max(row.shape[1] for row in rows)
    if all(row.shape[1] == longest for row in rows):
        return torch.cat(rows), None
    padded = torch.cat([torch.nn.functional.pad(row, (0, 0, 0, longest - row.shape[1])) for row in rows])
    mask = torch.zeros(len(rows), longest, dtype=torch.bool, device=padded.device)
    for index, row in enumerate(rows):
        mask[index, : row.shape[1]] = True
    return padded, mask


def rescaled_guidance(positive: torch.Tensor, negative: torch.Tensor, scale: float) -> torch.Tensor:
    """CFG, then the conditional prediction's norm per token, as __call__ does."""
    combined = negative + scale * (positive - negative)
    return combined * (torch.norm(positive, dim=-1, keepdim=True) / torch.norm(combined, dim=-1, keepdim=True))


class QwenImageStepPipeline(FlowMatchStepPipeline):
    """Qwen-Image driven one co-batched denoise step at a time (see the module docstring)."""

    family = "qwen-image"
    label = "Qwen-Image"
    diffusers_class = QwenImagePipeline

    def __init__(self, pipe, device, name, studio: StudioConfig | None = None, scheduler: str | None = None) -> None:
        if pipe.transformer.config.guidance_embeds:
            raise ValueError(
                f"{name}: guidance-distilled Qwen-Image transformers (guidance_embeds=True) are not supported; "
                "use a checkpoint with true CFG such as Qwen/Qwen-Image."
            )
        super().__init__(pipe, device, name, studio, scheduler)
        self.vae_scale_factor = pipe.vae_scale_factor
        self.preview_projection = wan_vae_projection(self.vae, self.studio, self.vae_scale_factor)
        size = pipe.default_sample_size * pipe.vae_scale_factor
        self.info = self._pipeline_info(
            self.studio.model_defaults(size, size, num_inference_steps=30, guidance_scale=4.0, negative_prompt=" "),
            size_multiple=pipe.vae_scale_factor * 2,  # latents are packed in 2x2 patches
        )

    def batch_key(self, params: GenerationParams) -> QwenImageBatchKey:
        return QwenImageBatchKey(params.width, params.height)

    # ------------------------------------------------------------------ texts
    def _uses_cfg(self, params: GenerationParams) -> bool:
        return params.guidance_scale > 1 and params.negative_prompt is not None

    @torch.no_grad()
    def _encode_texts(self, texts: list[str]) -> list[torch.Tensor]:
        """encode_prompt pads every text to the longest with zeros after the real tokens; each
        text gets back its own length ([1, tokens, dim])."""
        prompt_embeds, mask = self.pipe.encode_prompt(
            prompt=texts, device=self.device, max_sequence_length=MAX_SEQUENCE_LENGTH
        )
        lengths = [prompt_embeds.shape[1]] * len(texts) if mask is None else mask.sum(dim=1).tolist()
        # Each row is copied: a view would keep the whole batch alive while it is cached.
        return [prompt_embeds[i : i + 1, : int(length)].clone() for i, length in enumerate(lengths)]

    # ------------------------------------------------------------------ timesteps and latents
    def _set_timesteps(self, scheduler, params: GenerationParams) -> torch.Tensor:
        return self._shifted_timesteps(scheduler, params, self._packed_tokens(params))

    def _initial_latents(self, state: RequestState) -> torch.Tensor:
        channels = self.denoiser.config.in_channels // 4  # before 2x2 packing
        return self._stock_latents(state, channels, state.conditioning.positive.dtype)

    # ------------------------------------------------------------------ forward
    def _forward(self, denoiser: torch.nn.Module, rows: Sequence[Row]) -> torch.Tensor:
        latents = torch.cat([row.state.latents for row in rows])
        timesteps = torch.stack([row.state.current_timestep for row in rows]).to(latents.dtype)
        text, text_mask = pad_text_rows([row.text for row in rows])
        params = rows[0].state.params  # the size is the same for every row (batch key)
        patches = (1, params.height // self.vae_scale_factor // 2, params.width // self.vae_scale_factor // 2)
        return denoiser(
            hidden_states=latents,
            timestep=timesteps / 1000,
            guidance=None,
            encoder_hidden_states_mask=text_mask,
            encoder_hidden_states=text,
            img_shapes=[[patches]] * len(rows),
            attention_kwargs={},
            return_dict=False,
        )[0]

    _guide = staticmethod(rescaled_guidance)

    # ------------------------------------------------------------------ decode and preview
    def _vae_latents(self, state: RequestState) -> torch.Tensor:
        return unnormalized(self.vae, self._unpacked(state.latents, state.params))  # [1, C, 1, h, w]

    def _decoded(self, image: torch.Tensor) -> torch.Tensor:
        return image[:, :, 0]  # the one frame of the video VAE

    def _render_preview(self, x0: torch.Tensor, params: GenerationParams) -> Image.Image:
        return self.preview_projection.render(self._unpacked(x0, params)[0, :, 0])

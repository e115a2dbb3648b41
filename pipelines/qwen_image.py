"""Qwen-Image (`QwenImagePipeline`) as a step pipeline: flow matching with true CFG.

Reads top to bottom like `QwenImagePipeline.__call__`, cut at the step boundaries; the shared
half is in pipelines/diffusers_step.py and pipelines/flow_match.py:

    texts            encode_prompt (Qwen2.5-VL) through the prompt cache; each text keeps its
                     own token count
    timesteps        sigmas 1 .. 1/steps, shifted by this image size's `mu`
    latents          prepare_latents from the request's own generator (packed 2x2); from an
                     init image as QwenImageImg2ImgPipeline: the image as a one-frame video
                     through the VAE (a sample from the same generator), normalized with the
                     VAE's latents_mean / latents_std, packed, noised by `scale_noise`
    mask             as QwenImageInpaintPipeline: packed like the latents, blended after every
                     step (in the shared base)
    forward          ONE transformer forward for every row of the CFG layout; `__call__` runs
                     the negative prompt as a second forward
    guide            CFG, then rescaled to the conditional prediction's norm, per row
    post_decode      unpack, un-normalize (Wan VAE statistics), VAE decode, postprocess to PIL

Prompts have different token counts. A forward whose rows differ in size or prompt length runs
packed (pipelines/qwen_image_packed.py: each row exactly its own tokens, attention within each
row), so the batch key holds nothing; where packing can't keep rows apart (another attention
backend or processor) the key is the image size and text rows are zero-padded to the longest and
masked (`encoder_hidden_states_mask`): the transformer attends to real tokens only, and text
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
from diffusers.image_processor import VaeImageProcessor
from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution
from diffusers.utils.torch_utils import randn_tensor
from PIL import Image

from pipelines import qwen_image_packed
from pipelines.cfg import Row
from pipelines.flow_match import FlowMatchStepPipeline
from pipelines.interface import RequestState
from pipelines.params import GenerationParams
from pipelines.studio_config import StudioConfig
from pipelines.wan_vae import unnormalized, wan_vae_projection

MAX_SEQUENCE_LENGTH = 512  # __call__'s default prompt token limit


@dataclass(frozen=True)
class QwenImageBatchKey:
    """Rows share a forward with the same image size (RoPE image shapes are shared), or of any size
    when they run packed (both None). Guidance scale, CFG, prompt lengths, steps and seed are per row."""

    width: int | None
    height: int | None


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
    packed_model = qwen_image_packed.QWEN_IMAGE
    image_inputs = ("init_image", "mask_image")

    def __init__(self, pipe, device, name, studio: StudioConfig | None = None, scheduler: str | None = None) -> None:
        if pipe.transformer.config.guidance_embeds:
            raise ValueError(
                f"{name}: guidance-distilled Qwen-Image transformers (guidance_embeds=True) are not supported; "
                "use a checkpoint with true CFG such as Qwen/Qwen-Image."
            )
        super().__init__(pipe, device, name, studio, scheduler)
        self.vae_scale_factor = pipe.vae_scale_factor
        self.preview_projection = wan_vae_projection(self.vae, self.studio, self.vae_scale_factor)
        # QwenImageInpaintPipeline's mask: grayscale, binarized at 0.5, on the packed grid.
        self.mask_processor = VaeImageProcessor(
            vae_scale_factor=self.vae_scale_factor * 2, vae_latent_channels=self.vae.config.z_dim,
            do_normalize=False, do_binarize=True, do_convert_grayscale=True,
        )
        size = pipe.default_sample_size * pipe.vae_scale_factor
        self.info = self._pipeline_info(
            self.studio.model_defaults(size, size, num_inference_steps=30, guidance_scale=4.0, negative_prompt=" "),
            size_multiple=pipe.vae_scale_factor * 2,  # latents are packed in 2x2 patches
        )

    def batch_key(self, params: GenerationParams) -> QwenImageBatchKey:
        if self.packs:
            return QwenImageBatchKey(None, None)
        return QwenImageBatchKey(params.width, params.height)

    def _packable(self, denoiser: torch.nn.Module) -> bool:
        return qwen_image_packed.packs(denoiser)

    def _row_shape(self, row: Row) -> tuple:
        # Packed latents ([1, tokens, C]) hide the grid: 64x96 and 96x64 have as many tokens but
        # not the same rotary positions, so they can't share one stacked forward.
        params = row.state.params
        return tuple(row.state.latents.shape), tuple(row.text.shape), (params.height, params.width)

    def _packed_row(self, row: Row) -> qwen_image_packed.QwenRow:
        params, latents = row.state.params, row.state.latents
        patches = (1, params.height // self.vae_scale_factor // 2, params.width // self.vae_scale_factor // 2)
        return qwen_image_packed.QwenRow(latents=latents, timestep=row.state.current_timestep.to(latents.dtype) / 1000,
                                         text=row.text, patches=patches)

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

    # ------------------------------------------------------------------ from an init image
    # (QwenImageImg2ImgPipeline's default strength, 0.6, is the shared default)
    def _encode_images(self, images: list[Image.Image], height: int, width: int) -> list[DiagonalGaussianDistribution]:
        """ONE encoder call of the video VAE, each picture a one-frame video [3, 1, H, W]."""
        pixels = self.pipe.image_processor.preprocess(images, height=height, width=width)[:, :, None]
        with self.placement.using("vae"):
            moments = self.vae.encode(pixels.to(self.device, self.vae.dtype)).latent_dist.parameters
        return [DiagonalGaussianDistribution(row) for row in moments.split(1)]

    def _image_latents(self, state: RequestState, encoding: DiagonalGaussianDistribution) -> torch.Tensor:
        """_encode_vae_image (a sample from the request's generator, normalized), packed 2x2."""
        latents = encoding.sample(generator=state.generator)  # [1, z, 1, h, w]
        shape = (1, self.vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(self.vae.config.latents_mean).view(shape).to(latents.device, latents.dtype)
        std_inverse = 1.0 / torch.tensor(self.vae.config.latents_std).view(shape).to(latents.device, latents.dtype)
        latents = ((latents - mean) * std_inverse).to(self.device, state.conditioning.positive.dtype)
        return self._packed(latents[:, :, 0])

    def _mask_latents(self, state: RequestState) -> torch.Tensor:
        """prepare_mask_latents: the binarized mask, nearest-resized to the latent grid, on every
        channel, packed like the latents."""
        params = state.params
        height, width = (2 * (side // (self.vae_scale_factor * 2)) for side in (params.height, params.width))
        mask = self.mask_processor.preprocess(params.mask_image, height=params.height, width=params.width)
        mask = torch.nn.functional.interpolate(mask, size=(height, width))
        # The inpaint pipeline also VAE-encodes the masked image with the request's generator
        # (this transformer never reads it): draw that sample's noise too, as __call__ does.
        randn_tensor((1, self.vae.config.z_dim, 1, height, width), generator=state.generator,
                     device=self.device, dtype=self.vae.dtype)
        mask = mask.to(self.device, state.conditioning.positive.dtype)
        return self._packed(mask.repeat(1, self.denoiser.config.in_channels // 4, 1, 1))

    def _packed(self, latents: torch.Tensor) -> torch.Tensor:
        batch, channels, height, width = latents.shape
        return self.pipe._pack_latents(latents, batch, channels, height, width)

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

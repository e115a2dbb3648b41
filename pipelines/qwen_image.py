"""Qwen-Image (`QwenImagePipeline`) as a step pipeline: flow matching with true CFG.

The diffusers pipeline is loaded as usual and its pieces are reused (`encode_prompt`,
`prepare_latents`, the shift and timestep helpers, `vae`, `image_processor`); the denoise
loop is ours. `__call__` runs the negative prompt as a second transformer forward; here the
negative rows join the same forward as the positive ones, for every request in the batch.
Prompts have different token counts, so text rows are zero-padded to the longest and
masked (`encoder_hidden_states_mask`): the transformer attends to real tokens only, and
text positions (RoPE) don't move with padding. Prompt embeddings go through the prompt
cache (pipelines/prompt_cache.py); the joiners of a step share one encode_prompt call.

Semantics follow `__call__`: `guidance_scale` is its `true_cfg_scale`, and CFG runs only
when guidance_scale > 1 AND a negative prompt is given (the default negative prompt is " ",
as Qwen-Image's model card uses). The combined prediction is rescaled to the norm of the
conditional one, per row, as `__call__` does. Guidance-distilled variants
(`guidance_embeds=True`) are not supported.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from diffusers import QwenImagePipeline
from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift, retrieve_timesteps
from PIL import Image

from pipelines.attention import select_attention_backend
from pipelines.flow_match import flow_match_step
from pipelines.interface import Batch, PipelineInfo, RequestState
from pipelines.latent_preview import LatentRgbProjection
from pipelines.loader import LoadOptions, load_diffusers_pipeline
from pipelines.params import GenerationParams
from pipelines.prompt_cache import BatchedPromptEncoder, PromptEmbeddingCache
from pipelines.validation import check_image_params, check_scheduler_name
from pipelines.studio_config import StudioConfig, read_studio_config

SCHEDULER_NAME = "flow-match-euler"  # the only noise scheduler Qwen-Image is trained for
MAX_SEQUENCE_LENGTH = 512  # __call__'s default prompt token limit

# Latent -> RGB preview factors for the Wan 2.1 VAE latent space that Qwen-Image uses
# (as published with ComfyUI), on normalized latents: rgb in [-1, 1] = latent @ F + B.
WAN_LATENT_RGB_FACTORS = (
    (-0.1299, -0.1692, 0.2932), (0.0671, 0.0406, 0.0442), (0.3568, 0.2548, 0.1747), (0.0372, 0.2344, 0.1420),
    (0.0313, 0.0189, -0.0328), (0.0296, -0.0956, -0.0665), (-0.3477, -0.4059, -0.2925), (0.0166, 0.1902, 0.1975),
    (-0.0412, 0.0267, -0.1364), (-0.1293, 0.0740, 0.1636), (0.0680, 0.3019, 0.1128), (0.0032, 0.0581, 0.0639),
    (-0.1251, 0.0927, 0.1699), (0.0060, -0.0633, 0.0005), (0.3477, 0.2275, 0.2950), (0.1984, 0.0913, 0.1861),
)
WAN_LATENT_RGB_BIAS = (-0.1835, -0.0868, -0.3360)


@dataclass(frozen=True)
class QwenImageBatchKey:
    """Rows share a forward with the same image size (RoPE image shapes are shared) and the
    same CFG layout. Guidance scale, prompt lengths, steps and seed are per row."""

    width: int
    height: int
    true_cfg: bool


@dataclass
class QwenImageConditioning:
    prompt_embeds: torch.Tensor  # [1, tokens, dim], this prompt's own token count
    negative_prompt_embeds: torch.Tensor | None  # set when CFG is on
    guidance_scale: float


@dataclass
class QwenImageRequestExtra:
    predicted_x0: torch.Tensor | None = None  # packed, after the last step, for previews only


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


class QwenImageStepPipeline(BatchedPromptEncoder):
    """Qwen-Image driven one co-batched denoise step at a time."""

    family = "qwen-image"

    def __init__(self, pipe, name: str, device: torch.device, studio: StudioConfig | None = None) -> None:
        if pipe.transformer.config.guidance_embeds:
            raise ValueError(
                f"{name}: guidance-distilled Qwen-Image transformers (guidance_embeds=True) are not supported; "
                "use a checkpoint with true CFG such as Qwen/Qwen-Image."
            )
        self.pipe = pipe
        self.transformer = pipe.transformer
        self.vae = pipe.vae
        self.device = device
        self.vae_scale_factor = pipe.vae_scale_factor
        # Latents are packed in 2x2 patches: image sides must divide by twice the VAE factor.
        self.size_multiple = pipe.vae_scale_factor * 2
        self._scheduler_template = copy.deepcopy(pipe.scheduler)  # pristine: requests get copies
        self.prompt_cache = PromptEmbeddingCache(self._encode_texts)
        self.attention_backend = select_attention_backend(self.transformer, device, self.transformer.dtype)
        studio = studio or StudioConfig()
        self.preview_projection = self._preview_projection(studio)
        size = pipe.default_sample_size * pipe.vae_scale_factor
        self.info = PipelineInfo(
            name=name,
            family=self.family,
            output_kind="image",
            defaults=studio.model_defaults(size, num_inference_steps=30, guidance_scale=4.0, negative_prompt=" "),
            uses_negative_prompt=True,
            size_multiple=self.size_multiple,
            schedulers=(SCHEDULER_NAME,),
            extras={
                "default_scheduler": SCHEDULER_NAME,
                "preview": self.preview_projection.source,
                "attention": self.attention_backend,
            },
        )

    @classmethod
    def from_pretrained(cls, path: str | Path, options: LoadOptions) -> "QwenImageStepPipeline":
        if options.scheduler is not None:
            check_scheduler_name("scheduler", options.scheduler, (SCHEDULER_NAME,))
        pipe, device = load_diffusers_pipeline(QwenImagePipeline, Path(path), options, "Qwen-Image")
        return cls(pipe, Path(path).name, device, read_studio_config(Path(path)))

    # ---------------------------------------------------------------- protocol
    def validate(self, params: GenerationParams) -> None:
        check_image_params(params, self.info.name, self.size_multiple, (SCHEDULER_NAME,))

    def batch_key(self, params: GenerationParams) -> QwenImageBatchKey:
        return QwenImageBatchKey(params.width, params.height, self._uses_cfg(params))

    @torch.no_grad()
    def prepare_encode(self, state: RequestState) -> None:
        params = state.params
        cfg = self._uses_cfg(params)
        prompt_embeds, *negative = self.prompt_cache.encode_many(self._texts(params))
        negative_prompt_embeds = negative[0] if cfg else None
        state.conditioning = QwenImageConditioning(prompt_embeds, negative_prompt_embeds, float(params.guidance_scale))

        state.generator = torch.Generator(device=self.device).manual_seed(params.seed)
        state.latents = self.pipe.prepare_latents(
            1,
            self.transformer.config.in_channels // 4,
            params.height,
            params.width,
            prompt_embeds.dtype,
            self.device,
            state.generator,
        )

        # The request's own scheduler, with __call__'s sigmas and resolution-dependent shift.
        scheduler = copy.deepcopy(self._scheduler_template)
        steps = params.num_inference_steps
        config = scheduler.config
        mu = calculate_shift(
            state.latents.shape[1],
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", 1.15),
        )
        sigmas = np.linspace(1.0, 1 / steps, steps)
        state.timesteps, _ = retrieve_timesteps(scheduler, steps, self.device, sigmas=sigmas, mu=mu)
        scheduler.set_begin_index(0)
        state.noise_scheduler = scheduler
        state.step_index = 0
        state.extra = QwenImageRequestExtra()

    def _texts(self, params: GenerationParams) -> list[str]:
        return [params.prompt, params.negative_prompt] if self._uses_cfg(params) else [params.prompt]

    @torch.no_grad()
    def _encode_texts(self, texts: list[str]) -> list[torch.Tensor]:
        """encode_prompt for several texts at once. It pads every row to the longest with
        zeros after the real tokens; each text gets back its own length ([1, tokens, dim])."""
        prompt_embeds, mask = self.pipe.encode_prompt(
            prompt=texts, device=self.device, max_sequence_length=MAX_SEQUENCE_LENGTH
        )
        lengths = [prompt_embeds.shape[1]] * len(texts) if mask is None else mask.sum(dim=1).tolist()
        # Each row is copied: a view would keep the whole batch alive while it is cached.
        return [prompt_embeds[i : i + 1, : int(length)].clone() for i, length in enumerate(lengths)]

    @torch.no_grad()
    def denoise_step(self, batch: Batch) -> list[torch.Tensor]:
        states = batch.states
        conds = [s.conditioning for s in states]
        cfg = conds[0].negative_prompt_embeds is not None  # equal for all: batch key
        latents = torch.cat([s.latents for s in states])
        timesteps = torch.stack([s.current_timestep for s in states]).to(latents.dtype)
        text_rows = [c.prompt_embeds for c in conds]
        if cfg:  # positive rows first, then negative rows, in one forward
            latents = torch.cat([latents, latents])
            timesteps = torch.cat([timesteps, timesteps])
            text_rows += [c.negative_prompt_embeds for c in conds]
        text, text_mask = pad_text_rows(text_rows)
        params = states[0].params
        patches = (1, params.height // self.vae_scale_factor // 2, params.width // self.vae_scale_factor // 2)

        prediction = self.transformer(
            hidden_states=latents,
            timestep=timesteps / 1000,
            guidance=None,
            encoder_hidden_states_mask=text_mask,
            encoder_hidden_states=text,
            img_shapes=[[patches]] * len(text_rows),
            attention_kwargs={},
            return_dict=False,
        )[0]

        if not cfg:
            return list(prediction.split(1))
        positives, negatives = prediction.chunk(2)
        results = []
        for positive, negative, cond in zip(positives.split(1), negatives.split(1), conds):
            combined = negative + cond.guidance_scale * (positive - negative)
            # Keep the conditional prediction's norm, per token, as __call__ does.
            positive_norm = torch.norm(positive, dim=-1, keepdim=True)
            combined_norm = torch.norm(combined, dim=-1, keepdim=True)
            results.append(combined * (positive_norm / combined_norm))
        return results

    @torch.no_grad()
    def step_scheduler(self, state: RequestState, prediction: torch.Tensor) -> None:
        flow_match_step(state, prediction, pass_generator=False)  # QwenImagePipeline passes none

    @torch.no_grad()
    def post_decode(self, state: RequestState) -> list[Image.Image]:
        params = state.params
        latents = self.pipe._unpack_latents(state.latents, params.height, params.width, self.vae_scale_factor)
        latents = latents.to(self.vae.dtype)
        z_dim = self.vae.config.z_dim
        mean = torch.tensor(self.vae.config.latents_mean).view(1, z_dim, 1, 1, 1).to(latents.device, latents.dtype)
        std_inverse = 1.0 / torch.tensor(self.vae.config.latents_std).view(1, z_dim, 1, 1, 1).to(
            latents.device, latents.dtype
        )
        latents = latents / std_inverse + mean
        image = self.vae.decode(latents, return_dict=False)[0][:, :, 0]
        return self.pipe.image_processor.postprocess(image, output_type="pil")

    @torch.no_grad()
    def preview(self, state: RequestState) -> Image.Image | None:
        x0 = state.extra.predicted_x0 if state.extra is not None else None
        if x0 is None:
            return None
        params = state.params
        grid = self.pipe._unpack_latents(x0, params.height, params.width, self.vae_scale_factor)  # [1, C, 1, h, w]
        return self.preview_projection.render(grid[0, :, 0])

    # ---------------------------------------------------------------- helpers
    @staticmethod
    def _uses_cfg(params: GenerationParams) -> bool:
        return params.guidance_scale > 1 and params.negative_prompt is not None

    def _preview_projection(self, studio: StudioConfig) -> LatentRgbProjection:
        """stepstudio.json's factors, else the Wan 2.1 factors for 16 latent channels, else
        (a tiny or unusual VAE) the first three channels as RGB."""
        if studio.preview_rgb_factors is not None:
            return LatentRgbProjection(
                torch.tensor(studio.preview_rgb_factors), torch.tensor(studio.preview_rgb_bias), "stepstudio.json"
            )
        channels = self.vae.config.z_dim
        if channels == len(WAN_LATENT_RGB_FACTORS):
            factors = torch.tensor(WAN_LATENT_RGB_FACTORS) / 2.0  # [-1, 1] -> [0, 1]
            bias = (torch.tensor(WAN_LATENT_RGB_BIAS) + 1.0) / 2.0
            return LatentRgbProjection(factors, bias, "wan-2.1-vae")
        factors = torch.zeros(channels, 3)
        for index in range(min(3, channels)):
            factors[index, index] = 0.5
        return LatentRgbProjection(factors, torch.full((3,), 0.5), "first-three-channels")

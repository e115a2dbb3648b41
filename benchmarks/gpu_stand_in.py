"""A FLUX.1-dev-sized denoiser with random weights, served through the step protocol.

No checkpoint can be downloaded on the GPU machine, and for memory and speed only the
shapes matter. So the transformer is `FluxTransformer2DModel` with FLUX.1-dev's real config
(19 double + 38 single blocks, 24 heads x 128, 11.9B parameters), built directly on the
device in the serving dtype with random weights (no CPU init, no copy). The text encoders
become random embeddings of their real shapes (T5: 512 x 4096, CLIP pooled: 768), seeded by
the prompt, so the stock `FluxPipeline` can be handed the very same ones; there is no VAE
(`post_decode` returns a tiny picture of the latents, which also waits for the device).

`StandInFluxPipeline` follows the step protocol (pipelines/interface.py) the way
`FluxPipeline.__call__` runs a guidance-distilled model: the same noise, shifted sigmas,
per-row timestep and embedded guidance, one noise scheduler per request. `stock_pipeline`
is diffusers' own `FluxPipeline` around the same transformer, for the one-at-a-time baseline.
"""

from __future__ import annotations

import copy
import hashlib
import time
from dataclasses import dataclass

import numpy as np
import torch
from diffusers import (
    FlowMatchEulerDiscreteScheduler,
    FluxPipeline,
    FluxTransformer2DModel,
)
from diffusers.pipelines.flux.pipeline_flux import calculate_shift
from diffusers.utils.torch_utils import randn_tensor
from PIL import Image

from pipelines.attention import select_attention_backend
from pipelines.interface import Batch, ModelDefaults, PipelineInfo, RequestState
from pipelines.params import GenerationParams

# black-forest-labs/FLUX.1-dev transformer/config.json and scheduler/scheduler_config.json.
FLUX_DEV_TRANSFORMER = dict(
    patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
    num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
    axes_dims_rope=(16, 56, 56),
)
FLUX_DEV_SCHEDULER = dict(
    shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
    max_image_seq_len=4096,
)
# The same architecture at toy size, for the CPU dry run (same channels, so the same latents).
TINY_TRANSFORMER = dict(
    patch_size=1, in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
    joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=True, axes_dims_rope=(4, 4, 8),
)
PIXELS_PER_TOKEN = 16  # VAE 8x, then 2x2 packing


@dataclass(frozen=True)
class StandInConfig:
    label: str
    transformer: dict
    text_tokens: int  # T5 tokens (FLUX.1-dev serves 512)


FLUX_DEV = StandInConfig("FLUX.1-dev architecture, random weights", FLUX_DEV_TRANSFORMER, text_tokens=512)
TINY = StandInConfig("FLUX architecture, 2 blocks, random weights", TINY_TRANSFORMER, text_tokens=16)


def build_transformer(config: StandInConfig, device: torch.device, dtype: torch.dtype) -> FluxTransformer2DModel:
    """Random init straight on `device` in `dtype`: PyTorch's default initialisers, run there."""
    default_dtype = torch.get_default_dtype()
    torch.manual_seed(0)
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            transformer = FluxTransformer2DModel(**config.transformer)
    finally:
        torch.set_default_dtype(default_dtype)
    return transformer.eval().requires_grad_(False)


def image_tokens(width: int, height: int) -> int:
    return (width // PIXELS_PER_TOKEN) * (height // PIXELS_PER_TOKEN)


@dataclass(frozen=True)
class StandInBatchKey:
    width: int
    height: int


@dataclass(frozen=True)
class TextRows:
    embeds: torch.Tensor  # [1, text_tokens, joint_attention_dim]
    pooled: torch.Tensor  # [1, pooled_projection_dim]


class StandInFluxPipeline:
    """The step protocol around a FLUX transformer, with random text embeddings and no VAE."""

    def __init__(self, transformer: FluxTransformer2DModel, config: StandInConfig) -> None:
        self.transformer = transformer
        self.config = config
        self.device, self.dtype = transformer.device, transformer.dtype
        self.attention_backend = select_attention_backend(transformer, self.device, self.dtype)
        self._scheduler_template = FlowMatchEulerDiscreteScheduler(**FLUX_DEV_SCHEDULER)
        self.info = PipelineInfo(
            name=config.label,
            family="flux",
            output_kind="image",
            defaults=ModelDefaults(width=1024, height=1024, num_inference_steps=28, guidance_scale=3.5),
            uses_negative_prompt=False,
            size_multiple=PIXELS_PER_TOKEN,
            extras={"attention": self.attention_backend},
        )

    @property
    def denoisers(self) -> tuple[torch.nn.Module, ...]:
        return (self.transformer,)

    # ------------------------------------------------------------------ submission (any thread)
    def validate(self, params: GenerationParams) -> None:
        for name in ("width", "height"):
            value = getattr(params, name)
            if value % PIXELS_PER_TOKEN:
                raise ValueError(f"{name}={value} must be a multiple of {PIXELS_PER_TOKEN} for this model.")

    def batch_key(self, params: GenerationParams) -> StandInBatchKey:
        return StandInBatchKey(params.width, params.height)

    def forward_size(self, params: GenerationParams) -> tuple[int, int]:
        return 1, image_tokens(params.width, params.height)

    # ------------------------------------------------------------------ the engine thread
    def text_rows(self, prompt: str) -> TextRows:
        """What T5 and CLIP would give, in shape only: normal noise seeded by the prompt."""
        seed = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:8], "little")
        generator = torch.Generator().manual_seed(seed)
        transformer = self.transformer.config
        embeds = torch.randn(1, self.config.text_tokens, transformer.joint_attention_dim, generator=generator)
        pooled = torch.randn(1, transformer.pooled_projection_dim, generator=generator)
        return TextRows(embeds.to(self.device, self.dtype), pooled.to(self.device, self.dtype))

    def prepare_encode(self, state: RequestState) -> None:
        params = state.params
        state.conditioning = self.text_rows(params.prompt)
        state.generator = torch.Generator(device=self.device).manual_seed(params.seed)
        # FluxPipeline.prepare_latents: noise on the unpacked grid, then 2x2 patches packed.
        channels = self.transformer.config.in_channels // 4
        height, width = 2 * (params.height // PIXELS_PER_TOKEN), 2 * (params.width // PIXELS_PER_TOKEN)
        noise = randn_tensor((1, channels, height, width), generator=state.generator, device=self.device, dtype=self.dtype)
        state.latents = FluxPipeline._pack_latents(noise, 1, channels, height, width)
        # FluxPipeline.__call__'s schedule: linear sigmas, shifted by mu of the image's token count.
        steps = params.num_inference_steps
        scheduler = copy.deepcopy(self._scheduler_template)
        settings = scheduler.config
        mu = calculate_shift(state.latents.shape[1], settings.base_image_seq_len, settings.max_image_seq_len,
                             settings.base_shift, settings.max_shift)
        scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), device=self.device, mu=mu)
        scheduler.set_begin_index(0)
        state.noise_scheduler = scheduler
        state.timesteps = scheduler.timesteps

    @torch.no_grad()
    def denoise_step(self, batch: Batch):
        states = batch.states
        latents = torch.cat([s.latents for s in states])
        params = states[0].params
        image_ids = FluxPipeline._prepare_latent_image_ids(
            1, params.height // PIXELS_PER_TOKEN, params.width // PIXELS_PER_TOKEN, self.device, self.dtype
        )
        text_ids = torch.zeros(self.config.text_tokens, 3, device=self.device, dtype=self.dtype)
        timesteps = torch.stack([s.current_timestep for s in states]).to(latents.dtype)
        guidance = torch.tensor([s.params.guidance_scale for s in states], device=self.device, dtype=torch.float32)
        prediction = self.transformer(
            hidden_states=latents,
            timestep=timesteps / 1000,
            guidance=guidance,
            pooled_projections=torch.cat([s.conditioning.pooled for s in states]),
            encoder_hidden_states=torch.cat([s.conditioning.embeds for s in states]),
            txt_ids=text_ids,
            img_ids=image_ids,
            return_dict=False,
        )[0]
        return list(prediction.split(1))

    def step_scheduler(self, state: RequestState, prediction: torch.Tensor) -> None:
        state.latents = state.noise_scheduler.step(prediction, state.current_timestep, state.latents,
                                                   return_dict=False)[0]
        state.step_index += 1

    def post_decode(self, state: RequestState) -> list[Image.Image]:
        """No VAE: an 8x8 grey picture of the latents (reading it back waits for the device)."""
        grid = state.latents.float().mean(dim=-1).reshape(-1)[:64].cpu()
        values = ((grid.tanh() + 1) * 127.5).clamp(0, 255).to(torch.uint8).numpy()
        return [Image.fromarray(np.resize(values, 64).reshape(8, 8)).convert("RGB")]

    def preview(self, state: RequestState) -> None:
        return None


def build_stand_in(config: StandInConfig, device: torch.device, dtype: torch.dtype) -> tuple[StandInFluxPipeline, dict]:
    """The stand-in pipeline, and what building it took: seconds, parameters, weight bytes
    (from the tensors, and on CUDA as the allocator counts them)."""
    on_cuda = device.type == "cuda"
    allocated = torch.cuda.memory_allocated(device) if on_cuda else 0
    started = time.perf_counter()
    transformer = build_transformer(config, device, dtype)
    if on_cuda:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    parameters = sum(p.numel() for p in transformer.parameters())
    weights = {
        "model": config.label,
        "parameters": parameters,
        "dtype": str(dtype),
        "init_s": seconds,
        "weights_gib": sum(p.numel() * p.element_size() for p in transformer.parameters()) / 2**30,
        "allocated_by_init_gib": (torch.cuda.memory_allocated(device) - allocated) / 2**30 if on_cuda else None,
    }
    return StandInFluxPipeline(transformer, config), weights


def stock_pipeline(transformer: FluxTransformer2DModel) -> FluxPipeline:
    """diffusers' FluxPipeline around the same transformer: no text encoders, no VAE (it is
    given embeddings and asked for latents)."""
    pipe = FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**FLUX_DEV_SCHEDULER),
        vae=None, text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None,
        transformer=transformer,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe

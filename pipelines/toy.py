"""A tiny deterministic pipeline with no weights, for tests, benchmarks and UI work.

It follows the step protocol with real tensors and a real diffusers noise scheduler, but
its "model" is a closed-form function of each row's OWN latents, timestep and prompt
embedding. So a request's result can't depend on its batch-mates: any leak between rows
shows up as a changed image. It also records every forward and every text-encoder call
(its prompts go through a real PromptEmbeddingCache), and can be told to fail: a prompt
containing "[fail:<method>]" raises in that method, "[nan]" makes NaN latents, and
"[crash]" raises `EngineCrash` in the forward: not an `Exception`, so no request-level
isolation catches it and the engine thread itself goes down (for testing that path).
`max_forward_tokens` makes a forward with more latent tokens than that raise torch's
OutOfMemoryError, as a device that is too small would. `packs=True` makes it a model whose
forwards take rows of different sizes (as FLUX's packed forwards do): its batch key holds no size.

It starts from an init image as the real families do, in miniature: the image's "latents" are
its 8x8 cell means (the inverse of its decode), noised with the flow-match scheduler to the
first of the last `steps * strength` steps (`start_step`); with a mask, the unmasked cells go
back to the image's latents (noised to the next step) after every step, and the decoded image
takes the init image's own pixels wherever the mask is black.

Use it from the command line with `python app.py --model toy`.
"""

from __future__ import annotations

import copy
import hashlib
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from PIL import Image

from pipelines.errors import ParamError
from pipelines.interface import Batch, ModelDefaults, PipelineInfo, RequestState
from pipelines.params import GenerationParams, start_step
from pipelines.prompt_cache import PromptEmbeddingCache

LATENT_CHANNELS = 4
SCALE = 8  # pixels per latent cell


@dataclass(frozen=True)
class ToyBatchKey:
    width: int | None  # None (with height): any size (a packing toy model)
    height: int | None


def prompt_embedding(prompt: str) -> torch.Tensor:
    """A stable 'text encoder': a vector seeded by the prompt's hash."""
    digest = hashlib.sha256(prompt.encode()).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
    return torch.randn(LATENT_CHANNELS, generator=generator)


@dataclass
class ToyImageStart:
    """What a request that starts from an image keeps between steps (RequestState.extra)."""

    image_latents: torch.Tensor  # [C, h, w]: the init image's cell means
    noise: torch.Tensor  # the request's noise, for re-noising the unmasked cells
    mask: torch.Tensor | None  # [1, h, w], 1 = repaint (cells whose mean is at least half white)


def image_latents(image: Image.Image) -> torch.Tensor:
    """The inverse of the toy decode: 8x8 cell means of RGB mapped to [-2, 2], channel 4 zero."""
    pixels = torch.from_numpy(np.asarray(image, dtype=np.float32)).permute(2, 0, 1)
    cells = torch.nn.functional.avg_pool2d(pixels[None], SCALE)[0] * (4 / 255) - 2
    return torch.cat([cells, torch.zeros_like(cells[:1])]).reshape(LATENT_CHANNELS, *cells.shape[1:])


def mask_latents(mask: Image.Image) -> torch.Tensor:
    cells = torch.nn.functional.avg_pool2d(torch.from_numpy(np.asarray(mask, dtype=np.float32))[None, None], SCALE)
    return (cells[0] >= 127.5).float()


class EngineCrash(BaseException):
    """Injected by a "[crash]" prompt: escapes every `except Exception` of the engine."""


def _maybe_fail(state: RequestState, method: str) -> None:
    if f"[fail:{method}]" in state.params.prompt:
        raise RuntimeError(f"injected failure in {method} for this prompt")


class ToyPipeline:
    """Deterministic stand-in for a diffusion model (see module docstring)."""

    def __init__(
        self,
        step_delay_s: float = 0.0,
        defaults: ModelDefaults | None = None,
        on_forward: Callable[[int, Batch], None] | None = None,
        max_forward_tokens: int | None = None,
        packs: bool = False,
    ) -> None:
        self.packs = packs  # rows of different sizes share a forward
        # Sleep per forward, to stand in for model compute in UI and scheduling tests.
        self.step_delay_s = step_delay_s
        self.max_forward_tokens = max_forward_tokens  # a forward with more raises OutOfMemoryError
        # Called on the engine thread before forward number i (0-based): lets tests act at an
        # exact step boundary (submit, cancel) instead of racing the engine thread.
        self.on_forward = on_forward
        self.info = PipelineInfo(
            name="toy",
            family="toy",
            output_kind="image",
            defaults=defaults or ModelDefaults(width=64, height=64, num_inference_steps=8, guidance_scale=1.0),
            uses_negative_prompt=False,
            size_multiple=SCALE,
            schedulers=("flow-match-euler",),
            image_inputs=("init_image", "mask_image"),
        )
        self._scheduler_template = FlowMatchEulerDiscreteScheduler()
        self.forward_log: list[tuple[str, ...]] = []  # request ids of each forward, in row order
        self.encoded: list[str] = []
        self.text_encoder_calls: list[tuple[str, ...]] = []  # the texts of each batched encoding
        self.prompt_cache = PromptEmbeddingCache(self._encode_texts)
        self.decoded: list[str] = []

    # ---------------------------------------------------------------- protocol
    def validate(self, params: GenerationParams) -> None:
        for name in ("width", "height"):
            value = getattr(params, name)
            if value % SCALE:
                raise ParamError(name, f"{name}={value} must be a multiple of {SCALE} for the toy model.")
        if params.num_frames != 1:
            raise ParamError("num_frames", f"num_frames={params.num_frames}: the toy model makes images, use 1.")

    def batch_key(self, params: GenerationParams) -> ToyBatchKey:
        if self.packs:
            return ToyBatchKey(width=None, height=None)
        return ToyBatchKey(width=params.width, height=params.height)

    def forward_size(self, params: GenerationParams) -> tuple[int, int]:
        """One row per request (no CFG), one token per latent cell."""
        return 1, (params.width // SCALE) * (params.height // SCALE)

    def encode_prompts(self, params: Sequence[GenerationParams]) -> None:
        for p in params:
            if "[fail:encode_prompts]" in p.prompt:
                raise RuntimeError("injected failure in encode_prompts for this prompt")
        self.prompt_cache.encode_many([p.prompt for p in params])

    def prepare_encode(self, state: RequestState) -> None:
        _maybe_fail(state, "prepare_encode")
        params = state.params
        state.conditioning = self.prompt_cache.encode(params.prompt)
        state.generator = torch.Generator().manual_seed(params.seed)
        shape = (LATENT_CHANNELS, params.height // SCALE, params.width // SCALE)
        state.latents = torch.randn(shape, generator=state.generator)
        state.noise_scheduler = copy.deepcopy(self._scheduler_template)
        state.noise_scheduler.set_timesteps(params.num_inference_steps)
        state.timesteps = state.noise_scheduler.timesteps
        state.step_index = 0
        if params.init_image is not None:
            self._start_from_image(state)
        self.encoded.append(state.request_id)

    def _start_from_image(self, state: RequestState) -> None:
        params, scheduler, noise = state.params, state.noise_scheduler, state.latents
        first = start_step(params.num_inference_steps, params.strength)
        scheduler.set_begin_index(first)
        state.timesteps = state.timesteps[first:]
        start = ToyImageStart(
            image_latents(params.init_image), noise,
            None if params.mask_image is None else mask_latents(params.mask_image),
        )
        state.extra = start
        state.latents = scheduler.scale_noise(start.image_latents[None], state.timesteps[:1], noise[None])[0]

    def denoise_step(self, batch: Batch) -> list[torch.Tensor]:
        for state in batch.states:
            _maybe_fail(state, "denoise_step")
        tokens = sum(self.forward_size(state.params)[1] for state in batch.states)
        if self.max_forward_tokens is not None and tokens > self.max_forward_tokens:
            raise torch.OutOfMemoryError(f"toy device: {tokens} tokens in one forward, room for {self.max_forward_tokens}")
        if self.on_forward is not None:
            self.on_forward(len(self.forward_log), batch)
        if any("[crash]" in state.params.prompt for state in batch.states):
            raise EngineCrash("injected crash of the engine thread")
        self.forward_log.append(batch.request_ids)
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        if len({s.latents.shape for s in batch.states}) > 1:  # a packing toy model: rows of any sizes
            return [self._velocity([s])[0] for s in batch.states]
        return self._velocity(batch.states)

    @staticmethod
    def _velocity(states: Sequence[RequestState]) -> list[torch.Tensor]:
        latents = torch.stack([s.latents for s in states])
        t = torch.stack([s.current_timestep for s in states]).float() / 1000.0
        cond = torch.stack([s.conditioning for s in states])
        # velocity = noise - x0 with x0 pulled towards the prompt's colour: row-local only.
        prediction = 0.5 * torch.tanh(latents) - cond[:, :, None, None] * (1.0 - 0.5 * t[:, None, None, None])
        return list(prediction.unbind(0))

    def step_scheduler(self, state: RequestState, prediction: torch.Tensor) -> None:
        _maybe_fail(state, "step_scheduler")
        out = state.noise_scheduler.step(prediction, state.current_timestep, state.latents, return_dict=False)
        state.latents = out[0]
        state.step_index += 1
        start = state.extra
        if isinstance(start, ToyImageStart) and start.mask is not None:
            keep = start.image_latents
            if not state.is_denoised:  # noised to the next step, as the scheduler now stands
                keep = state.noise_scheduler.scale_noise(keep[None], state.current_timestep[None], start.noise[None])[0]
            state.latents = (1 - start.mask) * keep + start.mask * state.latents
        if "[nan]" in state.params.prompt and state.step_index == 2:
            state.latents = state.latents * float("nan")

    def post_decode(self, state: RequestState) -> list[Image.Image]:
        _maybe_fail(state, "post_decode")
        self.decoded.append(state.request_id)
        image = self._to_image(state.latents, SCALE)
        params = state.params
        if params.mask_image is not None:  # black in the mask: the init image's own pixels
            image = Image.composite(image, params.init_image, params.mask_image.point(lambda v: 255 if v >= 128 else 0))
        return [image]

    def preview(self, state: RequestState) -> Image.Image:
        return self._to_image(state.latents, 1)

    def _encode_texts(self, texts: list[str]) -> list[torch.Tensor]:
        self.text_encoder_calls.append(tuple(texts))
        return [prompt_embedding(text) for text in texts]

    @staticmethod
    def _to_image(latents: torch.Tensor, scale: int) -> Image.Image:
        rgb = ((latents[:3].clamp(-2, 2) + 2) * (255 / 4)).round().to(torch.uint8)
        array = np.ascontiguousarray(rgb.permute(1, 2, 0).numpy())
        if scale > 1:
            array = array.repeat(scale, axis=0).repeat(scale, axis=1)
        return Image.fromarray(array, mode="RGB")

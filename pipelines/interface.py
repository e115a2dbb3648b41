"""The step protocol: how the engine drives a diffusion model one denoise step at a time.

One request's life, as the engine's runner sees it:

    prepare_encode(state)                  once: text encoding, initial latents, the
                                           request's OWN noise scheduler and timesteps
    [denoise_step(batch) -> predictions    one model forward for every row of the batch;
     step_scheduler(state, prediction)]    rows may be at different step indices
        x num_inference_steps
    post_decode(state) -> media            VAE decode + postprocess

Optionally, a pipeline also offers `encode_prompts(params)` (`BatchedPromptEncoding`): the
runner calls it once with every request joining a step, before their prepare_encode calls,
so their prompts share one text-encoder call.

A pipeline never decides who runs; the engine never looks inside a state's tensors.
Requests share a forward only when their `batch_key` is equal.

Classifier-free guidance, the same in every family (pipelines/cfg.py): a request with CFG
adds its negative (unconditional) row to the forward its positive row is in, and the rows
of one forward are laid out as

    [negative rows of the CFG requests, in batch order] + [positive rows of every request, in batch order]

so requests with and without CFG, with any guidance scales, share a forward (CFG is never
part of a batch key), and a lone CFG request is exactly diffusers' `cat([negative, positive])`.
`denoise_step` still returns ONE guided prediction per request.

Requests that start from an image (`GenerationParams.init_image`, `strength`, `mask_image`):
prepare_encode gives them the schedule's last steps only (`state.timesteps` holds the steps
that really run) and latents that start from the image, noised to the first of them; with a
mask, step_scheduler puts the unmasked part back after every step. A pipeline names the image
fields it takes in `PipelineInfo.image_inputs`; `validate` refuses the others. Optionally it
also offers `encode_images(params)` (`BatchedImageEncoding`): the runner calls it with every
request joining a step, so their init images share one VAE encoder call. Likewise
`post_decode_many(states)` (`BatchedDecoding`): the requests that finish in the same step share
one VAE decoder call per latent shape.

LoRA adapters (`GenerationParams.loras`): a pipeline that serves them lists the loaded ones in
`PipelineInfo.loras` and applies each row's own adapters inside `denoise_step`'s one forward
(pipelines/lora_rows.py); the adapters are never part of a batch key.

Images and videos (`PipelineInfo.output_kind`): an image model's `post_decode` returns one
image and its `preview` one small image; a video model's `post_decode` returns the video's
frames, in order, and its `preview` a LIST of small frames (one per latent frame).
"""

from __future__ import annotations

import contextlib

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Hashable, Literal, Protocol, Sequence, runtime_checkable

from pipelines.params import GenerationParams

if TYPE_CHECKING:  # torch is only needed by the concrete pipelines
    import torch
    from PIL import Image


@dataclass
class RequestState:
    """Everything one request carries between steps. Grouped by who writes each field."""

    # --- identity and parameters: written by the engine when the request is admitted ---
    request_id: str
    params: GenerationParams

    # --- conditioning: written by prepare_encode (text embeddings, CFG rows, ...) ---
    conditioning: Any = None

    # --- denoising progress: prepare_encode sets them, step_scheduler advances them ---
    latents: "torch.Tensor | None" = None
    timesteps: "torch.Tensor | None" = None
    step_index: int = 0
    # Steps (indices into timesteps) whose forward reused the request's cached residual instead of
    # running the model's later blocks (step caching, pipelines/step_cache.py; written by denoise_step).
    skipped_steps: list[int] = field(default_factory=list)
    # The request's own noise scheduler (a deep copy of a pristine template): never shared.
    noise_scheduler: Any = None
    generator: "torch.Generator | None" = None

    # --- model-private data (a pipeline-specific dataclass), opaque to the engine ---
    extra: Any = None

    @property
    def total_steps(self) -> int:
        return 0 if self.timesteps is None else len(self.timesteps)

    @property
    def is_denoised(self) -> bool:
        return self.timesteps is not None and self.step_index >= len(self.timesteps)

    @property
    def current_timestep(self) -> "torch.Tensor":
        return self.timesteps[self.step_index]


@dataclass(frozen=True)
class Batch:
    """The rows of one model forward, in order. Built by the runner for every step."""

    states: tuple[RequestState, ...]

    def __len__(self) -> int:
        return len(self.states)

    @property
    def request_ids(self) -> tuple[str, ...]:
        return tuple(s.request_id for s in self.states)


@dataclass(frozen=True)
class ModelDefaults:
    """Serving defaults of a checkpoint: what an unset GenerationParams field becomes."""

    width: int
    height: int
    num_inference_steps: int
    guidance_scale: float
    negative_prompt: str | None = None
    num_frames: int = 1
    fps: int | None = None  # frames per second of a video model's output; None for images
    example_prompts: tuple[str, ...] = ()
    # How much of the schedule a request with an init image runs when it does not say
    # (diffusers' FluxImg2ImgPipeline and StableDiffusion3Img2ImgPipeline default).
    strength: float = 0.6
    # Step caching threshold of a request that does not say (0 = off; pipelines/step_cache.py).
    step_cache: float = 0.0


@dataclass(frozen=True)
class PipelineInfo:
    """What the UI and the API may show about the loaded model (no tensors)."""

    name: str
    family: str
    output_kind: Literal["image", "video"]
    defaults: ModelDefaults
    uses_negative_prompt: bool
    size_multiple: int
    schedulers: tuple[str, ...] = ()
    # The only (width, height) pairs served, when the model's card names them; empty: any size
    # that is a multiple of size_multiple (within the server's limits).
    supported_sizes: tuple[tuple[int, int], ...] = ()
    # The smallest and largest width or height served (multiples of size_multiple), when the
    # model's card names them; None: any multiple (within the server's limits).
    size_range: tuple[int, int] | None = None
    # A video model's only frame counts served, when its card names them; empty: any its VAE takes.
    supported_frame_counts: tuple[int, ...] = ()
    # The GenerationParams image fields this model takes ("init_image", "mask_image"); empty:
    # it makes media from text only.
    image_inputs: tuple[str, ...] = ()
    # The LoRA adapters loaded for this model, by name (GenerationParams.loras names them).
    loras: tuple[str, ...] = ()
    # Whether a request may ask for step caching (GenerationParams.step_cache > 0).
    step_cache: bool = False
    # Stages drawn in the pipeline graph view, in order.
    stages: tuple[str, ...] = ("prompt", "encode", "denoise", "decode", "media")
    extras: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class StepPipeline(Protocol):
    """A model adapter the engine can drive step by step.

    `validate` and `batch_key` run on the caller's thread at submission (they must be pure);
    every other method runs only on the engine thread, which owns the device."""

    info: PipelineInfo

    def validate(self, params: GenerationParams) -> None:
        """Raise ValueError (naming field, value and what is allowed) for model-specific limits."""

    def batch_key(self, params: GenerationParams) -> Hashable:
        """A frozen value: requests share a forward only when their keys are equal."""

    def prepare_encode(self, state: RequestState) -> None:
        """Encode the prompt, make initial latents from the request's own generator,
        give the request its own noise scheduler and timesteps."""

    def denoise_step(self, batch: Batch) -> Sequence["torch.Tensor"]:
        """ONE forward for all rows (a model with several experts, Wan 2.2: one forward per
        expert that has rows); returns one prediction per row, in row order."""

    def step_scheduler(self, state: RequestState, prediction: "torch.Tensor") -> None:
        """Advance the request's latents with its own noise scheduler; step_index += 1."""

    def post_decode(self, state: RequestState) -> "list[Image.Image]":
        """Decode the final latents: [image] for an image model, every frame for a video model."""

    def preview(self, state: RequestState) -> "Image.Image | list[Image.Image] | None":
        """A cheap small RGB preview of the current prediction (no VAE decode), or None.
        Video models return a list of frames (see the module docstring)."""


@runtime_checkable
class BatchedPromptEncoding(Protocol):
    """Optional part of the protocol, for pipelines that keep a prompt cache."""

    def encode_prompts(self, params: Sequence[GenerationParams]) -> None:
        """Encode the texts of these requests in one batched call, into the pipeline's cache,
        so their prepare_encode calls find them. An optimisation only: when it raises, the
        runner logs it and each prepare_encode encodes (and fails) on its own."""


@runtime_checkable
class BatchedImageEncoding(Protocol):
    """Optional part of the protocol, for pipelines that VAE-encode init images."""

    def encode_images(self, params: Sequence[GenerationParams]) -> None:
        """VAE-encode the init images of these requests in as few calls as their sizes allow, so
        their prepare_encode calls find them. An optimisation only, like `encode_prompts`."""


@runtime_checkable
class BatchedDecoding(Protocol):
    """Optional part of the protocol, for pipelines that can VAE-decode several requests at once."""

    def post_decode_many(self, states: Sequence[RequestState]) -> "list[list[Image.Image]]":
        """post_decode of requests that finished denoising in the same step, in as few VAE calls as
        their latent shapes allow; one result per state, in order. An optimisation only: when it
        raises, the runner decodes each request on its own."""


@runtime_checkable
class StagedComponents(Protocol):
    """Optional part of the protocol, for pipelines whose text encoders or VAE may wait in host
    memory (a memory plan, pipelines/component_placement.py)."""

    def component_stage(self) -> "contextlib.AbstractContextManager[None]":
        """The runner holds the encodes of a step's joining requests, and the decodes of its
        finished ones, each inside one stage: a component brought to the device during the stage
        stays there until it ends, so it moves once per group, never once per request."""


def resolve_defaults(params: GenerationParams, defaults: ModelDefaults) -> GenerationParams:
    """Fill the fields a user left unset with the model's defaults (the seed stays as given).
    A request with an init image takes the image's size, and the model's default strength; it runs
    every step unless it asks for step caching itself: on the built-in model, caching made a light
    redraw (strength 0.3, 6 steps) follow its prompt's colour less often (38% of held-out pictures
    without, 29% at threshold 0.1: docs/benchmarks.md#step-caching)."""
    from dataclasses import replace

    image = params.init_image
    width, height = (defaults.width, defaults.height) if image is None else image.size
    strength = params.strength
    if image is not None and strength is None:
        strength = defaults.strength
    step_cache = params.step_cache
    if step_cache is None:
        step_cache = defaults.step_cache if image is None else 0.0
    return replace(
        params,
        width=width if params.width is None else params.width,
        height=height if params.height is None else params.height,
        strength=strength,
        num_inference_steps=(
            defaults.num_inference_steps if params.num_inference_steps is None else params.num_inference_steps
        ),
        guidance_scale=defaults.guidance_scale if params.guidance_scale is None else params.guidance_scale,
        negative_prompt=defaults.negative_prompt if params.negative_prompt is None else params.negative_prompt,
        num_frames=defaults.num_frames if params.num_frames is None else params.num_frames,
        step_cache=step_cache,
    )

"""What every model family does the same way: the step protocol over a loaded diffusers pipeline.

A family file subclasses `DiffusersStepPipeline` (or `FlowMatchStepPipeline`, pipelines/flow_match.py)
and says only what its model does differently, in the order of its diffusers `__call__`:

    _texts / _encode_texts     which texts a request encodes, and the batched text encoder
    _set_timesteps             the request's own scheduler's schedule
    _initial_latents           the request's noise, from its own generator
    _forward                   ONE denoiser forward over the rows of the CFG layout (pipelines/cfg.py)
    _vae_latents, _render_preview

and, for requests that start from an image (a family lists what it takes in `image_inputs`):

    _encode_images     ONE VAE encoder call over same-size init images (at join, cached by digest)
    _image_latents     one request's image latents, sampled from its own generator
    _noise             the request's raw noise; _noised_latents: the image noised to a timestep
    _mask_latents      the mask on the latent grid, for the per-step inpaint blend

The hooks every family must write are abstract methods: a family that misses one fails when
it is made, not at its first request.

This class owns the rest, once for every family: loading, the constructor, the prompt cache,
per-request scheduler set-up (a deep copy of a pristine template), the CFG row layout and
combine, the scheduler step, and the predicted x0 kept for previews; and, in
pipelines/image_start.py, diffusers' img2img/inpaint logic once for image-started requests.
"""

from __future__ import annotations

import abc
import copy
import functools
import inspect
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import torch
from PIL import Image

from pipelines.attention import select_attention_backend
from pipelines.cfg import CfgLayout, Row, linear_guidance
from pipelines.component_placement import ComponentPlacement
from pipelines.diffusers_api import check_relied_on
from pipelines.image_encoding import ImageEncodingCache
from pipelines.image_start import ImageStart
from pipelines.interface import Batch, ModelDefaults, PipelineInfo, RequestState
from pipelines.loader import LoadOptions, load_diffusers_pipeline
from pipelines.lora_adapters import read_adapter
from pipelines.lora_rows import RowLoras
from pipelines.packing import PackedModel
from pipelines.params import GenerationParams
from pipelines.prompt_cache import AdaptedText, BatchedPromptEncoder, PromptEmbeddingCache, PromptKey
from pipelines.step_cache import BlockStack, CachedRun, RowStepCache, StepCacheState, cached_requests, step_caching
from pipelines.studio_config import StudioConfig, read_studio_config
from pipelines.validation import check_image_params, check_scheduler_name


@dataclass
class Conditioning:
    """What prepare_encode computes once per request (RequestState.conditioning)."""

    positive: Any  # the family's text row for the prompt
    negative: Any | None  # the CFG (unconditional) row; None when this request runs without CFG
    guidance_scale: float

    @property
    def cfg(self) -> bool:
        return self.negative is not None


@dataclass
class RequestExtra:
    """Model-private per-request data (RequestState.extra); families add fields."""

    predicted_x0: torch.Tensor | None = None  # after the last step, kept only for previews
    # Where the request's steps start in its scheduler's own arrays (sigmas): 0 from noise.
    begin_index: int = 0
    # Inpainting only: the init image's latents, the request's noise and the mask (1 = repaint),
    # in the latents' layout, for the blend after every step.
    image_latents: torch.Tensor | None = None
    noise: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    # Step caching (pipelines/step_cache.py): this request's own memory; None when it runs uncached.
    step_cache: StepCacheState | None = None


@functools.lru_cache(maxsize=None)
def _step_accepts(scheduler_class: type) -> tuple[bool, bool]:
    """(accepts eta, accepts generator): not every scheduler's step takes them."""
    names = set(inspect.signature(scheduler_class.step).parameters)
    return "eta" in names, "generator" in names


def text_length(studio: StudioConfig, default: int, limit: int, label: str) -> int:
    """The T5 length a model is served with: stepstudio.json's, else the family's default."""
    length = studio.max_sequence_length or default
    if not 1 <= length <= limit:
        raise ValueError(f"max_sequence_length={length} is not allowed for {label}: use 1..{limit}.")
    return length


class DiffusersStepPipeline(ImageStart, BatchedPromptEncoder):
    """The shared half of every family (see the module docstring)."""

    family: str  # PipelineInfo.family
    label: str  # the model's name in error messages
    diffusers_class: type  # the diffusers pipeline from_pretrained loads
    output_kind = "image"
    # The GenerationParams image fields this family takes (PipelineInfo.image_inputs).
    image_inputs: tuple[str, ...] = ()
    # How the family's transformer runs its blocks, for step caching (None: it does not cache steps).
    block_stack: BlockStack | None = None
    # The family's packed forward (pipelines/packing.PackedModel; None: rows of one shape per forward).
    packed_model: PackedModel | None = None

    def __init__(
        self,
        pipe,
        device: torch.device,
        name: str,
        studio: StudioConfig | None = None,
        scheduler: str | None = None,
    ) -> None:
        """Every family's constructor: the loaded diffusers pipeline, its device, the model's
        name, its stepstudio.json and the default noise scheduler's name (None: the checkpoint's)."""
        self.pipe = pipe
        self.device = device
        self.name = name
        self.studio = studio or StudioConfig()
        self.vae = pipe.vae
        self.denoiser = self._denoiser(pipe)
        self.dtype = self.denoiser.dtype  # the serving dtype: the denoiser's, even when it stores float8
        # Where the text encoders and VAE wait between uses (pipelines/memory_placement.py sets both).
        self.placement = ComponentPlacement(device)
        self.memory_plan = "resident"
        self.schedulers = self._offered_schedulers(pipe.scheduler)
        if scheduler is not None:
            check_scheduler_name("scheduler", scheduler, self.schedulers)
        self.default_scheduler = scheduler
        # Pristine template: every request deep-copies it; nobody ever steps it.
        self._checkpoint_scheduler = copy.deepcopy(pipe.scheduler)
        self.prompt_cache = PromptEmbeddingCache(self._encode_prompt_keys)
        self.image_cache = ImageEncodingCache(self._encode_images)
        self.attention_backend = select_attention_backend(self.denoiser, device, self.dtype)
        self.step_cache = None if self.block_stack is None else RowStepCache(self.block_stack)
        self.loras = RowLoras({
            f"{component}.{inner}": module
            for component, model in self._adapter_components().items()
            for inner, module in model.named_modules() if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d))
        })

    @classmethod
    def from_pretrained(cls, path: str | Path, options: LoadOptions | None = None) -> "DiffusersStepPipeline":
        """Load a diffusers folder of this family (safetensors only)."""
        options = options or LoadOptions()
        path = Path(path)
        check_relied_on(cls.diffusers_class)
        pipe, device = load_diffusers_pipeline(cls.diffusers_class, path, options, cls.label, cls._load_kwargs)
        # Built in host memory; the loader then places it on the device by its memory plan.
        return cls(pipe, device, path.name, read_studio_config(path), options.scheduler)

    @classmethod
    def _load_kwargs(cls, path: Path, dtype: torch.dtype) -> dict[str, Any]:
        """More from_pretrained arguments for this family."""
        return {}

    def _denoiser(self, pipe) -> torch.nn.Module:
        return pipe.transformer

    def _denoiser_components(self) -> dict[str, torch.nn.Module]:
        """The denoisers by their diffusers component name, as LoRA files name them."""
        names = ("transformer", "transformer_2", "unet")
        return {name: getattr(self.pipe, name) for name in names if getattr(self.pipe, name, None) is not None}

    def _adapter_components(self) -> dict[str, torch.nn.Module]:
        """What a LoRA file may change: the denoisers, and the text encoders this family's
        diffusers loader adapts too (its `_lora_loadable_modules`: CLIP, never T5)."""
        loadable = getattr(type(self.pipe), "_lora_loadable_modules", ())
        text_encoders = {name: getattr(self.pipe, name) for name in loadable
                         if name.startswith("text_encoder") and isinstance(getattr(self.pipe, name, None), torch.nn.Module)}
        return {**self._denoiser_components(), **text_encoders}

    def load_lora(self, name: str, path: str | Path) -> None:
        """Serve the LoRA adapter in `path` as `name` (pipelines/lora_adapters.py; LoraFileError
        when it does not fit this model). Requests name it in GenerationParams.loras."""
        stored_in_fp8 = self.memory_plan in ("fp8", "lowvram")  # its layers' own dtype is float8: use the serving one
        self.loras.add(read_adapter(name, path, self.pipe, self._adapter_components(), self.device,
                                    self.dtype if stored_in_fp8 else None))
        self.info = replace(self.info, loras=self.loras.names)

    def component_stage(self):
        """StagedComponents: components brought to the device stay until the stage ends."""
        return self.placement.stage()

    @property
    def denoisers(self) -> tuple[torch.nn.Module, ...]:
        """Every transformer or UNet this pipeline runs (what `--compile` compiles)."""
        return (self.denoiser,)

    @abc.abstractmethod
    def _offered_schedulers(self, checkpoint_scheduler) -> tuple[str, ...]:
        """The noise schedulers a request may name, the default first."""

    def _pipeline_info(
        self, defaults: ModelDefaults, size_multiple: int, uses_negative_prompt: bool = True, **extras: str
    ) -> PipelineInfo:
        if self.step_cache is None:
            defaults = replace(defaults, step_cache=0.0)
        return PipelineInfo(
            name=self.name,
            family=self.family,
            output_kind=self.output_kind,
            defaults=defaults,
            uses_negative_prompt=uses_negative_prompt,
            size_multiple=size_multiple,
            schedulers=self.schedulers,
            supported_sizes=self.studio.sizes,
            size_range=self.studio.size_range, supported_frame_counts=self.studio.frame_counts,
            image_inputs=self.image_inputs,
            step_cache=self.step_cache is not None,
            extras={
                **extras,
                "default_scheduler": self.default_scheduler or self.schedulers[0],
                "attention": self.attention_backend,
                "preview": self.preview_projection.source,
                "vocabulary": " ".join(sorted(self.studio.vocabulary)),
            },
        )

    # ------------------------------------------------------------------ words
    def unknown_words(self, prompt: str) -> list[str]:
        """Words the model never learned (only for models whose stepstudio.json lists a vocabulary)."""
        return self.studio.unknown_words(prompt)

    def _model_text(self, text: str) -> str:
        # A model with a vocabulary was trained on lower-case captions only.
        return text.lower() if self.studio.vocabulary else text

    # ------------------------------------------------------------------ prompts
    @abc.abstractmethod
    def _uses_cfg(self, params: GenerationParams) -> bool:
        """Whether this request runs classifier-free guidance (its negative row joins the forward)."""

    def _negative_text(self, params: GenerationParams) -> str | None:
        """The text of the CFG row; None: no text, the family's `_unconditional` row instead."""
        return params.negative_prompt or ""  # diffusers encodes "" when there is no negative prompt

    def _texts(self, params: GenerationParams) -> list[PromptKey]:
        """The prompt, and with CFG the negative text (if one is encoded), as the encoders see them:
        with the request's text-encoder adapters, if it names any (a cache entry of their own)."""
        texts = [self._model_text(params.prompt)]
        negative = self._negative_text(params) if self._uses_cfg(params) else None
        if negative is not None:
            texts.append(self._model_text(negative))
        # diffusers' load_lora_weights adapts the text encoder for every text, the negative one too.
        adapters = tuple(sorted((use for use in params.loras if self.loras.adapters[use.name].changes_text_encoder),
                                key=lambda use: (use.name, use.scale)))
        return [AdaptedText(text, adapters) for text in texts] if adapters else texts

    def _encode_prompt_keys(self, keys: list[PromptKey]) -> list[Any]:
        """The texts through the family's batched encoder, each row with its own text-encoder
        adapters (the hooks of pipelines/lora_rows.py, as in a denoiser forward)."""
        texts = [key.text if isinstance(key, AdaptedText) else key for key in keys]
        row_loras = [key.loras if isinstance(key, AdaptedText) else () for key in keys]
        with self.loras.rows(row_loras, self.device, self.dtype), self.placement.using("text_encoders"):
            return self._encode_texts(texts)

    @abc.abstractmethod
    def _encode_texts(self, texts: list[str]) -> list[Any]:
        """The family's text encoders over several texts at once: one text row per text."""

    def _unconditional(self, positive: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} encodes a text for every CFG row.")

    def _conditioning(self, params: GenerationParams) -> Conditioning:
        positive, *negative = self.prompt_cache.encode_many(self._texts(params))
        uncond = None
        if self._uses_cfg(params):
            uncond = negative[0] if negative else self._unconditional(positive)
        return Conditioning(positive, uncond, float(params.guidance_scale))

    # ------------------------------------------------------------------ protocol
    def forward_size(self, params: GenerationParams) -> tuple[int, int]:
        """(rows, latent tokens per row) one request puts in a forward, for the engine's cost:
        a CFG request brings its negative row; guidance-embedding models never do."""
        multiple = max(1, self.info.size_multiple)
        tokens = math.ceil(params.width / multiple) * math.ceil(params.height / multiple) * max(1, params.num_frames or 1)
        return (2 if self._uses_cfg(params) else 1), tokens

    def validate(self, params: GenerationParams) -> None:
        check_image_params(params, self.label, self.info.size_multiple, self.schedulers)

    @torch.no_grad()
    def prepare_encode(self, state: RequestState) -> None:
        params = state.params
        state.conditioning = self._conditioning(params)
        # The request's own scheduler, never shared; its own schedule from step 0.
        scheduler = copy.deepcopy(self._scheduler_template(params))
        timesteps = self._set_timesteps(scheduler, params)
        # From an image: only the schedule's last steps (diffusers' get_timesteps).
        begin = 0 if params.init_image is None else self._start_step(params) * scheduler.order
        if hasattr(scheduler, "set_begin_index"):
            scheduler.set_begin_index(begin)
        state.timesteps = timesteps[begin:] if begin else timesteps
        state.noise_scheduler = scheduler
        state.step_index = 0
        # The request's own generator: the same seed gives the same noise as the stock pipeline.
        state.generator = torch.Generator(device=self.device).manual_seed(params.seed)
        state.extra = self._request_extra(state)
        state.extra.begin_index = begin
        if params.step_cache and self.step_cache is not None:
            state.extra.step_cache = StepCacheState()
        state.latents = self._initial_latents(state) if params.init_image is None else self._latents_from_image(state)

    def _scheduler_template(self, params: GenerationParams):
        return self._checkpoint_scheduler

    @abc.abstractmethod
    def _set_timesteps(self, scheduler, params: GenerationParams) -> torch.Tensor:
        """Set the request's own scheduler's schedule; returns its timesteps."""

    def _request_extra(self, state: RequestState) -> RequestExtra:
        return RequestExtra()

    @abc.abstractmethod
    def _initial_latents(self, state: RequestState) -> torch.Tensor:
        """The request's starting noise, from its own generator."""

    # ------------------------------------------------------------------ forward
    @torch.no_grad()
    def denoise_step(self, batch: Batch) -> list[torch.Tensor]:
        return self._guided_forward(batch.states, self.denoiser)

    def _guided_forward(self, states: Sequence[RequestState], denoiser: torch.nn.Module) -> list[torch.Tensor]:
        """One forward of `denoiser` over the CFG layout of `states`; one guided prediction each."""
        # Where rows may pack, requests of one shape side by side (stable: one shape keeps its order).
        by_shape = (lambda state: self._row_shape(Row(state, state.conditioning.positive))) if self.packs else None
        layout = CfgLayout.of(states, order_by=by_shape)
        packed = self._runs_packed(layout.rows)
        # Each row with its request's adapters (both rows of a CFG request), on shared base weights.
        with self.loras.rows([row.state.params.loras for row in layout.rows], self.device, self.dtype):
            if packed:
                requests = None if self.step_cache is None else cached_requests(layout)
                run = None if requests is None else self.step_cache.decisions(requests, self.loras.only_rows, id(denoiser))
                prediction = self._packed_forward(denoiser, layout.rows, run)
            else:
                with step_caching(self.step_cache, denoiser, layout, self.loras.only_rows):
                    prediction = self._forward(denoiser, layout.rows)
        return layout.combine(prediction, self._guide)

    @functools.cached_property
    def packs(self) -> bool:
        """Whether rows of different sizes share a forward (packed, pipelines/packing.py): the family
        has a packed forward, and its attention runs through our own per-row kernels (SDPA or
        flash-attn, stock processors). Set it to False to make sizes take turns."""
        return (self.packed_model is not None and self.attention_backend in ("native", "flash")
                and all(self._packable(denoiser) for denoiser in self.denoisers))

    def _packable(self, denoiser: torch.nn.Module) -> bool:
        return False  # whether the denoiser's modules are the stock ones the packed forward reproduces

    def _row_shape(self, row: Row) -> tuple:
        """What a forward's rows must share to be stacked (their latents' and text's shapes)."""
        return tuple(row.state.latents.shape)

    def _runs_packed(self, rows: Sequence[Row]) -> bool:  # one packed forward instead of `_forward`
        return self.packs and len({self._row_shape(row) for row in rows}) > 1

    def _packed_forward(self, denoiser: torch.nn.Module, rows: Sequence[Row], run: CachedRun | None) -> list[torch.Tensor]:
        """ONE packed forward over rows of different sizes: one prediction per row, in row order;
        `run` runs the blocks when a request caches steps (pipelines/step_cache.CachedRun)."""
        model = self.packed_model
        return model.forward(denoiser, [self._packed_row(row) for row in rows], self.loras.tokens,
                             model.blocks_runner(denoiser, run))

    def _packed_row(self, row: Row):  # one row as the family's packed forward takes it (FluxRow, WanRow)
        raise NotImplementedError(f"{type(self).__name__} does not pack rows of different sizes.")

    @abc.abstractmethod
    def _forward(self, denoiser: torch.nn.Module, rows: Sequence[Row]) -> torch.Tensor:
        """ONE forward of `denoiser` over the rows of the CFG layout (pipelines/cfg.py), in row order."""

    _guide = staticmethod(linear_guidance)

    @torch.no_grad()
    def step_scheduler(self, state: RequestState, prediction: torch.Tensor) -> None:
        scheduler, latents = state.noise_scheduler, state.latents
        accepts_eta, accepts_generator = _step_accepts(type(scheduler))
        kwargs: dict[str, Any] = {}
        if accepts_eta:
            kwargs["eta"] = 0.0  # __call__'s default
        if accepts_generator:  # stochastic schedulers draw from the request's own generator
            kwargs["generator"] = state.generator
        output = scheduler.step(prediction, state.current_timestep, latents, **kwargs)
        if state.params.preview_every:
            state.extra.predicted_x0 = self._predicted_x0(state, latents, prediction, output)
        state.latents = output.prev_sample
        state.step_index += 1
        if state.extra.mask is not None:
            state.latents = self._inpaint_blend(state)

    @abc.abstractmethod
    def _predicted_x0(self, state: RequestState, latents, prediction, output) -> torch.Tensor | None:
        """The clean latents this step predicts, for previews (None: nothing to show)."""

    @torch.no_grad()
    def decode(self, state: RequestState, output_type: str = "pil"):
        """The stock pipeline's VAE decode and postprocess of the request's latents: "pil", "np" or "pt"."""
        return self._decode_latents(self._vae_latents(state), output_type)[0]

    def post_decode(self, state: RequestState) -> "list[Image.Image]":
        return self.decode(state, output_type="pil")

    @torch.no_grad()
    def post_decode_many(self, states: Sequence[RequestState]) -> "list[list[Image.Image]]":
        """post_decode of several finished requests: ONE VAE call per latent shape (BatchedDecoding)."""
        by_shape: dict[tuple[int, ...], list[tuple[int, torch.Tensor]]] = {}
        for index, state in enumerate(states):
            latents = self._vae_latents(state)
            by_shape.setdefault(tuple(latents.shape), []).append((index, latents))
        results: list = [None] * len(states)
        for items in by_shape.values():
            decoded = self._decode_latents(torch.cat([latents for _, latents in items]), "pil")
            for (index, _), media in zip(items, decoded):
                results[index] = list(media)
        return results

    def _decode_latents(self, latents: torch.Tensor, output_type: str) -> list:
        """ONE VAE decode and postprocess of rows of VAE latents: one request's media per row."""
        with self.placement.using("vae"):
            images = self.vae.decode(latents, return_dict=False)[0]
        media = self.pipe.image_processor.postprocess(self._decoded(images), output_type=output_type)
        return [media[row : row + 1] for row in range(len(latents))]

    @abc.abstractmethod
    def _vae_latents(self, state: RequestState) -> torch.Tensor:
        """The request's final latents as the VAE takes them (un-normalized, unpacked)."""

    def _decoded(self, image: torch.Tensor) -> torch.Tensor:
        return image

    @torch.no_grad()
    def preview(self, state: RequestState) -> "Image.Image | list[Image.Image] | None":
        x0 = state.extra.predicted_x0 if state.extra is not None else None
        return None if x0 is None else self._render_preview(x0, state.params)

    def _render_preview(self, x0: torch.Tensor, params: GenerationParams) -> "Image.Image | list[Image.Image]":
        return self.preview_projection.render(x0[0])

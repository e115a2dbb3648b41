"""FLUX.1 as a step pipeline: diffusers' FluxPipeline pieces, our own step loop.

Reads top to bottom like `FluxPipeline.__call__`, cut at the step boundaries:

    prepare_encode   encode_prompt (and the negative prompt for true CFG) through the prompt
                     cache, the request's own generator -> prepare_latents (packed 2x2),
                     its own FlowMatchEuler scheduler with the per-request `mu` of
                     dynamic shifting
    encode_prompts   the texts of a step's joiners in one encode_prompt call (optional protocol)
    denoise_step     ONE transformer forward for every row and every CFG negative row
    step_scheduler   the request's scheduler.step; remembers x0 for the preview
    post_decode      unpack, un-normalize, VAE decode, postprocess to PIL

Guidance, with our one `guidance_scale` knob:
- guidance-distilled checkpoints (FLUX.1-dev style, `transformer.config.guidance_embeds`)
  get it as the embedded guidance of each row; there is no negative prompt.
- the others (FLUX.1-schnell style, and the built-in model) use it as FluxPipeline's
  `true_cfg_scale`: true CFG is on when it is > 1 and the request has a negative prompt.

Co-batching: Flux's `img_ids`/`txt_ids` are shared 2-D tensors, so one forward can't mix
resolutions or text lengths; the batch key is (height, width, max_sequence_length). Guidance
scales and CFG are per row (a CFG request just adds its negative row), so they are not in
the key: a CFG and a non-CFG request at the same size share a forward.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from diffusers import FluxPipeline
from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps
from PIL import Image

from pipelines.attention import select_attention_backend
from pipelines.flow_match import combine_interleaved_cfg, flow_match_step
from pipelines.interface import Batch, ModelDefaults, PipelineInfo, RequestState
from pipelines.latent_preview import LatentRgbProjection, projection_for
from pipelines.loader import LoadOptions, load_diffusers_pipeline
from pipelines.params import GenerationParams
from pipelines.prompt_cache import BatchedPromptEncoder, PromptEmbeddingCache, split_rows
from pipelines.validation import check_image_params, check_scheduler_name
from pipelines.studio_config import StudioConfig, read_studio_config

log = logging.getLogger(__name__)

FLOW_MATCH_EULER = "flow-match-euler"
SCHEDULERS = (FLOW_MATCH_EULER,)  # the checkpoint's own; FluxPipeline's sigmas and mu assume it
MAX_SEQUENCE_LENGTH = 512  # FluxPipeline's limit for the T5 prompt


@dataclass(frozen=True)
class FluxBatchKey:
    height: int
    width: int
    max_sequence_length: int


@dataclass
class FluxConditioning:
    """What prepare_encode computes once per request (tensors on the pipeline's device)."""

    prompt_embeds: torch.Tensor  # [1, max_sequence_length, joint_attention_dim]
    pooled_prompt_embeds: torch.Tensor  # [1, pooled_projection_dim]
    guidance_scale: float
    # Present only when true CFG is on for this request.
    negative_prompt_embeds: torch.Tensor | None = None
    negative_pooled_prompt_embeds: torch.Tensor | None = None

    @property
    def true_cfg(self) -> bool:
        return self.negative_prompt_embeds is not None


@dataclass
class FluxRequestData:
    """Model-private per-request data (RequestState.extra)."""

    latent_image_ids: torch.Tensor  # [image tokens, 3], the same for every request of this size
    text_ids: torch.Tensor  # [max_sequence_length, 3], zeros
    mu: float  # dynamic-shifting parameter of this request's schedule
    predicted_x0: torch.Tensor | None = None  # packed, after the last step (kept only for previews)


def _serving_defaults(studio: StudioConfig, guidance_embeds: bool, default_size: int) -> ModelDefaults:
    # Without stepstudio.json: FLUX.1-dev's recommended 28 steps at guidance 3.5; a schnell-style
    # model is distilled for 4 steps without CFG (guidance 0, as in diffusers' schnell example).
    return studio.model_defaults(
        default_size, num_inference_steps=28 if guidance_embeds else 4, guidance_scale=3.5 if guidance_embeds else 0.0
    )


def _default_max_sequence_length(pipe: FluxPipeline, guidance_embeds: bool) -> int:
    # FLUX.1-dev was trained with 512 T5 tokens, schnell with 256; never more than the tokenizer holds.
    length = MAX_SEQUENCE_LENGTH if guidance_embeds else 256
    tokenizer_limit = getattr(pipe.tokenizer_2, "model_max_length", None)
    if isinstance(tokenizer_limit, int) and 0 < tokenizer_limit < length:
        length = tokenizer_limit
    return length


class FluxStepPipeline(BatchedPromptEncoder):
    """A FLUX.1 checkpoint driven one denoise step at a time (see the module docstring)."""

    def __init__(
        self,
        pipe: FluxPipeline,
        device: torch.device,
        name: str = "flux",
        studio: StudioConfig | None = None,
        attention_backend: str | None = None,
    ) -> None:
        self.pipe = pipe
        self.device = device
        self.studio = studio or StudioConfig()
        self.transformer = pipe.transformer
        self.vae = pipe.vae
        self.vae_scale_factor = pipe.vae_scale_factor
        self.guidance_embeds = bool(self.transformer.config.guidance_embeds)
        self.max_sequence_length = self.studio.max_sequence_length or _default_max_sequence_length(
            pipe, self.guidance_embeds
        )
        if not 1 <= self.max_sequence_length <= MAX_SEQUENCE_LENGTH:
            raise ValueError(
                f"max_sequence_length={self.max_sequence_length} is not allowed for FLUX: use 1..{MAX_SEQUENCE_LENGTH}."
            )
        # Pristine template: every request deep-copies it; nobody ever steps it.
        self._scheduler_template = copy.deepcopy(pipe.scheduler)
        self.prompt_cache = PromptEmbeddingCache(self._encode_texts)
        self.attention_backend = select_attention_backend(self.transformer, device, self.transformer.dtype, attention_backend)
        self.preview_projection: LatentRgbProjection = projection_for(
            self.vae, self.studio, self.vae_scale_factor
        )
        default_size = pipe.default_sample_size * self.vae_scale_factor  # 1024 for FLUX.1
        defaults = _serving_defaults(self.studio, self.guidance_embeds, default_size)
        self.info = PipelineInfo(
            name=name,
            family="flux",
            output_kind="image",
            defaults=defaults,
            uses_negative_prompt=not self.guidance_embeds,
            size_multiple=self.vae_scale_factor * 2,
            schedulers=SCHEDULERS,
            extras={
                "guidance": "embedded guidance (guidance-distilled)" if self.guidance_embeds
                else "true CFG when guidance_scale > 1 and a negative prompt is given",
                "max_sequence_length": str(self.max_sequence_length),
                "attention": self.attention_backend,
                "preview": self.preview_projection.source,
                "vocabulary": " ".join(sorted(self.studio.vocabulary)),
            },
        )

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        options: LoadOptions | None = None,
        *,
        attention_backend: str | None = None,
    ) -> "FluxStepPipeline":
        """Load a diffusers FLUX folder (safetensors only).

        `attention_backend`: a diffusers attention backend name ("native" = PyTorch SDPA,
        "flash", ...); None picks flash-attn when installed on CUDA, SDPA otherwise.
        Compiling the transformer is `LoadOptions(compile_denoiser=True)` (see pipelines/loader.py)."""
        options = options or LoadOptions()
        path = Path(path)
        if options.scheduler is not None:
            check_scheduler_name("scheduler", options.scheduler, SCHEDULERS)
        studio = read_studio_config(path)
        pipe, device = load_diffusers_pipeline(FluxPipeline, path, options, "FLUX")
        return cls(
            pipe,
            device,
            name=path.name,
            studio=studio,
            attention_backend=attention_backend,
        )

    # ------------------------------------------------------------------ words
    def unknown_words(self, prompt: str) -> list[str]:
        """Words the model never learned (only for models whose stepstudio.json lists a vocabulary)."""
        return self.studio.unknown_words(prompt)

    def _model_text(self, text: str) -> str:
        # A model with a vocabulary was trained on lower-case captions only.
        return text.lower() if self.studio.vocabulary else text

    def _uses_true_cfg(self, params: GenerationParams) -> bool:
        return not self.guidance_embeds and params.guidance_scale > 1.0 and params.negative_prompt is not None

    def _texts(self, params: GenerationParams) -> list[str]:
        """The prompt, and the negative prompt when true CFG is on, as the text encoders see them."""
        texts = [self._model_text(params.prompt)]
        if self._uses_true_cfg(params):
            texts.append(self._model_text(params.negative_prompt))
        return texts

    @torch.no_grad()
    def _encode_texts(self, texts: list[str]) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """FluxPipeline.encode_prompt for several texts at once, split back into one entry per text."""
        prompt_embeds, pooled, text_ids = self.pipe.encode_prompt(
            prompt=texts, prompt_2=None, device=self.device, max_sequence_length=self.max_sequence_length
        )
        rows = split_rows(len(texts), prompt_embeds, pooled)
        return [(embeds, pooled_row, text_ids) for embeds, pooled_row in rows]  # text_ids: zeros, shared

    # ------------------------------------------------------------------ protocol
    def validate(self, params: GenerationParams) -> None:
        check_image_params(params, "FLUX", self.vae_scale_factor * 2, SCHEDULERS)

    def batch_key(self, params: GenerationParams) -> FluxBatchKey:
        return FluxBatchKey(height=params.height, width=params.width, max_sequence_length=self.max_sequence_length)

    @torch.no_grad()
    def prepare_encode(self, state: RequestState) -> None:
        params = state.params
        pipe = self.pipe
        texts = self._texts(params)
        (prompt_embeds, pooled_prompt_embeds, text_ids), *negative = self.prompt_cache.encode_many(texts)
        conditioning = FluxConditioning(prompt_embeds, pooled_prompt_embeds, float(params.guidance_scale))
        if negative:
            conditioning.negative_prompt_embeds, conditioning.negative_pooled_prompt_embeds, _ = negative[0]
        state.conditioning = conditioning

        # The request's own generator: the same seed gives the same noise as FluxPipeline.
        state.generator = torch.Generator(device=self.device).manual_seed(params.seed)
        latents, latent_image_ids = pipe.prepare_latents(
            1,
            self.transformer.config.in_channels // 4,
            params.height,
            params.width,
            prompt_embeds.dtype,
            self.device,
            state.generator,
        )
        state.latents = latents

        # The request's own scheduler, with FluxPipeline's sigmas and this image size's mu.
        scheduler = copy.deepcopy(self._scheduler_template)
        steps = params.num_inference_steps
        sigmas = None if scheduler.config.get("use_flow_sigmas") else np.linspace(1.0, 1 / steps, steps)
        mu = calculate_shift(
            latents.shape[1],
            scheduler.config.get("base_image_seq_len", 256),
            scheduler.config.get("max_image_seq_len", 4096),
            scheduler.config.get("base_shift", 0.5),
            scheduler.config.get("max_shift", 1.15),
        )
        state.timesteps, _ = retrieve_timesteps(scheduler, steps, self.device, sigmas=sigmas, mu=mu)
        scheduler.set_begin_index(0)
        state.noise_scheduler = scheduler
        state.step_index = 0
        state.extra = FluxRequestData(latent_image_ids=latent_image_ids, text_ids=text_ids, mu=mu)

    @torch.no_grad()
    def denoise_step(self, batch: Batch) -> list[torch.Tensor]:
        latents, embeds, pooled, timesteps, guidance = [], [], [], [], []
        for state in batch.states:
            c: FluxConditioning = state.conditioning
            rows = [(c.prompt_embeds, c.pooled_prompt_embeds)]
            if c.true_cfg:  # the negative row rides in the same forward
                rows.append((c.negative_prompt_embeds, c.negative_pooled_prompt_embeds))
            for row_embeds, row_pooled in rows:
                latents.append(state.latents)
                embeds.append(row_embeds)
                pooled.append(row_pooled)
                timesteps.append(state.current_timestep)
                guidance.append(c.guidance_scale)

        hidden_states = torch.cat(latents)
        # Per-row timestep [rows], cast like FluxPipeline (latents' dtype, then / 1000).
        timestep = torch.stack(timesteps).to(device=hidden_states.device, dtype=hidden_states.dtype)
        first: FluxRequestData = batch.states[0].extra  # ids are equal across the batch (batch key)
        noise_pred = self.transformer(
            hidden_states=hidden_states,
            timestep=timestep / 1000,
            guidance=(
                torch.tensor(guidance, device=hidden_states.device, dtype=torch.float32)
                if self.guidance_embeds else None
            ),
            pooled_projections=torch.cat(pooled),
            encoder_hidden_states=torch.cat(embeds),
            txt_ids=first.text_ids,
            img_ids=first.latent_image_ids,
            joint_attention_kwargs={},
            return_dict=False,
        )[0]

        return combine_interleaved_cfg(
            noise_pred, [(s.conditioning.true_cfg, s.conditioning.guidance_scale) for s in batch.states]
        )

    @torch.no_grad()
    def step_scheduler(self, state: RequestState, prediction: torch.Tensor) -> None:
        flow_match_step(state, prediction)

    @torch.no_grad()
    def decode(self, state: RequestState, output_type: str = "pil"):
        """FluxPipeline's decode of the request's latents: "pil", "np" or "pt" output."""
        params = state.params
        latents = self.pipe._unpack_latents(state.latents, params.height, params.width, self.vae_scale_factor)
        latents = (latents / self.vae.config.scaling_factor) + self.vae.config.shift_factor
        image = self.vae.decode(latents.to(self.vae.device), return_dict=False)[0]
        return self.pipe.image_processor.postprocess(image, output_type=output_type)

    def post_decode(self, state: RequestState) -> list[Image.Image]:
        return self.decode(state, output_type="pil")

    @torch.no_grad()
    def preview(self, state: RequestState) -> Image.Image:
        """The predicted x0 on the latent grid (height / vae_scale_factor), linearly mapped to RGB."""
        params = state.params
        packed = state.extra.predicted_x0 if state.extra.predicted_x0 is not None else state.latents
        grid = self.pipe._unpack_latents(packed, params.height, params.width, self.vae_scale_factor)
        return self.preview_projection.render(grid[0])

"""Stable Diffusion 3 / 3.5 as a step pipeline: diffusers' StableDiffusion3Pipeline pieces, our own step loop.

Reads top to bottom like `StableDiffusion3Pipeline.__call__`, cut at the step boundaries:

    prepare_encode   encode_prompt: two CLIPs + T5 joint text, and the negative prompt for CFG,
                     through the prompt cache (pipelines/prompt_cache.py);
                     the request's own generator -> prepare_latents; its own FlowMatchEuler
                     scheduler with the checkpoint's shift (and `mu` if it shifts dynamically)
    denoise_step     ONE joint-transformer forward for every row and every CFG negative row
    step_scheduler   the request's scheduler.step; remembers x0 for the preview
    post_decode      un-normalize, VAE decode, postprocess to PIL
    encode_prompts   the texts of a step's joiners in one encode_prompt call (optional protocol)

CFG is on when guidance_scale > 1 (SD3's rule); a missing negative prompt is "" as in
diffusers. Rows carry their own timestep and guidance scale, and the text length is fixed
(77 CLIP + max_sequence_length T5 tokens), so the batch key is just the image size.
Skip-layer guidance (SD3.5 medium's optional extra forward) is not offered.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch
from diffusers import StableDiffusion3Pipeline
from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import calculate_shift, retrieve_timesteps
from PIL import Image

from pipelines.attention import select_attention_backend
from pipelines.flow_match import combine_interleaved_cfg, flow_match_step
from pipelines.interface import Batch, PipelineInfo, RequestState
from pipelines.latent_preview import LatentRgbProjection, projection_for
from pipelines.loader import LoadOptions, load_diffusers_pipeline
from pipelines.params import GenerationParams
from pipelines.prompt_cache import BatchedPromptEncoder, PromptEmbeddingCache, split_rows
from pipelines.validation import check_image_params, check_scheduler_name
from pipelines.studio_config import StudioConfig, read_studio_config

FLOW_MATCH_EULER = "flow-match-euler"
SCHEDULERS = (FLOW_MATCH_EULER,)  # the checkpoint's own, with its shift
MAX_SEQUENCE_LENGTH = 512  # StableDiffusion3Pipeline's limit for the T5 prompt
DEFAULT_SEQUENCE_LENGTH = 256  # StableDiffusion3Pipeline's default


@dataclass(frozen=True)
class SD3BatchKey:
    height: int
    width: int
    max_sequence_length: int


@dataclass
class SD3Conditioning:
    prompt_embeds: torch.Tensor  # [1, 77 + max_sequence_length, joint_attention_dim]
    pooled_prompt_embeds: torch.Tensor  # [1, pooled_projection_dim]
    guidance_scale: float
    # Present only when CFG is on for this request.
    negative_prompt_embeds: torch.Tensor | None = None
    negative_pooled_prompt_embeds: torch.Tensor | None = None

    @property
    def cfg(self) -> bool:
        return self.negative_prompt_embeds is not None


@dataclass
class SD3RequestData:
    """Model-private per-request data (RequestState.extra)."""

    mu: float | None  # dynamic-shifting parameter, None for a fixed shift
    predicted_x0: torch.Tensor | None = None  # after the last step (kept only for previews)


class SD3StepPipeline(BatchedPromptEncoder):
    """A Stable Diffusion 3 checkpoint driven one denoise step at a time (see the module docstring)."""

    def __init__(
        self,
        pipe: StableDiffusion3Pipeline,
        device: torch.device,
        name: str = "sd3",
        studio: StudioConfig | None = None,
    ) -> None:
        self.pipe = pipe
        self.device = device
        self.studio = studio or StudioConfig()
        self.transformer = pipe.transformer
        self.vae = pipe.vae
        self.vae_scale_factor = pipe.vae_scale_factor
        self.size_multiple = pipe.vae_scale_factor * pipe.patch_size
        self.max_sequence_length = self.studio.max_sequence_length or DEFAULT_SEQUENCE_LENGTH
        if not 1 <= self.max_sequence_length <= MAX_SEQUENCE_LENGTH:
            raise ValueError(
                f"max_sequence_length={self.max_sequence_length} is not allowed for SD3: use 1..{MAX_SEQUENCE_LENGTH}."
            )
        # Pristine template: every request deep-copies it; nobody ever steps it.
        self._scheduler_template = copy.deepcopy(pipe.scheduler)
        self.prompt_cache = PromptEmbeddingCache(self._encode_texts)
        self.attention_backend = select_attention_backend(self.transformer, device, self.transformer.dtype)
        self.preview_projection: LatentRgbProjection = projection_for(self.vae, self.studio, self.vae_scale_factor)
        default_size = pipe.default_sample_size * self.vae_scale_factor
        self.info = PipelineInfo(
            name=name,
            family="sd3",
            output_kind="image",
            # StableDiffusion3Pipeline's own defaults: 1024^2 for SD3, 28 steps, guidance 7.
            defaults=self.studio.model_defaults(default_size, num_inference_steps=28, guidance_scale=7.0),
            uses_negative_prompt=True,
            size_multiple=self.size_multiple,
            schedulers=SCHEDULERS,
            extras={
                "guidance": "CFG when guidance_scale > 1 (negative prompt rows share the forward)",
                "max_sequence_length": str(self.max_sequence_length),
                "shift": str(pipe.scheduler.config.get("shift")),
                "attention": self.attention_backend,
                "preview": self.preview_projection.source,
                "vocabulary": " ".join(sorted(self.studio.vocabulary)),
            },
        )

    @classmethod
    def from_pretrained(
        cls, path: str | Path, options: LoadOptions | None = None
    ) -> "SD3StepPipeline":
        """Load a diffusers SD3 folder (safetensors only)."""
        options = options or LoadOptions()
        path = Path(path)
        if options.scheduler is not None:
            check_scheduler_name("scheduler", options.scheduler, SCHEDULERS)
        studio = read_studio_config(path)
        pipe, device = load_diffusers_pipeline(StableDiffusion3Pipeline, path, options, "Stable Diffusion 3")
        return cls(pipe, device, name=path.name, studio=studio)

    # ------------------------------------------------------------------ words
    def unknown_words(self, prompt: str) -> list[str]:
        """Words the model never learned (only for models whose stepstudio.json lists a vocabulary)."""
        return self.studio.unknown_words(prompt)

    def _model_text(self, text: str) -> str:
        return text.lower() if self.studio.vocabulary else text

    def _texts(self, params: GenerationParams) -> list[str]:
        """The prompt, and for CFG the negative prompt ("" when none, as in diffusers)."""
        texts = [self._model_text(params.prompt)]
        if params.guidance_scale > 1.0:
            texts.append(self._model_text(params.negative_prompt or ""))
        return texts

    @torch.no_grad()
    def _encode_texts(self, texts: list[str]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """encode_prompt for several texts at once (each as a prompt: diffusers encodes a
        negative prompt the same way), split back into one entry per text."""
        prompt_embeds, _, pooled, _ = self.pipe.encode_prompt(
            prompt=texts,
            prompt_2=None,
            prompt_3=None,
            device=self.device,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
        )
        return split_rows(len(texts), prompt_embeds, pooled)

    # ------------------------------------------------------------------ protocol
    def validate(self, params: GenerationParams) -> None:
        check_image_params(params, "SD3", self.size_multiple, SCHEDULERS)

    def batch_key(self, params: GenerationParams) -> SD3BatchKey:
        return SD3BatchKey(height=params.height, width=params.width, max_sequence_length=self.max_sequence_length)

    @torch.no_grad()
    def prepare_encode(self, state: RequestState) -> None:
        params = state.params
        pipe = self.pipe
        (prompt_embeds, pooled), *negative = self.prompt_cache.encode_many(self._texts(params))
        negative_embeds, negative_pooled = negative[0] if negative else (None, None)  # CFG: see _texts
        state.conditioning = SD3Conditioning(
            prompt_embeds,
            pooled,
            float(params.guidance_scale),
            negative_prompt_embeds=negative_embeds,
            negative_pooled_prompt_embeds=negative_pooled,
        )

        # The request's own generator: the same seed gives the same noise as the stock pipeline.
        state.generator = torch.Generator(device=self.device).manual_seed(params.seed)
        state.latents = pipe.prepare_latents(
            1,
            self.transformer.config.in_channels,
            params.height,
            params.width,
            prompt_embeds.dtype,
            self.device,
            state.generator,
        )

        # The request's own scheduler: the checkpoint's shift, or this image size's mu.
        scheduler = copy.deepcopy(self._scheduler_template)
        mu = None
        if scheduler.config.get("use_dynamic_shifting", None):
            patch = self.transformer.config.patch_size
            _, _, latent_height, latent_width = state.latents.shape
            mu = calculate_shift(
                (latent_height // patch) * (latent_width // patch),
                scheduler.config.get("base_image_seq_len", 256),
                scheduler.config.get("max_image_seq_len", 4096),
                scheduler.config.get("base_shift", 0.5),
                scheduler.config.get("max_shift", 1.16),
            )
        kwargs = {} if mu is None else {"mu": mu}
        state.timesteps, _ = retrieve_timesteps(scheduler, params.num_inference_steps, self.device, **kwargs)
        state.noise_scheduler = scheduler
        state.step_index = 0
        state.extra = SD3RequestData(mu=mu)

    @torch.no_grad()
    def denoise_step(self, batch: Batch) -> list[torch.Tensor]:
        latents, embeds, pooled, timesteps = [], [], [], []
        for state in batch.states:
            c: SD3Conditioning = state.conditioning
            rows = [(c.prompt_embeds, c.pooled_prompt_embeds)]
            if c.cfg:  # the negative row rides in the same forward
                rows.append((c.negative_prompt_embeds, c.negative_pooled_prompt_embeds))
            for row_embeds, row_pooled in rows:
                latents.append(state.latents)
                embeds.append(row_embeds)
                pooled.append(row_pooled)
                timesteps.append(state.current_timestep)

        noise_pred = self.transformer(
            hidden_states=torch.cat(latents),
            timestep=torch.stack(timesteps),  # per row, in the scheduler's 0..1000 scale as SD3 expects
            encoder_hidden_states=torch.cat(embeds),
            pooled_projections=torch.cat(pooled),
            return_dict=False,
        )[0]

        return combine_interleaved_cfg(
            noise_pred, [(s.conditioning.cfg, s.conditioning.guidance_scale) for s in batch.states]
        )

    @torch.no_grad()
    def step_scheduler(self, state: RequestState, prediction: torch.Tensor) -> None:
        flow_match_step(state, prediction)

    @torch.no_grad()
    def decode(self, state: RequestState, output_type: str = "pil"):
        """StableDiffusion3Pipeline's decode of the request's latents: "pil", "np" or "pt" output."""
        latents = (state.latents / self.vae.config.scaling_factor) + self.vae.config.shift_factor
        image = self.vae.decode(latents.to(self.vae.device), return_dict=False)[0]
        return self.pipe.image_processor.postprocess(image, output_type=output_type)

    def post_decode(self, state: RequestState) -> list[Image.Image]:
        return self.decode(state, output_type="pil")

    @torch.no_grad()
    def preview(self, state: RequestState) -> Image.Image:
        """The predicted x0 on the latent grid (height / vae_scale_factor), linearly mapped to RGB."""
        x0 = state.extra.predicted_x0 if state.extra.predicted_x0 is not None else state.latents
        return self.preview_projection.render(x0[0])

"""The diffusers pipeline methods the step pipelines call, and the parameters they pass.

The families reuse their diffusers pipeline's pieces instead of copying them. Some are
private (a leading underscore) and some are public methods whose parameters diffusers
renames now and then, so `pyproject.toml` allows only the diffusers versions checked here
(see its `diffusers` line), and `check_relied_on` runs before a family loads a checkpoint
(and in tests/test_diffusers_helpers.py): a missing or changed helper is a clear error that
names it, not a wrong image. We call every helper with keyword arguments, so an argument
order change can't shift values silently; a renamed or removed parameter is caught here.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass


@dataclass(frozen=True)
class ReliedOn:
    owner: str  # the diffusers pipeline class name
    method: str
    parameters: tuple[str, ...]  # the parameter names we pass

    @property
    def name(self) -> str:
        return f"{self.owner}.{self.method}"


_LATENTS = ("batch_size", "num_channels_latents", "height", "width", "dtype", "device", "generator")
_UNPACK = ("latents", "height", "width", "vae_scale_factor")

RELIED_ON: tuple[ReliedOn, ...] = (
    ReliedOn("FluxPipeline", "encode_prompt", ("prompt", "prompt_2", "device", "max_sequence_length")),
    ReliedOn("FluxPipeline", "prepare_latents", _LATENTS),  # returns (packed latents, latent image ids)
    ReliedOn("FluxPipeline", "_unpack_latents", _UNPACK),
    ReliedOn(
        "StableDiffusion3Pipeline",
        "encode_prompt",
        ("prompt", "prompt_2", "prompt_3", "device", "do_classifier_free_guidance", "max_sequence_length"),
    ),
    ReliedOn("StableDiffusion3Pipeline", "prepare_latents", _LATENTS),
    ReliedOn("QwenImagePipeline", "encode_prompt", ("prompt", "device", "max_sequence_length")),
    ReliedOn("QwenImagePipeline", "prepare_latents", _LATENTS),  # returns packed latents only
    ReliedOn("QwenImagePipeline", "_unpack_latents", _UNPACK),
    ReliedOn(
        "StableDiffusionPipeline",
        "encode_prompt",
        ("prompt", "device", "num_images_per_prompt", "do_classifier_free_guidance"),
    ),
    ReliedOn("StableDiffusionPipeline", "get_guidance_scale_embedding", ("w", "embedding_dim")),
    ReliedOn(
        "StableDiffusionXLPipeline",
        "encode_prompt",
        ("prompt", "device", "num_images_per_prompt", "do_classifier_free_guidance"),
    ),
    ReliedOn(
        "StableDiffusionXLPipeline",
        "_get_add_time_ids",
        ("original_size", "crops_coords_top_left", "target_size", "dtype", "text_encoder_projection_dim"),
    ),
    ReliedOn("StableDiffusionXLPipeline", "get_guidance_scale_embedding", ("w", "embedding_dim")),
    ReliedOn("WanPipeline", "encode_prompt", ("prompt", "do_classifier_free_guidance", "max_sequence_length", "device")),
    ReliedOn("WanPipeline", "prepare_latents", _LATENTS[:4] + ("num_frames",) + _LATENTS[4:]),
)


def problems(pipeline_class: type) -> list[str]:
    """What is missing or changed in `pipeline_class` among the helpers we rely on."""
    found = []
    for helper in RELIED_ON:
        if helper.owner != pipeline_class.__name__:
            continue
        method = getattr(pipeline_class, helper.method, None)
        if method is None:
            found.append(f"{helper.name} is gone")
            continue
        names = list(inspect.signature(method).parameters)
        missing = [name for name in helper.parameters if name not in names]
        if missing:
            found.append(f"{helper.name} has no parameter {', '.join(missing)} (it takes {', '.join(names)})")
    return found


def check_relied_on(pipeline_class: type) -> None:
    """Raise RuntimeError naming every helper of `pipeline_class` that is missing or changed."""
    found = problems(pipeline_class)
    if found:
        import diffusers

        raise RuntimeError(
            f"diffusers {diffusers.__version__} changed what stepstudio relies on: {'; '.join(found)}. "
            "Install the diffusers version pyproject.toml allows, or update pipelines/ and "
            "pipelines/diffusers_api.py for this one."
        )

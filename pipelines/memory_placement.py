"""Put a loaded pipeline's components where its memory plan says (pipelines/memory_plan.py).

The loader builds every model in host memory first; `measure` reads its component sizes, the
plan is chosen, and `place` moves what the plan keeps on the device:

    resident   the whole diffusers pipeline to the device
    offload    the denoiser(s) to the device; text encoders and VAE stay in host memory in a
               `ComponentPlacement` (pipelines/component_placement.py)
    fp8        offload, after diffusers' layerwise casting stored the castable layers of the
               denoiser and the text encoders in float8_e4m3fn (computed in the serving dtype)
    lowvram    fp8, and diffusers' `enable_group_offload` (block level, one block per group, on
               a side stream on CUDA) keeps the denoiser's blocks in host memory too

LoRA adapters are read before (their weights are kept in the serving dtype on the device, apart
from the model's), so a plan changes nothing about them.
"""

from __future__ import annotations

import logging
import re

import torch
from diffusers.hooks.layerwise_casting import DEFAULT_SKIP_MODULES_PATTERN, apply_layerwise_casting

from pipelines.component_placement import ComponentPlacement
from pipelines.memory_plan import GIB, ModelBytes, PlanChoice, PlanDoesNotFit, choose_plan, usable

log = logging.getLogger(__name__)

FP8_STORAGE = torch.float8_e4m3fn
# What layerwise casting stores in float8 (diffusers' supported layers); a text encoder keeps its
# embeddings: transformers reads a model's dtype from its first parameter, an embedding's.
CASTABLE = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.ConvTranspose1d,
            torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d, torch.nn.Embedding)
TEXT_ENCODER_KEEPS = (torch.nn.Embedding,)
# The activations per token taken before a forward is measured: this many vectors of the widest
# layer input (FLUX: 4 x 15,360 x 2 bytes = 120 KiB): an estimate, which the measurement at load replaces.
ACTIVATION_VECTORS = 4


def module_bytes(module: torch.nn.Module | None) -> int:
    if module is None:
        return 0
    return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])


def _cast_layers(module: torch.nn.Module, skip: tuple[str, ...], keep: tuple[type, ...] = (),
                 prefix: str = "") -> list[torch.nn.Module]:
    """The layers layerwise casting stores in float8 (`skip`: name patterns, `keep`: classes)."""
    return [layer for name, layer in module.named_modules()
            if isinstance(layer, CASTABLE) and not isinstance(layer, keep)
            and not any(re.search(pattern, f"{prefix}{name}" if name else prefix.rstrip(".")) for pattern in skip)]


def _fp8_bytes(module: torch.nn.Module, skip: tuple[str, ...], keep: tuple[type, ...] = (), prefix: str = "") -> int:
    """`module`'s bytes once its castable layers store float8."""
    cast = _cast_layers(module, skip, keep, prefix)
    return module_bytes(module) - sum(p.numel() * (p.element_size() - 1) for layer in cast
                                      for p in layer.parameters(recurse=False))


def casts_in_fp8(text_encoder: torch.nn.Module) -> bool:
    """Whether the fp8 plans store this text encoder in float8: only when its first parameter
    (what transformers reports as its dtype, and diffusers casts the prompt embeddings to) stays."""
    first = next(iter(text_encoder.parameters()), None)
    cast = _cast_layers(text_encoder, _text_encoder_skips(text_encoder), TEXT_ENCODER_KEEPS)
    return first is not None and not any(first is p for layer in cast for p in layer.parameters(recurse=False))


def is_quantized(model: torch.nn.Module) -> bool:
    """A denoiser loaded from a quantized file (--denoiser-file): the fp8 plans leave it as it is."""
    return bool(getattr(model, "is_quantized", False))


def _skip_patterns(denoiser: torch.nn.Module) -> tuple[str, ...]:
    return tuple(getattr(denoiser, "_skip_layerwise_casting_patterns", None) or DEFAULT_SKIP_MODULES_PATTERN)


def _text_encoder_skips(text_encoder: torch.nn.Module) -> tuple[str, ...]:
    """Layers a text encoder keeps in the serving dtype: diffusers' defaults, and the modules the
    model keeps in float32 (T5's `wo`, whose weight dtype its own code casts activations to)."""
    keep = tuple(getattr(text_encoder, "_keep_in_fp32_modules", None) or ())
    return DEFAULT_SKIP_MODULES_PATTERN + tuple(rf"(^|\.){re.escape(name)}$" for name in keep)


def offloadable_groups(pipeline) -> dict[str, list[torch.nn.Module]]:
    """The components a denoise forward never uses, by group: the text encoders, the VAE."""
    pipe = pipeline.pipe
    text_encoders = [module for name, module in pipe.components.items()
                     if name.startswith("text_encoder") and isinstance(module, torch.nn.Module)]
    return {"text_encoders": text_encoders, "vae": [pipe.vae] if pipe.vae is not None else []}


def measure(pipeline, activation_per_token: int = 0) -> ModelBytes:
    """The component sizes the plans are chosen by, read from the modules (in their load dtype)."""
    groups = offloadable_groups(pipeline)
    return measure_modules(pipeline.denoisers, groups["text_encoders"], groups["vae"], activation_per_token)


def measure_modules(denoisers, text_encoders, vaes, activation_per_token: int = 0) -> ModelBytes:
    """`measure` of modules (they may live on the meta device: only their shapes are read)."""
    fp8 = largest_block = outside = 0
    for model in denoisers:
        skip = (".",) if is_quantized(model) else _skip_patterns(model)  # a quantized file stays as it is
        model_fp8 = _fp8_bytes(model, skip)
        blocks = [(f"{name}.{index}.", block) for name, child in model.named_children()
                  if isinstance(child, torch.nn.ModuleList) for index, block in enumerate(child)]
        block_sizes = [_fp8_bytes(block, skip, prefix=prefix) for prefix, block in blocks]
        fp8 += model_fp8
        largest_block = max([largest_block, *block_sizes])
        outside += model_fp8 - sum(block_sizes)
    return ModelBytes(
        denoiser=sum(module_bytes(model) for model in denoisers), denoiser_fp8=fp8, largest_block_fp8=largest_block,
        denoiser_outside_blocks_fp8=outside, text_encoders=sum(module_bytes(m) for m in text_encoders),
        text_encoders_fp8=sum(_fp8_bytes(m, _text_encoder_skips(m), TEXT_ENCODER_KEEPS) if casts_in_fp8(m)
                              else module_bytes(m) for m in text_encoders),
        vae=sum(module_bytes(m) for m in vaes), activation_per_token=activation_per_token)


def place(pipeline, plan: str) -> None:
    """Move `pipeline`'s components as `plan` says; sets `pipeline.placement` and `memory_plan`."""
    device = pipeline.device
    if plan == "resident":
        pipeline.pipe.to(device)
        pipeline.placement = ComponentPlacement(device)
    else:
        if plan in ("fp8", "lowvram"):
            for text_encoder in filter(casts_in_fp8, offloadable_groups(pipeline)["text_encoders"]):
                apply_layerwise_casting(text_encoder, FP8_STORAGE, text_encoder.dtype, _text_encoder_skips(text_encoder),
                                        TEXT_ENCODER_KEEPS)
        for denoiser in pipeline.denoisers:
            if plan in ("fp8", "lowvram") and not is_quantized(denoiser):
                denoiser.enable_layerwise_casting(storage_dtype=FP8_STORAGE, compute_dtype=pipeline.dtype)
            if plan == "lowvram":
                denoiser.enable_group_offload(onload_device=device, offload_device=torch.device("cpu"),
                                              offload_type="block_level", num_blocks_per_group=1,
                                              use_stream=device.type == "cuda")
            else:
                denoiser.to(device)
        pipeline.placement = ComponentPlacement(device, offloadable_groups(pipeline))
    pipeline.memory_plan = plan
    log.debug("%s: memory plan %s", pipeline.name, plan)


# ---------------------------------------------------------------------------- choosing at load
def default_tokens(pipeline) -> int:
    """Rows x latent tokens of one request at the model's defaults (what the engine costs it)."""
    from pipelines.interface import resolve_defaults
    from pipelines.params import GenerationParams

    params = resolve_defaults(GenerationParams(prompt="a default request"), pipeline.info.defaults)
    rows, tokens = pipeline.forward_size(params)
    return rows * tokens


def estimated_activation_per_token(denoisers, dtype: torch.dtype) -> int:
    """Before anything runs on the device: a forward's activations per latent token, taken as
    ACTIVATION_VECTORS vectors of the denoisers' widest layer input in `dtype` (the measurement
    after placing replaces it: `measured_activation_per_token`)."""
    widest = max((layer.in_features for model in denoisers for layer in model.modules()
                  if isinstance(layer, torch.nn.Linear)), default=0)
    return ACTIVATION_VECTORS * widest * torch.tensor([], dtype=dtype).element_size()


def measured_activation_per_token(pipeline) -> int:
    """A CUDA forward's peak above the weights, per token: one default request, then two."""
    from pipelines.interface import Batch, RequestState, resolve_defaults
    from pipelines.params import GenerationParams

    device = pipeline.device
    peaks = []
    for count in (1, 2):
        states = []
        for index in range(count):
            params = resolve_defaults(GenerationParams(prompt=f"a measured request {index}", seed=index),
                                      pipeline.info.defaults)
            state = RequestState(request_id=f"measure-{index}", params=params)
            pipeline.prepare_encode(state)
            states.append(state)
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        pipeline.denoise_step(Batch(tuple(states)))
        torch.cuda.synchronize(device)
        peaks.append(torch.cuda.max_memory_allocated(device) - base)
        del states
    tokens = default_tokens(pipeline)
    slope = (peaks[1] - peaks[0]) // tokens  # the second request's share: what each token adds
    return slope if slope > 0 else max(peaks[0] // tokens, 1)


def plan_and_place(pipeline, memory: str, batch_tokens: int) -> PlanChoice | None:
    """Choose `pipeline`'s memory plan (`memory`: a plan name or "auto") and place it. On CUDA
    the token limit the plan leaves is then measured (`PlanChoice.max_tokens`); on the CPU, the
    device is host memory: auto keeps everything resident and no limit changes (None)."""
    device = pipeline.device
    if device.type != "cuda":
        place(pipeline, "resident" if memory == "auto" else memory)
        return None
    sizes = measure(pipeline, estimated_activation_per_token(pipeline.denoisers, pipeline.dtype))
    free = torch.cuda.mem_get_info(device)[0]
    one = default_tokens(pipeline)
    choice = choose_plan(sizes, free, batch_tokens, one, memory)
    place(pipeline, choice.plan)
    per_token = measured_activation_per_token(pipeline)
    free_now = torch.cuda.mem_get_info(device)[0]
    spare = usable(free_now) - max(0, sizes.peak(choice.plan, 0) - sizes.weights_on_device(choice.plan))
    tokens = min(batch_tokens, spare // per_token)
    if tokens < one:
        raise PlanDoesNotFit(
            f"--memory {choice.plan}: after loading, {free_now / GIB:.1f} GiB is free and one request needs "
            f"{one * per_token / GIB:.1f} GiB of activations (measured); try a smaller plan than {choice.plan}.")
    return PlanChoice(choice.plan, tokens, sizes.weights_on_device(choice.plan) + tokens * per_token, free,
                      lowered=tokens < batch_tokens)

"""Tiny random LoRA adapters for the tiny checkpoints, written the way diffusers writes them.

`build_tiny_lora` makes a PEFT-format adapter (lora_A/lora_B pairs with its LoraConfig in the
file's metadata) and saves it with the family's own `save_lora_weights`; `build_kohya_lora` makes
an A1111/kohya-format one (`lora_unet_..._to_q.lora_down.weight`, `.alpha`) for Stable
Diffusion, which diffusers converts when it reads it."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

ATTENTION = ("to_q", "to_k", "to_v", "to_out.0")
CLIP_ATTENTION = ("q_proj", "k_proj", "v_proj", "out_proj")  # what diffusers' text-encoder LoRAs target


def _targets(denoiser: nn.Module, targets: tuple[str, ...]) -> dict[str, nn.Module]:
    return {name: module for name, module in denoiser.named_modules()
            if isinstance(module, nn.Linear) and any(name == t or name.endswith("." + t) for t in targets)}


def _random_pairs(model: nn.Module, targets: tuple[str, ...], rank: int, magnitude: float,
                  generator: torch.Generator) -> dict[str, torch.Tensor]:
    layers = {}
    for name, module in _targets(model, targets).items():
        layers[f"{name}.lora_A.weight"] = torch.randn(rank, module.in_features, generator=generator) * magnitude
        layers[f"{name}.lora_B.weight"] = torch.randn(module.out_features, rank, generator=generator) * magnitude
    return layers


def build_tiny_lora(pipe, out: Path, seed: int, rank: int = 4, alpha: float = 8.0,
                    targets: tuple[str, ...] = ATTENTION, magnitude: float = 0.3,
                    text_encoders: tuple[str, ...] = ()) -> Path:
    """A random adapter for `pipe`'s denoiser (transformer or unet) in `out`/<name>.safetensors,
    and for the CLIP attention of the `text_encoders` named ("text_encoder", "text_encoder_2").
    Returns the file. `magnitude` keeps the change visible and the model stable."""
    component = "unet" if getattr(pipe, "unet", None) is not None else "transformer"
    generator = torch.Generator().manual_seed(seed)
    metadata = {"r": rank, "lora_alpha": alpha, "target_modules": list(targets)}
    saved = {f"{component}_lora_layers": _random_pairs(getattr(pipe, component), targets, rank, magnitude, generator),
             f"{component}_lora_adapter_metadata": metadata}
    for encoder in text_encoders:
        saved[f"{encoder}_lora_layers"] = _random_pairs(getattr(pipe, encoder), CLIP_ATTENTION, rank, magnitude,
                                                        generator)
        saved[f"{encoder}_lora_adapter_metadata"] = {**metadata, "target_modules": list(CLIP_ATTENTION)}
    out.mkdir(parents=True, exist_ok=True)
    type(pipe).save_lora_weights(out, **saved)
    return out / "pytorch_lora_weights.safetensors"


def build_kohya_lora(unet: nn.Module, out_file: Path, seed: int, rank: int = 2, alpha: float = 1.0,
                     magnitude: float = 0.3, text_encoder: nn.Module | None = None) -> Path:
    """A kohya/A1111-format adapter for a Stable Diffusion UNet's attention projections, and
    with `text_encoder` for its CLIP attention too (`lora_te_text_model_encoder_...`, as kohya
    names CLIPTextModel's modules)."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    models = [("lora_unet_", unet, ATTENTION)]
    if text_encoder is not None:
        # kohya's names come from the older CLIPTextModel, whose modules sat under `text_model.`
        prefix = "lora_te_" if hasattr(text_encoder, "text_model") else "lora_te_text_model_"
        models.append((prefix, text_encoder, CLIP_ATTENTION))
    for prefix, model, targets in models:
        for name, module in _targets(model, targets).items():
            key = prefix + name.replace(".", "_")
            tensors[f"{key}.lora_down.weight"] = torch.randn(rank, module.in_features, generator=generator) * magnitude
            tensors[f"{key}.lora_up.weight"] = torch.randn(module.out_features, rank, generator=generator) * magnitude
            tensors[f"{key}.alpha"] = torch.tensor(float(alpha))
    out_file.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_file))
    return out_file

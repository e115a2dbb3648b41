"""Which attention kernel a denoiser uses: PyTorch SDPA by default, flash-attn when it is
installed and usable (CUDA, half precision). flash-attn is an optional extra, never required."""

from __future__ import annotations

import importlib.util
import logging

import torch

log = logging.getLogger(__name__)


def _supports_backends(model: torch.nn.Module) -> bool:
    """True when some attention processor of `model` goes through diffusers' backend dispatcher."""
    return any(hasattr(getattr(m, "processor", None), "_attention_backend") for m in model.modules())


def select_attention_backend(
    model: torch.nn.Module, device: torch.device, dtype: torch.dtype, requested: str | None = None
) -> str:
    """Set and return the attention backend name ("native" = PyTorch SDPA)."""
    if requested is not None:
        model.set_attention_backend(requested)
        return requested
    usable = device.type == "cuda" and dtype in (torch.float16, torch.bfloat16)
    if usable and importlib.util.find_spec("flash_attn") and _supports_backends(model):
        try:
            model.set_attention_backend("flash")
            return "flash"
        except (RuntimeError, ValueError, ImportError) as exc:
            log.warning("flash-attn is installed but unusable (%s); using PyTorch SDPA", exc)
    return "native"

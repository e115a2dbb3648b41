"""Which attention kernel really ran: read off the profiler's operator names of one call.

PyTorch's `scaled_dot_product_attention` picks a kernel per call (flash, memory-efficient,
cuDNN or plain math) from the inputs' device, dtype, shapes and mask, and every choice shows
up as its own aten operator; the flash-attn package's kernels show up under its own name.
The profiler records only the thread it was started on, so call this on the thread that
runs the model (the engine's, for a step pipeline).
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, TypeVar

import torch
from torch.profiler import ProfilerActivity, profile

T = TypeVar("T")

# Operator-name fragment -> kernel, most specific first.
KERNELS = (
    ("flash_attn", "flash-attn"),
    ("_scaled_dot_product_cudnn_attention", "SDPA cuDNN"),
    ("_scaled_dot_product_flash_attention_for_cpu", "SDPA flash (CPU)"),
    ("_scaled_dot_product_flash_attention", "SDPA flash"),
    ("_scaled_dot_product_efficient_attention", "SDPA memory-efficient"),
    ("_scaled_dot_product_fused_attention_overrideable", "SDPA fused (backend-specific)"),
    ("_scaled_dot_product_attention_math", "SDPA math"),
)
NO_SDPA = "no fused attention op (matmul + softmax)"


def kernel_of(op_name: str) -> str | None:
    for fragment, kernel in KERNELS:
        if fragment in op_name:
            return kernel
    return None


def attention_kernels(call: Callable[[], T]) -> tuple[str, T]:
    """Run `call()` under the profiler; returns ("SDPA flash x38", result)-style text and its result."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result = call()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    counts = Counter(kernel for kernel in (kernel_of(event.name) for event in prof.events()) if kernel)
    text = ", ".join(f"{kernel} x{count}" for kernel, count in sorted(counts.items())) or NO_SDPA
    return text, result

"""Packed forwards on the real-size stand-in: rows of three sizes in one forward.

Rows at 512x512, 768x768 and 1024x1024 (two each; the dry run: 64/96/128) of the FLUX.1-dev-sized
stand-in transformer (random weights, the real shapes; benchmarks/gpu_stand_in.py) run:
- as separate forwards, one per size (stepstudio without packing: sizes take turns), and
- packed into ONE forward (pipelines/flux_packed.py) with each attention kernel of
  pipelines/packing.py: flash-attn's varlen kernel (when installed), one SDPA call per size, and
  every row padded to the largest with a mask.

Each row reports the time per forward (median of the repeats), the attention kernel that really
ran, and the largest difference of every packed row from its solo forward in the device's dtype,
relative to the solo output's largest magnitude (bf16 holds about 3 significant digits).
"""

from __future__ import annotations

import statistics
import time

import torch

from benchmarks.gpu_attention import attention_kernels
from benchmarks.gpu_budget import Section
from benchmarks.gpu_stand_in import PIXELS_PER_TOKEN
from pipelines.flux_packed import FluxRow, packed_forward
from pipelines.packing import _flash_varlen, attention_kernel


def _rows(model, sizes: tuple[int, ...], text_tokens: int, per_size: int) -> list[FluxRow]:
    generator = torch.Generator(device="cpu").manual_seed(0)
    config, device, dtype = model.config, model.device, model.dtype
    rows = []
    for size in sizes:
        side = size // PIXELS_PER_TOKEN
        ids = torch.zeros(side, side, 3)
        ids[..., 1] += torch.arange(side)[:, None]
        ids[..., 2] += torch.arange(side)[None, :]
        for _ in range(per_size):
            rows.append(FluxRow(
                latents=torch.randn(1, side * side, config.in_channels, generator=generator).to(device, dtype),
                timestep=torch.rand((), generator=generator).to(device, dtype),
                pooled=torch.randn(1, config.pooled_projection_dim, generator=generator).to(device, dtype),
                embeds=torch.randn(1, text_tokens, config.joint_attention_dim, generator=generator).to(device, dtype),
                text_ids=torch.zeros(text_tokens, 3, device=device, dtype=dtype),
                image_ids=ids.reshape(-1, 3).to(device, dtype),
                guidance=3.5 if config.guidance_embeds else None,
            ))
    return rows


def _stacked(model, rows: list[FluxRow]) -> torch.Tensor:
    """diffusers' own forward over rows of one size."""
    guidance = None
    if model.config.guidance_embeds:
        guidance = torch.tensor([row.guidance for row in rows], device=model.device, dtype=torch.float32)
    return model(hidden_states=torch.cat([r.latents for r in rows]), timestep=torch.stack([r.timestep for r in rows]),
                 guidance=guidance, pooled_projections=torch.cat([r.pooled for r in rows]),
                 encoder_hidden_states=torch.cat([r.embeds for r in rows]), txt_ids=rows[0].text_ids,
                 img_ids=rows[0].image_ids, return_dict=False)[0]


def _timed(call, repeats: int) -> float:
    call()  # warm-up (kernels, caches)
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        started = time.perf_counter()
        call()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


@torch.no_grad()
def measure_packing(model, sizes: tuple[int, ...], text_tokens: int, per_size: int, repeats: int,
                    section: Section) -> dict:
    rows = _rows(model, sizes, text_tokens, per_size)
    groups = [rows[i:i + per_size] for i in range(0, len(rows), per_size)]
    solo = [_stacked(model, [row]).float() for row in rows]
    separate_s = section.run_if_it_fits("separate forwards, one per size", 0.0,
                                        lambda: _timed(lambda: [_stacked(model, group) for group in groups], repeats))
    results = [{"system": "separate forwards (sizes take turns)", "seconds": separate_s, "kernel": "diffusers' own",
                "max_rel_diff": 0.0}]
    kernels = ["varlen", "sdpa", "padded"] if _flash_varlen() is not None and model.device.type == "cuda" else ["sdpa", "padded"]
    for kernel in kernels:
        def packed(kernel=kernel):
            token = attention_kernel.set(kernel)
            try:
                return packed_forward(model, rows)
            finally:
                attention_kernel.reset(token)

        estimate = 1.5 * (separate_s or 0.0)
        seconds = section.run_if_it_fits(f"packed, {kernel} attention", estimate, lambda packed=packed: _timed(packed, repeats))
        if seconds is None:
            continue
        ran, outputs = attention_kernels(packed)
        difference = max(float((out.float() - ref).abs().max() / ref.abs().max()) for out, ref in zip(outputs, solo))
        results.append({"system": f"packed, {kernel} attention", "seconds": seconds, "kernel": ran,
                        "max_rel_diff": difference})
    for result in results:
        result["x_separate"] = None if not separate_s or not result["seconds"] else separate_s / result["seconds"]
    return {"sizes": list(sizes), "rows_per_size": per_size, "text_tokens": text_tokens,
            "flash_attn_varlen": _flash_varlen() is not None, "rows": results,
            "skipped_varlen": None if "varlen" in kernels else "flash-attn is not installed here (the `gpu` extra)"}

"""Device memory of the real-size denoiser: its weights, and the peak of one batched forward
per image size and batch size (`torch.cuda.max_memory_allocated`, weights included).

The CPU has no allocator statistics: there the dry run reports the weights (from the
tensors) and the forward times, and leaves the peaks empty.
"""

from __future__ import annotations

import time

import torch

from benchmarks.gpu_attention import attention_kernels
from benchmarks.gpu_budget import Section
from benchmarks.gpu_stand_in import StandInFluxPipeline, image_tokens
from pipelines.interface import Batch, RequestState
from pipelines.params import GenerationParams

GIB = 2**30


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prepared_batch(pipeline: StandInFluxPipeline, size: int, batch: int) -> Batch:
    """`batch` requests of `size` x `size`, encoded and ready for their first step."""
    states = []
    for index in range(batch):
        params = GenerationParams(prompt=f"request {index}", width=size, height=size, num_inference_steps=28,
                                  guidance_scale=3.5, seed=index)
        state = RequestState(request_id=str(index), params=params)
        pipeline.prepare_encode(state)
        states.append(state)
    return Batch(tuple(states))


def one_forward(pipeline: StandInFluxPipeline, size: int, batch: int) -> dict:
    device = pipeline.device
    rows = prepared_batch(pipeline, size, batch)
    on_cuda = device.type == "cuda"
    synchronize(device)
    if on_cuda:
        torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device) if on_cuda else None
    started = time.perf_counter()
    try:
        predictions = pipeline.denoise_step(rows)
        synchronize(device)
    except torch.cuda.OutOfMemoryError:
        return {"size": size, "batch": batch, "error": "out of memory"}
    seconds = time.perf_counter() - started
    finite = all(bool(torch.isfinite(p).all()) for p in predictions)
    peak = torch.cuda.max_memory_allocated(device) if on_cuda else None
    del predictions, rows
    return {
        "size": size,
        "batch": batch,
        "tokens_per_image": image_tokens(size, size),
        "forward_s": seconds,
        "peak_gib": None if peak is None else peak / GIB,
        "activations_gib": None if peak is None else (peak - before) / GIB,
        "finite": finite,
    }


def measure_memory(pipeline: StandInFluxPipeline, sizes, batches, section: Section, weights: dict) -> dict:
    """`weights`: what building the transformer measured (see gpu_check.real_size_pipeline)."""
    first = min(sizes)
    kernels, _ = attention_kernels(lambda: one_forward(pipeline, first, 1))  # also the warm-up
    rows: list[dict] = []
    per_token_s = None  # seconds per image token of the last forward, for the next estimate
    for size in sizes:
        for batch in batches:
            work = image_tokens(size, size) * batch
            estimate = 0.0 if per_token_s is None else 1.5 * per_token_s * work
            row = section.run_if_it_fits(f"memory {size}x{size} batch {batch}", estimate,
                                         lambda: one_forward(pipeline, size, batch))
            if row is not None:
                rows.append(row)
                if "forward_s" in row:
                    per_token_s = row["forward_s"] / work
    return {**weights, "attention_setting": pipeline.attention_backend, "attention_kernels": kernels, "rows": rows}

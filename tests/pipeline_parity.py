"""Parity tests of real model families share this: run requests through our engine while
recording each one's final latents and the size of every forward, and compare them with
the plain diffusers pipeline's latents and image."""

from __future__ import annotations

import numpy as np
import torch

from engine import Completed, Engine, GenerationParams

# Final latents. Alone: SD/SDXL do the very same float operations as __call__ (measured
# difference 0); Qwen-Image with CFG runs both prompts in one masked forward (~1e-6).
# Co-batched, a bigger forward may pick other CPU kernels: float noise of a few ulps, so
# the bound scales with the latents (a tiny random UNet's reach ~20).
ALONE_TOLERANCE = 1e-5
CO_BATCHED_RELATIVE_TOLERANCE = 1e-5


class Run:
    """An engine over one of our pipelines that records each request's final latents and
    the size of every forward; `arrivals` submits more requests from inside a forward, so
    they join at a known step boundary."""

    def __init__(self, pipeline, arrivals: dict[int, GenerationParams] | None = None) -> None:
        self.pipeline = pipeline
        self.arrivals = dict(arrivals or {})
        self.final_latents: dict[str, torch.Tensor] = {}
        self.forward_sizes: list[int] = []
        self.handles = []
        self.engine = Engine(pipeline, mode="step", max_batch=8)
        self._denoise, self._decode = pipeline.denoise_step, pipeline.post_decode
        pipeline.denoise_step, pipeline.post_decode = self._recording_denoise, self._recording_decode

    def _recording_denoise(self, batch):
        self.forward_sizes.append(len(batch))
        arriving = self.arrivals.pop(len(self.forward_sizes), None)
        if arriving is not None:  # runs on the engine thread: joins at the next boundary
            self.handles.append(self.engine.submit(arriving))
        return self._denoise(batch)

    def _recording_decode(self, state):
        self.final_latents[state.request_id] = state.latents.clone()
        return self._decode(state)

    def __enter__(self) -> "Run":
        self.engine.start()
        return self

    def __exit__(self, *exc) -> None:
        self.engine.close()
        del self.pipeline.denoise_step, self.pipeline.post_decode  # back to the class methods

    def submit(self, params: GenerationParams):
        handle = self.engine.submit(params)
        self.handles.append(handle)
        return handle


def finished(run: Run, handle) -> tuple[torch.Tensor, np.ndarray]:
    final = handle.result(timeout=120)
    assert isinstance(final, Completed), f"expected a completed request, got {final!r}"
    return run.final_latents[handle.request_id], np.asarray(final.images[0])


def assert_same(
    ours: tuple[torch.Tensor, np.ndarray], reference: tuple[torch.Tensor, np.ndarray], co_batched: bool = False
) -> None:
    latent_diff = (ours[0] - reference[0]).abs().max().item()
    bound = ALONE_TOLERANCE
    if co_batched:
        bound = CO_BATCHED_RELATIVE_TOLERANCE * max(1.0, reference[0].abs().max().item())
    assert latent_diff <= bound, f"final latents differ by {latent_diff:.3g} (allowed {bound:.3g})"
    assert ours[1].shape == reference[1].shape
    pixel_diff = np.abs(ours[1].astype(int) - reference[1].astype(int)).max()
    # That float noise may push a pixel across a rounding boundary: one uint8 level at most.
    allowed = 1 if co_batched else 0
    assert pixel_diff <= allowed, f"images differ by up to {pixel_diff} (uint8)"


def run_joining_together(pipeline, requests: list[GenerationParams], monkeypatch, keep_cache: bool = False):
    """Submit `requests` before the engine starts, so all of them join its first step.

    Returns each request's (final latents, image) and the texts of every call the
    pipeline made to its diffusers `encode_prompt` (the prompt cache is emptied first
    unless `keep_cache`)."""
    calls: list[list[str]] = []
    encode_prompt = pipeline.pipe.encode_prompt

    def recording(*args, **kwargs):
        texts = kwargs["prompt"] if "prompt" in kwargs else args[0]
        calls.append(list(texts) if isinstance(texts, list) else [texts])
        return encode_prompt(*args, **kwargs)

    monkeypatch.setattr(pipeline.pipe, "encode_prompt", recording)
    if not keep_cache:
        pipeline.prompt_cache.clear()
    run = Run(pipeline)
    handles = [run.submit(p) for p in requests]
    with run:
        results = [finished(run, handle) for handle in handles]
    assert run.forward_sizes[0] == len(requests), run.forward_sizes
    return results, calls

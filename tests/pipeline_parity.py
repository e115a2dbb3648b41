"""What the family parity tests share: run requests through our engine (or the step protocol)
while recording each one's final latents and every model forward, run the stock diffusers
pipeline on the same request, and compare with one tolerance, derived from the dtype."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

from engine import Completed, Engine, GenerationParams
from pipelines.loader import load_pipeline

# ---------------------------------------------------------------------------- the tolerance, once
# Our latents against diffusers', in units of the dtype's epsilon at the latents' magnitude.
# Alone, most families do the very same float operations as __call__ (difference 0); where a
# forward has another batch size than diffusers' (CFG rows in one forward, co-batched requests)
# the CPU kernels may sum in another order: a few ulps per operation, grown over the steps
# through the network (measured up to ~100 ulps, machine-dependent). 2**10 ulps is 1.2e-4 in
# float32: ten times that, and still a hundred times below what any real mistake (a wrong
# timestep, guidance scale or row) moves the latents by.
ULPS = 2**10


def float_tolerance(dtype: torch.dtype = torch.float32, magnitude: float = 1.0) -> float:
    return ULPS * torch.finfo(dtype).eps * max(1.0, float(magnitude))


def assert_close(ours, reference, what: str = "outputs") -> float:
    """Float outputs (latents, or decoded images in [0, 1]) within the tolerance; returns the difference."""
    ours, reference = torch.as_tensor(np.asarray(ours)), torch.as_tensor(np.asarray(reference))
    assert ours.shape == reference.shape, f"{what}: shape {tuple(ours.shape)} != {tuple(reference.shape)}"
    difference = (ours.double() - reference.double()).abs().max().item()
    bound = float_tolerance(reference.dtype if reference.is_floating_point() else torch.float32, reference.abs().max())
    assert difference <= bound, f"{what} differ by {difference:.3g} (allowed {bound:.3g})"
    return difference


class Finished(NamedTuple):
    """A request's final latents and its decoded image (or frames), and how many requests its
    decode ran with (requests that finish in the same step decode in one batch)."""

    latents: torch.Tensor
    media: np.ndarray
    decoded_with: int = 1


def assert_same(ours: tuple, reference: tuple) -> float:
    """Final latents within the tolerance and uint8 pixels equal. Where the latents are not
    bitwise equal, or ours were decoded in a batch of another size than the reference's (the
    CPU's convolutions then sum in another order), that float noise may push a pixel across a
    rounding boundary: one level."""
    latent_diff = assert_close(ours[0], reference[0], "final latents")
    assert ours[1].shape == reference[1].shape
    pixel_diff = np.abs(ours[1].astype(int) - reference[1].astype(int)).max()
    batched = getattr(ours, "decoded_with", 1) > 1
    allowed = 0 if latent_diff == 0 and not batched else 1
    assert pixel_diff <= allowed, f"images differ by up to {pixel_diff} (uint8; latents by {latent_diff:.3g})"
    return latent_diff


# ---------------------------------------------------------------------------- requests
SIZE = 32  # pixels: every tiny checkpoint's test size


def request(prompt: str = "a red circle", **fields) -> GenerationParams:
    """A small request (32x32, 4 steps, no guidance, seed 1) unless `fields` say otherwise."""
    values = dict(width=SIZE, height=SIZE, num_inference_steps=4, guidance_scale=1.0, seed=1)
    values.update(fields)
    return GenerationParams(prompt=prompt, **values)


# ---------------------------------------------------------------------------- the reference
class Reference:
    """A stock diffusers pipeline that reports its final latents next to its output.

    `arguments(params)` maps a request to the family's __call__ keyword arguments (the
    guidance and text-length ones); prompt, size, steps and generator are added here."""

    def __init__(self, pipe, arguments: Callable[[GenerationParams], dict], frames: bool = False) -> None:
        self.pipe = pipe
        self.pipe.set_progress_bar_config(disable=True)
        self.arguments = arguments
        self.frames = frames
        self.checkpoint_scheduler = copy.deepcopy(pipe.scheduler)

    def __call__(self, params: GenerationParams, output_type: str = "pil", scheduler=None):
        """(final latents, the output as an array: uint8 pixels for "pil", floats for "np")."""
        self.pipe.scheduler = copy.deepcopy(self.checkpoint_scheduler) if scheduler is None else scheduler
        final = {}

        def keep_latents(pipe, step, timestep, tensors):
            final["latents"] = tensors["latents"].clone()
            return {}

        extra = {"num_frames": params.num_frames} if self.frames else {}
        output = self.pipe(
            prompt=params.prompt,
            width=params.width,
            height=params.height,
            num_inference_steps=params.num_inference_steps,
            generator=torch.Generator("cpu").manual_seed(params.seed),
            callback_on_step_end=keep_latents,
            output_type=output_type,
            **extra,
            **self.arguments(params),
        )
        media = output.frames[0] if self.frames else output.images[0]
        if output_type == "pil":
            media = np.stack([np.asarray(frame) for frame in media]) if self.frames else np.asarray(media)
        return final["latents"], media


@dataclass(frozen=True)
class TinyFamily:
    folder: Path
    pipeline: Any  # ours, from pipelines.loader.load_pipeline
    reference: Reference  # the stock diffusers pipeline on the same folder


def tiny_family(folder: Path, build, stock, arguments, studio_config: dict | None = None, frames: bool = False):
    """Build a tiny checkpoint and load it twice: as our step pipeline and as the stock pipeline
    (`stock`: its diffusers class, or a function of the folder)."""
    folder = build(folder, studio_config=studio_config)
    pipe = stock.from_pretrained(folder, use_safetensors=True) if isinstance(stock, type) else stock(folder)
    return TinyFamily(folder, load_pipeline(str(folder)), Reference(pipe, arguments, frames))


def assert_step_outputs_match(family: TinyFamily, state, params: GenerationParams) -> None:
    """The step protocol's float outputs (final latents, decoded image) against __call__'s."""
    latents, image = family.reference(params, "np")
    assert_close(state.latents, latents, "final latents")
    assert_close(family.pipeline.decode(state, "np")[0], image, "decoded images")


# ---------------------------------------------------------------------------- forwards
class ForwardLog:
    """Records, per denoise_step of `pipeline`, every model forward it made, stacked or packed:
    (which denoiser, rows). A co-batched test asserts from this that its rows really shared one forward."""

    def __init__(self, pipeline) -> None:
        self.pipeline = pipeline
        self.steps: list[list[tuple[int, int]]] = []
        self._handles = []

    def __enter__(self) -> "ForwardLog":
        for index, denoiser in enumerate(self.pipeline.denoisers):
            self._handles.append(denoiser.register_forward_pre_hook(self._recorder(index), with_kwargs=True))
        denoise_step = self.pipeline.denoise_step

        def recording(batch):
            self.steps.append([])
            return denoise_step(batch)

        self.pipeline.denoise_step = recording
        packed_forward = getattr(self.pipeline, "_packed_forward", None)
        if packed_forward is not None:  # a packed forward (rows of different shapes) calls no denoiser hook

            def recording_packed(denoiser, rows, run):
                self.steps[-1].append((list(self.pipeline.denoisers).index(denoiser), len(rows)))
                return packed_forward(denoiser, rows, run)

            self.pipeline._packed_forward = recording_packed
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        del self.pipeline.denoise_step  # back to the class method
        self.pipeline.__dict__.pop("_packed_forward", None)

    def _recorder(self, index: int):
        def record(module, args, kwargs):
            rows = (args[0] if args else kwargs["hidden_states"]).shape[0]
            self.steps[-1].append((index, rows))

        return record

    @property
    def rows(self) -> list[int]:
        """Rows of each step's single forward (fails on a step with more than one)."""
        assert all(len(step) == 1 for step in self.steps), f"a step ran several forwards: {self.steps}"
        return [step[0][1] for step in self.steps]


# ---------------------------------------------------------------------------- the engine
class Run:
    """An engine over one of our pipelines that records each request's final latents, the
    requests of every step (`forward_sizes`) and its model forwards (`forwards`, a ForwardLog);
    `arrivals` submits more requests from inside a step, so they join at a known boundary."""

    def __init__(self, pipeline, arrivals: dict[int, GenerationParams] | None = None) -> None:
        self.pipeline = pipeline
        self.arrivals = dict(arrivals or {})
        self.final_latents: dict[str, torch.Tensor] = {}
        self.decoded_with: dict[str, int] = {}  # request id -> requests in its decode batch
        self.forward_sizes: list[int] = []
        self.handles = []
        self.forwards = ForwardLog(pipeline)
        self.engine = Engine(pipeline, mode="step", max_batch_requests=8)

    def __enter__(self) -> "Run":
        self.forwards.__enter__()
        self._denoise, self._decode = self.pipeline.denoise_step, self.pipeline.post_decode
        self.pipeline.denoise_step, self.pipeline.post_decode = self._recording_denoise, self._recording_decode
        self._decode_many = getattr(self.pipeline, "post_decode_many", None)
        if self._decode_many is not None:  # requests that finish in the same step decode together
            self.pipeline.post_decode_many = self._recording_decode_many
        self.engine.start()
        return self

    def __exit__(self, *exc) -> None:
        self.engine.close()
        self.pipeline.denoise_step = self._denoise  # the ForwardLog's, which it removes
        del self.pipeline.post_decode  # back to the class method
        if self._decode_many is not None:
            del self.pipeline.post_decode_many
        self.forwards.__exit__()

    def _recording_denoise(self, batch):
        self.forward_sizes.append(len(batch))
        arriving = self.arrivals.pop(len(self.forward_sizes), None)
        if arriving is not None:  # runs on the engine thread: joins at the next boundary
            self.handles.append(self.engine.submit(arriving))
        return self._denoise(batch)

    def _recording_decode(self, state):
        self.final_latents[state.request_id] = state.latents.clone()
        return self._decode(state)

    def _recording_decode_many(self, states):
        for state in states:
            self.final_latents[state.request_id] = state.latents.clone()
            self.decoded_with[state.request_id] = len(states)
        return self._decode_many(states)

    def submit(self, params: GenerationParams):
        handle = self.engine.submit(params)
        self.handles.append(handle)
        return handle


def finished(run: Run, handle) -> Finished:
    final = handle.result(timeout=120)
    assert isinstance(final, Completed), f"expected a completed request, got {final!r}"
    media = np.stack([np.asarray(frame) for frame in final.images]) if final.is_video else np.asarray(final.images[0])
    return Finished(run.final_latents[handle.request_id], media, run.decoded_with.get(handle.request_id, 1))


def run_joining_together(pipeline, requests: list[GenerationParams], monkeypatch, keep_cache: bool = False):
    """Submit `requests` before the engine starts, so all of them join its first step.

    Returns each request's (final latents, image), the texts of every call the pipeline
    made to its diffusers `encode_prompt` (the prompt cache is emptied first unless
    `keep_cache`), and the Run (its forwards)."""
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
    return results, calls, run

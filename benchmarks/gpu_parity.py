"""Every family's step pipeline against its stock diffusers `__call__`, on one device and dtype.

For each tiny checkpoint of `tests/tiny_checkpoints.py` (one per `build_tiny_<name>`), both
pipelines load the same folder through their public APIs only: ours with
`pipelines.loader.load_pipeline(folder, LoadOptions(device, dtype))`, driven through
`engine.Engine`; the stock one with `diffusers.<Class>.from_pretrained(folder, dtype)`.
Two requests (other prompts, seeds and step counts) run through our engine alone, then
together (queued before `start()`, so they share every forward while both run), and each
result is compared with the stock call of the same request: final latents (max abs
difference) and the uint8 image or frames.

The bounds, from the dtype alone: at least half of the dtype's significant bits must agree,

    latents:  |ours - stock| <= sqrt(eps) * max(1, max|stock|)
    pixels:   |ours - stock| <= ceil(255 * sqrt(eps)) uint8 levels

float32: 3.5e-4 and 1 level; bfloat16: 0.088 and 23 levels. Any real mistake (a wrong row,
timestep, seed or guidance) moves the latents by the order of their own size.
"""

from __future__ import annotations

import inspect
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from benchmarks.gpu_attention import attention_kernels
from benchmarks.gpu_budget import Section
from engine import Completed, Engine, GenerationParams, ServingLimits

SIZE = 32  # pixels: every tiny checkpoint's size
VIDEO_FRAMES = 9  # 3 latent frames
GUIDANCE = 3.0  # > 1: classifier-free guidance where a family has it, embedded guidance otherwise
NEGATIVE = "blurry"
# Two requests that share a batch key but nothing else a request chooses.
REQUESTS = (("a red circle", 1, 4), ("a blue square on the left", 2, 6))  # (prompt, seed, steps)


# ---------------------------------------------------------------------------- the bounds, once
def latent_bound(dtype: torch.dtype, magnitude: float) -> float:
    return math.sqrt(torch.finfo(dtype).eps) * max(1.0, magnitude)


def pixel_bound(dtype: torch.dtype) -> int:
    return math.ceil(255 * math.sqrt(torch.finfo(dtype).eps))


def describe_bounds(dtype: torch.dtype) -> str:
    return (f"{dtype}: latents within sqrt(eps) x max(1, |stock|) = {latent_bound(dtype, 1.0):.2g} x max(1, |stock|), "
            f"uint8 pixels within ceil(255 sqrt(eps)) = {pixel_bound(dtype)} levels")


# ---------------------------------------------------------------------------- how each family is asked
def stock_arguments(class_name: str, stock, params: GenerationParams, text_length: int) -> dict:
    """The stock __call__'s guidance, negative prompt, text length and frames for our request."""
    guidance, negative = params.guidance_scale, params.negative_prompt
    if class_name == "FluxPipeline":
        if stock.transformer.config.guidance_embeds:  # guidance-distilled: the scale is embedded per row
            return {"guidance_scale": guidance, "max_sequence_length": text_length}
        return {"true_cfg_scale": guidance, "negative_prompt": negative, "max_sequence_length": text_length}
    if class_name == "QwenImagePipeline":
        return {"true_cfg_scale": guidance, "negative_prompt": negative}
    arguments = {"guidance_scale": guidance, "negative_prompt": negative}
    if class_name in ("StableDiffusion3Pipeline", "WanPipeline"):
        arguments["max_sequence_length"] = text_length
    if class_name == "WanPipeline":
        arguments["num_frames"] = params.num_frames
    return arguments


def tiny_builders() -> dict[str, Callable]:
    """name -> build_tiny_<name>(folder, studio_config=None), every one tests/tiny_checkpoints.py has."""
    from tests import tiny_checkpoints

    prefix = "build_tiny_"
    return {name[len(prefix):]: fn for name, fn in inspect.getmembers(tiny_checkpoints, inspect.isfunction)
            if name.startswith(prefix)}


def load_stock(class_name: str, folder: Path, device: torch.device, dtype: torch.dtype):
    """`diffusers.<class_name>.from_pretrained(folder, dtype=dtype)` on the device (accelerate, a
    dependency, lets it keep Wan's float32 modules as diffusers does)."""
    import diffusers

    pipe = getattr(diffusers, class_name).from_pretrained(folder, dtype=dtype, use_safetensors=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device), "from_pretrained"


# ---------------------------------------------------------------------------- our side
class RecordingPipeline:
    """Our step pipeline as the engine sees it, plus what the comparison needs: every request's
    final latents (read in `post_decode` and `post_decode_many`, before the decode) and the attention kernels of the
    first forward (profiled on the engine thread, which runs it)."""

    def __init__(self, pipeline) -> None:
        self._pipeline = pipeline
        self.final_latents: dict[str, torch.Tensor] = {}
        self.attention: str | None = None

    def __getattr__(self, name):
        return getattr(self._pipeline, name)

    def denoise_step(self, batch):
        if self.attention is None:
            self.attention, predictions = attention_kernels(lambda: self._pipeline.denoise_step(batch))
            return predictions
        return self._pipeline.denoise_step(batch)

    def post_decode(self, state):
        self.final_latents[state.request_id] = state.latents.detach().to("cpu", torch.float64)
        return self._pipeline.post_decode(state)

    def post_decode_many(self, states):
        """Requests that finish in the same step decode together (engine/runner.py): recorded too."""
        for state in states:
            self.final_latents[state.request_id] = state.latents.detach().to("cpu", torch.float64)
        return self._pipeline.post_decode_many(states)


@dataclass(frozen=True)
class Result:
    latents: torch.Tensor  # float64, on the CPU
    pixels: np.ndarray  # uint8: [H, W, 3], or [F, H, W, 3] for a video


def run_engine(recording: RecordingPipeline, requests: list[GenerationParams]) -> tuple[list[Result], list, dict]:
    """Queue every request, then start the engine: they join its first step together.
    Returns their results, their resolved parameters and the forwards by batch size."""
    limits = ServingLimits(max_steps=1000, max_size=4096, max_queue=1000, max_per_session=1000)
    engine = Engine(recording, mode="step", max_batch_requests=8, limits=limits)
    handles = [engine.submit(params, session_id="gpu-check") for params in requests]
    engine.start()
    try:
        finals = [handle.result(timeout=600) for handle in handles]
    finally:
        engine.close()
    results = []
    for handle, final in zip(handles, finals):
        if not isinstance(final, Completed):
            raise RuntimeError(f"request {handle.request_id[:8]} ended as {final!r}")
        pixels = np.stack([np.asarray(image) for image in final.images]) if final.is_video else np.asarray(final.images[0])
        results.append(Result(recording.final_latents[handle.request_id], pixels))
    sizes = dict(engine.snapshot().stats.forwards_by_batch_size)
    return results, [handle.params for handle in handles], sizes


# ---------------------------------------------------------------------------- the stock side
def run_stock(stock, class_name: str, params: GenerationParams, device: torch.device, text_length: int) -> Result:
    final = {}

    def keep_latents(pipe, step, timestep, tensors):
        final["latents"] = tensors["latents"].detach().to("cpu", torch.float64)
        return {}

    output = stock(
        prompt=params.prompt,
        width=params.width,
        height=params.height,
        num_inference_steps=params.num_inference_steps,
        generator=torch.Generator(device=device).manual_seed(params.seed),  # ours draws on its device too
        callback_on_step_end=keep_latents,
        output_type="pil",
        **stock_arguments(class_name, stock, params, text_length),
    )
    if hasattr(output, "frames"):  # a video pipeline
        pixels = np.stack([np.asarray(frame) for frame in output.frames[0]])
    else:
        pixels = np.asarray(output.images[0])
    return Result(final["latents"], pixels)


def compare(ours: Result, stock: Result, dtype: torch.dtype) -> dict:
    if ours.latents.shape != stock.latents.shape or ours.pixels.shape != stock.pixels.shape:
        return {"passed": False, "error": f"shapes differ: latents {tuple(ours.latents.shape)} vs "
                                          f"{tuple(stock.latents.shape)}, pixels {ours.pixels.shape} vs {stock.pixels.shape}"}
    magnitude = stock.latents.abs().max().item()
    latent_diff = (ours.latents - stock.latents).abs().max().item()
    pixel_diff = int(np.abs(ours.pixels.astype(int) - stock.pixels.astype(int)).max())
    bound, levels = latent_bound(dtype, magnitude), pixel_bound(dtype)
    return {
        "max_abs_diff": latent_diff,
        "latent_magnitude": magnitude,
        "latent_bound": bound,
        "uint8_diff": pixel_diff,
        "uint8_bound": levels,
        "finite": bool(torch.isfinite(ours.latents).all()),
        "passed": bool(latent_diff <= bound and pixel_diff <= levels and torch.isfinite(ours.latents).all()),
    }


# ---------------------------------------------------------------------------- one family
def requests_for(output_kind: str) -> list[GenerationParams]:
    frames = {"num_frames": VIDEO_FRAMES} if output_kind == "video" else {}
    return [GenerationParams(prompt=prompt, negative_prompt=NEGATIVE, width=SIZE, height=SIZE, num_inference_steps=steps,
                             guidance_scale=GUIDANCE, seed=seed, **frames) for prompt, seed, steps in REQUESTS]


def check_family(name: str, build, workdir: Path, device: torch.device, dtype: torch.dtype) -> list[dict]:
    from pipelines.loader import FAMILIES, LoadOptions, load_pipeline
    from tests.tiny_checkpoints import T5_LENGTH

    folder = build(workdir / name, studio_config={"max_sequence_length": T5_LENGTH})
    class_name = json.loads((folder / "model_index.json").read_text())["_class_name"]
    ours = load_pipeline(str(folder), LoadOptions(device=str(device), dtype=str(dtype).removeprefix("torch.")))
    stock, stock_loader = load_stock(class_name, folder, device, dtype)
    recording = RecordingPipeline(ours)
    first, second = requests_for(ours.info.output_kind)

    alone, (resolved_first,), _ = run_engine(recording, [first])
    together, resolved, sizes = run_engine(recording, [first, second])
    stock_runs = [run_stock(stock, class_name, params, device, T5_LENGTH) for params in resolved]
    common = {
        "family": name,
        "class": class_name,
        "registered": class_name in FAMILIES,
        "attention_setting": ours.info.extras.get("attention", "-"),
        "attention_kernels": recording.attention,
        "stock_loader": stock_loader,
    }
    rows = [{**common, "run": "alone", "request": describe(resolved_first), **compare(alone[0], stock_runs[0], dtype)}]
    shared = sizes.get(2, 0)
    for index, (ours_result, stock_result) in enumerate(zip(together, stock_runs)):
        rows.append({**common, "run": f"co-batched {index + 1}/2", "request": describe(resolved[index]),
                     "shared_forwards": shared, **compare(ours_result, stock_result, dtype)})
        if shared == 0:
            rows[-1].update(passed=False, error="the two requests never shared a forward")
    return rows


def describe(params: GenerationParams) -> str:
    frames = f"x{params.num_frames}f" if params.num_frames and params.num_frames > 1 else ""
    return (f"{params.width}x{params.height}{frames}, {params.num_inference_steps} steps, seed {params.seed}, "
            f"guidance {params.guidance_scale:g}")


# ---------------------------------------------------------------------------- every family
def check_every_family(section: Section, workdir: Path, device: torch.device, dtype: torch.dtype) -> dict:
    from pipelines.loader import FAMILIES

    rows: list[dict] = []
    costs: list[float] = []
    for name, build in tiny_builders().items():
        estimate = max(costs, default=0.0)
        if not section.fits(estimate):
            section.skip(f"parity {name}", estimate)
            continue
        print(f"    {name}", flush=True)
        started = time.perf_counter()
        try:
            rows += check_family(name, build, workdir, device, dtype)
        except Exception as exc:  # noqa: BLE001 - one family's failure is a finding, not the end of the check
            rows.append({"family": name, "run": "load and run", "passed": False, "error": f"{type(exc).__name__}: {exc}"})
        costs.append(time.perf_counter() - started)
    checked = {row.get("class") for row in rows}
    for class_name in sorted(set(FAMILIES) - checked):
        if section.skipped or any("error" in row for row in rows):
            why = "not checked: a tiny checkpoint was skipped or failed (see there)"
        else:
            why = "registered in pipelines/loader.py FAMILIES, but no tiny checkpoint builds it"
        rows.append({"family": class_name, "class": class_name, "run": "-", "passed": False, "error": why})
    return {"dtype": str(dtype), "device": str(device), "bounds": describe_bounds(dtype), "rows": rows}

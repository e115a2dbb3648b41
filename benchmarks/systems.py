"""The systems a serving benchmark compares, behind one small interface.

- `DiffusersSystem`: the stock diffusers pipeline `__call__` (`FluxPipeline`, or `WanPipeline`
  for a video model), one request at a time from a FIFO queue: what a plain Gradio demo with
  concurrency 1 does.
- `EngineSystem`: stepstudio's engine in request mode or step mode with a given max batch (and,
  for a model that packs rows of different sizes, with packing off: size groups take turns).

Each `submit(item)` returns a `Ticket` whose `Record` collects the request's timestamps
(all on this process's `time.perf_counter()` clock, which the engine uses too).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

import torch

from benchmarks.workload import WorkItem
from engine import (
    Aborted,
    Completed,
    Engine,
    Failed,
    GenerationParams,
    Progress,
    ServingLimits,
    Started,
)
from pipelines.interface import Batch, RequestState
from pipelines.loader import load_pipeline


@dataclass
class Record:
    index: int
    steps: int
    submitted: float
    admitted: float | None = None  # first denoise step began
    admitted_batch: int | None = None  # rows of the forward it joined
    first_preview: float | None = None
    finished: float | None = None
    status: str = "pending"  # completed | aborted | failed
    cancel_requested: float | None = None
    steps_done: int = 0


class Ticket:
    def __init__(self, record: Record, done: threading.Event) -> None:
        self.record = record
        self._done = done

    def wait(self, timeout: float = 3600) -> None:
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.record.index} did not finish in {timeout} s")


def _negative_prompt(model_defaults) -> str | None:
    return model_defaults.negative_prompt


# ---------------------------------------------------------------------------- stepstudio
class EngineSystem:
    step_cache: float | None = 0.0  # every request's step-caching threshold (None: the model's default)
    images: dict[int, object] | None = None  # item index -> its first image, when kept

    def __init__(self, model: str, mode: str, max_batch: int, preview_every: int,
                 guidance_scale: float | None = None, step_cache: float | None = 0.0,
                 batched_decodes: bool = True, packs: bool = True, pipeline=None, keep_images: bool = False,
                 max_batch_tokens: int | None = None) -> None:
        self.pipeline = pipeline or load_pipeline(model)
        self.images: dict[int, object] | None = {} if keep_images else None  # item index -> its first image
        if not packs and getattr(self.pipeline, "packs", False):
            self.pipeline.packs = False  # each size its own batch key: size groups take turns
        self.preview_every = preview_every
        self.guidance_scale = guidance_scale
        self.step_cache = step_cache
        limits = ServingLimits(max_steps=1000, max_size=4096, max_queue=100_000, max_per_session=100_000)
        self.engine = Engine(self.pipeline, mode=mode, max_batch_requests=max_batch, limits=limits,
                             batched_decodes=batched_decodes, max_batch_tokens=max_batch_tokens).start()

    def params(self, item: WorkItem) -> GenerationParams:
        return GenerationParams(
            prompt=item.prompt,
            width=item.width_height[0],
            height=item.width_height[1],
            num_inference_steps=item.steps,
            seed=item.seed,
            preview_every=self.preview_every,
            guidance_scale=self.guidance_scale,
            num_frames=item.frames,
            step_cache=self.step_cache,
        )

    def submit(self, item: WorkItem) -> Ticket:
        record = Record(item.index, item.steps, submitted=time.perf_counter())
        handle = self.engine.submit(self.params(item), session_id=f"user{item.user}")
        done = threading.Event()

        def follow() -> None:
            try:
                record_events()
            finally:
                done.set()  # a follower that fails must not leave its caller waiting for ever

        def record_events() -> None:
            for event in handle.events():
                now = time.perf_counter()
                if isinstance(event, Started):
                    record.admitted = now
                    record.admitted_batch = event.batch_size
                elif isinstance(event, Progress):
                    record.steps_done = event.step
                    if event.preview is not None and record.first_preview is None:
                        record.first_preview = now
                    if item.cancel_after_step is not None and event.step == item.cancel_after_step:
                        record.cancel_requested = time.perf_counter()
                        handle.cancel()
                elif isinstance(event, (Completed, Aborted, Failed)):
                    record.finished = now
                    record.status = {Completed: "completed", Aborted: "aborted", Failed: "failed"}[type(event)]
                    if isinstance(event, Completed) and self.images is not None:
                        self.images[item.index] = event.images[0]

        threading.Thread(target=follow, daemon=True).start()
        return Ticket(record, done)

    def batch_sizes(self) -> dict[int, int]:
        return dict(self.engine.snapshot().stats.forwards_by_batch_size)

    def close(self) -> None:
        self.engine.close()


# ---------------------------------------------------------------------------- diffusers
class DiffusersSystem:
    """FluxPipeline.__call__ (WanPipeline.__call__ for a video model) one request at a time, with
    the model's serving defaults."""

    def __init__(self, model: str, preview_every: int, guidance_scale: float | None = None,
                 keep_images: bool = False) -> None:
        from pathlib import Path

        from diffusers import FluxPipeline

        from pipelines.loader import BUILTIN_MODELS, read_model_index
        from pipelines.studio_config import read_studio_config

        path = str(BUILTIN_MODELS[model or "builtin"]) if model in (None, *BUILTIN_MODELS) else model
        self.makes_video = read_model_index(Path(path)).get("_class_name") == "WanPipeline"
        if self.makes_video:
            from benchmarks.gpu_parity import load_stock

            self.pipe, _ = load_stock("WanPipeline", Path(path), torch.device("cpu"), torch.float32)
        else:
            self.pipe = FluxPipeline.from_pretrained(path, use_safetensors=True, dtype=torch.float32)
        self.pipe.set_progress_bar_config(disable=True)
        studio = read_studio_config(Path(path))
        self.max_sequence_length = studio.max_sequence_length or 512
        if guidance_scale is None:
            # Wan's own default guidance is 5 (WanPipeline.__call__ and the step pipeline agree).
            family_default = 5.0 if self.makes_video else 1.0
            guidance_scale = studio.guidance_scale if studio.guidance_scale is not None else family_default
        self.guidance_scale = guidance_scale
        self.negative_prompt = studio.negative_prompt
        self.images: dict[int, object] | None = {} if keep_images else None  # item index -> its first image
        self._queue: queue.Queue = queue.Queue()
        self._worker = threading.Thread(target=self._serve, daemon=True)
        self._worker.start()
        self._forwards = 0

    def submit(self, item: WorkItem) -> Ticket:
        record = Record(item.index, item.steps, submitted=time.perf_counter())
        done = threading.Event()
        self._queue.put((item, record, done))
        return Ticket(record, done)

    def _serve(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            item, record, done = job
            record.admitted = time.perf_counter()

            def on_step_end(pipe, step_index, timestep, callback_kwargs):
                record.steps_done = step_index + 1
                if item.cancel_after_step is not None and record.steps_done == item.cancel_after_step:
                    record.cancel_requested = time.perf_counter()
                    pipe._interrupt = True  # diffusers skips the remaining steps, then still decodes
                return callback_kwargs

            output = self.pipe(
                prompt=item.prompt,
                **self._guidance(item),
                height=item.width_height[1],
                width=item.width_height[0],
                num_inference_steps=item.steps,
                generator=torch.Generator().manual_seed(item.seed),
                max_sequence_length=self.max_sequence_length,
                callback_on_step_end=on_step_end,
            )
            self._forwards += record.steps_done
            if self.images is not None:
                self.images[item.index] = output.images[0] if not self.makes_video else output.frames[0]
            record.finished = time.perf_counter()
            record.status = "aborted" if record.cancel_requested is not None else "completed"
            done.set()

    def _guidance(self, item: WorkItem) -> dict:
        """The stock __call__'s guidance arguments as the step pipeline's defaults ask for them."""
        if self.makes_video:  # CFG when guidance > 1, the negative prompt "" when none (as __call__)
            return {"negative_prompt": self.negative_prompt, "guidance_scale": self.guidance_scale,
                    "num_frames": item.frames, "output_type": "pil"}
        true_cfg = self.negative_prompt is not None and self.guidance_scale > 1
        return {"negative_prompt": self.negative_prompt if true_cfg else None,
                "true_cfg_scale": self.guidance_scale if true_cfg else 1.0}

    def batch_sizes(self) -> dict[int, int]:
        return {1: self._forwards} if self._forwards else {}

    def close(self) -> None:
        self._queue.put(None)
        self._worker.join(timeout=60)


# ---------------------------------------------------------------------------- ceiling
@torch.no_grad()
def measure_denoiser(model: str, size: int, batch_sizes: tuple[int, ...], repeats: int = 10,
                     guidance_scale: float | None = None, frames: int | None = None) -> dict:
    """Time the bare batched denoiser forward (the pipeline's denoise_step, no engine), and
    one request's encode and decode, to compute the batching ceiling."""
    pipeline = load_pipeline(model)
    engine = Engine(pipeline)  # only for its parameter resolution; never started
    states = []
    encode_s, encode_cpu_s = [], []
    for i in range(max(batch_sizes)):
        params = engine.prepare_params(
            GenerationParams(prompt=f"a red circle {i}", width=size, height=size, seed=i, guidance_scale=guidance_scale,
                             num_frames=frames, step_cache=0)
        )
        state = RequestState(request_id=str(i), params=params)
        started, cpu_started = time.perf_counter(), time.process_time()
        pipeline.prepare_encode(state)
        encode_s.append(time.perf_counter() - started)
        encode_cpu_s.append(time.process_time() - cpu_started)
        states.append(state)
    started, cpu_started = time.perf_counter(), time.process_time()
    pipeline.post_decode(states[0])
    decode_s, decode_cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    per_image_step, per_image_step_cpu = {}, {}
    for b in batch_sizes:
        batch = Batch(tuple(states[:b]))
        pipeline.denoise_step(batch)  # warm-up
        trials = []
        for _ in range(5):  # the median of 5 trials: this machine's timings are noisy
            started, cpu_started = time.perf_counter(), time.process_time()
            for _ in range(repeats):
                pipeline.denoise_step(batch)
            trials.append(((time.perf_counter() - started) / repeats / b, (time.process_time() - cpu_started) / repeats / b))
        per_image_step[b] = sorted(wall for wall, _ in trials)[2]
        per_image_step_cpu[b] = sorted(cpu for _, cpu in trials)[2]

    def mean_after_first(samples: list[float]) -> float:
        return sum(samples[1:]) / max(1, len(samples) - 1) if len(samples) > 1 else samples[0]

    return {
        "per_image_step_s": per_image_step,
        "encode_s": mean_after_first(encode_s),
        "decode_s": decode_s,
        # The same in this process's CPU time (the work, less moved by other load on the machine).
        "per_image_step_cpu_s": per_image_step_cpu,
        "encode_cpu_s": mean_after_first(encode_cpu_s),
        "decode_cpu_s": decode_cpu_s,
    }


# ---------------------------------------------------------------------------- over HTTP
class HttpSystem:
    """stepstudio step mode behind its OpenAI-compatible HTTP API (uvicorn on 127.0.0.1):
    the same engine plus JSON, PNG encoding, base64 and a socket per request. The client
    can't see steps over this API, so cancels are not sent and admission is not observed."""

    def __init__(self, model: str, max_batch: int, preview_every: int, guidance_scale: float | None = None) -> None:
        import socket

        import uvicorn
        from fastapi import FastAPI

        from studio.api.http_routes import build_router

        inner = EngineSystem(model, mode="step", max_batch=max_batch, preview_every=0)
        self.guidance_scale = guidance_scale
        self.engine = inner.engine
        app = FastAPI()
        app.include_router(build_router(self.engine))
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1/images/generations"
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the benchmark's HTTP server did not start in 30 s")
            time.sleep(0.01)

    def submit(self, item: WorkItem) -> Ticket:
        import httpx

        record = Record(item.index, item.steps, submitted=time.perf_counter())
        done = threading.Event()
        body = {"prompt": item.prompt, "size": "{}x{}".format(*item.width_height), "num_inference_steps": item.steps,
                "seed": item.seed, "response_format": "b64_json"}
        if self.guidance_scale is not None:
            body["guidance_scale"] = self.guidance_scale

        def call() -> None:
            response = httpx.post(self.url, json=body, timeout=3600)
            record.finished = time.perf_counter()
            record.steps_done = item.steps if response.status_code == 200 else 0
            record.status = "completed" if response.status_code == 200 else "failed"
            done.set()

        threading.Thread(target=call, daemon=True).start()
        return Ticket(record, done)

    def batch_sizes(self) -> dict[int, int]:
        return dict(self.engine.snapshot().stats.forwards_by_batch_size)

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self.engine.close()

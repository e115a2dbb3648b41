"""Serving the real-size stand-in on the GPU: how the engine's modes compare, and how far batching goes.

- `compare_modes`: one seeded open-loop workload (arrivals two step-times apart, two step
  counts, one request cancelled after its first step) served by the stock `FluxPipeline.__call__` one
  request at a time, by the engine in request mode and by the engine in step mode, each
  after a warm-up request; summarised as benchmarks/serving.py does (throughput, latency,
  admission and cancel latency, batch sizes). Admission and cancel come out in step-times.
- `stand_in_against_stock`: first, one request through both, to show the baseline and the
  stand-in do the same math (same final latents within the dtype's bound).
- `batching_curve`: for each batch size B, B requests queued before the engine starts, so
  every forward has B rows from the first step to the last; images per second against B = 1.

Each system and each batch size runs only when its estimate fits the section's time.
"""

from __future__ import annotations

import queue
import resource
import threading
import time
from dataclasses import asdict, replace
from typing import Callable

import torch

from benchmarks.gpu_budget import Section
from benchmarks.gpu_memory import synchronize
from benchmarks.gpu_parity import RecordingPipeline, latent_bound, run_engine
from benchmarks.gpu_stand_in import StandInFluxPipeline
from benchmarks.serving import _drive, _engine_histogram_totals, summarize
from benchmarks.systems import EngineSystem, Record, Ticket
from benchmarks.workload import WorkItem, Workload, make_workload
from engine import Completed, Engine, GenerationParams, ServingLimits

LIMITS = ServingLimits(max_steps=1000, max_size=4096, max_queue=100_000, max_per_session=100_000)
GUIDANCE = 3.5  # FLUX.1-dev's embedded guidance
MAX_BATCH = 8


# ---------------------------------------------------------------------------- the systems
class StandInEngineSystem(EngineSystem):
    """benchmarks/systems.py's EngineSystem over a pipeline object instead of a model folder."""

    def __init__(self, pipeline: StandInFluxPipeline, mode: str, max_batch: int) -> None:
        self.pipeline = pipeline
        self.preview_every = 0
        self.guidance_scale = GUIDANCE
        self.engine = Engine(pipeline, mode=mode, max_batch_requests=max_batch, limits=LIMITS).start()


class StockOneAtATime:
    """The stock FluxPipeline.__call__ around the same transformer, one request at a time
    from a FIFO queue (a plain demo with concurrency 1), given the stand-in's embeddings."""

    def __init__(self, pipe, stand_in: StandInFluxPipeline) -> None:
        self.pipe = pipe
        self.stand_in = stand_in
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._forwards = 0
        self._worker = threading.Thread(target=self._serve, name="stock-one-at-a-time", daemon=True)
        self._worker.start()

    def submit(self, item: WorkItem) -> Ticket:
        record = Record(item.index, item.steps, submitted=time.perf_counter())
        done = threading.Event()
        self._jobs.put((item, record, done))
        return Ticket(record, done)

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            item, record, done = job
            record.admitted = time.perf_counter()
            record.admitted_batch = 1
            self._run(item, record)
            self._forwards += record.steps_done
            record.finished = time.perf_counter()
            record.status = "aborted" if record.cancel_requested is not None else "completed"
            done.set()

    def _run(self, item: WorkItem, record: Record) -> None:
        def on_step_end(pipe, step_index, timestep, tensors):
            record.steps_done = step_index + 1
            if item.cancel_after_step is not None and record.steps_done == item.cancel_after_step:
                record.cancel_requested = time.perf_counter()
                pipe._interrupt = True  # diffusers' own cancel: the remaining steps are skipped
            return {}

        rows = self.stand_in.text_rows(item.prompt)
        self.pipe(
            prompt_embeds=rows.embeds,
            pooled_prompt_embeds=rows.pooled,
            height=item.size,
            width=item.size,
            num_inference_steps=item.steps,
            guidance_scale=GUIDANCE,
            max_sequence_length=self.stand_in.config.text_tokens,
            generator=torch.Generator(device=self.stand_in.device).manual_seed(item.seed),
            output_type="latent",
            callback_on_step_end=on_step_end,
        )
        synchronize(self.stand_in.device)

    def batch_sizes(self) -> dict[int, int]:
        return {1: self._forwards} if self._forwards else {}

    def close(self) -> None:
        self._jobs.put(None)
        self._worker.join(timeout=60)


# ---------------------------------------------------------------------------- step vs request vs one at a time
def stand_in_against_stock(pipeline: StandInFluxPipeline, stock_pipe, size: int, steps: int = 4) -> dict:
    """One request through the engine and through the stock __call__: their final latents."""
    params = GenerationParams(prompt="a faithful baseline", width=size, height=size, num_inference_steps=steps,
                              guidance_scale=GUIDANCE, seed=7)
    recording = RecordingPipeline(pipeline)
    (ours,), _, _ = run_engine(recording, [params])
    rows = pipeline.text_rows(params.prompt)
    stock = stock_pipe(prompt_embeds=rows.embeds, pooled_prompt_embeds=rows.pooled, height=size, width=size,
                       num_inference_steps=steps, guidance_scale=GUIDANCE,
                       max_sequence_length=pipeline.config.text_tokens,
                       generator=torch.Generator(device=pipeline.device).manual_seed(params.seed),
                       output_type="latent").images.to("cpu", torch.float64)
    difference = (ours.latents - stock).abs().max().item()
    bound = latent_bound(pipeline.dtype, stock.abs().max().item())
    return {"steps": steps, "max_abs_diff": difference, "bound": bound, "passed": difference <= bound,
            "attention_kernels": recording.attention}


def serving_workload(size: int, requests: int, steps: tuple[int, ...], step_s: float) -> Workload:
    """Open loop, a request every two step-times. The third request asks for four times the
    longest step count and is cancelled after its first step: the cancel, sent when the client
    sees that step, always arrives while the request still has steps to run."""
    workload = make_workload("open", requests, users=1, rate_per_s=1 / (2 * step_s), steps_mix=steps, sizes=(size,),
                             cancel_fraction=0.0, seed=0, arrivals="fixed", guidance_scale=GUIDANCE)
    items = list(workload.items)
    cancelled = min(2, len(items) - 1)
    items[cancelled] = replace(items[cancelled], steps=4 * max(steps), cancel_after_step=1)
    return replace(workload, items=tuple(items))


def measure_system(name: str, system, workload: Workload) -> dict:
    """One system on the workload, after one warm-up request; summarised like benchmarks/serving.py."""
    warm = system.submit(replace(workload.items[0], index=-1, cancel_after_step=None))
    warm.wait()
    solo = warm.record
    warm_sizes = dict(system.batch_sizes())
    before = _engine_histogram_totals(system)
    started = time.perf_counter()
    records = _drive(system, workload)
    wall = time.perf_counter() - started
    engine_means = {}
    for key, (total, count) in _engine_histogram_totals(system).items():
        total_before, count_before = before[key]
        engine_means[key] = (total - total_before) / (count - count_before) if count > count_before else None
    sizes = {b: n - warm_sizes.get(b, 0) for b, n in system.batch_sizes().items() if n - warm_sizes.get(b, 0) > 0}
    system.close()
    device = torch.device("cuda") if torch.cuda.is_available() else None
    summary = summarize({
        "system": name,
        "wall_s": wall,
        "solo_step_s": (solo.finished - solo.admitted) / solo.steps,
        **engine_means,
        "solo_latency_s": solo.finished - solo.submitted,
        "forwards_by_batch_size": sizes,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_gpu_mb": torch.cuda.max_memory_allocated(device) / 2**20 if device else None,
        "records": [asdict(r) for r in sorted(records, key=lambda r: r.index)],
    })
    return with_step_times(summary)


def with_step_times(summary: dict) -> dict:
    """Admission and cancel latency in units of the step this system served with."""
    step = summary["serving_step_s"] or summary["solo_step_s"]
    summary["step_unit_s"] = step
    summary["images_per_s"] = summary["completed"] / summary["wall_s"]
    for key, seconds in (("admission_p50", summary["admission_p50_s"]),
                         ("cancel_engine", summary.get("engine_cancel_s")),
                         ("cancel_client", summary["cancel_latency_mean_s"])):
        summary[f"{key}_steps"] = None if seconds is None or not step else seconds / step
    return summary


def compare_modes(pipeline: StandInFluxPipeline, stock_pipe, size: int, requests: int, steps: tuple[int, ...],
                  section: Section) -> dict:
    baseline = stand_in_against_stock(pipeline, stock_pipe, size)
    step_s = solo_step_seconds(pipeline, size)
    workload = serving_workload(size, requests, steps, step_s)
    # Every request's steps (the cancelled one: a few), and the warm-up request's.
    image_steps = sum(item.cancel_after_step or item.steps for item in workload.items) + 2 + max(steps)
    systems = {
        "one at a time (stock FluxPipeline)": lambda: StockOneAtATime(stock_pipe, pipeline),
        f"request mode (max {MAX_BATCH})": lambda: StandInEngineSystem(pipeline, "request", MAX_BATCH),
        f"step mode (max {MAX_BATCH})": lambda: StandInEngineSystem(pipeline, "step", MAX_BATCH),
    }
    rows = []
    for name, make in systems.items():
        # Serving the workload takes at most its image-steps one at a time (batching only helps).
        summary = section.run_if_it_fits(f"serving: {name}", 1.3 * image_steps * step_s,
                                         lambda: measure_system(name, make(), workload))
        if summary is not None:
            rows.append(summary)
    return {"size": size, "stand_in_against_stock": baseline, "solo_step_s": step_s,
            "workload": [asdict(item) for item in workload.items], "rows": rows, "targets": mode_targets(rows)}


def mode_targets(rows: list[dict]) -> dict:
    by_name = {row["system"].split(" (")[0]: row for row in rows}
    targets = {}
    if "step mode" in by_name and "request mode" in by_name:
        ratio = by_name["step mode"]["images_per_s"] / by_name["request mode"]["images_per_s"]
        targets["step_over_request"] = {"value": ratio, "target": ">= 1.0", "met": ratio >= 1.0}
    if "step mode" in by_name and "one at a time" in by_name:
        targets["step_over_one_at_a_time"] = {
            "value": by_name["step mode"]["images_per_s"] / by_name["one at a time"]["images_per_s"]}
    return targets


def solo_step_seconds(pipeline: StandInFluxPipeline, size: int, steps: int = 3) -> float:
    """One request alone through the engine (also the warm-up): seconds per step."""
    return run_batch(pipeline, size, batch=1, steps=steps)["seconds"] / steps


# ---------------------------------------------------------------------------- the batching curve
def run_batch(pipeline, size: int, batch: int, steps: int, step_cache: float | None = None) -> dict:
    """`batch` requests queued before the engine starts: every forward has `batch` rows. With
    `step_cache`, every request's threshold (benchmarks/gpu_caching.py)."""
    engine = Engine(pipeline, mode="step", max_batch_requests=batch, limits=LIMITS)
    handles = [engine.submit(GenerationParams(prompt=f"request {i}", width=size, height=size, num_inference_steps=steps,
                                              guidance_scale=GUIDANCE, seed=i, step_cache=step_cache),
                             session_id=f"client{i}")
               for i in range(batch)]
    started = time.perf_counter()
    engine.start()
    try:
        finals = [handle.result(timeout=3600) for handle in handles]
    finally:
        engine.close()
    seconds = time.perf_counter() - started
    failed = [final for final in finals if not isinstance(final, Completed)]
    if failed:
        raise RuntimeError(f"{len(failed)} of {batch} requests did not complete: {failed[0]!r}")
    stats = engine.snapshot().stats
    return {"seconds": seconds, "forwards": dict(stats.forwards_by_batch_size), "finals": finals,
            "rows_computed": stats.rows_computed, "rows_skipped": stats.rows_skipped,
            "request_ids": [handle.request_id for handle in handles]}


def batching_curve(pipeline, size: int, batches: tuple[int, ...], steps: int, section: Section,
                   on_row: Callable[[dict], None] | None = None) -> dict:
    """Images per second for each batch size (after a one-step warm-up at that size);
    `on_row` sees each row as soon as it is measured."""
    rows = []
    per_row_step_s = None
    for batch in batches:
        estimate = 0.0 if per_row_step_s is None else 1.3 * per_row_step_s * batch * (steps + 1)

        def measure(batch=batch) -> dict:
            warm_up = run_batch(pipeline, size, batch, steps=1)["seconds"]
            timed = run_batch(pipeline, size, batch, steps)
            return {"batch": batch, "warm_up_s": warm_up, "seconds": timed["seconds"], "steps": steps,
                    "images_per_s": batch / timed["seconds"], "step_s": timed["seconds"] / steps,
                    "forwards_by_batch_size": timed["forwards"]}

        row = section.run_if_it_fits(f"batching curve: batch {batch}", estimate, measure)
        if row is None:
            continue
        rows.append(row)
        per_row_step_s = row["step_s"] / batch
        if on_row is not None:
            on_row(row)
    base = next((row["images_per_s"] for row in rows if row["batch"] == 1), None)
    for row in rows:
        row["speedup"] = None if base is None else row["images_per_s"] / base
    return {"size": size, "rows": rows}

"""Step caching on the real-size stand-in: rows skipped and speed at the serving size.

The stand-in (benchmarks/gpu_stand_in.py) runs the FLUX transformer itself; here it is given
the FLUX family's per-row step cache (pipelines/step_cache.py with pipelines/flux.py's
`block_stack`), exactly as the studio's FLUX pipeline applies it. For each threshold (0 = off
first), `requests` requests queued before the engine starts run `steps` steps side by side;
the row reports images per second, the share of rows that skipped the later blocks, and the
final latents' largest difference from caching off. A threshold no change stays under (every
row computes, through the cache's block loop) must give exactly caching off's latents.

The stand-in's weights are random: how many steps a threshold skips says little about a trained
model (docs/benchmarks.md has the built-in models' sweeps); what this measures is what a skipped
row saves at 1024x1024 on the device, and that the gathered forward is right there.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace

import torch

from benchmarks.gpu_budget import Section
from benchmarks.gpu_serving import run_batch
from benchmarks.gpu_stand_in import StandInFluxPipeline
from pipelines.flux import FluxStepPipeline
from pipelines.interface import Batch, RequestState
from pipelines.step_cache import CachedRequest, RowStepCache, StepCacheState

NOTHING_SKIPPED = 1e-9  # every relative change is larger: every row computes


class CachingStandIn(StandInFluxPipeline):
    """The stand-in with the FLUX family's per-row step cache (no CFG rows: guidance is embedded)."""

    def __init__(self, stand_in: StandInFluxPipeline) -> None:
        super().__init__(stand_in.transformer, stand_in.config)
        self.step_cache = RowStepCache(FluxStepPipeline.block_stack)
        self.info = replace(self.info, step_cache=True)

    def prepare_encode(self, state: RequestState) -> None:
        super().prepare_encode(state)
        state.extra = StepCacheState() if state.params.step_cache else None

    def denoise_step(self, batch: Batch):
        if not any(state.extra is not None for state in batch.states):
            return super().denoise_step(batch)
        requests = [CachedRequest(state, (row,), state.extra) for row, state in enumerate(batch.states)]
        with self.step_cache.applied(self.transformer, requests, lambda rows: contextlib.nullcontext()):
            return super().denoise_step(batch)

    def post_decode(self, state: RequestState):
        self.final_latents[state.request_id] = state.latents.float().cpu()
        return super().post_decode(state)


def run_cached(pipeline: CachingStandIn, size: int, requests: int, steps: int, threshold: float) -> dict:
    """`requests` requests queued before the engine starts, each with `threshold`."""
    pipeline.final_latents = {}
    run = run_batch(pipeline, size, requests, steps, step_cache=threshold)
    rows = run["rows_computed"] + run["rows_skipped"]
    return {"seconds": run["seconds"], "images_per_s": requests / run["seconds"], "rows_skipped": run["rows_skipped"] / rows,
            "skipped_steps": [len(final.skipped_steps) for final in run["finals"]],
            "latents": [pipeline.final_latents[request_id] for request_id in run["request_ids"]]}


def caching_rows(stand_in: StandInFluxPipeline, size: int, requests: int, steps: int,
                 thresholds: tuple[float, ...], section: Section) -> dict:
    """Caching off, then NOTHING_SKIPPED (the exactness check), then each threshold."""
    pipeline = CachingStandIn(stand_in)
    rows, off, per_run_s = [], None, None
    for threshold in (0.0, NOTHING_SKIPPED, *thresholds):
        estimate = 0.0 if per_run_s is None else 1.3 * per_run_s
        run = section.run_if_it_fits(f"step cache {threshold:g}: {requests} x {steps} steps at {size}x{size}", estimate,
                                     lambda threshold=threshold: run_cached(pipeline, size, requests, steps, threshold))
        if run is None:
            continue
        per_run_s = per_run_s or run["seconds"]
        latents = run.pop("latents")
        off = off or latents
        difference = max(float((a - b).abs().max()) for a, b in zip(latents, off))
        rows.append({"threshold": threshold, **run, "max_abs_diff_from_off": difference,
                     "speedup": None if not rows else run["images_per_s"] / rows[0]["images_per_s"]})
    exact = next((row for row in rows if row["threshold"] == NOTHING_SKIPPED), None)
    return {"size": size, "requests": requests, "steps": steps, "rows": rows, "nothing_skipped_threshold": NOTHING_SKIPPED,
            "nothing_skipped_is_exact": None if exact is None else exact["max_abs_diff_from_off"] == 0.0}


@torch.no_grad()
def measure_caching(stand_in: StandInFluxPipeline, settings, section: Section) -> dict:
    return caching_rows(stand_in, settings.caching_size, settings.caching_requests, settings.caching_steps,
                        settings.caching_thresholds, section)

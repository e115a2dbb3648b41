"""Drive a step pipeline by hand, without the engine: exact arrivals, float outputs."""

from __future__ import annotations

import numpy as np

from pipelines.interface import Batch, RequestState, resolve_defaults
from pipelines.params import GenerationParams


def drive(pipeline, arrivals: list[tuple[int, GenerationParams]]) -> list[RequestState]:
    """Run requests to the end of denoising; request i joins the batch at global step arrivals[i][0].

    Every global step is ONE denoise_step over all live requests, as the engine's step mode does."""
    states = [
        RequestState(request_id=f"r{i}", params=resolve_defaults(p, pipeline.info.defaults))
        for i, (_, p) in enumerate(arrivals)
    ]
    live: list[RequestState] = []
    step = 0
    while live or any(arrival >= step for arrival, _ in arrivals):
        for (arrival, _), state in zip(arrivals, states):
            if arrival == step:
                pipeline.prepare_encode(state)
                live.append(state)
        if live:
            predictions = pipeline.denoise_step(Batch(tuple(live)))
            assert len(predictions) == len(live), "denoise_step must return one prediction per row"
            for state, prediction in zip(live, predictions):
                pipeline.step_scheduler(state, prediction)
            live = [s for s in live if not s.is_denoised]
        step += 1
    return states


def max_abs_diff(a, b) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())


class SubmitDuringForward:
    """Wraps a step pipeline for an Engine: during forward number k (1-based) it submits the
    requests planned for k, so they join at the very next step boundary, mid-run.

    Submitting from the engine's own thread makes the arrival step exact; reacting to
    Progress events from another thread would depend on thread timing."""

    def __init__(self, pipeline, plan: dict[int, GenerationParams]) -> None:
        self._pipeline = pipeline
        self._plan = dict(plan)
        self._forwards = 0
        self.engine = None  # set before the first submit
        self.handles: dict[int, object] = {}  # forward number -> RequestHandle

    def __getattr__(self, name):
        return getattr(self._pipeline, name)

    def denoise_step(self, batch):
        self._forwards += 1
        if self._forwards in self._plan:
            params = self._plan.pop(self._forwards)
            self.handles[self._forwards] = self.engine.submit(params, session_id=f"joiner-{self._forwards}")
        return self._pipeline.denoise_step(batch)

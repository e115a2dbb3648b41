"""Helpers for engine tests: run a toy engine, collect results, compare images exactly."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import numpy as np

from engine import Completed, Engine, GenerationParams
from pipelines.toy import ToyPipeline


@contextlib.contextmanager
def running_engine(pipeline=None, **engine_kwargs):
    engine = Engine(pipeline or ToyPipeline(), **engine_kwargs).start()
    try:
        yield engine
    finally:
        engine.close()


@contextlib.contextmanager
def engine_started_after(submissions, pipeline=None, **engine_kwargs):
    """Submit (params, session) pairs before the engine thread starts, so they all arrive
    at the same first step boundary. Yields (engine, handles)."""
    engine = Engine(pipeline or ToyPipeline(), **engine_kwargs)
    handles = [engine.submit(p, session_id=session) for p, session in submissions]
    engine.start()
    try:
        yield engine, handles
    finally:
        engine.close()


def params(prompt: str = "a red circle", seed: int = 1, steps: int = 6, size: int = 64, **extra) -> GenerationParams:
    return GenerationParams(prompt=prompt, seed=seed, num_inference_steps=steps, width=size, height=size, **extra)


def pixels(final) -> np.ndarray:
    assert isinstance(final, Completed), f"expected a completed request, got {final!r}"
    return np.asarray(final.images[0])


def solo_pixels(p: GenerationParams) -> np.ndarray:
    """The image a request makes when it runs entirely alone."""
    with running_engine(max_batch_requests=1) as engine:
        return pixels(engine.submit(p).result(timeout=30))


class StepGate:
    """An `on_forward` hook that holds the engine thread inside forward `index` until released,
    so a test can look at or act on the engine at an exact step, with no sleeps or timing.
    With `min_requests`, it holds instead in the first forward that has at least that many
    requests (all of them are running then); with `when`, in the first forward in which
    `when()` is true (e.g. a look at the engine's published snapshot)."""

    def __init__(self, index: int | None = None, *, min_requests: int | None = None,
                 when: Callable[[], bool] | None = None) -> None:
        self.index = index
        self.min_requests = min_requests
        self.when = when
        self._reached = threading.Event()
        self._released = threading.Event()

    def __call__(self, index: int, batch) -> None:
        if self._reached.is_set():
            return
        if (index == self.index or (self.min_requests is not None and len(batch.request_ids) >= self.min_requests)
                or (self.when is not None and self.when())):
            self._reached.set()
            assert self._released.wait(30), "the test never released the engine"

    def wait(self) -> None:
        where = (f"a forward of {self.min_requests} requests" if self.min_requests is not None
                 else "a forward where its condition held" if self.when is not None else f"forward {self.index}")
        assert self._reached.wait(30), f"the engine never reached {where}"

    def release(self) -> None:
        self._released.set()


def spy_on_cancels(engine, monkeypatch) -> list[str]:
    """The request ids the engine is asked to cancel, from now on."""
    cancels: list[str] = []
    cancel = engine.cancel

    def recording(request_id, *args, **kwargs):
        cancels.append(request_id)
        return cancel(request_id, *args, **kwargs)

    monkeypatch.setattr(engine, "cancel", recording)
    return cancels


def spy_on_submits(engine, monkeypatch=None) -> list[GenerationParams]:
    """The params of every request submitted to the engine from now on: for the engine's life, or
    for one test with its `monkeypatch`."""
    submitted: list[GenerationParams] = []
    submit = engine.submit

    def recording(params, *args, **kwargs):
        submitted.append(params)
        return submit(params, *args, **kwargs)

    if monkeypatch is None:
        engine.submit = recording
    else:
        monkeypatch.setattr(engine, "submit", recording)
    return submitted


def run_workflow_to_end(pipeline, compiled, session_id: str):
    """Run a compiled workflow on a fresh engine over `pipeline` until it ends: (its last view,
    the engine's forwards by batch size)."""
    import asyncio

    from engine import Engine
    from studio.workflows.run import WorkflowRun

    engine = Engine(pipeline, max_batch_requests=8).start()
    try:
        run = WorkflowRun(engine, compiled, session_id=session_id)

        async def last_view():
            async for view in run.updates():
                pass
            return view

        final = asyncio.run(last_view())
        return final, dict(engine.snapshot().stats.forwards_by_batch_size)
    finally:
        engine.close()

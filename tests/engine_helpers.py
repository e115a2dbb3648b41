"""Helpers for engine tests: run a toy engine, collect results, compare images exactly."""

from __future__ import annotations

import contextlib

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
    with running_engine(max_batch=1) as engine:
        return pixels(engine.submit(p).result(timeout=30))

"""Warm the engine up before serving: the first forwards pay for lazy initialisation and,
with a compiled denoiser, for compilation. Run a short request per configured size."""

from __future__ import annotations

import logging
import time

from engine.client import EngineClient
from engine.events import Completed
from pipelines.params import GenerationParams

log = logging.getLogger(__name__)


def warm_up(engine: EngineClient, sizes: list[tuple[int, int]], steps: int = 2, timeout: float = 1800) -> list[float]:
    """Run one `steps`-step request per (width, height) through the started engine.

    Returns each warm-up's wall time; raises RuntimeError if one does not complete."""
    times = []
    for width, height in sizes:
        started = time.perf_counter()
        params = GenerationParams(prompt="warm-up", width=width, height=height, num_inference_steps=steps, seed=0)
        final = engine.submit(params, session_id="warm-up").result(timeout=timeout)
        if not isinstance(final, Completed):
            raise RuntimeError(f"warm-up at {width}x{height} did not complete: {final!r}")
        times.append(time.perf_counter() - started)
        log.info("warmed up %dx%d in %.2f s", width, height, times[-1])
    return times

"""The page-bytes benchmark's parts that need no browser: its grid workflow and its loop-lag probe
(the full run drives Chromium against the built-in model; its figures are quoted in docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
import time

from benchmarks import page_bytes
from studio.workflows.compiler import compile_workflow
from studio.workflows.format import parse_workflow
from studio.workflows.limits import ModelLimits, WorkflowLimits


def test_the_grid_workflow_is_a_4x4_grid_of_16_branches():
    workflow = page_bytes.grid_workflow(steps=7, guidance=[1, 2, 3, 4], seeds=4)
    compiled = compile_workflow(parse_workflow(workflow), WorkflowLimits((ModelLimits(name="toy"),), max_branches=16))
    assert len(compiled.branches) == 16
    (grid,) = compiled.grids
    assert len(grid.rows) == 4 and len(grid.columns) == 4
    assert {branch.params.num_inference_steps for branch in compiled.branches} == {7}
    assert sorted({branch.params.guidance_scale for branch in compiled.branches}) == [1, 2, 3, 4]


def blocking_call(seconds: float) -> None:
    """What inline image encoding does to an event loop."""
    time.sleep(seconds)


def test_the_probe_sees_a_stall_of_the_event_loop():
    async def stalled() -> dict:
        probe = page_bytes.LoopLagProbe()
        probe.ensure_running()
        await asyncio.sleep(0.05)
        probe.take()  # start over: only the stall below counts
        await asyncio.sleep(0.02)
        blocking_call(0.08)
        await asyncio.sleep(0.03)
        return probe.take()

    figures = asyncio.run(stalled())
    assert figures["samples"] >= 2
    assert 60 <= figures["max_ms"] < 1000

"""Workflow runs on a real engine with the toy pipeline: shared forwards, limits, cancels, failures.

The toy pipeline logs the request ids of every forward, so "the branches shared a forward" is
checked on that log, and its images depend only on each request's own parameters, so every
branch must equal the same request run alone.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from PIL import Image

from engine import Engine, GenerationParams, ServingLimits
from pipelines.toy import ToyPipeline
from studio.workflows.compiler import compile_workflow
from studio.workflows.format import WorkflowError, parse_workflow
from studio.workflows.limits import ModelLimits, WorkflowLimits
from studio.workflows.run import WorkflowRun
from tests.engine_helpers import solo_pixels

STEPS = 6


def link(source, source_port, target, target_port):
    return {"from": {"node": source, "port": source_port}, "to": {"node": target, "port": target_port}}


def seed_by_guidance(seeds=(3, 4), guidance="1, 2", prompt="a red circle", steps=STEPS) -> dict:
    """Prompt + Seed batch x Guidance sweep -> Sampler -> Grid."""
    return {
        "version": 1,
        "nodes": [
            {"id": "p", "type": "prompt", "values": {"text": prompt}},
            {"id": "b", "type": "seed_batch", "values": {"start": seeds[0], "count": len(seeds)}},
            {"id": "g", "type": "sweep", "values": {"param": "guidance", "values": guidance}},
            {"id": "t", "type": "steps", "values": {"steps": steps}},
            {"id": "s", "type": "sampler", "values": {}},
            {"id": "grid", "type": "grid", "values": {"x": "guidance", "y": "seed"}},
        ],
        "links": [link("p", "prompt", "s", "prompt"), link("b", "seed", "s", "seed"), link("g", "values", "s", "guidance"),
                  link("t", "steps", "s", "steps"), link("s", "images", "grid", "images")],
    }


def compiled(source: dict, **limits):
    return compile_workflow(parse_workflow(source), WorkflowLimits((ModelLimits(name="toy", **limits),)))


def drive(run: WorkflowRun, engine: Engine, start_after_first_view: bool = True, on_view=None):
    """Iterate the run to its end on a fresh event loop; start the engine thread once the run
    has queued its first branches, so they all arrive at the same first step boundary."""

    async def go():
        views = []
        async for view in run.updates():
            views.append(view)
            if start_after_first_view and len(views) == 1:
                engine.start()
            if on_view is not None:
                on_view(view)
        return views

    return asyncio.run(go())


@pytest.fixture
def toy():
    pipeline = ToyPipeline()
    engine = Engine(pipeline, max_batch_requests=8, limits=ServingLimits(max_per_session=16))
    yield pipeline, engine
    engine.close()


def test_a_2x2_seed_by_guidance_run_shares_every_forward(toy):
    pipeline, engine = toy
    run = WorkflowRun(engine, compiled(seed_by_guidance()), session_id="tab", preview_every=2)
    views = drive(run, engine)
    final = views[-1]
    assert final.state == "completed" and (final.done, final.total) == (4, 4)
    ids = {b.request_id for b in run.branches}
    assert len(pipeline.forward_log) == STEPS
    assert all(set(rows) == ids and len(rows) == 4 for rows in pipeline.forward_log)
    # Every branch is the request it stands for: same pixels as that request run alone.
    for progress in run.branches:
        params = progress.params
        assert (params.seed, params.guidance_scale) == ({0: 3, 1: 3, 2: 4, 3: 4}[progress.branch.index],
                                                        {0: 1.0, 1: 2.0, 2: 1.0, 3: 2.0}[progress.branch.index])
        alone = GenerationParams(prompt="a red circle", seed=params.seed, num_inference_steps=STEPS,
                                 guidance_scale=params.guidance_scale, width=64, height=64)
        assert np.array_equal(np.asarray(progress.result.images[0]), solo_pixels(alone))
    assert {node: (v.state, v.done, v.total) for node, v in final.nodes.items()} == {
        node: ("done", 4, 4) for node in ("p", "b", "g", "t", "s", "grid")}


def test_the_grid_fills_in_with_every_branch_image(toy):
    pipeline, engine = toy
    run = WorkflowRun(engine, compiled(seed_by_guidance()), session_id="tab")
    first_grid = {}
    views = drive(run, engine, on_view=lambda v: first_grid.setdefault("g", v.grids["grid"]))
    grid = views[-1].grids["grid"]
    cells = np.asarray(grid)
    # Each of the four 64x64 toy images was enlarged 2x into its cell: find them in the grid.
    for progress in run.branches:
        enlarged = np.asarray(progress.result.images[0].resize((128, 128), Image.NEAREST))
        found = any(
            np.array_equal(cells[y:y + 128, x:x + 128], enlarged)
            for y in range(0, cells.shape[0] - 127) for x in range(0, cells.shape[1] - 127)
            if cells[y, x].tolist() == enlarged[0, 0].tolist() and cells[y, x + 127].tolist() == enlarged[0, 127].tolist()
        )
        assert found, f"branch {progress.branch.index}'s image is not in the grid"
    placeholder = np.asarray(first_grid["g"])
    assert (placeholder == 222).all(axis=2).sum() > 4 * 128 * 100  # before any branch ended: grey cells


def test_a_run_larger_than_the_session_limit_queues_its_own_branches():
    pipeline = ToyPipeline()
    engine = Engine(pipeline, max_batch_requests=8, limits=ServingLimits(max_per_session=2))
    try:
        run = WorkflowRun(engine, compiled(seed_by_guidance(seeds=(1, 2, 3), guidance="1, 2")), session_id="tab")
        views = drive(run, engine)
    finally:
        engine.close()
    assert [b.state for b in views[0].branches] == ["queued"] * 2 + ["waiting"] * 4
    assert views[-1].state == "completed" and views[-1].done == 6
    assert max(len(rows) for rows in pipeline.forward_log) == 2
    # Branches entered the engine in their own order.
    first_forward = {}
    for index, rows in enumerate(pipeline.forward_log):
        for request_id in rows:
            first_forward.setdefault(request_id, index)
    order = [first_forward[b.request_id] for b in run.branches]
    assert order == sorted(order)


def metric(engine: Engine, name: str, **labels) -> float:
    return engine.metrics.registry.get_sample_value(name, labels)


def test_branches_waiting_for_room_are_counted_as_waiting_not_as_rejected_requests():
    pipeline = ToyPipeline()
    engine = Engine(pipeline, max_batch_requests=8, limits=ServingLimits(max_per_session=8))
    seen = []  # (the run's waiting branches, the engine's gauge) at every view

    def look(view):
        seen.append((sum(b.state == "waiting" for b in view.branches),
                     metric(engine, "stepstudio_workflow_branches_waiting")))

    try:
        run = WorkflowRun(engine, compiled(seed_by_guidance(seeds=tuple(range(10)), guidance="1, 2")), session_id="tab")
        assert len(run.branches) == 20
        views = drive(run, engine, on_view=look)
        # The run's branches waited for room on every step; none of those tries was a refused call.
        assert metric(engine, "stepstudio_requests_rejected_total", reason="session_limit") == 0
        assert metric(engine, "stepstudio_requests_submitted_total") == 20
        assert metric(engine, "stepstudio_workflow_branches_waiting") == 0  # the run ended
    finally:
        engine.close()
    assert views[-1].state == "completed" and views[-1].done == 20
    assert seen[0] == (12, 12)
    assert all(waiting == gauge for waiting, gauge in seen)
    waits = [waiting for waiting, _ in seen]
    assert waits == sorted(waits, reverse=True) and waits[-1] == 0  # in as room came, never back


def run_acting_at_forward(index: int, action):
    """Run the 2x2 workflow; `action(run)` is called on the engine thread inside forward `index`
    (0-based), so it lands at an exact step boundary. Returns (pipeline, run, views)."""
    holder = {}
    pipeline = ToyPipeline(on_forward=lambda i, batch: action(holder["run"]) if i == index else None)
    engine = Engine(pipeline, max_batch_requests=8, limits=ServingLimits(max_per_session=16))
    try:
        run = holder["run"] = WorkflowRun(engine, compiled(seed_by_guidance()), session_id="tab")
        views = drive(run, engine)
    finally:
        engine.close()
    return pipeline, run, views


def test_cancelling_the_run_stops_every_branch_at_the_next_step_boundary():
    pipeline, run, views = run_acting_at_forward(2, lambda run: run.cancel())
    assert views[-1].state == "aborted"
    assert [b.state for b in run.branches] == ["aborted"] * 4
    assert len(pipeline.forward_log) == 3  # the forward that was running when the cancel came, then none
    assert pipeline.decoded == []
    assert all(view.state == "aborted" for view in views[-1].nodes.values())


def test_one_branch_can_be_cancelled_alone():
    pipeline, run, views = run_acting_at_forward(1, lambda run: run.cancel_branch(1))
    assert [b.state for b in run.branches] == ["completed", "aborted", "completed", "completed"]
    assert [len(rows) for rows in pipeline.forward_log] == [4, 4] + [3] * (STEPS - 2)
    assert views[-1].state == "partial"
    assert run.branches[1].request_id not in pipeline.decoded
    assert not run.cancel_branch(1) and not run.cancel_branch(9)
    assert views[-1].nodes["s"].state == "partial"  # the run's word, when some finished and some were aborted


def test_a_failing_branch_fails_alone_and_marks_its_nodes():
    pipeline = ToyPipeline()
    engine = Engine(pipeline, max_batch_requests=8, limits=ServingLimits(max_per_session=16))
    source = seed_by_guidance()
    source["nodes"][0] = {"id": "p", "type": "prompt_list", "values": {"prompts": "fine\nbroken [fail:step_scheduler]"}}
    try:
        run = WorkflowRun(engine, compiled(source), session_id="tab")
        views = drive(run, engine)
    finally:
        engine.close()
    states = [(b.params.prompt.startswith("broken"), b.state) for b in run.branches]
    assert states.count((True, "failed")) == 4 and states.count((False, "completed")) == 4
    assert "injected failure in step_scheduler" in run.branches[-1].message
    assert views[-1].state == "partial" and views[-1].nodes["s"].state == "error"


def test_the_engine_checks_every_branch_before_anything_is_submitted(toy):
    pipeline, engine = toy
    # The compiler allows multiples of 4; the toy model wants multiples of 8: the engine says no.
    source = seed_by_guidance()
    source["nodes"].append({"id": "z", "type": "sweep", "values": {"param": "size", "values": "64x64, 68x64"}})
    source["links"].append(link("z", "values", "s", "size"))
    with pytest.raises(WorkflowError) as caught:
        WorkflowRun(engine, compiled(source, size_multiple=4), session_id="tab")
    assert (caught.value.problems[0].node_id, caught.value.problems[0].port) == ("z", "values")  # the size sweep
    assert "width=68 must be a multiple of 8" in str(caught.value)
    assert engine.snapshot().requests == () and pipeline.encoded == []


def test_a_sampler_without_a_seed_uses_one_random_seed_for_all_its_branches(toy):
    pipeline, engine = toy
    source = seed_by_guidance()
    source["nodes"] = [n for n in source["nodes"] if n["id"] != "b"]
    source["links"] = [lk for lk in source["links"] if lk["from"]["node"] != "b"]
    source["nodes"][-1]["values"] = {"x": "guidance", "y": "auto"}
    run = WorkflowRun(engine, compiled(source), session_id="tab")
    seeds = {b.params.seed for b in run.branches}
    assert len(run.branches) == 2 and len(seeds) == 1 and None not in seeds

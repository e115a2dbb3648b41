"""Step-level co-batching gives every request exactly the image it would get alone."""

import numpy as np

from engine import Completed, Progress, Queued, Started
from pipelines.toy import ToyPipeline
from tests.engine_helpers import (
    engine_started_after,
    params,
    pixels,
    running_engine,
    solo_pixels,
)


def _run_all(mode, requests, max_batch_requests=8):
    """Every request queued before the engine starts, so all of them meet at its first step."""
    pipeline = ToyPipeline()
    submissions = [(p, f"s{i}") for i, p in enumerate(requests)]
    with engine_started_after(submissions, pipeline, mode=mode, max_batch_requests=max_batch_requests) as (_, handles):
        return [pixels(h.result(timeout=30)) for h in handles], pipeline


def test_step_mode_equals_request_mode_bit_for_bit():
    requests = [params(seed=s, steps=n, prompt=f"prompt {s}") for s, n in [(1, 4), (2, 7), (3, 5)]]
    step_images, step_pipe = _run_all("step", requests)
    request_images, request_pipe = _run_all("request", requests, max_batch_requests=1)
    for a, b in zip(step_images, request_images):
        assert np.array_equal(a, b)
    # Step mode: all three shared every forward until the 4-step one finished, then two, then one.
    assert [len(f) for f in step_pipe.forward_log] == [3] * 4 + [2] * 1 + [1] * 2
    # Request mode with one request per forward: one row per forward, one request after another.
    assert [len(f) for f in request_pipe.forward_log] == [1] * (4 + 7 + 5)


def test_cobatched_requests_each_equal_their_solo_run():
    a, b, c = params(seed=11, steps=7, prompt="a"), params(seed=22, steps=9, prompt="b"), params(seed=33, steps=3, prompt="c")
    arrivals = {2: b, 4: c}  # forward index -> request submitted right before it
    pipeline = ToyPipeline()
    handles = {}

    def submit_late(index, batch):
        if index in arrivals:
            handles[index] = engine.submit(arrivals[index], session_id=f"late{index}")

    pipeline.on_forward = submit_late
    with running_engine(pipeline, max_batch_requests=8) as engine:
        first = engine.submit(a, session_id="first")
        results = [first.result(timeout=30)] + [handles[i].result(timeout=30) for i in (2, 4)]
    for final, p in zip(results, (a, b, c)):
        assert np.array_equal(pixels(final), solo_pixels(p))
    # They really shared forwards: some forward carried all three rows.
    assert max(len(f) for f in pipeline.forward_log) == 3


def test_changing_request_b_does_not_move_request_a():
    a = params(seed=5, steps=6, prompt="request a")
    images_of_a = []
    for b in (params(seed=6, steps=4, prompt="b one"), params(seed=999, steps=9, prompt="b two, different")):
        pipeline = ToyPipeline()
        with engine_started_after([(a, "a"), (b, "b")], pipeline) as (_, (handle_a, handle_b)):
            images_of_a.append(pixels(handle_a.result(timeout=30)))
            handle_b.result(timeout=30)
        # B really shared A's forwards: its first four steps at least.
        assert pipeline.forward_log[:4] == [(handle_a.request_id, handle_b.request_id)] * 4
    assert np.array_equal(images_of_a[0], images_of_a[1])


def test_late_request_joins_at_the_next_step_boundary():
    pipeline = ToyPipeline()
    late = {}

    def submit_at_third_forward(index, batch):
        if index == 2:
            late["handle"] = engine.submit(params(seed=2, steps=3, prompt="late"), session_id="late")

    pipeline.on_forward = submit_at_third_forward
    with running_engine(pipeline, max_batch_requests=4) as engine:
        early = engine.submit(params(seed=1, steps=8, prompt="early"), session_id="early")
        early.result(timeout=30)
        late_id = late["handle"].request_id
        late_events = list(late["handle"].events(timeout=30))
    # Submitted during forward 2, it runs in forward 3 alongside the early request: it waited 0 steps.
    assert [i for i, f in enumerate(pipeline.forward_log) if late_id in f] == [3, 4, 5]
    assert pipeline.forward_log[3] == (early.request_id, late_id)
    kinds = [type(e) for e in late_events]
    assert kinds == [Queued, Started, Progress, Progress, Progress, Completed]
    assert [e.step for e in late_events if isinstance(e, Progress)] == [1, 2, 3]
    assert [e.batch_size for e in late_events if isinstance(e, Progress)] == [2, 2, 2]


def test_max_batch_requests_caps_requests_per_forward_and_the_rest_wait():
    pipeline = ToyPipeline()
    submissions = [(params(seed=i, steps=3), f"s{i}") for i in range(5)]
    with engine_started_after(submissions, pipeline, max_batch_requests=2) as (engine, handles):
        assert all(isinstance(h.result(timeout=30), Completed) for h in handles)
        assert engine.max_batch_requests == 2
    ids = [h.request_id for h in handles]
    # Two at a time, in arrival order (one session each, so sessions take turns in that order).
    assert pipeline.forward_log == [tuple(ids[0:2])] * 3 + [tuple(ids[2:4])] * 3 + [(ids[4],)] * 3


def test_previews_arrive_every_k_steps_and_match_the_latent_grid():
    with running_engine() as engine:
        handle = engine.submit(params(steps=7, preview_every=3))
        progress = [e for e in handle.events(timeout=30) if isinstance(e, Progress)]
    with_preview = [e.step for e in progress if e.preview is not None]
    assert with_preview == [3, 6]
    assert progress[2].preview.size == (64 // 8, 64 // 8)


def test_request_mode_runs_one_batch_to_the_end_before_admitting():
    pipeline = ToyPipeline()
    late = {}

    def submit_at_second_forward(index, batch):
        if index == 1:
            late["handle"] = engine.submit(params(seed=2, steps=2, prompt="late"), session_id="late")

    pipeline.on_forward = submit_at_second_forward
    with running_engine(pipeline, mode="request", max_batch_requests=4) as engine:
        engine.submit(params(seed=1, steps=5), session_id="early").result(timeout=30)
        late["handle"].result(timeout=30)
    late_id = late["handle"].request_id
    assert [i for i, f in enumerate(pipeline.forward_log) if late_id in f] == [5, 6]


class _CfgToy(ToyPipeline):
    """Says that a request with guidance_scale > 1 puts two rows in a forward (as true CFG does)."""

    def forward_size(self, params):
        return (2 if params.guidance_scale > 1 else 1), super().forward_size(params)[1]


def test_a_cfg_request_counts_once_in_max_batch_requests_and_twice_in_forward_rows():
    pipeline = _CfgToy()
    submissions = [(params(seed=1, steps=2, guidance_scale=3.0), "a"), (params(seed=2, steps=2, guidance_scale=1.0), "b")]
    with engine_started_after(submissions, pipeline, max_batch_requests=2) as (engine, handles):
        assert all(isinstance(h.result(timeout=30), Completed) for h in handles)
        sample = engine.metrics.registry.get_sample_value
        figures = {name: sample(name) for name in (
            "stepstudio_batch_size_sum", "stepstudio_batch_size_count",
            "stepstudio_forward_rows_sum", "stepstudio_forward_rows_count",
        )}
    assert pipeline.forward_log == [tuple(h.request_id for h in handles)] * 2
    # Two forwards of two requests each; the CFG request's negative row makes three model rows.
    assert figures == {
        "stepstudio_batch_size_sum": 4, "stepstudio_batch_size_count": 2,
        "stepstudio_forward_rows_sum": 6, "stepstudio_forward_rows_count": 2,
    }

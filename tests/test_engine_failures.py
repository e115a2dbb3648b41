"""A failure in one request's step-protocol call ends that request only."""

import numpy as np
import pytest

from engine import Completed, Engine, Failed, ServingLimits
from pipelines.toy import ToyPipeline
from tests.engine_helpers import engine_started_after, params, pixels, solo_pixels


@pytest.mark.parametrize("method", ["prepare_encode", "denoise_step", "step_scheduler", "post_decode"])
def test_failure_in_one_method_fails_only_that_request(method):
    pipeline = ToyPipeline()
    healthy_params = [params(seed=s, steps=5, prompt=f"healthy {s}") for s in (1, 2)]
    broken_params = params(seed=3, steps=5, prompt=f"broken [fail:{method}]")
    submissions = [(p, f"h{i}") for i, p in enumerate(healthy_params)] + [(broken_params, "b")]
    with engine_started_after(submissions, pipeline, max_batch_requests=4) as (engine, handles):
        *healthy, broken = handles
        final = broken.result(timeout=30)
        results = [h.result(timeout=30) for h in healthy]
        assert engine.states_in_memory == 0
        stats = engine.snapshot().stats
    assert isinstance(final, Failed)
    assert final.stage == method
    assert final.message.startswith(f"{method} failed: RuntimeError: injected failure in {method}")
    for result, p in zip(results, healthy_params):
        assert np.array_equal(pixels(result), solo_pixels(p))
    assert stats.finished == {"completed": 2, "error": 1}
    healthy_ids = tuple(h.request_id for h in healthy)
    if method == "denoise_step":
        # The 3-row forward raised; rows were retried one by one (the broken one raised
        # again), then the healthy pair went on together.
        assert pipeline.forward_log[:3] == [healthy_ids[:1], healthy_ids[1:], healthy_ids]
    elif method in ("step_scheduler", "post_decode"):
        assert pipeline.forward_log[0] == healthy_ids + (broken.request_id,)
    assert engine.metrics.errors.labels(method)._value.get() == 1


def test_nan_latents_fail_that_request_only():
    submissions = [(params(seed=1, prompt="[nan] this one"), "a"), (params(seed=2, prompt="fine"), "b")]
    with engine_started_after(submissions, max_batch_requests=4) as (engine, (bad, good)):
        final = bad.result(timeout=30)
        assert isinstance(good.result(timeout=30), Completed)
    assert isinstance(final, Failed)
    assert "NaN or infinite at step 2/6" in final.message


class _WrongRowCount(ToyPipeline):
    def denoise_step(self, batch):
        return super().denoise_step(batch)[:1] if len(batch) > 1 else super().denoise_step(batch)


def test_a_pipeline_returning_the_wrong_row_count_is_caught():
    pipeline = _WrongRowCount()
    submissions = [(params(seed=s), f"s{s}") for s in (1, 2)]
    with engine_started_after(submissions, pipeline, max_batch_requests=4) as (engine, handles):
        finals = [h.result(timeout=30) for h in handles]
    # The batched call was rejected for its row count; one-by-one retries then succeed.
    assert all(isinstance(f, Completed) for f in finals)
    assert pipeline.forward_log[:3] == [tuple(h.request_id for h in handles), (handles[0].request_id,), (handles[1].request_id,)]
    assert np.array_equal(pixels(finals[0]), solo_pixels(params(seed=1)))


class _DecodesNothing(ToyPipeline):
    def post_decode(self, state):
        return None if "[none]" in state.params.prompt else super().post_decode(state)


def test_post_decode_returning_none_fails_that_request_and_the_engine_serves_on():
    submissions = [(params(seed=1, prompt="[none] this one"), "a"), (params(seed=2, prompt="fine"), "b")]
    with engine_started_after(submissions, _DecodesNothing(), max_batch_requests=4) as (engine, (bad, good)):
        final = bad.result(timeout=30)
        assert isinstance(good.result(timeout=30), Completed)
        assert isinstance(engine.submit(params(seed=3)).result(timeout=30), Completed)
        assert engine.is_alive and engine.states_in_memory == 0
    assert isinstance(final, Failed) and final.stage == "post_decode"
    assert "post_decode returned None; a pipeline must return a non-empty list of images" in final.message


class _BrokenLatents(ToyPipeline):
    def step_scheduler(self, state, prediction):
        super().step_scheduler(state, prediction)
        if "[broken]" in state.params.prompt:
            state.latents = "not a tensor"  # the finite check itself would raise on it


def test_a_latents_check_that_raises_fails_that_request_only():
    submissions = [(params(seed=1, prompt="[broken] latents"), "a"), (params(seed=2, prompt="fine"), "b")]
    with engine_started_after(submissions, _BrokenLatents(), max_batch_requests=4) as (engine, (bad, good)):
        final = bad.result(timeout=30)
        assert isinstance(good.result(timeout=30), Completed)
        assert engine.is_alive
    assert isinstance(final, Failed) and final.stage == "step_scheduler"
    assert "AttributeError" in final.message


class _KeyBug(ToyPipeline):
    def batch_key(self, params):
        if "[bad key]" in params.prompt:
            raise ValueError("prompt=... makes no batch key (an injected validation error)")
        if "[key bug]" in params.prompt:
            raise KeyError("a pipeline bug")
        return super().batch_key(params)


def test_a_batch_key_error_does_not_leak_the_sessions_slot():
    engine = Engine(_KeyBug(), limits=ServingLimits(max_per_session=2))
    with pytest.raises(ValueError, match="makes no batch key"):
        engine.submit(params(prompt="[bad key] one"), session_id="s")
    with pytest.raises(KeyError):
        engine.submit(params(prompt="[key bug] two"), session_id="s")
    assert engine.requests_in_flight == 0
    handles = [engine.submit(params(seed=i), session_id="s") for i in range(2)]  # both slots are still free
    engine.start()
    try:
        assert all(isinstance(h.result(timeout=30), Completed) for h in handles)
    finally:
        engine.close()
    assert engine.metrics.requests_rejected.labels("invalid")._value.get() == 1


def test_out_of_memory_splits_the_batch_once_and_no_row_is_retried_alone():
    pipeline = ToyPipeline(max_forward_tokens=3 * 64)  # room for three 64x64 rows, four are asked
    requests = [params(seed=i, steps=3, prompt=f"p{i}") for i in range(4)]
    with engine_started_after([(p, f"s{i}") for i, p in enumerate(requests)], pipeline) as (engine, handles):
        finals = [h.result(timeout=30) for h in handles]
    ids = [h.request_id for h in handles]
    # Every step: the four-row forward ran out of memory, then two halves of two ran.
    assert pipeline.forward_log == [tuple(ids[:2]), tuple(ids[2:])] * 3
    for final, p in zip(finals, requests):
        assert np.array_equal(pixels(final), solo_pixels(p))


def test_out_of_memory_in_half_a_batch_fails_its_largest_request():
    pipeline = ToyPipeline(max_forward_tokens=100)  # one 64x64 row fits, two don't
    requests = [params(seed=i, steps=3, prompt=f"p{i}") for i in range(4)]
    with engine_started_after([(p, f"s{i}") for i, p in enumerate(requests)], pipeline) as (engine, handles):
        finals = [h.result(timeout=30) for h in handles]
        errors = engine.metrics.errors.labels("denoise_step")._value.get()
    ids = [h.request_id for h in handles]
    # Step 1: 4 rows, then halves of 2 ran out of memory: each half's largest (the first of equals)
    # failed and its partner sat the step out. From then on the two survivors run one per half.
    assert [type(f).__name__ for f in finals] == ["Failed", "Completed", "Failed", "Completed"]
    assert all("out of memory (OutOfMemoryError)" in finals[i].message for i in (0, 2))
    assert "1 rows x 64 tokens" in finals[0].message
    assert pipeline.forward_log == [(ids[1],), (ids[3],)] * 3
    assert errors == 2

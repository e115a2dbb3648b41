"""A failure in one request's step-protocol call ends that request only."""

import numpy as np
import pytest

from engine import Completed, Failed
from pipelines.toy import ToyPipeline
from tests.engine_helpers import engine_started_after, params, pixels, running_engine, solo_pixels


@pytest.mark.parametrize("method", ["prepare_encode", "denoise_step", "step_scheduler", "post_decode"])
def test_failure_in_one_method_fails_only_that_request(method):
    pipeline = ToyPipeline()
    healthy_params = [params(seed=s, steps=5, prompt=f"healthy {s}") for s in (1, 2)]
    broken_params = params(seed=3, steps=5, prompt=f"broken [fail:{method}]")
    submissions = [(p, f"h{i}") for i, p in enumerate(healthy_params)] + [(broken_params, "b")]
    with engine_started_after(submissions, pipeline, max_batch=4) as (engine, handles):
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
    with running_engine(max_batch=4) as engine:
        bad = engine.submit(params(seed=1, prompt="[nan] this one"), session_id="a")
        good = engine.submit(params(seed=2, prompt="fine"), session_id="b")
        final = bad.result(timeout=30)
        assert isinstance(good.result(timeout=30), Completed)
    assert isinstance(final, Failed)
    assert "NaN or infinite at step 2/6" in final.message


class _WrongRowCount(ToyPipeline):
    def denoise_step(self, batch):
        return super().denoise_step(batch)[:1] if len(batch) > 1 else super().denoise_step(batch)


def test_a_pipeline_returning_the_wrong_row_count_is_caught():
    pipeline = _WrongRowCount()
    with running_engine(pipeline, max_batch=4) as engine:
        handles = [engine.submit(params(seed=s), session_id=f"s{s}") for s in (1, 2)]
        finals = [h.result(timeout=30) for h in handles]
    # The batched call was rejected for its row count; one-by-one retries then succeed.
    assert all(isinstance(f, Completed) for f in finals)
    assert np.array_equal(pixels(finals[0]), solo_pixels(params(seed=1)))

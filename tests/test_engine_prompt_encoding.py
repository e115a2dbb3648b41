"""Requests joining the same step share one text-encoder call; a repeated prompt is not re-encoded."""

import numpy as np

from engine import Completed
from pipelines.toy import ToyPipeline
from tests.engine_helpers import (
    engine_started_after,
    params,
    pixels,
    running_engine,
    solo_pixels,
)


def test_requests_joining_one_step_are_encoded_in_one_call():
    pipeline = ToyPipeline()
    prompts = ["a red circle", "a blue square", "a red circle", "a green star"]
    requests = [params(prompt=p, seed=i, steps=4) for i, p in enumerate(prompts)]
    with engine_started_after([(p, f"s{i}") for i, p in enumerate(requests)], pipeline, max_batch_requests=4) as (engine, handles):
        results = [h.result(timeout=30) for h in handles]
    assert pipeline.forward_log[0] == tuple(h.request_id for h in handles)  # all four joined step 1
    assert pipeline.text_encoder_calls == [("a red circle", "a blue square", "a green star")]
    for result, p in zip(results, requests):
        assert np.array_equal(pixels(result), solo_pixels(p))


def test_a_repeated_prompt_is_served_from_the_cache():
    pipeline = ToyPipeline()
    with running_engine(pipeline) as engine:  # one after the other, on purpose
        first = engine.submit(params(prompt="a red circle", seed=1)).result(timeout=30)
        again = engine.submit(params(prompt="a red circle", seed=2)).result(timeout=30)
    assert isinstance(first, Completed) and isinstance(again, Completed)
    assert pipeline.text_encoder_calls == [("a red circle",)]
    assert (pipeline.prompt_cache.misses, pipeline.prompt_cache.hits) == (1, 1)


def test_a_failed_batched_encoding_falls_back_to_one_encoding_per_request():
    pipeline = ToyPipeline()
    prompts = ["a red circle", "a blue square [fail:encode_prompts]", "a green star"]
    requests = [params(prompt=p, seed=i, steps=4) for i, p in enumerate(prompts)]
    with engine_started_after([(p, f"s{i}") for i, p in enumerate(requests)], pipeline, max_batch_requests=4) as (engine, handles):
        results = [h.result(timeout=30) for h in handles]
    # Nothing is lost: each request encodes on its own and completes with its solo image.
    assert sorted(pipeline.text_encoder_calls) == sorted((p,) for p in prompts)
    for result, p in zip(results, requests):
        assert np.array_equal(pixels(result), solo_pixels(p))

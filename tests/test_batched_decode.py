"""Requests that finish denoising in the same step share one VAE decode per latent shape
(`BatchedDecoding.post_decode_many`, engine/runner.py), with the pixels each would get alone."""

from __future__ import annotations

import numpy as np
import pytest

from engine import Completed, Engine, GenerationParams, ServingLimits
from pipelines.loader import load_pipeline
from tools.moving_shapes_world import caption, held_out_specs
from tools.shapes_world import example_prompts


@pytest.fixture(scope="module")
def image():
    return load_pipeline("builtin")


@pytest.fixture(scope="module")
def video():
    return load_pipeline("builtin-video")


def decoded_batches(pipeline, monkeypatch) -> list[int]:
    """The rows of every VAE decode call the pipeline makes from now on."""
    rows: list[int] = []
    decode = pipeline.vae.decode

    def recording(latents, *args, **kwargs):
        rows.append(len(latents))
        return decode(latents, *args, **kwargs)

    monkeypatch.setattr(pipeline.vae, "decode", recording)
    return rows


def run_together(pipeline, requests: list[GenerationParams]) -> list[Completed]:
    """All submitted before the engine starts: they run their steps side by side."""
    engine = Engine(pipeline, max_batch_requests=8, limits=ServingLimits(max_queue=16, max_per_session=16))
    handles = [engine.submit(p, session_id=str(i)) for i, p in enumerate(requests)]
    engine.start()
    try:
        finals = [h.result(timeout=600) for h in handles]
    finally:
        engine.close()
    assert all(isinstance(f, Completed) for f in finals), finals
    return finals


def pixels(final: Completed) -> np.ndarray:
    return np.stack([np.asarray(frame, np.int16) for frame in final.images])


def test_images_that_finish_together_share_one_decode_and_keep_their_pixels(image, monkeypatch):
    requests = [GenerationParams(prompt=p, seed=60 + i, num_inference_steps=(6, 6, 6, 4)[i], step_cache=0)
                for i, p in enumerate(example_prompts(4, seed=60))]
    alone = [run_together(image, [p])[0] for p in requests]
    rows = decoded_batches(image, monkeypatch)
    together = run_together(image, requests)
    assert sorted(rows) == [1, 3]  # the 4-step request first, then the three 6-step ones in one call
    for a, b in zip(alone, together):
        assert np.abs(pixels(a) - pixels(b)).max() <= 1


def test_a_failed_batched_decode_decodes_each_request_on_its_own(image, monkeypatch):
    def broken(states):
        raise RuntimeError("the batched decode broke")

    monkeypatch.setattr(image, "post_decode_many", broken)
    rows = decoded_batches(image, monkeypatch)
    requests = [GenerationParams(prompt=p, seed=70 + i, num_inference_steps=3) for i, p in enumerate(example_prompts(2))]
    finals = run_together(image, requests)
    assert rows == [1, 1] and all(f.images[0].size == (64, 64) for f in finals)


def test_videos_share_a_decode_only_when_their_shapes_match(video, monkeypatch):
    prompts = [caption(spec) for spec in held_out_specs()[:3]]
    requests = [GenerationParams(prompt=p, seed=80 + i, num_inference_steps=3, num_frames=(9, 9, 5)[i], step_cache=0)
                for i, p in enumerate(prompts)]
    alone = [run_together(video, [p])[0] for p in requests]
    rows = decoded_batches(video, monkeypatch)
    together = run_together(video, requests)
    assert sorted(rows) == [1, 2]  # the two 9-frame videos in one call, the 5-frame one alone
    assert [len(f.images) for f in together] == [9, 9, 5]
    for a, b in zip(alone, together):
        assert np.abs(pixels(a) - pixels(b)).max() <= 1

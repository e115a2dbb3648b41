"""The shipped built-in model served by stepstudio: its defaults apply, it follows prompts
through the engine, and the engine's pixels equal the stock FluxPipeline's."""

from pathlib import Path

import numpy as np
import pytest

from engine import Completed, Engine, GenerationParams, Progress
from pipelines.loader import BUILTIN_MODEL_DIR, load_pipeline
from tests.test_builtin_checkpoint import PROMPTS  # every shape, size and position
from tools.evaluate_builtin import ATTRIBUTES, evaluate_images
from tools.evaluate_engine import engine_images, stock_images
from tools.shapes_world import example_prompts


@pytest.fixture(scope="module")
def pipeline():
    return load_pipeline("builtin")


def test_the_builtin_model_is_the_default_and_its_serving_defaults_apply(pipeline):
    assert Path(BUILTIN_MODEL_DIR).name == "shapes-flux"
    defaults = pipeline.info.defaults
    assert (defaults.width, defaults.height, defaults.num_inference_steps) == (64, 64, 20)
    assert defaults.guidance_scale > 1 and defaults.negative_prompt == ""  # true CFG is the default
    assert defaults.step_cache == 0.1 and pipeline.step_cache.rule == "teacache"  # docs/benchmarks.md#step-caching
    assert pipeline.max_sequence_length == 16
    assert len(defaults.example_prompts) >= 4
    assert pipeline.unknown_words("A large RED hexagon on a blue background") == ["hexagon"]


def test_engine_follows_prompts_with_live_previews(pipeline):
    engine = Engine(pipeline, max_batch_requests=8).start()
    try:
        handles = [engine.submit(GenerationParams(prompt=p, seed=100 + i, preview_every=5), session_id=str(i))
                   for i, p in enumerate(PROMPTS)]
        events = [list(h.events(timeout=300)) for h in handles]
    finally:
        engine.close()
    finals = [e[-1] for e in events]
    assert all(isinstance(f, Completed) for f in finals)
    assert all(f.images[0].size == (64, 64) for f in finals)
    previews = [ev.preview for ev in events[0] if isinstance(ev, Progress) and ev.preview is not None]
    assert [ev.step for ev in events[0] if isinstance(ev, Progress) and ev.preview is not None] == [5, 10, 15]
    # The last live preview (a linear projection of predicted x0) already looks like the image:
    # its mean colour is close to the decoded image's.
    final_small = np.asarray(finals[0].images[0].resize(previews[-1].size), np.float32)
    assert np.abs(np.asarray(previews[-1], np.float32).mean((0, 1)) - final_small.mean((0, 1))).max() < 40
    scores = evaluate_images(list(zip(PROMPTS, [f.images[0] for f in finals])))
    assert scores["color"] >= 0.75 and scores["background"] >= 0.75 and scores["position"] >= 0.75, scores


def test_engine_pixels_equal_the_stock_pipeline():
    prompts = PROMPTS[:2]
    ours = engine_images(BUILTIN_MODEL_DIR, prompts, seed=7, step_cache=0)  # the stock pipeline caches no step
    stock = stock_images(BUILTIN_MODEL_DIR, prompts, seed=7)
    for a, b in zip(ours, stock):
        assert np.abs(np.asarray(a, np.int16) - np.asarray(b, np.int16)).max() <= 1


@pytest.mark.slow
def test_the_documented_scores_120_prompts_through_the_engine_all_right():
    """docs/models.md's table: 120 prompts (`example_prompts(120, seed=1234)`, seed 1234 + i), the
    model's serving defaults (step caching at its default threshold included), the engine in step mode
    at batch 8 score 1.00 on every attribute (`python -m tools.evaluate_engine --prompts 120 --step-cache -1`)."""
    prompts = example_prompts(120, seed=1234)
    images = engine_images(BUILTIN_MODEL_DIR, prompts, seed=1234, max_batch=8)
    scores = evaluate_images(list(zip(prompts, images)))
    assert {attribute: scores[attribute] for attribute in ATTRIBUTES} == dict.fromkeys(ATTRIBUTES, 1.0), scores

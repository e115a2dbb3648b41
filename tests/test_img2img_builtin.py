"""The built-in model (assets/shapes-flux) redraws a picture through the engine: at a low
strength the result stays close to the picture, at full strength it follows the prompt alone."""

import numpy as np
import pytest

from engine import Completed, Engine, GenerationParams, Progress
from pipelines.loader import load_pipeline
from tools.shapes_world import ShapeSpec, render


@pytest.fixture(scope="module")
def pipeline():
    return load_pipeline("builtin")


def test_low_strength_keeps_the_picture_and_full_strength_redraws_it(pipeline):
    picture = render(ShapeSpec(shape="circle", color="red", size="large", position="left", background="blue"))
    prompt = "a small green square at the bottom on a yellow background"
    engine = Engine(pipeline, max_batch_requests=8).start()
    try:
        handles = {strength: engine.submit(GenerationParams(prompt=prompt, init_image=picture, strength=strength, seed=5))
                   for strength in (0.3, 1.0)}
        events = {strength: list(handle.events(timeout=300)) for strength, handle in handles.items()}
    finally:
        engine.close()
    original = np.asarray(picture, np.float32)
    distance = {}
    for strength, stream in events.items():
        assert isinstance(stream[-1], Completed)
        steps = {e.total for e in stream if isinstance(e, Progress)}
        assert steps == {round(20 * strength)}  # the model's 20 steps: 6 and 20 run
        distance[strength] = np.abs(np.asarray(stream[-1].images[0], np.float32) - original).mean()
    assert distance[0.3] < 12, distance  # close to the picture (levels per channel)
    assert distance[1.0] > 60, distance  # the prompt's own scene

"""The built-in model (assets/shapes-flux) redraws a picture through the engine: at a low
strength the result stays close to the picture, at full strength it follows the prompt alone;
the shipped picture examples (assets/workflows) do what they say."""

import numpy as np
import pytest

from engine import Completed, Engine, GenerationParams, Progress
from pipelines.loader import load_pipeline
from studio.page.workflow_tab import EXAMPLES_DIR
from studio.workflows.compiler import compile_workflow
from studio.workflows.format import parse_workflow
from studio.workflows.limits import ModelLimits, WorkflowLimits
from tests.engine_helpers import run_workflow_to_end
from tools.evaluate_builtin import measure
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


@pytest.mark.parametrize("example, expected", [
    # (label, colour, shape) of every branch: the picture, then its redraws at 0.3 .. 0.9
    ("image-to-image", [("single", "red", "circle"), ("strength 0.3", "red", "circle"),
                        ("strength 0.5", "yellow", "circle"), ("strength 0.7", "yellow", "circle"),
                        ("strength 0.9", "yellow", "circle")]),
    ("inpaint", [("single", "yellow", "circle")]),  # the red square, repainted as the prompt says
])
def test_the_shipped_picture_examples_do_what_they_say_on_the_built_in_model(pipeline, example, expected):
    info = pipeline.info
    limits = WorkflowLimits((ModelLimits(name=info.name, size_multiple=info.size_multiple,
                                         sizes=tuple(info.supported_sizes), image_inputs=tuple(info.image_inputs)),))
    compiled = compile_workflow(parse_workflow((EXAMPLES_DIR / f"{example}.json").read_text()), limits)
    final, _ = run_workflow_to_end(pipeline, compiled, "examples")
    assert final.state == "completed"
    seen = [(b.branch.label, measure(b.result.images[0]).color, measure(b.result.images[0]).shape)
            for b in final.branches]
    assert seen == expected

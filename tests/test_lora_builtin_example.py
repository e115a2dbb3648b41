"""The shipped LoRA example (assets/workflows/lora-outline-sweep.json) on the built-in model with
its built-in `outline` adapter, as `python app.py` loads them: a LoRA node whose scale is swept
0, 0.5, 1 over two seeds, six branches in shared forwards, a grid with a `lora` axis, and the
pictures outlined where the scale is 1 and filled where it is 0."""

from __future__ import annotations

import pytest

from pipelines.loader import load_models
from studio.page.workflow_tab import EXAMPLES_DIR
from studio.workflows.compiler import compile_workflow
from studio.workflows.format import parse_workflow
from studio.workflows.limits import ModelLimits, WorkflowLimits
from tests.engine_helpers import run_workflow_to_end
from tools.evaluate_builtin import measure


@pytest.fixture(scope="module")
def pipeline():
    [pipeline] = load_models(("builtin",))
    return pipeline


def test_the_lora_example_sweeps_the_outline_adapters_scale_in_shared_forwards(pipeline):
    info = pipeline.info
    assert info.loras == ("outline",)
    limits = WorkflowLimits((ModelLimits(name=info.name, size_multiple=info.size_multiple,
                                         sizes=tuple(info.supported_sizes), loras=tuple(info.loras)),))
    compiled = compile_workflow(parse_workflow((EXAMPLES_DIR / "lora-outline-sweep.json").read_text()), limits)
    (grid,) = compiled.grids
    assert (grid.x_axis, grid.y_axis, grid.columns, grid.rows) == (
        "lora", "seed", ("outline:0", "outline:0.5", "outline:1"), ("3", "4"))
    final, forwards = run_workflow_to_end(pipeline, compiled, "lora-example")
    assert final.state == "completed" and len(final.branches) == 6
    # Submitted one after another while the engine runs, the branches may join over the first steps;
    # from then on every forward holds all six, three adapter scales in each.
    assert max(forwards) == 6 and forwards[6] >= 15 and sum(forwards.values()) <= 20 + 5, forwards
    seen = {}
    for branch in final.branches:
        scores = measure(branch.result.images[0])
        seen[branch.branch.label] = (scores.color, scores.background)
    assert set(seen.values()) == {("red", "blue")}, seen  # the prompt's colours at every scale
    assert final.grids and next(iter(final.grids.values())).size[0] > 3 * 64

"""shapes-flux v2's documented scores (docs/models.md), on a smaller held-out prompt set than the
evaluator's (tools/evaluate_v2.py, same seed): through the engine at the model's defaults, every
named canvas, prompts with parts left out, and image to image. Each bound sits a little under what
this set scores now (the figure beside it), so a change that makes the model draw worse fails here;
the model is below issue 43's targets, and the bounds rise as it trains."""

import pytest

from pipelines.loader import BUILTIN_V2_MODEL_DIR
from tools.evaluate_v2 import canvas_cases, engine_for, part_cases, picture_cases, picture_table, text_cases

SEED = 4321


@pytest.fixture(scope="module")
def engine():
    engine = engine_for(BUILTIN_V2_MODEL_DIR, None)
    yield engine
    engine.close()


def mean_over_canvases(table: dict, attribute: str) -> float:
    values = [scores[attribute] for scores in table.values() if attribute in scores]
    return sum(values) / len(values)


def test_every_named_canvas(engine):
    table = text_cases(engine, canvas_cases(3, SEED), SEED)["by_canvas"]
    assert len(table) == 8
    assert mean_over_canvases(table, "background") == 1.0
    assert mean_over_canvases(table, "color") >= 0.9  # 1.00
    assert mean_over_canvases(table, "shape") >= 0.9  # 1.00 on this set now (0.96 on run 2's weights)
    assert mean_over_canvases(table, "position") >= 0.85  # 0.96 (0.88)
    assert mean_over_canvases(table, "size") >= 0.75  # 0.88 (0.88)


def test_prompts_with_parts_left_out(engine):
    result = text_cases(engine, part_cases(16, SEED), SEED + 10_000)
    assert mean_over_canvases(result["by_canvas"], "background") == 1.0
    assert mean_over_canvases(result["by_canvas"], "color") >= 0.9  # 1.00
    assert result["everything_named_drawn"] >= 0.8  # 15 of 16 (0.69 on run 2's weights)


def test_image_to_image_keeps_the_layout_and_takes_the_prompts_colour(engine):
    result = picture_table(engine, picture_cases(8, SEED), SEED + 20_000)
    assert result["layout_kept"] >= 0.85  # 8 of 8 now
    assert result["colour_taken"] >= 0.85  # 8 of 8 now (29% of the evaluator's 48 before run 2)
    assert result["inpaint_levels_outside_mask"] <= 3.0  # 1.79 levels now

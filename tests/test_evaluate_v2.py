"""tools/evaluate_v2.py's analysis reads clean renders of the open shapes world right: every named
part of every held-out prompt, at every named canvas (so a score it reports for a model is the
model's, not the evaluator's); its step-caching sweep runs caching off, then each threshold."""

from PIL import Image

from pipelines.loader import BUILTIN_V2_MODEL_DIR
from tools.evaluate_v2 import canvas_cases, contact_sheet, part_cases, picture_cases, score, sweep_step_cache
from tools.shapes_world_v2 import NAMED_CANVASES, render


def test_clean_renders_score_every_named_part():
    cases = canvas_cases(30, 4321) + part_cases(96, 4321)
    assert {label for label, _, _ in cases} >= set(NAMED_CANVASES)
    misses = [(label, attribute) for label, scene, named in cases
              for attribute, hit in score(scene, named, render(scene)).items() if not hit]
    assert misses == []


def test_a_wrong_picture_is_scored_wrong():
    label, scene, named = canvas_cases(1, 4321)[0]
    blank = Image.new("RGB", (scene.width, scene.height), (0, 0, 0))
    assert not any(score(scene, named, blank).values()) or scene.background == "black"
    other = next(s for _, s, _ in canvas_cases(5, 4321) if s.width == scene.width and s.color != scene.color)
    assert score(scene, named, render(other))["color"] is False


def test_pictures_are_off_every_named_region():
    assert all(picture.position_word() is None and asked.color != picture.color
               for picture, asked in picture_cases(24, 4321))


def test_the_contact_sheet_shows_two_images_of_every_named_canvas():
    cases = canvas_cases(3, 4321)
    canvases = {"labels": [c[0] for c in cases], "images": [render(c[1]) for c in cases],
                "prompts": ["a prompt"] * len(cases), "verdicts": [{"color": True}] * len(cases)}
    sheet = contact_sheet(canvases)
    assert sheet.size == (4 * 272, (2 * len(NAMED_CANVASES) // 4) * (272 + 62))


def test_outline_renders_are_outlines_on_every_named_canvas_and_plain_renders_are_not():
    from tools.evaluate_v2 import measure
    from tools.shapes_world_v2 import render_outline

    cases = canvas_cases(6, 4321)
    assert all(measure(render_outline(scene)).outlined is True for _, scene, _ in cases)
    assert not any(measure(render(scene)).outlined for _, scene, _ in cases)
    # the ring is drawn where the shape is: shape, colour and position read as the filled shape's
    assert all(score(scene, named, render_outline(scene)) == score(scene, named, render(scene)) for _, scene, named in cases)


def test_the_step_cache_sweep_runs_caching_off_then_each_threshold(capsys):
    rows = sweep_step_cache(BUILTIN_V2_MODEL_DIR, per_canvas=1, parts=4, seed=4321, thresholds=[0.5])
    assert [(row.rule, row.threshold) for row in rows] == [("off", 0.0), ("teacache", 0.5)]
    assert rows[0].rows_skipped == 0.0 and rows[1].rows_skipped > 0.2
    for row in rows:
        assert set(row.scores) == {"color", "shape", "background", "position", "size", "parts named"}
        assert all(0.0 <= value <= 1.0 for value in row.scores.values())
        assert row.scores["background"] == 1.0  # drawn right on every canvas with caching off and on
    printed = capsys.readouterr().out
    assert "8 full captions (1 per named canvas) and 4 with parts left out" in printed
    assert printed.count("| teacache | 0.5 |") == 1


def test_the_coupled_outline_is_the_outline_of_what_the_picture_draws():
    from tools.evaluate_v2 import measure
    from tools.shapes_world_v2 import Named, render_outline
    from tools.train_lora_v2 import outline_of_drawn

    cases = canvas_cases(4, 4321)
    for _, scene, named in cases:
        outline = outline_of_drawn(scene, named, render(scene))
        seen, drawn = measure(outline), measure(render(scene))
        assert seen.outlined is True
        assert (seen.shape, seen.color, seen.background) == (drawn.shape, drawn.color, drawn.background)
        # the ring lies on the drawing's box (a triangle's box reads a pixel or two inside its tip and corners)
        assert max(abs(a - b) for a, b in zip(seen.box, drawn.box)) <= (2.0 if scene.shape == "triangle" else 0.0)
    _, scene, named = cases[0]
    assert outline_of_drawn(scene, named, Image.new("RGB", (scene.width, scene.height), (0, 0, 0))) is None
    other = next(s for _, s, _ in cases if s.width == scene.width and s.color != scene.color)
    assert outline_of_drawn(scene, Named(), render(other)) is None  # a part the caption names is missed
    # a drawing stretched out of its square box is outlined stretched
    left, top, right, bottom = scene.box
    wide = render_outline(scene, box=(left - 4, top, right + 4, bottom))
    seen_box = measure(wide).box
    assert abs((seen_box[2] - seen_box[0]) - (right - left + 8)) <= 1.0

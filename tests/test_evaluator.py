import numpy as np
import pytest
from PIL import Image

from tools.evaluate_builtin import ATTRIBUTES, evaluate_images, measure, score_image
from tools.shapes_world import PALETTE, ShapeSpec, caption, random_spec, render


def test_clean_jittered_renders_score_at_least_098_on_every_attribute():
    rng = np.random.default_rng(0)
    specs = [random_spec(rng) for _ in range(200)]
    pairs = [(caption(spec), render(spec, rng)) for spec in specs]
    scores = evaluate_images(pairs)
    assert set(scores) == set(ATTRIBUTES)
    for attribute, value in scores.items():
        assert value >= 0.98, (attribute, value)


def test_wrong_color_scores_zero_on_color_only():
    rendered = ShapeSpec(shape="circle", color="green", size="large", position="left", background="white")
    claimed = ShapeSpec(shape="circle", color="red", size="large", position="left", background="white")
    result = score_image(claimed, render(rendered))
    assert result == {"color": False, "shape": True, "background": True, "position": True, "size": True}


@pytest.mark.parametrize("drawn, claimed", [("square", "circle"), ("circle", "triangle"), ("triangle", "square")])
def test_wrong_shape_scores_zero_on_shape(drawn, claimed):
    image = render(ShapeSpec(shape=drawn, color="blue", size="small", position="right", background="yellow"))
    text = caption(ShapeSpec(shape=claimed, color="blue", size="small", position="right", background="yellow"))
    scores = evaluate_images([(text, image)])
    assert scores["shape"] == 0.0
    assert scores["color"] == scores["background"] == scores["position"] == scores["size"] == 1.0


def test_wrong_background_position_and_size_are_caught():
    image = render(ShapeSpec(shape="square", color="black", size="small", position="top", background="orange"))
    text = caption(ShapeSpec(shape="square", color="black", size="large", position="bottom", background="purple"))
    scores = evaluate_images([(text, image)])
    assert scores == {"color": 1.0, "shape": 1.0, "background": 0.0, "position": 0.0, "size": 0.0}


def test_blank_image_has_no_shape_and_scores_only_background():
    blank = Image.new("RGB", (64, 64), PALETTE["blue"])
    seen = measure(blank)
    assert seen.background == "blue" and seen.shape is None and seen.color is None
    text = "a large red circle on a blue background, center"
    assert evaluate_images([(text, blank)]) == {
        "color": 0.0, "shape": 0.0, "background": 1.0, "position": 0.0, "size": 0.0
    }


def test_a_few_stray_pixels_do_not_change_the_verdict():
    spec = ShapeSpec(shape="triangle", color="white", size="large", position="center", background="black")
    pixels = np.asarray(render(spec)).copy()
    pixels[2, 60] = PALETTE["white"]
    pixels[61, 3] = PALETTE["white"]
    assert all(score_image(spec, Image.fromarray(pixels)).values())


def test_evaluate_images_rejects_bad_input():
    with pytest.raises(ValueError, match="at least one"):
        evaluate_images([])
    with pytest.raises(ValueError, match="64x64"):
        measure(Image.new("RGB", (32, 32)))

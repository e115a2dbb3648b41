import numpy as np
import pytest

from tools.shapes_world import (
    COLORS,
    IMAGE_SIZE,
    PALETTE,
    POSITIONS,
    SHAPES,
    SIZES,
    ShapeSpec,
    all_specs,
    caption,
    example_prompts,
    example_specs,
    parse_caption,
    render,
    unknown_words,
    vocabulary,
)


def test_caption_reads_like_the_documented_example():
    spec = ShapeSpec(shape="circle", color="red", size="large", position="left", background="blue")
    assert caption(spec) == "a large red circle on a blue background, left"


def test_every_scene_round_trips_through_its_caption():
    specs = all_specs()
    assert len(specs) == len(SHAPES) * len(SIZES) * len(POSITIONS) * len(COLORS) * (len(COLORS) - 1)
    for spec in specs:
        assert parse_caption(caption(spec)) == spec


def test_parse_caption_ignores_case_and_spacing():
    parsed = parse_caption("  A Small GREEN Triangle on a white background ,  top ")
    assert parsed == ShapeSpec(shape="triangle", color="green", size="small", position="top", background="white")


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("a red circle", "does not have the form"),
        ("a large red hexagon on a blue background, left", "hexagon"),
        ("a large red circle on a red background, left", "invisible"),
        ("a huge red circle on a blue background, left", "huge"),
    ],
)
def test_parse_caption_names_what_was_wrong(text, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_caption(text)


def test_render_is_64px_rgb_with_background_border_and_shape_color_inside():
    spec = ShapeSpec(shape="square", color="yellow", size="large", position="center", background="purple")
    pixels = np.asarray(render(spec))
    assert pixels.shape == (IMAGE_SIZE, IMAGE_SIZE, 3)
    assert tuple(pixels[0, 0]) == PALETTE["purple"]
    assert tuple(pixels[IMAGE_SIZE // 2, IMAGE_SIZE // 2]) == PALETTE["yellow"]


def test_position_moves_the_shape_to_that_side():
    def centroid(position):
        spec = ShapeSpec(shape="circle", color="white", size="small", position=position, background="black")
        mask = np.asarray(render(spec))[..., 0] > 128
        ys, xs = np.nonzero(mask)
        return xs.mean(), ys.mean()

    middle = IMAGE_SIZE / 2
    assert centroid("left")[0] < middle - 10 and centroid("right")[0] > middle + 10
    assert centroid("top")[1] < middle - 10 and centroid("bottom")[1] > middle + 10
    cx, cy = centroid("center")
    assert abs(cx - middle) < 1 and abs(cy - middle) < 1


def test_large_shapes_cover_clearly_more_pixels_than_small_ones():
    def area(size):
        spec = ShapeSpec(shape="triangle", color="white", size=size, position="center", background="black")
        return (np.asarray(render(spec))[..., 0] > 128).sum()

    assert area("large") > 2 * area("small")


def test_jitter_is_seeded():
    spec = ShapeSpec(shape="circle", color="red", size="small", position="top", background="green")
    first = np.asarray(render(spec, np.random.default_rng(5)))
    again = np.asarray(render(spec, np.random.default_rng(5)))
    other = np.asarray(render(spec, np.random.default_rng(6)))
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other)


def test_vocabulary_holds_every_caption_word():
    words_in_captions = {w.strip(",") for spec in all_specs() for w in caption(spec).split()}
    assert words_in_captions == vocabulary()


def test_unknown_words_lists_new_words_once_in_order():
    assert unknown_words("a large red circle on a blue background, left") == []
    assert unknown_words("A LARGE Red circle") == []
    assert unknown_words("a fluffy red dog next to a fluffy cat") == ["fluffy", "dog", "next", "to", "cat"]


def test_example_prompts_cover_every_attribute_value_and_are_seeded():
    specs = example_specs(120, seed=3)
    for attribute, values in (
        ("shape", SHAPES),
        ("size", SIZES),
        ("position", POSITIONS),
        ("color", COLORS),
    ):
        counts = {value: sum(getattr(s, attribute) == value for s in specs) for value in values}
        assert min(counts.values()) == max(counts.values()), (attribute, counts)
    assert {s.background for s in specs} == set(COLORS)
    assert example_prompts(8, seed=3) == example_prompts(8, seed=3)
    assert all(parse_caption(p) for p in example_prompts(8, seed=3))

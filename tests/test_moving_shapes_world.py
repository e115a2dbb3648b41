import itertools

import numpy as np
import pytest

from tools.evaluate_video import (
    MIN_TRAVEL_PIXELS,
    evaluate_videos,
    measure_video,
    score_video,
)
from tools.moving_shapes_world import (
    DIRECTIONS,
    FRAME_SIZE,
    NUM_FRAMES,
    TRAVEL_PIXELS,
    V1_CANVAS,
    V2_CANVASES,
    Canvas,
    MotionSpec,
    all_specs,
    caption,
    example_prompts,
    held_out_specs,
    is_held_out,
    parse_caption,
    random_spec,
    render,
    training_specs,
    unknown_words,
    vocabulary,
)
from tools.shapes_world import COLORS, SHAPES

FIELDS = ("color", "shape", "background", "direction")


def test_caption_reads_like_the_documented_example():
    spec = MotionSpec(color="red", shape="circle", background="blue", direction="left")
    assert caption(spec) == "a red circle moving left on a blue background"


def test_captions_use_an_before_vowels():
    spec = MotionSpec(color="orange", shape="square", background="white", direction="up")
    assert caption(spec) == "an orange square moving up on a white background"
    spec = MotionSpec(color="white", shape="triangle", background="orange", direction="down")
    assert caption(spec) == "a white triangle moving down on an orange background"


def test_every_clip_round_trips_through_its_caption():
    specs = all_specs()
    assert len(specs) == len(COLORS) * len(SHAPES) * (len(COLORS) - 1) * len(DIRECTIONS) == 672
    for spec in specs:
        assert parse_caption(caption(spec)) == spec


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("a red circle", "does not have the form"),
        ("a red hexagon moving left on a blue background", "hexagon"),
        ("a red circle moving sideways on a blue background", "sideways"),
        ("a red circle moving left on a red background", "invisible"),
    ],
)
def test_bad_captions_are_refused_with_the_reason(text, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_caption(text)


def test_vocabulary_is_exactly_the_words_of_the_captions():
    words_used = {word for spec in all_specs() for word in caption(spec).split()}
    assert vocabulary() == words_used
    assert len(vocabulary()) == 5 + 8 + 3 + 4


def test_unknown_words_lists_new_words_once_in_order():
    assert unknown_words("a red circle moving left on a blue background") == []
    assert unknown_words("A Red HEXAGON moving sideways, hexagon on a blue background") == ["hexagon", "sideways"]


def test_held_out_split_is_fixed_disjoint_and_covers_every_pair():
    held_out, training = held_out_specs(), training_specs()
    assert len(held_out) == 48 and len(training) == 624
    assert set(held_out).isdisjoint(training)
    assert set(held_out) | set(training) == set(all_specs())
    assert held_out[:2] == [
        MotionSpec(color="red", shape="circle", background="orange", direction="right"),
        MotionSpec(color="red", shape="circle", background="orange", direction="down"),
    ]
    # The held-out combinations are new as wholes: every pair of attribute values was trained.
    for first, second in itertools.combinations(FIELDS, 2):
        trained = {(getattr(s, first), getattr(s, second)) for s in training}
        wanted = {(getattr(s, first), getattr(s, second)) for s in held_out}
        assert wanted <= trained, (first, second, wanted - trained)


def test_random_specs_come_from_the_training_split_only():
    rng = np.random.default_rng(0)
    drawn = [random_spec(rng) for _ in range(2000)]
    assert not any(is_held_out(spec) for spec in drawn)
    assert len(set(drawn)) > 550  # nearly all 624 training clips appear


def test_example_prompts_are_held_out_and_cycle_through_directions():
    prompts = example_prompts(8, seed=7)
    specs = [parse_caption(prompt) for prompt in prompts]
    assert all(is_held_out(spec) for spec in specs)
    assert [spec.direction for spec in specs] == list(DIRECTIONS) * 2


def test_render_is_deterministic_and_jittered_by_the_generator():
    spec = MotionSpec(color="yellow", shape="triangle", background="purple", direction="down")
    first = [np.asarray(frame) for frame in render(spec, np.random.default_rng(5))]
    again = [np.asarray(frame) for frame in render(spec, np.random.default_rng(5))]
    other = [np.asarray(frame) for frame in render(spec, np.random.default_rng(6))]
    assert len(first) == NUM_FRAMES and first[0].shape == (FRAME_SIZE, FRAME_SIZE, 3)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))
    # Two colours only, plus anti-aliased edge pixels.
    background = np.all(first[0] == (140, 50, 170), axis=-1).mean()
    shape = np.all(first[0] == (245, 225, 50), axis=-1).mean()
    assert 0.8 < background < 0.95 and 0.05 < shape < 0.15, (background, shape)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_renders_move_in_the_stated_direction(direction):
    spec = MotionSpec(color="green", shape="square", background="black", direction=direction)
    centred = measure_video(render(spec)).track
    # Without jitter the track is centred and moves TRAVEL_PIXELS along one axis only.
    (x0, y0), (x1, y1) = centred[0], centred[-1]
    step = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}[direction]
    assert (x1 - x0, y1 - y0) == pytest.approx((step[0] * TRAVEL_PIXELS, step[1] * TRAVEL_PIXELS), abs=0.5)
    assert ((x0 + x1) / 2, (y0 + y1) / 2) == pytest.approx((FRAME_SIZE / 2, FRAME_SIZE / 2), abs=0.5)
    jittered = measure_video(render(spec, np.random.default_rng(3)))
    assert jittered.direction == direction


def test_evaluator_scores_clean_renders_perfectly():
    rng = np.random.default_rng(11)
    specs = held_out_specs() + training_specs()[::12]
    scores = evaluate_videos([(caption(spec), render(spec, rng)) for spec in specs])
    assert scores == {"color": 1.0, "shape": 1.0, "background": 1.0, "direction": 1.0}


def test_evaluator_accepts_the_pipelines_float_frames():
    spec = MotionSpec(color="blue", shape="circle", background="white", direction="left")
    frames = np.stack([np.asarray(frame) for frame in render(spec, np.random.default_rng(0))]) / 255.0
    assert score_video(spec, frames.astype(np.float32)) == {field: True for field in FIELDS}


def test_evaluator_scores_wrong_clips_lower():
    spec = MotionSpec(color="red", shape="triangle", background="blue", direction="right")
    frames = render(spec, np.random.default_rng(1))
    # Played backwards the shape moves left: only the direction is wrong.
    assert score_video(spec, frames[::-1]) == {"color": True, "shape": True, "background": True, "direction": False}
    # A still clip has no direction at all.
    still = measure_video([frames[4]] * NUM_FRAMES)
    assert still.direction is None and still.shape == "triangle"
    # A clip of another scene fails on what differs.
    other = render(MotionSpec(color="yellow", shape="circle", background="blue", direction="up"))
    assert score_video(spec, other) == {"color": False, "shape": False, "background": True, "direction": False}
    # A blank clip shows nothing.
    blank = [frames[0].copy() for _ in range(NUM_FRAMES)]
    for frame in blank:
        frame.paste((40, 80, 220), (0, 0, FRAME_SIZE, FRAME_SIZE))
    assert score_video(spec, blank) == {"color": False, "shape": False, "background": True, "direction": False}
    scores = evaluate_videos([(caption(spec), frames), (caption(spec), frames[::-1]), (caption(spec), blank)])
    assert scores == {"color": 2 / 3, "shape": 2 / 3, "background": 1.0, "direction": 1 / 3}


def test_min_travel_is_a_third_of_the_rendered_travel():
    assert MIN_TRAVEL_PIXELS == pytest.approx(TRAVEL_PIXELS / 3)


def test_the_default_canvas_is_shapes_wan_s_nine_frames_of_64x64():
    assert (V1_CANVAS.width, V1_CANVAS.height, V1_CANVAS.frames) == (FRAME_SIZE, FRAME_SIZE, NUM_FRAMES)
    assert [canvas.name for canvas in V2_CANVASES] == ["64x64x9", "96x64x13"]
    spec = MotionSpec(color="red", shape="circle", background="blue", direction="up")
    default = render(spec, np.random.default_rng(2))
    explicit = render(spec, np.random.default_rng(2), V1_CANVAS)
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(default, explicit))


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_a_wider_longer_canvas_keeps_the_speed_where_the_canvas_leaves_room(direction):
    canvas = Canvas(96, 64, 13)
    spec = MotionSpec(color="white", shape="square", background="green", direction=direction)
    frames = render(spec, canvas=canvas)
    assert len(frames) == 13 and {frame.size for frame in frames} == {(96, 64)}
    track = measure_video(frames).track
    (x0, y0), (x1, y1) = track[0], track[-1]
    # 3 px a frame over 12 frames along the 96 px width; the 64 px height leaves 64 - 26 - 6 = 32 px.
    travel = 36.0 if direction in ("left", "right") else 32.0
    assert canvas.travel(direction) == travel
    step = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}[direction]
    assert (x1 - x0, y1 - y0) == pytest.approx((step[0] * travel, step[1] * travel), abs=1.0)
    assert ((x0 + x1) / 2, (y0 + y1) / 2) == pytest.approx((48, 32), abs=0.5)


def test_evaluator_scores_clean_renders_of_every_v2_canvas_perfectly():
    rng = np.random.default_rng(12)
    for canvas in V2_CANVASES:
        pairs = [(caption(spec), render(spec, rng, canvas)) for spec in held_out_specs()]
        assert evaluate_videos(pairs) == {"color": 1.0, "shape": 1.0, "background": 1.0, "direction": 1.0}, canvas

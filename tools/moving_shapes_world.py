"""The moving-shapes world: one coloured shape sliding across a plain background, 9 frames at 64x64
(shapes-wan), or any canvas of `Canvas` (shapes-wan v2: 64x64 x 9 frames and 96x64 x 13 frames).

The built-in video model (assets/shapes-wan) is trained on this world only, so its captions,
vocabulary, renderer and held-out split live here. A caption reads

    "a red circle moving left on a blue background"

Shapes and colours come from the still-image world (`tools/shapes_world.py`): the same palette,
the same three outlines and the same anti-aliased drawing. What is new is time: the shape moves
TRAVEL_PIXELS along one axis over the clip, at a constant speed, starting on the opposite side
of the middle so that the clip is centred. On a longer clip it keeps that speed (3 px per frame)
as far as the canvas leaves room.

Some (colour, shape, background, direction) combinations are held out: the trainer never sees
them, the evaluator reports on them ("prompts the trainer never saw"). Every single attribute
value and every pair of attribute values still appears in training.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from tools.shapes_world import COLORS, PALETTE, SHAPES, article, draw_shape, words

FRAME_SIZE = 64
NUM_FRAMES = 9  # Wan needs 4k+1 frames
FPS = 8

DIRECTIONS: tuple[str, ...] = ("left", "right", "up", "down")
# Unit step of each direction in image coordinates (x to the right, y downwards).
DIRECTION_VECTORS: dict[str, tuple[int, int]] = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}

SHAPE_PIXELS = 26.0  # bounding-box side: the size the image model could tell apart
TRAVEL_PIXELS = 24.0  # first frame to last frame, 3 px per frame
SIZE_JITTER_PIXELS = 2.0
TRAVEL_JITTER_PIXELS = 2.0
POSITION_JITTER_PIXELS = 2.0  # of the whole track, along and across the motion

FILLER_WORDS: tuple[str, ...] = ("a", "an", "moving", "on", "background")

_SUPERSAMPLE = 4  # draw at 4x then downsample, for anti-aliased edges
_EDGE_ROOM_PIXELS = 6.0  # what a track leaves free at the canvas edges, beyond the shape itself


@dataclass(frozen=True)
class Canvas:
    """A clip's frame size and length. Wan needs 4k+1 frames (this VAE: 2k+1) and sides in 16s."""

    width: int = FRAME_SIZE
    height: int = FRAME_SIZE
    frames: int = NUM_FRAMES

    @property
    def name(self) -> str:
        return f"{self.width}x{self.height}x{self.frames}"

    def travel(self, direction: str) -> float:
        """First frame to last: TRAVEL_PIXELS' speed over the clip, within the room the axis leaves."""
        length = self.width if DIRECTION_VECTORS[direction][0] else self.height
        speed = TRAVEL_PIXELS / (NUM_FRAMES - 1)
        return min(speed * (self.frames - 1), length - SHAPE_PIXELS - _EDGE_ROOM_PIXELS)


V1_CANVAS = Canvas()
V2_CANVASES: tuple[Canvas, ...] = (V1_CANVAS, Canvas(96, 64, 13))


@dataclass(frozen=True)
class MotionSpec:
    """One clip: which shape, its colour, the background colour and where it moves."""

    color: str
    shape: str
    background: str
    direction: str

    def __post_init__(self) -> None:
        for field, value, allowed in (
            ("color", self.color, COLORS),
            ("shape", self.shape, SHAPES),
            ("background", self.background, COLORS),
            ("direction", self.direction, DIRECTIONS),
        ):
            if value not in allowed:
                raise ValueError(f"MotionSpec.{field}={value!r} is not allowed; choose one of {list(allowed)}")
        if self.color == self.background:
            raise ValueError(
                f"MotionSpec color and background are both {self.color!r}; the shape would be invisible"
            )


def all_specs() -> list[MotionSpec]:
    """Every valid clip description (8 x 3 x 7 x 4 = 672), in a fixed order."""
    return [
        MotionSpec(color, shape, background, direction)
        for color in COLORS
        for shape in SHAPES
        for background in COLORS
        for direction in DIRECTIONS
        if background != color
    ]


def is_held_out(spec: MotionSpec) -> bool:
    """The fixed evaluation split: 48 of the 672 combinations (one in 14), spread over every
    colour, shape, background and direction by a modular rule rather than a random draw, so the
    split does not depend on any random-number generator. As 7 * direction is 0 or 7 (mod 14),
    24 (colour, shape, background) scenes are held out moving left and up, or right and down;
    training sees them only moving the other two ways."""
    c, s = COLORS.index(spec.color), SHAPES.index(spec.shape)
    b, d = COLORS.index(spec.background), DIRECTIONS.index(spec.direction)
    return (3 * c + 5 * s + b + 7 * d) % 14 == 0


def held_out_specs() -> list[MotionSpec]:
    return [spec for spec in all_specs() if is_held_out(spec)]


def training_specs() -> list[MotionSpec]:
    return [spec for spec in all_specs() if not is_held_out(spec)]


_TRAINING_SPECS: tuple[MotionSpec, ...] = tuple(training_specs())


def track(spec: MotionSpec, rng: np.random.Generator | None = None,
          canvas: Canvas = V1_CANVAS) -> tuple[float, list[tuple[float, float]]]:
    """(side, centres): the shape's bounding-box side and its (x, y) centre in every frame.
    With `rng` the size, the travel and the whole track are jittered slightly."""
    side, travel = SHAPE_PIXELS, canvas.travel(spec.direction)
    along, across = 0.0, 0.0
    if rng is not None:
        side += rng.uniform(-SIZE_JITTER_PIXELS, SIZE_JITTER_PIXELS)
        travel += rng.uniform(-TRAVEL_JITTER_PIXELS, TRAVEL_JITTER_PIXELS)
        along = rng.uniform(-POSITION_JITTER_PIXELS, POSITION_JITTER_PIXELS)
        across = rng.uniform(-POSITION_JITTER_PIXELS, POSITION_JITTER_PIXELS)
    dx, dy = DIRECTION_VECTORS[spec.direction]
    middle_x, middle_y = canvas.width / 2.0, canvas.height / 2.0
    centres = []
    for frame in range(canvas.frames):
        distance = travel * (frame / (canvas.frames - 1) - 0.5) + along  # -travel/2 .. +travel/2
        # `across` shifts the track sideways: along y for horizontal motion, along x for vertical.
        centres.append((middle_x + dx * distance + abs(dy) * across, middle_y + dy * distance + abs(dx) * across))
    return side, centres


def render(spec: MotionSpec, rng: np.random.Generator | None = None, canvas: Canvas = V1_CANVAS) -> list[Image.Image]:
    """Draw `spec` as the canvas' RGB frames (default 9 of 64x64); `rng` adds jitter."""
    side, centres = track(spec, rng, canvas)
    half = side / 2.0
    frames = []
    for cx, cy in centres:
        big = (canvas.width * _SUPERSAMPLE, canvas.height * _SUPERSAMPLE)
        image = Image.new("RGB", big, PALETTE[spec.background])
        box = tuple(v * _SUPERSAMPLE for v in (cx - half, cy - half, cx + half, cy + half))
        draw_shape(ImageDraw.Draw(image), spec.shape, box, PALETTE[spec.color])
        frames.append(image.resize((canvas.width, canvas.height), Image.Resampling.BOX))
    return frames


def caption(spec: MotionSpec) -> str:
    return (
        f"{article(spec.color)} {spec.color} {spec.shape} moving {spec.direction} "
        f"on {article(spec.background)} {spec.background} background"
    )


_CAPTION_PATTERN = re.compile(
    r"^\s*an?\s+(?P<color>\w+)\s+(?P<shape>\w+)\s+moving\s+(?P<direction>\w+)"
    r"\s+on\s+an?\s+(?P<background>\w+)\s+background\s*$"
)


def parse_caption(text: str) -> MotionSpec:
    """Inverse of `caption` (case-insensitive); ValueError naming the problem otherwise."""
    match = _CAPTION_PATTERN.match(text.lower())
    if match is None:
        raise ValueError(
            f"caption {text!r} does not have the form "
            "'a <color> <shape> moving <direction> on a <color> background', "
            "e.g. 'a red circle moving left on a blue background'"
        )
    return MotionSpec(**match.groupdict())


def vocabulary() -> set[str]:
    """Every word the built-in video model was trained on."""
    return set(FILLER_WORDS) | set(COLORS) | set(SHAPES) | set(DIRECTIONS)


def unknown_words(prompt: str) -> list[str]:
    """Words of `prompt` the model never saw, in order of first appearance, without repeats."""
    known = vocabulary()
    unknown: list[str] = []
    for word in words(prompt):
        if word not in known and word not in unknown:
            unknown.append(word)
    return unknown


def random_spec(rng: np.random.Generator, specs: list[MotionSpec] | None = None) -> MotionSpec:
    """A uniformly drawn clip description, from `specs` (default: the training split)."""
    choices = specs if specs is not None else _TRAINING_SPECS
    return choices[int(rng.integers(len(choices)))]


def example_prompts(n: int, seed: int = 0) -> list[str]:
    """`n` held-out captions that cycle through every direction and shape evenly."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    rng = np.random.default_rng(seed)
    pool = held_out_specs()
    order = rng.permutation(len(pool))
    by_direction = {d: [pool[i] for i in order if pool[i].direction == d] for d in DIRECTIONS}
    picked = []
    for i in range(n):
        group = by_direction[DIRECTIONS[i % len(DIRECTIONS)]]
        picked.append(group[(i // len(DIRECTIONS)) % len(group)])
    return [caption(spec) for spec in picked]

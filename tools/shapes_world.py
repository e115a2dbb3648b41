"""The shapes world: one colored shape on a plain background, rendered at 64x64.

The built-in model (assets/shapes-flux) is trained on this world only, so its
captions, vocabulary and renderer live here and nowhere else. A caption reads

    "a large red circle on a blue background, left"

Shapes are drawn big (26 px and 42 px across on a 64 px canvas) so that each one
spans several of the transformer's 8x8-pixel image tokens; that is what lets a
tiny model tell a circle from a square.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

IMAGE_SIZE = 64

# RGB values chosen so every pair is at least ~90 apart (Euclidean), which keeps
# the evaluator's nearest-color decisions unambiguous.
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (245, 225, 50),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
    "purple": (140, 50, 170),
    "orange": (240, 130, 20),
}
COLORS: tuple[str, ...] = tuple(PALETTE)
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
SIZES: tuple[str, ...] = ("small", "large")
POSITIONS: tuple[str, ...] = ("left", "right", "top", "bottom", "center")

# Bounding-box side in pixels, and how far a non-center shape sits from the middle.
SIZE_PIXELS: dict[str, float] = {"small": 26.0, "large": 42.0}
POSITION_OFFSET: dict[str, float] = {"small": 15.0, "large": 9.5}
SIZE_JITTER_PIXELS = 2.0
POSITION_JITTER_PIXELS = 1.5

FILLER_WORDS: tuple[str, ...] = ("a", "an", "on", "background")

_SUPERSAMPLE = 4  # draw at 4x then downsample, for anti-aliased edges


@dataclass(frozen=True)
class ShapeSpec:
    """One scene: which shape, its color and size, where, on which background."""

    shape: str
    color: str
    size: str
    position: str
    background: str

    def __post_init__(self) -> None:
        for field, value, allowed in (
            ("shape", self.shape, SHAPES),
            ("color", self.color, COLORS),
            ("size", self.size, SIZES),
            ("position", self.position, POSITIONS),
            ("background", self.background, COLORS),
        ):
            if value not in allowed:
                raise ValueError(f"ShapeSpec.{field}={value!r} is not allowed; choose one of {list(allowed)}")
        if self.color == self.background:
            raise ValueError(
                f"ShapeSpec color and background are both {self.color!r}; the shape would be invisible"
            )


def all_specs() -> list[ShapeSpec]:
    """Every valid scene, in a fixed order (the balanced training set walks this list)."""
    return [
        ShapeSpec(shape, color, size, position, background)
        for shape in SHAPES
        for color in COLORS
        for size in SIZES
        for position in POSITIONS
        for background in COLORS
        if background != color
    ]


def shape_center(spec: ShapeSpec) -> tuple[float, float]:
    """Nominal (x, y) center of the shape's bounding box, in pixels."""
    middle = IMAGE_SIZE / 2.0
    offset = POSITION_OFFSET[spec.size]
    dx, dy = {
        "left": (-offset, 0.0),
        "right": (offset, 0.0),
        "top": (0.0, -offset),
        "bottom": (0.0, offset),
        "center": (0.0, 0.0),
    }[spec.position]
    return middle + dx, middle + dy


def shape_polygon_or_box(shape: str, left: float, top: float, right: float, bottom: float):
    """Outline of `shape` filling the box: polygon points, or the box itself for circle/square."""
    if shape == "triangle":
        return [((left + right) / 2.0, top), (right, bottom), (left, bottom)]
    return [left, top, right, bottom]


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, box: tuple[float, float, float, float], fill) -> None:
    left, top, right, bottom = box
    outline = shape_polygon_or_box(shape, left, top, right, bottom)
    if shape == "circle":
        draw.ellipse(outline, fill=fill)
    elif shape == "square":
        draw.rectangle(outline, fill=fill)
    elif shape == "triangle":
        draw.polygon(outline, fill=fill)
    else:
        raise ValueError(f"unknown shape {shape!r}; allowed: {list(SHAPES)}")


def render(spec: ShapeSpec, rng: np.random.Generator | None = None) -> Image.Image:
    """Draw `spec` as a 64x64 RGB image; with `rng`, jitter size and position slightly."""
    side = SIZE_PIXELS[spec.size]
    cx, cy = shape_center(spec)
    if rng is not None:
        side += rng.uniform(-SIZE_JITTER_PIXELS, SIZE_JITTER_PIXELS)
        cx += rng.uniform(-POSITION_JITTER_PIXELS, POSITION_JITTER_PIXELS)
        cy += rng.uniform(-POSITION_JITTER_PIXELS, POSITION_JITTER_PIXELS)
    big = IMAGE_SIZE * _SUPERSAMPLE
    image = Image.new("RGB", (big, big), PALETTE[spec.background])
    half = side / 2.0
    box = tuple(v * _SUPERSAMPLE for v in (cx - half, cy - half, cx + half, cy + half))
    draw_shape(ImageDraw.Draw(image), spec.shape, box, PALETTE[spec.color])
    return image.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BOX)


def article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def caption(spec: ShapeSpec) -> str:
    return (
        f"a {spec.size} {spec.color} {spec.shape} "
        f"on {article(spec.background)} {spec.background} background, {spec.position}"
    )


_CAPTION_PATTERN = re.compile(
    r"^\s*an?\s+(?P<size>\w+)\s+(?P<color>\w+)\s+(?P<shape>\w+)\s+on\s+an?\s+(?P<background>\w+)"
    r"\s+background\s*,\s*(?P<position>\w+)\s*$"
)


def parse_caption(text: str) -> ShapeSpec:
    """Inverse of `caption` (case-insensitive); ValueError naming the problem otherwise."""
    match = _CAPTION_PATTERN.match(text.lower())
    if match is None:
        raise ValueError(
            f"caption {text!r} does not have the form "
            "'a <size> <color> <shape> on a <color> background, <position>', "
            "e.g. 'a large red circle on a blue background, left'"
        )
    return ShapeSpec(**match.groupdict())


def vocabulary() -> set[str]:
    """Every word the built-in model was trained on."""
    return set(FILLER_WORDS) | set(COLORS) | set(SHAPES) | set(SIZES) | set(POSITIONS)


def words(prompt: str) -> list[str]:
    """Lower-cased words of a prompt; punctuation separates words and is dropped."""
    return re.findall(r"[a-z0-9']+", prompt.lower())


def unknown_words(prompt: str) -> list[str]:
    """Words of `prompt` the model never saw, in order of first appearance, without repeats."""
    known = vocabulary()
    unknown: list[str] = []
    for word in words(prompt):
        if word not in known and word not in unknown:
            unknown.append(word)
    return unknown


def random_spec(rng: np.random.Generator) -> ShapeSpec:
    color, background = rng.choice(len(COLORS), size=2, replace=False)
    return ShapeSpec(
        shape=SHAPES[rng.integers(len(SHAPES))],
        color=COLORS[color],
        size=SIZES[rng.integers(len(SIZES))],
        position=POSITIONS[rng.integers(len(POSITIONS))],
        background=COLORS[background],
    )


def example_specs(n: int, seed: int = 0) -> list[ShapeSpec]:
    """`n` scenes that cycle through every shape, size, position and color evenly."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    rng = np.random.default_rng(seed)
    specs = []
    for i in range(n):
        color = COLORS[i % len(COLORS)]
        background_choices = [c for c in COLORS if c != color]
        specs.append(
            ShapeSpec(
                shape=SHAPES[i % len(SHAPES)],
                color=color,
                size=SIZES[(i // len(SHAPES)) % len(SIZES)],
                position=POSITIONS[i % len(POSITIONS)],
                background=background_choices[rng.integers(len(background_choices))],
            )
        )
    order = rng.permutation(n)
    return [specs[i] for i in order]


def example_prompts(n: int, seed: int = 0) -> list[str]:
    return [caption(spec) for spec in example_specs(n, seed)]


# ----------------------------------------------------------------------------- outlines
# The "outline" LoRA adapter (assets/loras/shapes-flux/outline.safetensors, tools/train_lora.py)
# draws the same scenes as rings: the shape's border in its colour, its inside the background.

OUTLINE_THICKNESS_PIXELS = 4.0


def inner_box_or_polygon(shape: str, box: tuple[float, float, float, float], thickness: float):
    """The region `thickness` inside the outline of `shape` drawn into `box`: a shrunken box for
    circle/square, the triangle whose edges are each moved inwards by `thickness` (a copy of the
    triangle scaled about its incenter) for a triangle."""
    left, top, right, bottom = box
    if shape in ("circle", "square"):
        return [left + thickness, top + thickness, right - thickness, bottom - thickness]
    if shape != "triangle":
        raise ValueError(f"unknown shape {shape!r}; allowed: {list(SHAPES)}")
    points = np.array(shape_polygon_or_box(shape, left, top, right, bottom), dtype=np.float64)
    sides = np.array([np.linalg.norm(points[(i + 1) % 3] - points[(i + 2) % 3]) for i in range(3)])
    incenter = (sides[:, None] * points).sum(axis=0) / sides.sum()
    (ax, ay), (bx, by) = points[1] - points[0], points[2] - points[0]
    area = 0.5 * abs(ax * by - ay * bx)
    inradius = 2.0 * area / sides.sum()
    factor = max(inradius - thickness, 0.0) / inradius
    return [tuple(incenter + (point - incenter) * factor) for point in points]


def render_outline(spec: ShapeSpec, rng: np.random.Generator | None = None,
                   thickness: float = OUTLINE_THICKNESS_PIXELS) -> Image.Image:
    """`spec` drawn as an outline `thickness` pixels wide: the shape in its colour with its inside
    (`inner_box_or_polygon`) in the background colour. Size and position (and, with `rng`, their
    jitter: the same draws in the same order as `render`) are those of `render`."""
    side = SIZE_PIXELS[spec.size]
    cx, cy = shape_center(spec)
    if rng is not None:
        side += rng.uniform(-SIZE_JITTER_PIXELS, SIZE_JITTER_PIXELS)
        cx += rng.uniform(-POSITION_JITTER_PIXELS, POSITION_JITTER_PIXELS)
        cy += rng.uniform(-POSITION_JITTER_PIXELS, POSITION_JITTER_PIXELS)
    big = IMAGE_SIZE * _SUPERSAMPLE
    image = Image.new("RGB", (big, big), PALETTE[spec.background])
    half = side / 2.0
    box = tuple(v * _SUPERSAMPLE for v in (cx - half, cy - half, cx + half, cy + half))
    draw_outline(ImageDraw.Draw(image), spec.shape, box, thickness * _SUPERSAMPLE, PALETTE[spec.color],
                 PALETTE[spec.background])
    return image.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BOX)


def draw_outline(draw: ImageDraw.ImageDraw, shape: str, box: tuple[float, float, float, float], thickness: float,
                 fill, inside) -> None:
    """`shape` in `box` as a ring `thickness` wide in `fill`, its inside in `inside`."""
    draw_shape(draw, shape, box, fill)
    inner = inner_box_or_polygon(shape, box, thickness)
    if shape == "circle":
        draw.ellipse(inner, fill=inside)
    elif shape == "square":
        draw.rectangle(inner, fill=inside)
    else:
        draw.polygon(inner, fill=inside)

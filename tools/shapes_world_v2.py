"""The open shapes world (shapes-flux v2): one coloured shape anywhere on a plain canvas of any
size the model serves, described by captions that may leave any part out.

A scene is a shape, its colour, its side (a fraction of the canvas's short side), its centre
(continuous, anywhere the whole shape fits) and a background colour, on a canvas from 48 to 128
pixels a side in steps of 8 (the VAE's factor 4 x the transformer's 2x2 patches). A caption names
what it names and leaves the rest to the model:

    "a large red circle on a blue background, left"   (every part, the v1 form)
    "a red circle on a blue background"               (size and position left out)
    "a square at the top"  "red triangle on green"  "a small shape in the center"

Words: `small` and `large` are ranges of the side (relative to the canvas, so a small circle is
small at every size); the five position words are regions of where the centre may lie (its place
between the two extremes the shape can reach, per axis); a caption names a size or a position only
when the scene lies inside that word's range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from PIL import Image, ImageDraw

from tools.shapes_world import COLORS, OUTLINE_THICKNESS_PIXELS, PALETTE, SHAPES, article, draw_outline, draw_shape

SIZE_STEP = 8
MIN_SIDE_PIXELS = 48
MAX_SIDE_PIXELS = 128
CANVAS_SIDES: tuple[int, ...] = tuple(range(MIN_SIDE_PIXELS, MAX_SIDE_PIXELS + 1, SIZE_STEP))

# The canvases the evaluator reports one by one: every aspect ratio the model card names.
NAMED_CANVASES: dict[str, tuple[int, int]] = {
    "48x48": (48, 48), "64x64": (64, 64), "96x96": (96, 96), "128x128": (128, 128),
    "96x64 (3:2)": (96, 64), "64x96 (2:3)": (64, 96),
    "128x72 (16:9)": (128, 72), "72x128 (9:16)": (72, 128),
}

SIZE_WORDS: tuple[str, ...] = ("small", "large")
# Side of the shape's box as a fraction of the canvas's short side; small shapes never go below
# MIN_SHAPE_PIXELS (a shape has to span a few 8-pixel image tokens to be told apart).
SIZE_FRACTIONS: dict[str, tuple[float, float]] = {"small": (0.30, 0.40), "large": (0.54, 0.68)}
SIZE_THRESHOLD_FRACTION = 0.48
MIN_SHAPE_PIXELS = 20.0
MARGIN_PIXELS = 2.0  # the shape keeps this far from the canvas edge

POSITION_WORDS: tuple[str, ...] = ("left", "right", "top", "bottom", "center")
# Regions of the centre in "reach" coordinates: per axis 0 is as far left/up as the shape fits,
# 1 as far right/down. A caption names a position only for a centre inside its region; the
# evaluator calls a drawn centre by the nearest anchor.
POSITION_REGIONS: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {
    "left": ((0.0, 0.25), (0.3, 0.7)),
    "right": ((0.75, 1.0), (0.3, 0.7)),
    "top": ((0.3, 0.7), (0.0, 0.25)),
    "bottom": ((0.3, 0.7), (0.75, 1.0)),
    "center": ((0.38, 0.62), (0.38, 0.62)),
}
POSITION_ANCHORS: dict[str, tuple[float, float]] = {
    "left": (0.1, 0.5), "right": (0.9, 0.5), "top": (0.5, 0.1), "bottom": (0.5, 0.9), "center": (0.5, 0.5),
}
# How a caption says a position: the v1 form after a comma, or a phrase.
POSITION_PHRASES: dict[str, str] = {
    "left": "on the left", "right": "on the right", "top": "at the top", "bottom": "at the bottom",
    "center": "in the center",
}
GENERIC_SHAPE = "shape"
FILLER_WORDS: tuple[str, ...] = ("a", "an", "on", "background", "the", "at", "in", GENERIC_SHAPE)

_SUPERSAMPLE = 4


def vocabulary() -> set[str]:
    return set(FILLER_WORDS) | set(COLORS) | set(SHAPES) | set(SIZE_WORDS) | set(POSITION_WORDS)


def check_canvas(width: int, height: int) -> None:
    for name, value in (("width", width), ("height", height)):
        if value not in CANVAS_SIDES:
            raise ValueError(
                f"{name}={value} is not a canvas side of the open shapes world; allowed: multiples of "
                f"{SIZE_STEP} from {MIN_SIDE_PIXELS} to {MAX_SIDE_PIXELS}"
            )


@dataclass(frozen=True)
class Scene:
    """One picture: canvas, shape, colours, the shape's side (pixels) and centre (pixels)."""

    width: int
    height: int
    shape: str
    color: str
    background: str
    side: float
    cx: float
    cy: float

    def __post_init__(self) -> None:
        check_canvas(self.width, self.height)
        for field, value, allowed in (("shape", self.shape, SHAPES), ("color", self.color, COLORS),
                                      ("background", self.background, COLORS)):
            if value not in allowed:
                raise ValueError(f"Scene.{field}={value!r} is not allowed; choose one of {list(allowed)}")
        if self.color == self.background:
            raise ValueError(f"Scene color and background are both {self.color!r}; the shape would be invisible")

    @property
    def short_side(self) -> int:
        return min(self.width, self.height)

    @property
    def box(self) -> tuple[float, float, float, float]:
        half = self.side / 2.0
        return (self.cx - half, self.cy - half, self.cx + half, self.cy + half)

    def size_word(self) -> str | None:
        return size_word_of(self.side, self.width, self.height)

    def position_word(self) -> str | None:
        u, v = reach(self.cx, self.cy, self.side, self.width, self.height)
        for word, ((u0, u1), (v0, v1)) in POSITION_REGIONS.items():
            if u0 <= u <= u1 and v0 <= v <= v1:
                return word
        return None


def side_range(word: str, width: int, height: int) -> tuple[float, float]:
    short = min(width, height)
    low, high = SIZE_FRACTIONS[word]
    low_px, high_px = low * short, high * short
    if word == "small":
        low_px, high_px = max(low_px, MIN_SHAPE_PIXELS), max(high_px, MIN_SHAPE_PIXELS)
    return low_px, high_px


def size_word_of(side: float, width: int, height: int) -> str | None:
    for word in SIZE_WORDS:
        low, high = side_range(word, width, height)
        if low - 1e-6 <= side <= high + 1e-6:
            return word
    return None


def centre_limits(side: float, extent: int) -> tuple[float, float]:
    half = side / 2.0
    return half + MARGIN_PIXELS, extent - half - MARGIN_PIXELS


def reach(cx: float, cy: float, side: float, width: int, height: int) -> tuple[float, float]:
    """The centre in reach coordinates (0..1 per axis between the two extremes it can take)."""
    values = []
    for centre, extent in ((cx, width), (cy, height)):
        low, high = centre_limits(side, extent)
        values.append(0.5 if high <= low else (centre - low) / (high - low))
    return values[0], values[1]


def from_reach(u: float, v: float, side: float, width: int, height: int) -> tuple[float, float]:
    (x0, x1), (y0, y1) = centre_limits(side, width), centre_limits(side, height)
    return x0 + u * (x1 - x0), y0 + v * (y1 - y0)


def nearest_position(u: float, v: float) -> str:
    return min(POSITION_ANCHORS, key=lambda word: math.dist((u, v), POSITION_ANCHORS[word]))


def random_canvas(rng: np.random.Generator) -> tuple[int, int]:
    return int(rng.choice(CANVAS_SIDES)), int(rng.choice(CANVAS_SIDES))


def random_scene(rng: np.random.Generator, width: int, height: int,
                 size: str | None = None, position: str | None = None) -> Scene:
    """A scene on this canvas. Half the time (unless asked) the side lies in a size word's range
    and the centre in a position word's region, so captions can name them; otherwise anywhere."""
    color, background = rng.choice(len(COLORS), size=2, replace=False)
    if size is None and rng.random() < 0.8:
        size = SIZE_WORDS[rng.integers(len(SIZE_WORDS))]
    if size is None:
        low, high = side_range("small", width, height)[0], side_range("large", width, height)[1]
    else:
        low, high = side_range(size, width, height)
    side = float(rng.uniform(low, high))
    if position is None and rng.random() < 0.5:
        position = POSITION_WORDS[rng.integers(len(POSITION_WORDS))]
    if position is None:
        u, v = rng.uniform(0.0, 1.0, size=2)
    else:
        (u0, u1), (v0, v1) = POSITION_REGIONS[position]
        u, v = rng.uniform(u0, u1), rng.uniform(v0, v1)
    cx, cy = from_reach(float(u), float(v), side, width, height)
    return Scene(width, height, SHAPES[rng.integers(len(SHAPES))], COLORS[color], COLORS[background], side, cx, cy)


def render(scene: Scene) -> Image.Image:
    big = (scene.width * _SUPERSAMPLE, scene.height * _SUPERSAMPLE)
    image = Image.new("RGB", big, PALETTE[scene.background])
    box = tuple(v * _SUPERSAMPLE for v in scene.box)
    draw_shape(ImageDraw.Draw(image), scene.shape, box, PALETTE[scene.color])
    return image.resize((scene.width, scene.height), Image.Resampling.BOX)


def render_outline(scene: Scene, thickness: float = OUTLINE_THICKNESS_PIXELS,
                   box: tuple[float, float, float, float] | None = None) -> Image.Image:
    """`scene` as the outline adapter draws it: the shape's border `thickness` pixels wide in its
    colour, its inside the background (tools/train_lora_v2.py); `box` (pixels) instead of the
    scene's square one draws it stretched to that box."""
    big = (scene.width * _SUPERSAMPLE, scene.height * _SUPERSAMPLE)
    image = Image.new("RGB", big, PALETTE[scene.background])
    box = tuple(v * _SUPERSAMPLE for v in (box or scene.box))
    draw_outline(ImageDraw.Draw(image), scene.shape, box, thickness * _SUPERSAMPLE, PALETTE[scene.color],
                 PALETTE[scene.background])
    return image.resize((scene.width, scene.height), Image.Resampling.BOX)


def recolored(scene: Scene, rng: np.random.Generator) -> Scene:
    """The same scene with the shape in another colour (never the background's)."""
    colors = [c for c in COLORS if c not in (scene.color, scene.background)]
    return replace(scene, color=colors[int(rng.integers(len(colors)))])


@dataclass(frozen=True)
class Named:
    """Which parts of a scene a caption names (the rest is left to the model)."""

    size: bool = True
    color: bool = True
    shape: bool = True
    background: bool = True
    position: bool = True

    @staticmethod
    def everything() -> "Named":
        return Named()


def caption(scene: Scene, named: Named = Named(), phrase_position: bool = False,
            short_background: bool = False, bare: bool = False) -> str:
    """The caption of `scene` naming what `named` says (a size or position the scene lies outside
    of is never named). `phrase_position`: "at the top" instead of ", top"; `short_background`:
    "on blue" instead of "on a blue background"; `bare`: no leading article."""
    words: list[str] = []
    size = scene.size_word() if named.size else None
    if size:
        words.append(size)
    if named.color:
        words.append(scene.color)
    words.append(scene.shape if named.shape else GENERIC_SHAPE)
    if not bare:
        words.insert(0, article(words[0]))
    text = " ".join(words)
    if named.background:
        text += f" on {scene.background}" if short_background else \
            f" on {article(scene.background)} {scene.background} background"
    position = scene.position_word() if named.position else None
    if position:
        text += f" {POSITION_PHRASES[position]}" if phrase_position else f", {position}"
    return text


def random_caption(scene: Scene, rng: np.random.Generator, drop: float = 0.35, name_color: bool = False) -> str:
    """A training caption: each part left out with probability `drop` (about one in four
    captions names everything), and the phrasings varied; `name_color` always names the colour."""
    return random_named_caption(scene, rng, drop, name_color)[1]


def random_named_caption(scene: Scene, rng: np.random.Generator, drop: float = 0.35,
                         name_color: bool = False) -> tuple[Named, str]:
    """random_caption's caption and which parts it names."""
    keep = rng.random(5) >= drop
    named = Named(size=bool(keep[0]), color=bool(keep[1]) or name_color, shape=bool(keep[2]),
                  background=bool(keep[3]), position=bool(keep[4]))
    return named, caption(scene, named, phrase_position=bool(rng.random() < 0.5),
                          short_background=bool(rng.random() < 0.2), bare=bool(rng.random() < 0.2))

"""Score generated shapes-world images against their captions, attribute by attribute.

The measurement is deterministic image analysis, no learned model:
- background: median of the border pixels -> nearest palette color;
- foreground mask: pixels closer to the estimated shape color than to the background;
- color: median of the mask -> nearest palette color;
- position and size: robust bounding box of the mask (2nd-98th percentile of its pixels);
- shape: intersection-over-union of the mask with a circle, square and triangle drawn
  into that same box; the best match wins.

CLI (runs the stock diffusers FluxPipeline with the model's serving defaults):

    python -m tools.evaluate_builtin --model assets/shapes-flux --prompts 120 --steps 20
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from tools.shapes_world import (
    COLORS,
    IMAGE_SIZE,
    PALETTE,
    POSITION_OFFSET,
    SHAPES,
    SIZE_PIXELS,
    ShapeSpec,
    draw_shape,
    example_prompts,
    parse_caption,
)

ATTRIBUTES: tuple[str, ...] = ("color", "shape", "background", "position", "size")

_PALETTE_ARRAY = np.array([PALETTE[name] for name in COLORS], dtype=np.float32)
# A pixel this far (RGB distance) from the background is surely part of the shape.
_SURE_FOREGROUND_DISTANCE = 60.0
# Fewer mask pixels than this means "no shape was drawn".
_MIN_MASK_PIXELS = 12
_SIZE_THRESHOLD = (SIZE_PIXELS["small"] + SIZE_PIXELS["large"]) / 2.0
# A box center closer than this to the middle (in pixels, per axis) counts as "center".
_CENTER_TOLERANCE = min(POSITION_OFFSET.values()) / 2.0


@dataclass(frozen=True)
class Measurement:
    """What the image shows; None where the image shows no shape at all."""

    background: str
    color: str | None
    shape: str | None
    position: str | None
    size: str | None


def nearest_palette_color(rgb: np.ndarray) -> str:
    distances = np.linalg.norm(_PALETTE_ARRAY - np.asarray(rgb, dtype=np.float32), axis=1)
    return COLORS[int(np.argmin(distances))]


def border_pixels(pixels: np.ndarray) -> np.ndarray:
    return np.concatenate([pixels[0], pixels[-1], pixels[1:-1, 0], pixels[1:-1, -1]], axis=0)


def foreground_mask(pixels: np.ndarray, background_rgb: np.ndarray) -> np.ndarray:
    """Two passes: sure-foreground pixels give the shape color; then nearest of the two colors."""
    to_background = np.linalg.norm(pixels - background_rgb, axis=-1)
    sure = to_background > _SURE_FOREGROUND_DISTANCE
    if sure.sum() < _MIN_MASK_PIXELS:
        return sure
    foreground_rgb = np.median(pixels[sure], axis=0)
    to_foreground = np.linalg.norm(pixels - foreground_rgb, axis=-1)
    return to_foreground < to_background


def robust_box(mask: np.ndarray) -> tuple[float, float, float, float]:
    """(left, top, right, bottom) in pixel-edge coordinates over rows/columns holding at least
    two mask pixels, so a few stray pixels do not stretch the box."""
    columns = np.nonzero(mask.sum(axis=0) >= 2)[0]
    rows = np.nonzero(mask.sum(axis=1) >= 2)[0]
    if len(columns) == 0 or len(rows) == 0:
        ys, xs = np.nonzero(mask)
        columns, rows = xs, ys
    return float(columns.min()), float(rows.min()), float(columns.max()) + 1.0, float(rows.max()) + 1.0


def template_mask(shape: str, box: tuple[float, float, float, float]) -> np.ndarray:
    scale = 4
    canvas = Image.new("L", (IMAGE_SIZE * scale, IMAGE_SIZE * scale), 0)
    draw_shape(ImageDraw.Draw(canvas), shape, tuple(v * scale for v in box), 255)
    small = canvas.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BOX)
    return np.asarray(small) >= 128


def classify_shape(mask: np.ndarray, box: tuple[float, float, float, float]) -> str:
    best_shape, best_iou = SHAPES[0], -1.0
    for shape in SHAPES:
        template = template_mask(shape, box)
        union = np.logical_or(mask, template).sum()
        iou = np.logical_and(mask, template).sum() / max(union, 1)
        if iou > best_iou:
            best_shape, best_iou = shape, iou
    return best_shape


def classify_position(box: tuple[float, float, float, float]) -> str:
    left, top, right, bottom = box
    dx = (left + right) / 2.0 - IMAGE_SIZE / 2.0
    dy = (top + bottom) / 2.0 - IMAGE_SIZE / 2.0
    if max(abs(dx), abs(dy)) < _CENTER_TOLERANCE:
        return "center"
    if abs(dx) >= abs(dy):
        return "left" if dx < 0 else "right"
    return "top" if dy < 0 else "bottom"


def classify_size(box: tuple[float, float, float, float]) -> str:
    left, top, right, bottom = box
    return "large" if max(right - left, bottom - top) > _SIZE_THRESHOLD else "small"


def measure(image: Image.Image) -> Measurement:
    if image.size != (IMAGE_SIZE, IMAGE_SIZE):
        raise ValueError(f"expected a {IMAGE_SIZE}x{IMAGE_SIZE} image, got {image.size[0]}x{image.size[1]}")
    pixels = np.asarray(image.convert("RGB"), dtype=np.float32)
    background_rgb = np.median(border_pixels(pixels), axis=0)
    background = nearest_palette_color(background_rgb)
    mask = foreground_mask(pixels, background_rgb)
    if mask.sum() < _MIN_MASK_PIXELS:
        return Measurement(background, None, None, None, None)
    box = robust_box(mask)
    return Measurement(
        background=background,
        color=nearest_palette_color(np.median(pixels[mask], axis=0)),
        shape=classify_shape(mask, box),
        position=classify_position(box),
        size=classify_size(box),
    )


def score_image(spec: ShapeSpec, image: Image.Image) -> dict[str, bool]:
    seen = measure(image)
    return {attribute: getattr(seen, attribute) == getattr(spec, attribute) for attribute in ATTRIBUTES}


def evaluate_images(pairs: list[tuple[str, Image.Image]]) -> dict[str, float]:
    """Per-attribute accuracy over (caption, image) pairs, each in [0, 1]."""
    if not pairs:
        raise ValueError("evaluate_images needs at least one (caption, image) pair, got none")
    hits = {attribute: 0 for attribute in ATTRIBUTES}
    for text, image in pairs:
        for attribute, correct in score_image(parse_caption(text), image).items():
            hits[attribute] += int(correct)
    return {attribute: hits[attribute] / len(pairs) for attribute in ATTRIBUTES}


def load_serving_defaults(model_dir: Path) -> dict:
    path = model_dir / "stepstudio.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; the model folder must carry its serving defaults")
    return json.loads(path.read_text())


def generate(pipe, prompts: list[str], defaults: dict, steps: int, guidance_scale: float, seed: int, batch: int):
    """Images for `prompts` from the stock FluxPipeline; true CFG when guidance_scale > 1."""
    import torch

    images = []
    for start in range(0, len(prompts), batch):
        chunk = prompts[start : start + batch]
        generator = torch.Generator("cpu").manual_seed(seed + start)
        cfg = {}
        if guidance_scale > 1.0:
            cfg = {"negative_prompt": [defaults.get("negative_prompt", "")] * len(chunk), "true_cfg_scale": guidance_scale}
        result = pipe(
            prompt=chunk,
            height=defaults["height"],
            width=defaults["width"],
            num_inference_steps=steps,
            max_sequence_length=defaults["max_sequence_length"],
            generator=generator,
            **cfg,
        )
        images.extend(result.images)
    return images


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("assets/shapes-flux"))
    parser.add_argument("--prompts", type=int, default=120, help="how many evaluation prompts")
    parser.add_argument("--steps", type=int, default=None, help="denoise steps (default: the model's)")
    parser.add_argument("--cfg", type=float, nargs="*", default=None, help="true-CFG scales (default: the model's)")
    parser.add_argument("--seed", type=int, default=1234, help="seed of the prompt list and the noise")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch
    from diffusers import FluxPipeline

    torch.set_num_threads(args.threads)
    defaults = load_serving_defaults(args.model)
    steps = args.steps or defaults["num_inference_steps"]
    scales = args.cfg if args.cfg else [defaults["guidance_scale"]]
    pipe = FluxPipeline.from_pretrained(args.model, use_safetensors=True)
    pipe.set_progress_bar_config(disable=True)
    prompts = example_prompts(args.prompts, seed=args.seed)
    print(f"model {args.model}, {len(prompts)} prompts, {steps} steps, 64x64, seed {args.seed}\n")
    print("| true CFG | " + " | ".join(ATTRIBUTES) + " | s/image |")
    print("|---|" + "---|" * (len(ATTRIBUTES) + 1))
    for scale in scales:
        started = time.perf_counter()
        images = generate(pipe, prompts, defaults, steps, scale, args.seed, args.batch)
        per_image = (time.perf_counter() - started) / len(prompts)
        scores = evaluate_images(list(zip(prompts, images)))
        cells = " | ".join(f"{scores[a]:.2f}" for a in ATTRIBUTES)
        print(f"| {scale:g} | {cells} | {per_image:.3f} |", flush=True)


if __name__ == "__main__":
    main()

"""Score generated shapes-world images against their captions, attribute by attribute.

The measurement is deterministic image analysis, no learned model:
- background: median of the border pixels -> nearest palette color;
- foreground mask: pixels closer to the estimated shape color than to the background;
- color: median of the mask -> nearest palette color;
- position and size: robust bounding box of the mask (2nd-98th percentile of its pixels);
- shape: intersection-over-union of the mask, closed (gaps up to ~4 px bridged) and its holes
  filled (so an outlined circle is still a circle), with a circle, square and triangle drawn into that same box; the best
  match wins;
- outline (`is_outlined`, not one of ATTRIBUTES since captions do not say it): the centre of
  the filled mask (its pixels deeper than 0.6 x the deepest one's distance from its edge) is
  mostly not shape and its median colour is the background's palette colour.

CLI (runs the stock diffusers FluxPipeline with the model's serving defaults):

    python -m tools.evaluate_builtin --model assets/shapes-flux --prompts 120 --steps 20

With a LoRA adapter (the "outline" adapter of tools/train_lora.py), through stepstudio's own
engine (pipeline.load_lora + GenerationParams.loras), without and with it, outlined rate added;
the default prompts (--seed 1234, up to 120) are scenes held out of the adapter's training:

    python -m tools.evaluate_builtin --lora assets/loras/shapes-flux/outline.safetensors --lora-scale 1

Step caching's thresholds (tools/step_cache_sweep.py), through stepstudio's engine: caching off,
then every rule at every threshold, with the rows skipped, the speed against caching off and the
scores (each with its change from caching off):

    python -m tools.evaluate_builtin --step-cache 0.05 0.1 0.2 --step-cache-rule first-block teacache
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
    caption,
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
# The centre region of a shape: pixels at least this fraction of the deepest pixel's depth from
# its edge. A 4 px outline of the smallest shape (a 26 px triangle, inradius ~8 px) leaves a hole
# deeper than ~half the inradius.
_CENTRE_DEPTH = 0.6
# An outline: at least this fraction of the centre region is not shape.
_OUTLINE_HOLE_FRACTION = 0.5
# Gaps up to ~4 px in an outline are bridged before its inside is filled (a closing of radius 2).
_OUTLINE_GAP_RADIUS = 2


@dataclass(frozen=True)
class Measurement:
    """What the image shows; None where the image shows no shape at all."""

    background: str
    color: str | None
    shape: str | None
    position: str | None
    size: str | None
    # The shape drawn as an outline (its centre shows the background colour, its border another
    # colour) rather than filled; not one of ATTRIBUTES, since captions do not say it.
    outlined: bool | None = None


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


def template_mask(shape: str, box: tuple[float, float, float, float],
                  canvas_size: tuple[int, int] = (IMAGE_SIZE, IMAGE_SIZE)) -> np.ndarray:
    """`shape` drawn into `box` on a canvas of (width, height) pixels, as a boolean mask."""
    scale = 4
    width, height = canvas_size
    canvas = Image.new("L", (width * scale, height * scale), 0)
    draw_shape(ImageDraw.Draw(canvas), shape, tuple(v * scale for v in box), 255)
    small = canvas.resize((width, height), Image.Resampling.BOX)
    return np.asarray(small) >= 128


def fill_holes(mask: np.ndarray) -> np.ndarray:
    """`mask` with every region it encloses filled: the non-mask pixels that can't reach the image
    border through 4-connected non-mask pixels become mask (so a ring reads as a disc)."""
    outside = ~mask
    reached = np.zeros_like(mask)
    reached[0], reached[-1], reached[:, 0], reached[:, -1] = outside[0], outside[-1], outside[:, 0], outside[:, -1]
    while True:
        grown = reached.copy()
        grown[1:] |= reached[:-1]
        grown[:-1] |= reached[1:]
        grown[:, 1:] |= reached[:, :-1]
        grown[:, :-1] |= reached[:, 1:]
        grown &= outside
        if np.array_equal(grown, reached):
            return ~reached
        reached = grown


def _grow(mask: np.ndarray) -> np.ndarray:
    """One step of 8-neighbour dilation."""
    grown = mask.copy()
    grown[1:] |= mask[:-1]
    grown[:-1] |= mask[1:]
    rows = grown.copy()
    grown[:, 1:] |= rows[:, :-1]
    grown[:, :-1] |= rows[:, 1:]
    return grown


def close_mask(mask: np.ndarray, radius: int) -> np.ndarray:
    """Morphological closing with a (2 radius + 1)-pixel square: gaps up to ~2 x radius pixels
    wide in a drawn outline are bridged; a convex filled shape stays as it is."""
    if radius <= 0:
        return mask.copy()
    padded = np.pad(mask, radius + 1)
    for _ in range(radius):
        padded = _grow(padded)
    for _ in range(radius):
        padded = ~_grow(~padded)
    return padded[radius + 1 : -radius - 1, radius + 1 : -radius - 1]


def depth_map(mask: np.ndarray) -> np.ndarray:
    """Per mask pixel, how many 4-neighbour erosions it survives (1 at the mask's edge), 0 off it."""
    depth = np.zeros(mask.shape, dtype=np.int32)
    current = mask.copy()
    level = 0
    while current.any():
        level += 1
        depth[current] = level
        eroded = current.copy()
        eroded[1:] &= current[:-1]
        eroded[:-1] &= current[1:]
        eroded[:, 1:] &= current[:, :-1]
        eroded[:, :-1] &= current[:, 1:]
        eroded[0] = eroded[-1] = eroded[:, 0] = eroded[:, -1] = False
        current = eroded
    return depth


def centre_region(filled: np.ndarray) -> np.ndarray:
    """The middle of a (filled) shape: its pixels at least _CENTRE_DEPTH of the deepest one's
    depth away from its edge, which lies inside an outline's hole for every shape and size."""
    depth = depth_map(filled)
    return depth >= max(1, int(np.ceil(_CENTRE_DEPTH * depth.max())))


def classify_outline(pixels: np.ndarray, mask: np.ndarray, filled: np.ndarray, background: str) -> bool:
    """An outline: most of the centre region is not shape (the mask has a hole there) and the
    centre's median colour is the background's palette colour."""
    centre = centre_region(filled)
    if centre.sum() == 0:
        return False
    hole_fraction = float((~mask[centre]).mean())
    centre_color = nearest_palette_color(np.median(pixels[centre], axis=0))
    return hole_fraction >= _OUTLINE_HOLE_FRACTION and centre_color == background


def classify_shape(mask: np.ndarray, box: tuple[float, float, float, float]) -> str:
    best_shape, best_iou = SHAPES[0], -1.0
    for shape in SHAPES:
        template = template_mask(shape, box, (mask.shape[1], mask.shape[0]))
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
    # An outlined shape is classified by the region its outline encloses (small gaps bridged).
    filled = fill_holes(close_mask(mask, _OUTLINE_GAP_RADIUS))
    return Measurement(
        background=background,
        color=nearest_palette_color(np.median(pixels[mask], axis=0)),
        shape=classify_shape(filled, box),
        position=classify_position(box),
        size=classify_size(box),
        outlined=classify_outline(pixels, mask, filled, background),
    )


def is_outlined(image: Image.Image) -> bool:
    """Whether `image` shows its shape as an outline: the shape's centre region shows the
    background colour while its border shows another colour (which colour, shape, position and
    size it shows is scored by `score_image` as for filled shapes)."""
    return measure(image).outlined is True


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


def outline_rate(images: list[Image.Image]) -> float:
    """The fraction of `images` that show their shape as an outline (`is_outlined`)."""
    if not images:
        raise ValueError("outline_rate needs at least one image, got none")
    return sum(is_outlined(image) for image in images) / len(images)


def stepstudio_images(model: Path, prompts: list[str], seed: int, loras=(), steps: int | None = None,
                      guidance_scale: float | None = None, max_batch: int = 8, pipeline=None) -> list[Image.Image]:
    """Images for `prompts` made by stepstudio's engine (step mode, all requests submitted at once
    and co-batched), request i with seed + i. `loras`: the adapters (LoraUse) every request runs
    with, or a list with one tuple of them per prompt; they must be loaded in `pipeline`
    (`pipeline.load_lora`), which is loaded from `model` when not given. `<lora:NAME:SCALE>` tags
    in a prompt work too (the engine moves them into the request's loras)."""
    from engine import Completed, Engine, GenerationParams, ServingLimits
    from pipelines.loader import load_pipeline

    if pipeline is None:
        pipeline = load_pipeline(str(model))
    per_prompt = list(loras) if isinstance(loras, list) else [tuple(loras)] * len(prompts)
    if len(per_prompt) != len(prompts):
        raise ValueError(f"loras: {len(per_prompt)} entries for {len(prompts)} prompts")
    limits = ServingLimits(max_queue=len(prompts) + 1, max_per_session=len(prompts) + 1)
    engine = Engine(pipeline, mode="step", max_batch_requests=max_batch, limits=limits).start()
    try:
        handles = [engine.submit(GenerationParams(prompt=p, seed=seed + i, num_inference_steps=steps,
                                                  guidance_scale=guidance_scale, loras=tuple(uses)),
                                 session_id="eval") for i, (p, uses) in enumerate(zip(prompts, per_prompt))]
        finals = [h.result(timeout=3600) for h in handles]
    finally:
        engine.close()
    failed = [f for f in finals if not isinstance(f, Completed)]
    if failed:
        raise RuntimeError(f"{len(failed)} evaluation requests did not complete, e.g. {failed[0]!r}")
    return [f.images[0] for f in finals]


def evaluate_lora(args) -> None:
    """With and without the adapter, through stepstudio (pipeline.load_lora + GenerationParams.loras),
    on held-out prompts: outlined rate and the usual attributes."""
    from pipelines.lora_request import LoraUse
    from tools.train_lora import held_out_specs

    defaults = load_serving_defaults(args.model)
    steps = args.steps or defaults["num_inference_steps"]
    scales = args.cfg if args.cfg else [defaults["guidance_scale"]]
    prompts = example_prompts(args.prompts, seed=args.seed)
    held_out = {caption(spec) for spec in held_out_specs()}
    unseen = sum(prompt in held_out for prompt in prompts)
    noise_seed = args.seed if args.noise_seed is None else args.noise_seed
    print(f"model {args.model}, adapter {args.lora}, {len(prompts)} prompts (seed {args.seed}; {unseen} of them held "
          f"out of the adapter's training), {steps} steps, 64x64, noise seeds {noise_seed} + i, through "
          "stepstudio's engine\n")
    print("| adapter | true CFG | outlined | " + " | ".join(ATTRIBUTES) + " | s/image |")
    print("|---|---|---|" + "---|" * (len(ATTRIBUTES) + 1))
    from pipelines.loader import load_pipeline

    pipeline = load_pipeline(str(args.model))
    pipeline.load_lora("outline", args.lora)
    for scale in scales:
        for lora_scale in [0.0] + list(args.lora_scale):
            loras = (LoraUse("outline", lora_scale),) if lora_scale else ()
            started = time.perf_counter()
            images = stepstudio_images(args.model, prompts, noise_seed, loras, steps, scale, args.batch,
                                       pipeline=pipeline)
            per_image = (time.perf_counter() - started) / len(prompts)
            scores = evaluate_images(list(zip(prompts, images)))
            label = f"{Path(args.lora).stem} x{lora_scale:g}" if lora_scale else "none"
            cells = " | ".join(f"{scores[a]:.2f}" for a in ATTRIBUTES)
            print(f"| {label} | {scale:g} | {outline_rate(images):.2f} | {cells} | {per_image:.3f} |", flush=True)
            if args.save_images:
                folder = Path(args.save_images) / f"cfg{scale:g}-lora{lora_scale:g}"
                folder.mkdir(parents=True, exist_ok=True)
                for i, image in enumerate(images):
                    image.save(folder / f"{i:03d}.png")


def evaluate_step_cache(args) -> None:
    """Caching off and each rule at each threshold, through stepstudio's engine (step mode)."""
    from tools.step_cache_sweep import sweep_prompts

    sweep_prompts(args.model, example_prompts(args.prompts, seed=args.seed), args.seed, args.steps,
                  args.cfg[0] if args.cfg else None,
                  lambda pairs: evaluate_images([(prompt, final.images[0]) for prompt, final in pairs]),
                  args.step_cache, args.step_cache_rule, ATTRIBUTES, args.batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("assets/shapes-flux"))
    parser.add_argument("--prompts", type=int, default=120, help="how many evaluation prompts")
    parser.add_argument("--steps", type=int, default=None, help="denoise steps (default: the model's)")
    parser.add_argument("--cfg", type=float, nargs="*", default=None, help="true-CFG scales (default: the model's)")
    parser.add_argument("--seed", type=int, default=1234, help="seed of the prompt list and the noise")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lora", type=Path, default=None,
                        help="a LoRA adapter file: evaluate through stepstudio without it and with it, and "
                             "report the outlined rate too")
    parser.add_argument("--lora-scale", type=float, nargs="+", default=[1.0], help="the adapter's scales (with --lora)")
    parser.add_argument("--noise-seed", type=int, default=None,
                        help="with --lora: request i uses noise seed NOISE_SEED + i (default: --seed)")
    parser.add_argument("--save-images", type=Path, default=None, help="with --lora: write the images here")
    parser.add_argument("--step-cache", type=float, nargs="+", default=None, metavar="THRESHOLD",
                        help="through stepstudio's engine: caching off, then step caching at each threshold")
    parser.add_argument("--step-cache-rule", nargs="+", default=["teacache"], choices=("first-block", "teacache"),
                        help="with --step-cache: the rules to try (pipelines/step_cache.py)")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    if args.lora is not None:
        evaluate_lora(args)
        return
    if args.step_cache is not None:
        evaluate_step_cache(args)
        return

    from diffusers import FluxPipeline

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

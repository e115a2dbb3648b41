"""Score generated moving-shapes clips against their captions: colour, shape, background, direction.

Deterministic image analysis, no learned model. Per clip:
- background: median of the border pixels of every frame -> nearest palette colour;
- shape colour: median of the pixels far (> 60 RGB) from the background, over every frame;
- foreground mask of each frame: pixels closer to the shape colour than to the background;
- colour: median of the masks' pixels -> nearest palette colour;
- shape: per frame, IoU of the mask with a circle, square and triangle drawn into its box
  (tools/evaluate_builtin.py); the majority over frames wins;
- direction: the centroid track of the masks; a least-squares line through it gives the
  displacement from the first frame to the last; its larger axis and sign name the direction.
  Less than MIN_TRAVEL_PIXELS of displacement counts as no motion (wrong for every caption).

CLI (runs the stock diffusers WanPipeline with the model's serving defaults):

    python -m tools.evaluate_video --model assets/shapes-wan --split held-out --repeats 2
    python -m tools.evaluate_video --split training --flow-shift 5   # try a sampler setting on seen prompts
    python -m tools.evaluate_video --model assets/shapes-wan --repeats 0 --contact-sheet assets/shapes-wan/contact_sheet.png

Step caching's thresholds (tools/step_cache_sweep.py), through stepstudio's engine (every clip its
own request, seed + i): caching off, then every rule at every threshold:

    python -m tools.evaluate_video --step-cache 0.05 0.1 0.2 --step-cache-rule first-block teacache
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from tools.evaluate_builtin import border_pixels, classify_shape, nearest_palette_color, robust_box
from tools.moving_shapes_world import (
    DIRECTION_VECTORS,
    Canvas,
    TRAVEL_PIXELS,
    MotionSpec,
    caption,
    held_out_specs,
    parse_caption,
    training_specs,
)

ATTRIBUTES: tuple[str, ...] = ("color", "shape", "background", "direction")

# A pixel this far (RGB distance) from the background is surely part of the shape.
_SURE_FOREGROUND_DISTANCE = 60.0
# A frame whose mask has fewer pixels than this shows no shape.
_MIN_MASK_PIXELS = 12
# A third of the rendered travel: less than this is "not moving".
MIN_TRAVEL_PIXELS = TRAVEL_PIXELS / 3.0


@dataclass(frozen=True)
class VideoMeasurement:
    """What a clip shows; None where the clip shows no shape (or, for direction, no motion)."""

    background: str
    color: str | None
    shape: str | None
    direction: str | None
    track: tuple[tuple[float, float] | None, ...]  # mask centroid (x, y) per frame


def as_frame_arrays(frames) -> list[np.ndarray]:
    """PIL images, uint8 arrays or float arrays in [0, 1] (WanPipeline's "np" output) ->
    float32 [H, W, 3] arrays on the 0-255 scale."""
    arrays = []
    for frame in frames:
        if isinstance(frame, Image.Image):
            array = np.asarray(frame.convert("RGB"), dtype=np.float32)
        else:
            array = np.asarray(frame)
            array = array.astype(np.float32) * (255.0 if array.dtype.kind == "f" else 1.0)
        if array.ndim != 3 or array.shape[-1] != 3 or (arrays and array.shape != arrays[0].shape):
            raise ValueError(f"expected RGB frames of one size, got an array of shape {array.shape}")
        arrays.append(array)
    if not arrays:
        raise ValueError("a clip needs at least one frame, got none")
    return arrays


def centroid(mask: np.ndarray) -> tuple[float, float] | None:
    if mask.sum() < _MIN_MASK_PIXELS:
        return None
    ys, xs = np.nonzero(mask)
    return float(xs.mean()) + 0.5, float(ys.mean()) + 0.5  # pixel centres


def classify_direction(track: list[tuple[float, float] | None]) -> str | None:
    """Direction of the least-squares line through the track's visible points, or None when
    fewer than half the frames show the shape or it travels less than MIN_TRAVEL_PIXELS."""
    visible = [(index, point) for index, point in enumerate(track) if point is not None]
    if len(visible) < max(2, len(track) // 2):
        return None
    times = np.array([index for index, _ in visible], dtype=np.float64)
    points = np.array([point for _, point in visible], dtype=np.float64)
    slope = np.polyfit(times, points, deg=1)[0]  # [dx/frame, dy/frame]
    dx, dy = slope * (len(track) - 1)
    if max(abs(dx), abs(dy)) < MIN_TRAVEL_PIXELS:
        return None
    step = (int(np.sign(dx)), 0) if abs(dx) >= abs(dy) else (0, int(np.sign(dy)))
    return next(name for name, vector in DIRECTION_VECTORS.items() if vector == step)


def measure_video(frames) -> VideoMeasurement:
    arrays = as_frame_arrays(frames)
    background_rgb = np.median(np.concatenate([border_pixels(a) for a in arrays]), axis=0)
    background = nearest_palette_color(background_rgb)
    distances = [np.linalg.norm(a - background_rgb, axis=-1) for a in arrays]
    sure = np.concatenate([a[d > _SURE_FOREGROUND_DISTANCE] for a, d in zip(arrays, distances)])
    if len(sure) < _MIN_MASK_PIXELS:
        return VideoMeasurement(background, None, None, None, tuple(None for _ in arrays))
    shape_rgb = np.median(sure, axis=0)
    masks = [np.linalg.norm(a - shape_rgb, axis=-1) < d for a, d in zip(arrays, distances)]
    track = [centroid(mask) for mask in masks]
    shapes = Counter(classify_shape(mask, robust_box(mask)) for mask in masks if mask.sum() >= _MIN_MASK_PIXELS)
    shown = np.concatenate([a[mask] for a, mask in zip(arrays, masks)])
    return VideoMeasurement(
        background=background,
        color=nearest_palette_color(np.median(shown, axis=0)) if len(shown) else None,
        shape=shapes.most_common(1)[0][0] if shapes else None,
        direction=classify_direction(track),
        track=tuple(track),
    )


def score_video(spec: MotionSpec, frames) -> dict[str, bool]:
    seen = measure_video(frames)
    return {attribute: getattr(seen, attribute) == getattr(spec, attribute) for attribute in ATTRIBUTES}


def evaluate_videos(pairs: list[tuple[str, object]]) -> dict[str, float]:
    """Per-attribute accuracy over (caption, frames) pairs, each in [0, 1]."""
    if not pairs:
        raise ValueError("evaluate_videos needs at least one (caption, frames) pair, got none")
    hits = {attribute: 0 for attribute in ATTRIBUTES}
    for text, frames in pairs:
        for attribute, correct in score_video(parse_caption(text), frames).items():
            hits[attribute] += int(correct)
    return {attribute: hits[attribute] / len(pairs) for attribute in ATTRIBUTES}


def load_serving_defaults(model_dir: Path) -> dict:
    path = Path(model_dir) / "stepstudio.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; the model folder must carry its serving defaults")
    return json.loads(path.read_text())


def load_pipeline(model_dir: Path):
    """The stock WanPipeline from a folder, fp32, safetensors only, offline."""
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(Path(model_dir), use_safetensors=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def default_canvas(defaults: dict) -> Canvas:
    return Canvas(defaults["width"], defaults["height"], defaults["num_frames"])


def parse_canvas(text: str) -> Canvas:
    """"WIDTHxHEIGHTxFRAMES" (e.g. 96x64x13) -> Canvas."""
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(part.isdigit() for part in parts):
        raise argparse.ArgumentTypeError(f"a canvas reads WIDTHxHEIGHTxFRAMES, e.g. 96x64x13; got {text!r}")
    return Canvas(*map(int, parts))


def generate(pipe, prompts: list[str], defaults: dict, steps: int, guidance_scale: float, seed: int, batch: int,
             canvas: Canvas | None = None):
    """Clips for `prompts` from the stock WanPipeline: float arrays [T, H, W, 3] in [0, 1], at
    `canvas` (default: the model's serving size and length)."""
    canvas = canvas or default_canvas(defaults)
    import torch

    clips = []
    for start in range(0, len(prompts), batch):
        chunk = prompts[start : start + batch]
        generator = torch.Generator("cpu").manual_seed(seed + start)
        result = pipe(
            prompt=chunk,
            negative_prompt=[defaults["negative_prompt"]] * len(chunk),
            height=canvas.height,
            width=canvas.width,
            num_frames=canvas.frames,
            num_inference_steps=steps,
            guidance_scale=guidance_scale,
            max_sequence_length=defaults["max_sequence_length"],
            generator=generator,
            output_type="np",
        )
        clips.extend(list(result.frames))
    return clips


def contact_sheet(prompts: list[str], clips: list) -> Image.Image:
    """One row per clip: its first, middle and last frames (shown 2x, nearest-neighbour), then the
    prompt and the evaluator's verdict. Clips may differ in size and length."""
    from PIL import ImageDraw, ImageFont

    clip_arrays = [as_frame_arrays(clip) for clip in clips]
    tile_width = 2 * max(arrays[0].shape[1] for arrays in clip_arrays)
    tile_height = 2 * max(arrays[0].shape[0] for arrays in clip_arrays)
    text_width, row_height = 300, tile_height + 8
    sheet = Image.new("RGB", (3 * (tile_width + 4) + text_width, len(clips) * row_height), "white")
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default()
    for row, (prompt, clip, arrays) in enumerate(zip(prompts, clips, clip_arrays)):
        y = row * row_height + 4
        for column, index in enumerate((0, len(arrays) // 2, len(arrays) - 1)):
            image = Image.fromarray(arrays[index].round().clip(0, 255).astype(np.uint8))
            size = (2 * image.width, 2 * image.height)
            sheet.paste(image.resize(size, Image.Resampling.NEAREST), (column * (tile_width + 4), y))
        verdict = score_video(parse_caption(prompt), clip)
        misses = [attribute for attribute, correct in verdict.items() if not correct]
        x = 3 * (tile_width + 4) + 6
        draw.text((x, y + 40), prompt, fill="black", font=font)
        draw.text((x, y + 58), ("wrong: " + ", ".join(misses)) if misses else "all attributes right",
                  fill="firebrick" if misses else "darkgreen", font=font)
    return sheet


def evaluation_prompts(split: str, repeats: int) -> list[str]:
    specs = held_out_specs() if split == "held-out" else training_specs()[::13]
    return [caption(spec) for spec in specs] * repeats


def evaluate_step_cache(args) -> None:
    """Caching off and each rule at each threshold, through stepstudio's engine (step mode)."""
    from tools.step_cache_sweep import sweep_prompts

    print(f"{args.split} split\n")
    sweep_prompts(args.model, evaluation_prompts(args.split, args.repeats), args.seed, args.steps,
                  args.cfg[0] if args.cfg else None,
                  lambda pairs: evaluate_videos([(prompt, final.images) for prompt, final in pairs]),
                  args.step_cache, args.step_cache_rule, ATTRIBUTES, args.batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("assets/shapes-wan"))
    parser.add_argument("--split", choices=("held-out", "training"), default="held-out",
                        help="held-out: the 48 combinations the trainer never saw; training: every 13th seen one")
    parser.add_argument("--repeats", type=int, default=2, help="clips per prompt (different noise)")
    parser.add_argument("--steps", type=int, default=None, help="denoise steps (default: the model's)")
    parser.add_argument("--cfg", type=float, nargs="*", default=None, help="guidance scales (default: the model's)")
    parser.add_argument("--seed", type=int, default=1234, help="noise seed")
    parser.add_argument("--flow-shift", type=float, default=None,
                        help="the sampler's flow_shift (default: the model's scheduler config)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--canvas", type=parse_canvas, nargs="+", default=None, metavar="WxHxFRAMES",
                        help="the sizes and lengths to score, e.g. 64x64x9 96x64x13 (default: the model's)")
    parser.add_argument("--contact-sheet", type=Path, default=None,
                        help="also write first/middle/last frames of the model's example prompts here")
    parser.add_argument("--step-cache", type=float, nargs="+", default=None, metavar="THRESHOLD",
                        help="through stepstudio's engine: caching off, then step caching at each threshold")
    parser.add_argument("--step-cache-rule", nargs="+", default=["teacache"], choices=("first-block", "teacache"),
                        help="with --step-cache: the rules to try (pipelines/step_cache.py)")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    if args.step_cache is not None:
        evaluate_step_cache(args)
        return
    defaults = load_serving_defaults(args.model)
    steps = args.steps or defaults["num_inference_steps"]
    scales = args.cfg if args.cfg else [defaults["guidance_scale"]]
    pipe = load_pipeline(args.model)
    if args.flow_shift is not None:
        pipe.scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config, flow_shift=args.flow_shift)
    prompts = evaluation_prompts(args.split, args.repeats)
    canvases = args.canvas or [default_canvas(defaults)]
    print(f"model {args.model}, {args.split} split, {len(prompts)} clips per canvas, {steps} steps, "
          f"flow_shift {pipe.scheduler.config.flow_shift:g}, seed {args.seed}\n")
    print("| canvas (WxHxframes) | guidance | " + " | ".join(ATTRIBUTES) + " | s/clip |")
    print("|---|---|" + "---|" * (len(ATTRIBUTES) + 1))
    for canvas in canvases if prompts else []:  # --repeats 0: only the contact sheet
        for scale in scales:
            started = time.perf_counter()
            clips = generate(pipe, prompts, defaults, steps, scale, args.seed, args.batch, canvas)
            per_clip = (time.perf_counter() - started) / len(prompts)
            scores = evaluate_videos(list(zip(prompts, clips)))
            cells = " | ".join(f"{scores[a]:.2f}" for a in ATTRIBUTES)
            print(f"| {canvas.name} | {scale:g} | {cells} | {per_clip:.3f} |", flush=True)
    if args.contact_sheet:  # the example prompts; several canvases take turns, a clip each
        examples = defaults["example_prompts"]
        if len(canvases) == 1:
            clips = generate(pipe, examples, defaults, steps, scales[0], args.seed, args.batch, canvases[0])
        else:
            clips = [generate(pipe, [prompt], defaults, steps, scales[0], args.seed + i, 1,
                              canvases[i % len(canvases)])[0] for i, prompt in enumerate(examples)]
        contact_sheet(examples, clips).save(args.contact_sheet)
        print(f"\nwrote {args.contact_sheet}")


if __name__ == "__main__":
    main()

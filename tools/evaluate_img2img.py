"""Score the built-in model (assets/shapes-flux) on requests that start from an image.

Every case is a held-out init picture: one coloured shape on a plain palette background,
drawn with the shapes world's renderer but with its centre shifted 4-8 px off the
canonical position its caption names (at least 4 px from every canonical centre of its
size, so beyond the training renders' 1.5 px jitter: no training picture looks like it).
Its prompt is the shapes-world caption of the same scene with ANOTHER shape colour. Every
request runs through the engine (`engine.Engine`, co-batched), with the same noise seed
for one case at every strength.

Image to image, per strength (the analysis is `tools.evaluate_builtin`'s, no learned model):
- layout kept: the robust box of the result's foreground mask has its centre within
  10 px of the init shape's centre;
- follows the shift: that centre is nearer the init shape's centre than the canonical
  centre (10 px alone would also pass a shape snapped back to the training position);
- prompt colour / init colour / background: `measure(result)` against the prompt;
- distance: mean absolute pixel difference to the init picture, in levels per channel.
The acceptance bar: at strength 0.7, layout kept AND prompt colour taken in >= 85% of cases.

Inpainting (strength 1.0): the mask (white = repaint) is the init shape's box plus a
4 px margin. Reported: the colour of the shape measured inside the mask and on the whole
result against the prompt's, and how far the result strays from the init outside the mask
(mean and max absolute difference per case). The model repaints whole latent cells (4x4
pixels: the built-in VAE downsamples 4x), a cell when its top-left pixel is white
(FluxInpaintPipeline's nearest resize of the mask), so the table also gives how much of
the init shape lies in repainted cells and the difference outside those cells.

CLI:

    python -m tools.evaluate_img2img --cases 48 --seed 0    # table on stdout, JSON in --out
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from tools.evaluate_builtin import (
    border_pixels,
    foreground_mask,
    measure,
    nearest_palette_color,
    robust_box,
    score_image,
)
from tools.shapes_world import (
    COLORS,
    IMAGE_SIZE,
    PALETTE,
    POSITIONS,
    SHAPES,
    SIZE_PIXELS,
    SIZES,
    ShapeSpec,
    caption,
    draw_shape,
    shape_center,
)

DEFAULT_STRENGTHS: tuple[float, ...] = (0.3, 0.5, 0.6, 0.7, 0.8, 0.9)
ACCEPTANCE_STRENGTH = 0.7
ACCEPTANCE_RATE = 0.85
INPAINT_STRENGTH = 1.0

SHIFT_RANGE_PIXELS = (4.0, 8.0)
# Training renders jitter 1.5 px per axis: 4 px from every canonical centre is clear of them.
MIN_CANONICAL_DISTANCE_PIXELS = 4.0
# The shifted box stays this far inside the canvas, so the border still shows the background.
CANVAS_MARGIN_PIXELS = 1.0
LAYOUT_TOLERANCE_PIXELS = 10.0
MASK_MARGIN_PIXELS = 4
# Pixels per latent cell when the pipeline does not say (its vae_scale_factor): the built-in's.
LATENT_CELL_PIXELS = 4
# Fewer foreground pixels than this inside the mask means "no shape painted there"
# (evaluate_builtin's own threshold for the whole image).
_MIN_MASK_PIXELS = 12
_SUPERSAMPLE = 4  # draw at 4x then downsample, as shapes_world.render does


@dataclass(frozen=True)
class Case:
    """One held-out request: the init picture's scene, the prompt's, where the shape really is."""

    init: ShapeSpec  # its position names the canonical position the shape was shifted from
    prompt: ShapeSpec  # the same scene, another shape colour
    center: tuple[float, float]  # (x, y) of the init shape's box centre, in pixels
    seed: int  # the request's noise seed, the same at every strength

    @property
    def canonical_center(self) -> tuple[float, float]:
        return shape_center(self.init)

    @property
    def box(self) -> tuple[float, float, float, float]:
        return centered_box(self.center, SIZE_PIXELS[self.init.size])

    @property
    def prompt_text(self) -> str:
        return caption(self.prompt)


def centered_box(center: tuple[float, float], side: float) -> tuple[float, float, float, float]:
    half = side / 2.0
    return center[0] - half, center[1] - half, center[0] + half, center[1] + half


def canonical_centers(size: str) -> list[tuple[float, float]]:
    """Every centre the training renders put a shape of this size near."""
    return [shape_center(ShapeSpec(SHAPES[0], COLORS[0], size, position, COLORS[1])) for position in POSITIONS]


def is_held_out_center(spec: ShapeSpec, center: tuple[float, float]) -> bool:
    """Inside the canvas, clear of every canonical centre, and the picture still measures as
    the caption says (its position word included), so the prompt describes the init truly."""
    box = centered_box(center, SIZE_PIXELS[spec.size])
    inside = min(box) >= CANVAS_MARGIN_PIXELS and max(box) <= IMAGE_SIZE - CANVAS_MARGIN_PIXELS
    clear = all(math.dist(center, other) >= MIN_CANONICAL_DISTANCE_PIXELS for other in canonical_centers(spec.size))
    return inside and clear and all(score_image(spec, draw_picture(spec, center)).values())


def shifted_center(spec: ShapeSpec, rng: np.random.Generator) -> tuple[float, float]:
    """The canonical centre moved 4-8 px in a random direction, redrawn until it is held out."""
    cx, cy = shape_center(spec)
    for _ in range(1000):
        angle = rng.uniform(0.0, 2.0 * math.pi)
        distance = rng.uniform(*SHIFT_RANGE_PIXELS)
        center = (cx + distance * math.cos(angle), cy + distance * math.sin(angle))
        if is_held_out_center(spec, center):
            return center
    raise RuntimeError(f"no held-out centre found for {spec}")


def cases(n: int, seed: int = 0) -> list[Case]:
    """`n` held-out cases cycling through every shape, size and position (30 combinations);
    colours, background and shift are drawn from `seed`."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    rng = np.random.default_rng(seed)
    built = []
    for i in range(n):
        color, background, prompt_color = (COLORS[k] for k in rng.choice(len(COLORS), size=3, replace=False))
        init = ShapeSpec(SHAPES[i % len(SHAPES)], color, SIZES[(i // len(SHAPES)) % len(SIZES)],
                         POSITIONS[i % len(POSITIONS)], background)
        prompt = ShapeSpec(init.shape, prompt_color, init.size, init.position, init.background)
        built.append(Case(init, prompt, shifted_center(init, rng), seed=int(rng.integers(2**31))))
    return built


def draw_picture(spec: ShapeSpec, center: tuple[float, float]) -> Image.Image:
    """`spec`'s shape at exactly `center`, drawn the way shapes_world.render draws (no jitter)."""
    big = IMAGE_SIZE * _SUPERSAMPLE
    image = Image.new("RGB", (big, big), PALETTE[spec.background])
    box = tuple(v * _SUPERSAMPLE for v in centered_box(center, SIZE_PIXELS[spec.size]))
    draw_shape(ImageDraw.Draw(image), spec.shape, box, PALETTE[spec.color])
    return image.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BOX)


def init_picture(case: Case) -> Image.Image:
    return draw_picture(case.init, case.center)


def inpaint_mask(case: Case) -> Image.Image:
    """White (repaint) over the shape's box plus the margin, whole pixels, black elsewhere."""
    left, top, right, bottom = case.box
    left, top = (max(0, math.floor(v - MASK_MARGIN_PIXELS)) for v in (left, top))
    right, bottom = (min(IMAGE_SIZE, math.ceil(v + MASK_MARGIN_PIXELS)) for v in (right, bottom))
    mask = np.zeros((IMAGE_SIZE, IMAGE_SIZE), np.uint8)
    mask[top:bottom, left:right] = 255
    return Image.fromarray(mask, "L")


def repainted_cells(mask: np.ndarray, cell_pixels: int = LATENT_CELL_PIXELS) -> np.ndarray:
    """The pixels whose latent cell the model repaints: a cell is repainted when its top-left
    pixel is white (torch's nearest resize to the latent grid, as FluxInpaintPipeline does it)."""
    cells = mask[::cell_pixels, ::cell_pixels]
    return np.kron(cells, np.ones((cell_pixels, cell_pixels), bool)).astype(bool)


def pixels_of(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.float32)


def shape_pixels(image: Image.Image) -> np.ndarray:
    """The result's foreground mask, the way `measure` finds it (border median as background)."""
    pixels = pixels_of(image)
    return foreground_mask(pixels, np.median(border_pixels(pixels), axis=0))


def box_center(box: tuple[float, float, float, float]) -> tuple[float, float]:
    return (box[0] + box[2]) / 2.0, (box[1] + box[3]) / 2.0


def mean_distance(a: Image.Image, b: Image.Image) -> float:
    return float(np.abs(pixels_of(a) - pixels_of(b)).mean())


def score_image_to_image(case: Case, result: Image.Image) -> dict:
    """One image-to-image result against its case (see the module docstring)."""
    seen = measure(result)
    center = box_center(robust_box(shape_pixels(result))) if seen.color is not None else None
    error = math.dist(center, case.center) if center is not None else None
    return {
        "seen_color": seen.color,
        "center_error_px": error,
        "layout_kept": error is not None and error <= LAYOUT_TOLERANCE_PIXELS,
        "follows_shift": error is not None and error < math.dist(center, case.canonical_center),
        "prompt_color": seen.color == case.prompt.color,
        "init_color": seen.color == case.init.color,
        "background": seen.background == case.prompt.background,
        "distance": mean_distance(result, init_picture(case)),
    }


def color_inside(result: Image.Image, region: np.ndarray) -> str | None:
    """The palette colour of the result's shape pixels inside `region`; None when too few."""
    inside = shape_pixels(result) & region
    if inside.sum() < _MIN_MASK_PIXELS:
        return None
    return nearest_palette_color(np.median(pixels_of(result)[inside], axis=0))


def score_inpainting(case: Case, result: Image.Image, cell_pixels: int = LATENT_CELL_PIXELS) -> dict:
    """One inpainting result against its case (see the module docstring)."""
    init = init_picture(case)
    mask = np.asarray(inpaint_mask(case)) >= 128
    cells = repainted_cells(mask, cell_pixels)
    # Means are per channel; a max is the largest difference of any one channel.
    difference = np.abs(pixels_of(result) - pixels_of(init))
    mask_color = color_inside(result, mask)
    init_shape = shape_pixels(init)
    return {
        "mask_color": mask_color,
        "prompt_color_in_mask": mask_color == case.prompt.color,
        "prompt_color_whole": measure(result).color == case.prompt.color,
        "shape_in_repainted_cells": float((init_shape & cells).sum() / init_shape.sum()),
        "outside_mean": float(difference[~mask].mean()),
        "outside_max": float(difference[~mask].max()),
        "outside_cells_mean": float(difference[~cells].mean()) if (~cells).any() else None,
        "outside_cells_max": float(difference[~cells].max()) if (~cells).any() else None,
    }


def rate(rows: list[dict], key: str) -> float:
    return sum(bool(row[key]) for row in rows) / len(rows)


def values(rows: list[dict], key: str) -> list[float]:
    return [row[key] for row in rows if row[key] is not None]


def summarise_image_to_image(rows: list[dict], steps: int) -> dict:
    errors, distances = values(rows, "center_error_px"), values(rows, "distance")
    return {
        "steps_run": steps,
        "layout_kept": rate(rows, "layout_kept"),
        "follows_shift": rate(rows, "follows_shift"),
        "prompt_color": rate(rows, "prompt_color"),
        "layout_and_prompt_color": sum(r["layout_kept"] and r["prompt_color"] for r in rows) / len(rows),
        "init_color": rate(rows, "init_color"),
        "background": rate(rows, "background"),
        "no_shape": sum(r["seen_color"] is None for r in rows) / len(rows),
        "distance_mean": float(np.mean(distances)),
        "distance_max": float(np.max(distances)),
        "center_error_mean_px": float(np.mean(errors)) if errors else None,
    }


def summarise_inpainting(rows: list[dict]) -> dict:
    cells_means, cells_maxes = values(rows, "outside_cells_mean"), values(rows, "outside_cells_max")
    return {
        "prompt_color_in_mask": rate(rows, "prompt_color_in_mask"),
        "prompt_color_whole": rate(rows, "prompt_color_whole"),
        "shape_in_repainted_cells_mean": float(np.mean(values(rows, "shape_in_repainted_cells"))),
        "outside_mean": float(np.mean(values(rows, "outside_mean"))),
        "outside_mean_worst": float(np.max(values(rows, "outside_mean"))),
        "outside_max_median": float(np.median(values(rows, "outside_max"))),
        "outside_max_worst": float(np.max(values(rows, "outside_max"))),
        "outside_cells_mean": float(np.mean(cells_means)) if cells_means else None,
        "outside_cells_max_median": float(np.median(cells_maxes)) if cells_maxes else None,
        "outside_cells_max_worst": float(np.max(cells_maxes)) if cells_maxes else None,
    }


def lowest_passing_strength(by_strength: dict[str, dict]) -> float | None:
    passing = [float(s) for s, row in by_strength.items() if row["layout_and_prompt_color"] >= ACCEPTANCE_RATE]
    return min(passing) if passing else None


def request_params(case: Case, strength: float, inpaint: bool):
    from engine import GenerationParams

    return GenerationParams(prompt=case.prompt_text, init_image=init_picture(case), strength=strength,
                            mask_image=inpaint_mask(case) if inpaint else None, seed=case.seed)


def run_requests(pipeline, params: list, max_batch_requests: int, timeout: float) -> list:
    """Every request submitted at once to one engine, so it co-batches them; their Completed events."""
    from engine import Completed, Engine, ServingLimits

    limits = ServingLimits(max_queue=len(params) + 1, max_per_session=len(params) + 1)
    engine = Engine(pipeline, max_batch_requests=max_batch_requests, limits=limits).start()
    try:
        handles = [engine.submit(p, session_id="evaluate-img2img") for p in params]
        finals = [handle.result(timeout=timeout) for handle in handles]
    finally:
        engine.close()
    failed = [final for final in finals if not isinstance(final, Completed)]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(finals)} requests did not complete, e.g. {failed[0]!r}")
    return finals


def evaluate(pipeline, cases: list[Case], strengths=DEFAULT_STRENGTHS, inpaint: bool = True,
             max_batch_requests: int = 16, timeout: float = 1800.0) -> dict:
    """Image to image at each strength (and inpainting) over `cases`: the summary, per-case rows included."""
    jobs = [(strength, False) for strength in strengths] + ([(INPAINT_STRENGTH, True)] if inpaint else [])
    params = [request_params(case, strength, masked) for strength, masked in jobs for case in cases]
    started = time.perf_counter()
    finals = run_requests(pipeline, params, max_batch_requests, timeout)
    seconds = time.perf_counter() - started
    summary = {"cases": len(cases), "requests": len(params), "seconds": seconds,
               "image_to_image": {}, "inpainting": None, "per_case": {}}
    for index, (strength, masked) in enumerate(jobs):
        chunk = finals[index * len(cases) : (index + 1) * len(cases)]
        if masked:
            cell_pixels = getattr(pipeline, "vae_scale_factor", LATENT_CELL_PIXELS)
            rows = [score_inpainting(case, final.images[0], cell_pixels) for case, final in zip(cases, chunk)]
            summary["inpainting"] = summarise_inpainting(rows)
            summary["per_case"]["inpainting"] = rows
        else:
            rows = [score_image_to_image(case, final.images[0]) for case, final in zip(cases, chunk)]
            summary["image_to_image"][f"{strength:g}"] = summarise_image_to_image(rows, chunk[0].params.denoise_steps)
            summary["per_case"][f"{strength:g}"] = rows
    summary["lowest_passing_strength"] = lowest_passing_strength(summary["image_to_image"])
    return summary


def describe_case(case: Case) -> dict:
    return {"init": caption(case.init), "prompt": case.prompt_text, "center": list(case.center),
            "canonical_center": list(case.canonical_center), "seed": case.seed}


def percent(value: float) -> str:
    return f"{100 * value:.0f}%"


def image_to_image_table(by_strength: dict[str, dict]) -> list[str]:
    lines = ["| strength | steps | layout kept (<=10 px) | follows shift | prompt colour | layout AND colour "
             "| init colour | background | distance to init, mean / max | centre error, mean |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for strength, row in by_strength.items():
        error = "-" if row["center_error_mean_px"] is None else f"{row['center_error_mean_px']:.1f} px"
        lines.append(
            f"| {strength} | {row['steps_run']} | {percent(row['layout_kept'])} | {percent(row['follows_shift'])} "
            f"| {percent(row['prompt_color'])} | {percent(row['layout_and_prompt_color'])} "
            f"| {percent(row['init_color'])} | {percent(row['background'])} "
            f"| {row['distance_mean']:.1f} / {row['distance_max']:.1f} | {error} |"
        )
    return lines


def inpainting_table(row: dict) -> list[str]:
    cells = "-" if row["outside_cells_mean"] is None else (
        f"{row['outside_cells_mean']:.1f} / {row['outside_cells_max_median']:.0f} / {row['outside_cells_max_worst']:.0f}")
    return [
        "| prompt colour in mask | prompt colour, whole image | shape in repainted cells "
        "| outside mask: mean (worst case) | outside mask: max, median case / worst "
        "| outside repainted cells: mean / max median / max worst |",
        "|---|---|---|---|---|---|",
        f"| {percent(row['prompt_color_in_mask'])} | {percent(row['prompt_color_whole'])} "
        f"| {percent(row['shape_in_repainted_cells_mean'])} "
        f"| {row['outside_mean']:.1f} ({row['outside_mean_worst']:.1f}) "
        f"| {row['outside_max_median']:.0f} / {row['outside_max_worst']:.0f} | {cells} |",
    ]


def format_report(summary: dict) -> str:
    lines = [f"{summary['cases']} held-out cases, {summary['requests']} requests, "
             f"{summary['seconds']:.1f} s through the engine", "",
             "Image to image (distances in levels per channel, 0-255):", ""]
    lines += image_to_image_table(summary["image_to_image"])
    if summary["inpainting"] is not None:
        lines += ["", f"Inpainting at strength {INPAINT_STRENGTH:g}, mask = shape box + {MASK_MARGIN_PIXELS} px "
                      "(differences in levels: mean per channel, max over channels):", ""]
        lines += inpainting_table(summary["inpainting"])
    lines += ["", acceptance_line(summary)]
    return "\n".join(lines)


def acceptance_line(summary: dict) -> str:
    bar = f"layout kept AND prompt colour in >= {percent(ACCEPTANCE_RATE)} of cases"
    at_default = summary["image_to_image"].get(f"{ACCEPTANCE_STRENGTH:g}")
    verdict = ("not measured" if at_default is None else
               ("meets" if at_default["layout_and_prompt_color"] >= ACCEPTANCE_RATE else "misses") +
               f" it ({percent(at_default['layout_and_prompt_color'])})")
    lowest = summary["lowest_passing_strength"]
    lowest_text = "none of the strengths measured" if lowest is None else f"{lowest:g}"
    return f"Acceptance ({bar}): strength {ACCEPTANCE_STRENGTH:g} {verdict}; lowest strength that meets it: {lowest_text}."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin", help="what pipelines.loader.load_pipeline loads")
    parser.add_argument("--cases", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0, help="seed of the cases and their noise")
    parser.add_argument("--strengths", type=float, nargs="+", default=list(DEFAULT_STRENGTHS))
    parser.add_argument("--no-inpaint", action="store_true", help="skip the inpainting requests")
    parser.add_argument("--max-batch", type=int, default=16, help="requests per forward")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/img2img_builtin.json"))
    args = parser.parse_args()

    import torch

    from pipelines.loader import load_pipeline

    torch.set_num_threads(args.threads)
    held_out = cases(args.cases, args.seed)
    summary = evaluate(load_pipeline(args.model), held_out, args.strengths, not args.no_inpaint, args.max_batch)
    print(f"model {args.model}, seed {args.seed}\n")
    print(format_report(summary))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {"model": args.model, "seed": args.seed, **summary, "case_list": [describe_case(c) for c in held_out]}
    args.out.write_text(json.dumps(record, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()

"""Score shapes-flux v2 (tools/shapes_world_v2.py) on held-out prompts, through stepstudio's engine.

    python -m tools.evaluate_v2                                  # every table, the model's defaults
    python -m tools.evaluate_v2 --per-canvas 8 --parts 48 --pictures 24 --step-cache 0
    python -m tools.evaluate_v2 --step-cache-sweep 0.1 0.2 0.3     # step caching's thresholds

The analysis is tools.evaluate_builtin's (no learned model: border median, foreground mask, robust
box, shape by IoU with drawn templates), read against the open world's words:
- position: the drawn centre in reach coordinates (0..1 per axis between the two extremes the
  shape can take), called by the nearest of the five anchors;
- size: the drawn side as a fraction of the canvas's short side, "large" above 0.48.

Tables (prompts and noise from `--seed`, never used in training: training draws its scenes from
seed 0's generators, and every scene here is drawn afresh):
1. every named canvas (sizes 48 to 128, aspect ratios 1:1, 3:2, 2:3, 16:9, 9:16): full captions,
   colour, shape, background, position and size;
2. prompts with parts left out (64x64 and 96x64): what each prompt names, drawn;
3. image to image at strength 0.7 from pictures with the shape anywhere (not at the five anchors),
   the prompt naming another colour and no position: layout kept (the result's centre within 6 px
   of the picture's) and the prompt's colour taken; inpainting with a mask over the shape: the
   unmasked area's mean difference from the picture, in levels;
4. with `--outline FILE`: the outline adapter on table 1's prompts and seeds, the share drawn as
   outlines per canvas with `<lora:outline:1>` and without.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from tools.evaluate_builtin import (
    _MIN_MASK_PIXELS,
    _OUTLINE_GAP_RADIUS,
    border_pixels,
    classify_outline,
    classify_shape,
    close_mask,
    fill_holes,
    foreground_mask,
    nearest_palette_color,
    robust_box,
)
from tools.shapes_world import COLORS
from tools.shapes_world_v2 import (
    NAMED_CANVASES,
    SIZE_THRESHOLD_FRACTION,
    Named,
    Scene,
    caption,
    nearest_position,
    random_scene,
    reach,
    render,
)

ATTRIBUTES = ("color", "shape", "background", "position", "size")
LAYOUT_PIXELS = 6.0  # image to image keeps the layout: the result's centre within this of the picture's
STRENGTH = 0.7


@dataclass(frozen=True)
class Seen:
    """What an image shows (None where it shows no shape)."""

    background: str
    color: str | None = None
    shape: str | None = None
    position: str | None = None
    size: str | None = None
    centre: tuple[float, float] | None = None
    outlined: bool | None = None
    box: tuple[float, float, float, float] | None = None  # left, top, right, bottom (pixels)


def measure(image: Image.Image) -> Seen:
    pixels = np.asarray(image.convert("RGB"), dtype=np.float32)
    height, width = pixels.shape[:2]
    background_rgb = np.median(border_pixels(pixels), axis=0)
    background = nearest_palette_color(background_rgb)
    mask = foreground_mask(pixels, background_rgb)
    if mask.sum() < _MIN_MASK_PIXELS:
        return Seen(background)
    box = robust_box(mask)
    left, top, right, bottom = box
    side = max(right - left, bottom - top)
    cx, cy = (left + right) / 2.0, (top + bottom) / 2.0
    filled = fill_holes(close_mask(mask, _OUTLINE_GAP_RADIUS))
    return Seen(
        background=background,
        color=nearest_palette_color(np.median(pixels[mask], axis=0)),
        shape=classify_shape(filled, box),
        position=nearest_position(*reach(cx, cy, side, width, height)),
        size="large" if side / min(width, height) > SIZE_THRESHOLD_FRACTION else "small",
        centre=(cx, cy),
        outlined=classify_outline(pixels, mask, filled, background),
        box=box,
    )


def score(scene: Scene, named: Named, image: Image.Image) -> dict[str, bool]:
    """For each attribute the caption named: whether the image shows it."""
    return score_seen(scene, named, measure(image))


def score_seen(scene: Scene, named: Named, seen: Seen) -> dict[str, bool]:
    """score, from what an image was measured to show."""
    truth = {"color": scene.color, "shape": scene.shape, "background": scene.background,
             "position": scene.position_word(), "size": scene.size_word()}
    return {attribute: getattr(seen, attribute) == truth[attribute] for attribute in ATTRIBUTES
            if getattr(named, attribute) and truth[attribute] is not None}


# ----------------------------------------------------------------------------- prompt sets


def canvas_cases(per_canvas: int, seed: int) -> list[tuple[str, Scene, Named]]:
    """Full captions on every named canvas: sizes and positions always inside a word's range."""
    rng = np.random.default_rng([seed, 11])
    cases = []
    for label, (width, height) in NAMED_CANVASES.items():
        for index in range(per_canvas):
            scene = random_scene(rng, width, height, size=("small", "large")[index % 2],
                                 position=("left", "right", "top", "bottom", "center")[index % 5])
            cases.append((label, scene, Named()))
    return cases


PART_FORMS = (Named(size=False, position=False), Named(size=False, background=False, position=False),
              Named(color=False, size=False), Named(shape=False, position=False), Named(background=False),
              Named(size=False, color=False, background=False), Named(position=False), Named(size=False))


def part_cases(count: int, seed: int) -> list[tuple[str, Scene, Named]]:
    """Prompts that leave parts out, on two canvases."""
    rng = np.random.default_rng([seed, 12])
    cases = []
    for index in range(count):
        width, height = ((64, 64), (96, 64))[index % 2]
        named = PART_FORMS[index % len(PART_FORMS)]
        scene = random_scene(rng, width, height, size=("small", "large")[index % 2] if named.size else None,
                             position=("left", "right", "top", "bottom", "center")[index % 5] if named.position else None)
        cases.append((f"{width}x{height}", scene, named))
    return cases


def picture_cases(count: int, seed: int) -> list[tuple[Scene, Scene]]:
    """(picture, what the prompt asks): the shape anywhere on a 64x64 canvas, another colour asked."""
    rng = np.random.default_rng([seed, 13])
    cases = []
    for _ in range(count):
        picture = random_scene(rng, 64, 64, size="large")
        while picture.position_word() is not None:  # off every named region: nothing to snap to
            picture = random_scene(rng, 64, 64, size="large")
        others = [c for c in COLORS if c not in (picture.color, picture.background)]
        cases.append((picture, replace(picture, color=others[int(rng.integers(len(others)))])))
    return cases


# ----------------------------------------------------------------------------- generation


def engine_for(model: Path, step_cache: float | None, outline: Path | None = None):
    from engine import Engine, ServingLimits
    from pipelines.loader import LoadOptions, load_pipeline

    pipeline = load_pipeline(str(model), LoadOptions(step_cache=step_cache))
    if outline is not None:
        pipeline.load_lora("outline", str(outline))
    limits = ServingLimits(max_queue=10_000, max_per_session=10_000)
    return Engine(pipeline, mode="step", max_batch_requests=8, limits=limits).start()


def run_all(engine, requests: list) -> list[Image.Image]:
    from engine import Completed

    handles = [engine.submit(params, session_id="eval") for params in requests]
    finals = [handle.result(timeout=3600) for handle in handles]
    failed = [final for final in finals if not isinstance(final, Completed)]
    if failed:
        raise RuntimeError(f"{len(failed)} evaluation requests did not complete, e.g. {failed[0]!r}")
    return [final.images[0] for final in finals]


def text_requests(cases, seed: int, loras: tuple = ()) -> list:
    from engine import GenerationParams

    return [GenerationParams(prompt=caption(scene, named, phrase_position=i % 2 == 1), seed=seed + i, loras=loras,
                             width=scene.width, height=scene.height) for i, (_, scene, named) in enumerate(cases)]


def outline_table(engine, cases, seed: int, plain: dict) -> dict:
    """The share of images drawn as outlines per canvas, with the outline adapter at scale 1 and
    without it (`plain`: text_cases of the same cases and seed), each prompt at the same seed."""
    from pipelines.lora_request import LoraUse

    images = run_all(engine, text_requests(cases, seed, loras=(LoraUse("outline", 1.0),)))
    table: dict[str, dict[str, list[bool]]] = {}
    for (label, _, _), with_it, without in zip(cases, images, plain["images"]):
        table.setdefault(label, {"with": [], "without": []})
        table[label]["with"].append(measure(with_it).outlined is True)
        table[label]["without"].append(measure(without).outlined is True)
    return {"by_canvas": {label: {k: sum(v) / len(v) for k, v in rates.items()} for label, rates in table.items()},
            "images": images}


def text_cases(engine, cases, seed: int) -> dict:
    requests = text_requests(cases, seed)
    return tabulate(cases, requests, run_all(engine, requests))


def tabulate(cases, requests: list, images: list[Image.Image]) -> dict:
    """Each case's image scored against what its prompt names: per canvas, the share of each
    attribute drawn, and the share of prompts with everything they name drawn."""
    by_label: dict[str, dict[str, list[bool]]] = {}
    verdicts = [score(scene, named, image) for (_, scene, named), image in zip(cases, images)]
    for (label, _, _), hits in zip(cases, verdicts):
        for attribute, hit in hits.items():
            by_label.setdefault(label, {}).setdefault(attribute, []).append(hit)
    table = {label: {a: sum(v) / len(v) for a, v in scores.items()} for label, scores in by_label.items()}
    everything_named = [all(hits.values()) for hits in verdicts]
    return {"by_canvas": table, "everything_named_drawn": sum(everything_named) / len(everything_named), "images": images,
            "prompts": [r.prompt for r in requests], "verdicts": verdicts, "labels": [case[0] for case in cases]}


def picture_table(engine, cases, seed: int) -> dict:
    from engine import GenerationParams

    redraws, inpaints = [], []
    for i, (picture, asked) in enumerate(cases):
        prompt = caption(asked, Named(size=False, position=False))
        image = render(picture)
        redraws.append(GenerationParams(prompt=prompt, seed=seed + i, init_image=image, strength=STRENGTH))
        left, top, right, bottom = picture.box
        mask = Image.new("L", image.size, 0)
        ImageDraw.Draw(mask).rectangle([left - 3, top - 3, right + 3, bottom + 3], fill=255)
        inpaints.append(GenerationParams(prompt=prompt, seed=seed + i, init_image=image, mask_image=mask, strength=1.0))
    redrawn, inpainted = run_all(engine, redraws), run_all(engine, inpaints)
    kept, taken, outside = [], [], []
    for (picture, asked), result, painted, params in zip(cases, redrawn, inpainted, inpaints):
        seen = measure(result)
        kept.append(seen.centre is not None and np.hypot(seen.centre[0] - picture.cx, seen.centre[1] - picture.cy)
                    <= LAYOUT_PIXELS)
        taken.append(seen.color == asked.color)
        keep = np.asarray(params.mask_image) < 128
        difference = np.abs(np.asarray(painted, dtype=float) - np.asarray(params.init_image, dtype=float)).mean(axis=2)
        outside.append(float(difference[keep].mean()))
    return {"layout_kept": sum(kept) / len(kept), "colour_taken": sum(taken) / len(taken),
            "both": sum(k and t for k, t in zip(kept, taken)) / len(kept),
            "inpaint_levels_outside_mask": float(np.mean(outside)), "images": redrawn}


def contact_sheet(canvases: dict, per_label: int = 2, tile: int = 272, caption_height: int = 62,
                  columns: int = 4) -> Image.Image:
    """The first `per_label` images of every named canvas, shown twice their size (nearest
    neighbour), each under its prompt and the evaluator's verdict."""
    import textwrap

    picked, seen = [], {}
    for index, label in enumerate(canvases["labels"]):
        if seen.get(label, 0) < per_label:
            seen[label] = seen.get(label, 0) + 1
            picked.append(index)
    rows = (len(picked) + columns - 1) // columns
    sheet = Image.new("RGB", (columns * tile, rows * (tile + caption_height)), "white")
    draw = ImageDraw.Draw(sheet)
    for place, index in enumerate(picked):
        image = canvases["images"][index]
        x, y = (place % columns) * tile, (place // columns) * (tile + caption_height)
        sheet.paste(image.resize((image.width * 2, image.height * 2), Image.Resampling.NEAREST), (x + 8, y + 8))
        misses = [a for a, hit in canvases["verdicts"][index].items() if not hit]
        lines = [canvases["labels"][index]] + textwrap.wrap(canvases["prompts"][index], width=40)
        lines.append(("wrong: " + ", ".join(misses)) if misses else "all named parts drawn")
        for number, line in enumerate(lines[:4]):
            draw.text((x + 8, y + tile + number * 14), line, fill="black")
    return sheet


def markdown(result: dict) -> str:
    lines = ["| canvas | " + " | ".join(ATTRIBUTES) + " |", "|---|" + "---|" * len(ATTRIBUTES)]
    for label, scores in result["canvases"]["by_canvas"].items():
        lines.append(f"| {label} | " + " | ".join(f"{scores.get(a, float('nan')):.2f}" for a in ATTRIBUTES) + " |")
    parts = result["parts"]
    lines += ["", "| prompts with parts left out | " + " | ".join(ATTRIBUTES) + " | everything named |",
              "|---|" + "---|" * (len(ATTRIBUTES) + 1)]
    for label, scores in parts["by_canvas"].items():
        lines.append(f"| {label} | " + " | ".join(f"{scores[a]:.2f}" if a in scores else "-" for a in ATTRIBUTES)
                     + f" | {parts['everything_named_drawn']:.2f} |")
    if "outline" in result:
        lines += ["", "| outline adapter: outlined | " + " | ".join(result["outline"]["by_canvas"]) + " |",
                  "|---|" + "---|" * len(result["outline"]["by_canvas"])]
        for key, name in (("with", "with `<lora:outline:1>`"), ("without", "without")):
            lines.append(f"| {name} | " + " | ".join(f"{rates[key]:.2f}" for rates in result["outline"]["by_canvas"].values())
                         + " |")
    pictures = result["pictures"]
    lines += ["", "| from a picture (strength 0.7, no position named) | layout kept (6 px) | colour taken | both | "
              "inpaint: levels outside the mask |", "|---|---|---|---|---|",
              f"| {result['counts']['pictures']} pictures | {pictures['layout_kept']:.2f} | {pictures['colour_taken']:.2f} | "
              f"{pictures['both']:.2f} | {pictures['inpaint_levels_outside_mask']:.1f} |"]
    return "\n".join(lines)


def evaluate(model: Path, per_canvas: int, parts: int, pictures: int, seed: int, step_cache: float | None,
             outline: Path | None = None) -> dict:
    engine = engine_for(model, step_cache, outline)
    started = time.perf_counter()
    try:
        cases = canvas_cases(per_canvas, seed)
        result = {"canvases": text_cases(engine, cases, seed),
                  "parts": text_cases(engine, part_cases(parts, seed), seed + 10_000),
                  "pictures": picture_table(engine, picture_cases(pictures, seed), seed + 20_000)}
        if outline is not None:
            result["outline"] = outline_table(engine, cases, seed, result["canvases"])
    finally:
        engine.close()
    result["counts"] = {"per_canvas": per_canvas, "parts": parts, "pictures": pictures}
    result["seconds"] = time.perf_counter() - started
    return result


def sweep_step_cache(model: Path, per_canvas: int, parts: int, seed: int, thresholds: list[float]) -> list:
    """Caching off, then TeaCache at each threshold (tools/step_cache_sweep.py), on tables 1 and 2's
    prompts and seeds: each attribute's mean over the named canvases, and the share of prompts with
    parts left out whose every named part is drawn. (Image to image runs every step by default.)"""
    from pipelines.loader import load_pipeline
    from tools.step_cache_sweep import print_sweep

    full, partial = canvas_cases(per_canvas, seed), part_cases(parts, seed)
    requests = text_requests(full, seed) + text_requests(partial, seed + 10_000)

    def requests_for(threshold: float) -> list:
        return [replace(request, step_cache=threshold) for request in requests]

    def means(finals: list) -> dict[str, float]:
        images = [final.images[0] for final in finals]
        table = tabulate(full, requests[:len(full)], images[:len(full)])["by_canvas"]
        result = {a: float(np.mean([canvas[a] for canvas in table.values() if a in canvas])) for a in ATTRIBUTES}
        result["parts named"] = tabulate(partial, requests[len(full):], images[len(full):])["everything_named_drawn"]
        return result

    print(f"{model}: {len(full)} full captions ({per_canvas} per named canvas) and {len(partial)} with parts "
          f"left out, noise seeds from {seed}, through stepstudio's engine (step mode, batch 8)\n")
    return print_sweep(load_pipeline(str(model)), requests_for, means, thresholds, ["teacache"],
                       ATTRIBUTES + ("parts named",))


def main() -> None:
    from pipelines.loader import BUILTIN_V2_MODEL_DIR

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=BUILTIN_V2_MODEL_DIR,
                        help="the model's diffusers folder (default: the shipped shapes-flux v2)")
    parser.add_argument("--per-canvas", type=int, default=30, help="full-caption prompts per named canvas")
    parser.add_argument("--parts", type=int, default=96, help="prompts with parts left out")
    parser.add_argument("--pictures", type=int, default=48, help="pictures for image to image and inpainting")
    parser.add_argument("--seed", type=int, default=4321, help="seed of the held-out scenes and the noise")
    parser.add_argument("--step-cache", type=float, default=None, help="step caching threshold (default: the model's)")
    parser.add_argument("--outline", type=Path, default=None,
                        help="the outline adapter's file: also score it on every named canvas, with and without it")
    parser.add_argument("--step-cache-sweep", type=float, nargs="+", default=None, metavar="THRESHOLD",
                        help="instead of the tables: caching off against TeaCache at each threshold, scores and speed")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--save", type=Path, default=None, help="write the JSON summary (no images) here")
    parser.add_argument("--sheet", type=Path, default=None,
                        help="write a contact sheet here (two images of every named canvas, with verdicts)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.step_cache_sweep:
        sweep_step_cache(args.model, args.per_canvas, args.parts, args.seed, args.step_cache_sweep)
        return
    result = evaluate(args.model, args.per_canvas, args.parts, args.pictures, args.seed, args.step_cache, args.outline)
    print(markdown(result))
    print(f"\n{args.model}, seed {args.seed}, step cache {args.step_cache}, {result['seconds']:.0f} s")
    if args.sheet:
        contact_sheet(result["canvases"]).save(args.sheet)
    if args.save:
        summary = {key: {k: v for k, v in value.items() if k not in ("images", "verdicts")}
                   if isinstance(value, dict) else value for key, value in result.items()}
        args.save.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()

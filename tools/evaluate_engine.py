"""Score the built-in model through stepstudio's engine, next to the stock FluxPipeline.

    python -m tools.evaluate_engine --prompts 120            # engine (step mode, batch 8) + stock pipeline
    python -m tools.evaluate_engine --prompts 120 --no-stock # engine only

Both paths use the model's serving defaults (stepstudio.json) and the same per-request seed
(seed + i for prompt i), so their images should be identical: the table shows both scores
and the largest pixel difference between the two paths. The engine runs without step caching
here (the stock pipeline has none); `--step-cache T` runs it with threshold T (the model's
default: `--step-cache -1`).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from PIL import Image

from tools.evaluate_builtin import ATTRIBUTES, evaluate_images
from tools.shapes_world import example_prompts


def engine_images(model: Path, prompts: list[str], seed: int, max_batch: int = 8,
                  step_cache: float | None = None) -> list[Image.Image]:
    """Every prompt as its own request, all submitted at once, co-batched by the engine;
    `step_cache`: every request's threshold (None: the model's default)."""
    from engine import Completed, Engine, GenerationParams, ServingLimits
    from pipelines.loader import load_pipeline

    limits = ServingLimits(max_queue=len(prompts) + 1, max_per_session=len(prompts) + 1)
    engine = Engine(load_pipeline(str(model)), mode="step", max_batch_requests=max_batch, limits=limits).start()
    try:
        handles = [engine.submit(GenerationParams(prompt=p, seed=seed + i, step_cache=step_cache), session_id="eval")
                   for i, p in enumerate(prompts)]
        finals = [h.result(timeout=600) for h in handles]
    finally:
        engine.close()
    failed = [f for f in finals if not isinstance(f, Completed)]
    if failed:
        raise RuntimeError(f"{len(failed)} evaluation requests did not complete, e.g. {failed[0]!r}")
    return [f.images[0] for f in finals]


def stock_images(model: Path, prompts: list[str], seed: int) -> list[Image.Image]:
    """The stock diffusers FluxPipeline, one call per prompt, with the same defaults and seeds."""
    import torch
    from diffusers import FluxPipeline

    from pipelines.studio_config import read_studio_config

    studio = read_studio_config(model)
    pipe = FluxPipeline.from_pretrained(model, use_safetensors=True)
    pipe.set_progress_bar_config(disable=True)
    cfg = studio.guidance_scale is not None and studio.guidance_scale > 1 and studio.negative_prompt is not None
    images = []
    for i, prompt in enumerate(prompts):
        images.append(
            pipe(
                prompt=prompt.lower(),
                negative_prompt=studio.negative_prompt if cfg else None,
                true_cfg_scale=studio.guidance_scale if cfg else 1.0,
                height=studio.height,
                width=studio.width,
                num_inference_steps=studio.num_inference_steps,
                max_sequence_length=studio.max_sequence_length,
                generator=torch.Generator().manual_seed(seed + i),
            ).images[0]
        )
    return images


def max_pixel_difference(a: list[Image.Image], b: list[Image.Image]) -> int:
    return max(int(np.abs(np.asarray(x, np.int16) - np.asarray(y, np.int16)).max()) for x, y in zip(a, b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("assets/shapes-flux"))
    parser.add_argument("--prompts", type=int, default=120)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--no-stock", action="store_true", help="skip the stock FluxPipeline run")
    parser.add_argument("--step-cache", type=float, default=0.0,
                        help="the engine's step-caching threshold (0: off, as the stock pipeline; -1: the model's default)")
    args = parser.parse_args()

    prompts = example_prompts(args.prompts, seed=args.seed)
    print(f"model {args.model}, {len(prompts)} prompts, the model's serving defaults, seed {args.seed} + i\n")
    print("| path | " + " | ".join(ATTRIBUTES) + " | s/image |")
    print("|---|" + "---|" * (len(ATTRIBUTES) + 1))
    step_cache = None if args.step_cache < 0 else args.step_cache
    runs = {"stepstudio engine (step mode)": lambda: engine_images(args.model, prompts, args.seed, args.max_batch,
                                                                    step_cache)}
    if not args.no_stock:
        runs["stock FluxPipeline"] = lambda: stock_images(args.model, prompts, args.seed)
    produced = {}
    for label, run in runs.items():
        started = time.perf_counter()
        images = run()
        per_image = (time.perf_counter() - started) / len(prompts)
        scores = evaluate_images(list(zip(prompts, images)))
        produced[label] = images
        print(f"| {label} | " + " | ".join(f"{scores[a]:.2f}" for a in ATTRIBUTES) + f" | {per_image:.3f} |", flush=True)
    if len(produced) == 2:
        print(f"\nlargest pixel difference between the two paths: {max_pixel_difference(*produced.values())} (of 255)")


if __name__ == "__main__":
    main()

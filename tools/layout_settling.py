"""When does shapes-flux v2 settle its layout? For pictures drawn from random captions, the shape's
centre in the model's one-step prediction of the finished picture (x0 = x_t - sigma * v, with v
read off the sampler's own Euler step) against the centre in the finished picture, every other
step. It is why tools/train_lora_v2.py's --switch-sigma can leave the layout to the base model
above a noise level and only hollow the shape out below it (docs/models.md).

    python -m tools.layout_settling --canvas 64x64 128x72 48x48
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from diffusers import FluxPipeline

from pipelines.loader import BUILTIN_V2_MODEL_DIR
from tools.builtin_components import TEXT_LENGTH
from tools.evaluate_v2 import measure
from tools.shapes_world_v2 import random_named_caption, random_scene
from tools.train_lora_v2 import canvas_size

MISSED = 99.0  # the distance counted when a prediction shows no shape at all


def settling(pipe, width: int, height: int, pictures: int, seed: int, steps: int, guidance: float) -> list[dict]:
    """One row per even step: its noise level and how far the predictions' centres are from the end's."""
    rng = np.random.default_rng(seed)
    texts = [random_named_caption(random_scene(rng, width, height), rng)[1] for _ in range(pictures)]
    channels = pipe.transformer.config.in_channels // 4
    start = pipe.prepare_latents(pictures, channels, height, width, torch.float32, "cpu",
                                 torch.Generator().manual_seed(seed))[0]
    states = [start]

    def keep_latents(_pipe, _step, _timestep, outputs):
        states.append(outputs["latents"].clone())
        return outputs

    finished = pipe(prompt=texts, negative_prompt=[""] * pictures, true_cfg_scale=guidance, height=height,
                    width=width, num_inference_steps=steps, max_sequence_length=TEXT_LENGTH, latents=start.clone(),
                    callback_on_step_end=keep_latents).images
    sigmas = pipe.scheduler.sigmas.tolist()
    ends = [measure(image).centre for image in finished]
    vae = pipe.vae
    rows = []
    for step in range(0, steps, 2):
        velocity = (states[step + 1] - states[step]) / (sigmas[step + 1] - sigmas[step])
        predicted = states[step] - sigmas[step] * velocity
        latents = pipe._unpack_latents(predicted, height, width, pipe.vae_scale_factor)
        with torch.no_grad():
            decoded = vae.decode(latents / vae.config.scaling_factor + vae.config.shift_factor).sample
        distances = []
        for image, end in zip(pipe.image_processor.postprocess(decoded), ends):
            if end is None:  # the finished picture shows no shape: nothing to settle on
                continue
            seen = measure(image).centre
            distances.append(MISSED if seen is None else float(np.hypot(seen[0] - end[0], seen[1] - end[1])))
        distances = np.array(distances)
        rows.append({"step": step, "sigma": sigmas[step], "within_4px": float(np.mean(distances <= 4)),
                     "within_8px": float(np.mean(distances <= 8)), "median_px": float(np.median(distances))})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(BUILTIN_V2_MODEL_DIR))
    parser.add_argument("--canvas", type=canvas_size, nargs="+", default=[(64, 64), (128, 72), (48, 48)])
    parser.add_argument("--pictures", type=int, default=12)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--guidance-scale", type=float, default=3.0)
    args = parser.parse_args(argv)
    pipe = FluxPipeline.from_pretrained(args.model)
    pipe.set_progress_bar_config(disable=True)
    for width, height in args.canvas:
        for row in settling(pipe, width, height, args.pictures, args.seed, args.steps, args.guidance_scale):
            print(f"{width}x{height} step {row['step']:2d} sigma {row['sigma']:.3f}: centre within 4 px "
                  f"{row['within_4px']:.2f}, within 8 px {row['within_8px']:.2f}, median {row['median_px']:.1f} px")


if __name__ == "__main__":
    main()

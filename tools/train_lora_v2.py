"""Train the "outline" LoRA adapter for shapes-flux v2 (assets/shapes-flux-v2), on CPU.

With the adapter the model draws the prompted shape as an outline (its border, ~4 px thick, in the
prompted colour; its inside the background colour) on every canvas the model serves; everything
else follows the prompt as without it. No new words: the captions are the base model's own.

The recipe of the v1 adapter (tools/train_lora.py, whose helpers it uses) on the v2 world
(tools/shapes_world_v2.py):
- data: --per-canvas scenes on each of the 121 canvases drawn from the seed's own generator (the
  evaluator's held-out scenes come from seed 4321's), drawn as outlines (`render_outline`) and
  encoded once by the frozen VAE (posterior mean and log-variance; a fresh sample every step);
- text: captions drawn afresh every step, leaving parts out as the base model was trained
  (`random_caption`), through the frozen CLIP and T5 encoders; ~10% empty, for true CFG;
- objective: rectified flow in FluxPipeline's conventions, each batch one canvas, the noise level
  logit-normal around that canvas's schedule shift plus --sigma-offset (noisier than the base
  model's: filled or ring is decided early);
- adapter: PEFT LoRA on the transformer only (base weights and text encoders frozen), saved with
  `FluxPipeline.save_lora_weights` and its LoraConfig, float16.
- --coupled N (reflow's coupling): instead of outlines of random scenes under fresh noise, N
  pictures per canvas that the base model itself draws from stored noise (`couple_outlines`), each
  redrawn as the outline of the shape it shows and trained under that same noise, so the adapter
  is asked only to hollow out the shape the base model was going to draw there, not to pick a
  layout from pure noise.
- --switch-sigma T: the path bends at noise level T. Above it, filled scenes on the base model's
  own straight path (so the adapter keeps the base model's layout choice from the noise); below it,
  a straight path from that noisy filled scene at T to its ring (`switched_path`).
- --init FILE: start from a saved adapter (same rank and targets) and train on; the shipped adapter
  is one bent-path run continued this way (its card, assets/loras/shapes-flux-v2/README.md).
- --whole-layers: the same layers trained whole (every weight of every target matrix, at a
  fine-tune's learning rate), then each layer's change cut to --rank by SVD into the PEFT adapter
  (tools/lora_extraction.py). docs/models.md has what each recipe measured.

    python -m tools.train_lora_v2 --seed 0 --steps 2400 --out assets/loras/shapes-flux-v2/outline.safetensors

Deterministic given --seed and --steps (same machine, torch build and --threads).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from pipelines.loader import BUILTIN_V2_MODEL_DIR
from tools.builtin_components import TEXT_LENGTH
from tools.evaluate_v2 import measure, score_seen
from tools.lora_extraction import cut_adapter, train_whole
from tools.shapes_world import OUTLINE_THICKNESS_PIXELS
from tools.shapes_world_v2 import (
    Scene,
    check_canvas,
    random_caption,
    random_named_caption,
    random_scene,
    render,
    render_outline,
)
from tools.train_builtin import image_ids, pack_latents, to_tensor
from tools.train_builtin_v2 import CANVASES, image_tokens, scene_of, schedule_mu
from tools.train_lora import (
    checked,
    encode_texts,
    finish,
    frozen_pipeline,
    run,
    shared_arguments,
    train_adapter,
    with_adapter,
)
from tools.training_loop import log

DEFAULT_MODEL = BUILTIN_V2_MODEL_DIR  # the loader's own path to it, from any working directory
DEFAULT_OUT = Path("assets/loras/shapes-flux-v2/outline.safetensors")


def ring_thickness(side: float, share: float) -> float:
    """The ring's width in pixels: `share` of the shape's side, never under v1's 4 px (share 0: 4 px
    on every shape, as v1's adapter draws)."""
    return max(OUTLINE_THICKNESS_PIXELS, share * side)


@torch.no_grad()
def encode_outlines(vae, per_canvas: int, seed: int, canvases=CANVASES, thickness_share: float = 0.0,
                    filled: bool = False) -> dict:
    """{(width, height): {"mean", "logvar", "scenes"}}: `per_canvas` outline scenes on each canvas;
    with `filled`, also each scene drawn filled ("filled_mean", "filled_logvar"), for --switch-sigma."""
    rng = np.random.default_rng([seed, 7])
    buckets = {}
    for width, height in canvases:
        scenes = [random_scene(rng, width, height) for _ in range(per_canvas)]
        outlines = [render_outline(scene, ring_thickness(scene.side, thickness_share)) for scene in scenes]
        posterior = vae.encode(to_tensor(outlines)).latent_dist
        buckets[(width, height)] = {"mean": posterior.mean, "logvar": posterior.logvar,
                                    "scenes": [(s.shape, s.color, s.background, s.side, s.cx, s.cy) for s in scenes]}
        if filled:
            drawn = vae.encode(to_tensor([render(scene) for scene in scenes])).latent_dist
            buckets[(width, height)].update(filled_mean=drawn.mean, filled_logvar=drawn.logvar)
    return buckets


def switched_path(filled: torch.Tensor, ring: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor,
                  switch: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_t, velocity target) on a path that bends at noise level `switch`: above it, the base
    model's own straight path from the filled shape to the noise (the adapter learns to change
    nothing there, so the base model picks the layout from the noise as it always does); below it,
    a straight path from that noisy filled shape at `switch` to the ring, so the adapter only
    hollows out a shape whose place, size and colours are already in the latent, instead of
    averaging rings over every place still possible (docs/models.md)."""
    s = sigma[:, None, None]
    above = (1.0 - s) * filled + s * noise, noise - filled
    at_switch = (1.0 - switch) * filled + switch * noise
    below = ring + (s / switch) * (at_switch - ring), (at_switch - ring) / switch
    high = (sigma >= switch)[:, None, None]
    return torch.where(high, above[0], below[0]), torch.where(high, above[1], below[1])


@torch.no_grad()
def couple_outlines(pipe, per_canvas: int, seed: int, canvases, guidance: float, steps: int = 20,
                    chunk: int = 16, thickness_share: float = 0.0) -> dict:
    """{(width, height): {"mean", "logvar", "noise", "texts"}}: on each canvas, the base model's
    pictures from `per_canvas` random captions, each from noise drawn here (the packed initial
    latents, kept), redrawn as the outline of the shape the picture shows. A picture is kept only
    if it draws everything its caption names (tools/evaluate_v2.score) and its outline, through the
    VAE and back, still reads as an outline; the outline takes the drawn shape, colours and box
    (stretched where the drawing is)."""
    rng = np.random.default_rng([seed, 9])
    generator = torch.Generator().manual_seed(seed)
    pipe.set_progress_bar_config(disable=True)
    channels = pipe.transformer.config.in_channels // 4
    buckets = {}
    for width, height in canvases:
        asked = [random_scene(rng, width, height) for _ in range(per_canvas)]
        captions = [random_named_caption(scene, rng) for scene in asked]
        noises, images = [], []
        for start in range(0, per_canvas, chunk):
            texts = [text for _, text in captions[start : start + chunk]]
            noises.append(pipe.prepare_latents(len(texts), channels, height, width, torch.float32, "cpu", generator)[0])
            images += pipe(prompt=texts, negative_prompt=[""] * len(texts), true_cfg_scale=guidance, height=height,
                           width=width, num_inference_steps=steps, max_sequence_length=TEXT_LENGTH,
                           latents=noises[-1]).images
        noise = torch.cat(noises)
        kept, outlines = [], []
        for index, (scene, (named, _), image) in enumerate(zip(asked, captions, images)):
            outline = outline_of_drawn(scene, named, image, thickness_share)
            if outline is not None:
                kept.append(index)
                outlines.append(outline)
        if kept:
            posterior = pipe.vae.encode(to_tensor(outlines)).latent_dist
            # A ring too thin for the VAE (a small triangle's) fills in on its way through: as a
            # target it would teach a filled shape, so only outlines that come back as outlines stay.
            with torch.no_grad():
                decoded = pipe.image_processor.postprocess(pipe.vae.decode(posterior.mean).sample)
            rings = [i for i, image in enumerate(decoded) if measure(image).outlined is True]
            kept = [kept[i] for i in rings]
        log(f"coupled: {width}x{height}: {len(kept)} of {per_canvas} pictures kept")
        if kept:  # `posterior` and `rings` exist whenever anything is kept
            buckets[(width, height)] = {"mean": posterior.mean[rings], "logvar": posterior.logvar[rings],
                                        "noise": noise[kept], "texts": [captions[i][1] for i in kept]}
    return buckets


def outline_of_drawn(scene: Scene, named, image, thickness_share: float = 0.0) -> Image.Image | None:
    """The outline of what `image` (the base model's drawing of `scene`'s caption) shows, or None
    where it misses a part the caption names."""
    seen = measure(image)
    if seen.shape is None or not all(score_seen(scene, named, seen).values()):
        return None
    left, top, right, bottom = seen.box  # a triangle's reads a pixel or two inside its tip and corners
    if min(right - left, bottom - top) < 3 * OUTLINE_THICKNESS_PIXELS:  # a speck: too small to hold a ring
        return None
    try:
        drawn = Scene(scene.width, scene.height, seen.shape, seen.color, seen.background,
                      max(right - left, bottom - top), (left + right) / 2.0, (top + bottom) / 2.0)
    except ValueError:  # the shape drawn in the background's colour: nothing to outline
        return None
    return render_outline(drawn, ring_thickness(drawn.side, thickness_share), box=seen.box)


def train(args) -> dict:
    started_all = time.time()
    pipe, shift, scale = frozen_pipeline(args)
    canvases = (args.canvas if args.canvas is not None else CANVASES if args.canvases is None
                else CANVASES[:: max(1, len(CANVASES) // args.canvases)])
    if args.coupled:
        buckets = couple_outlines(pipe, args.coupled, args.seed, canvases, args.guidance_scale,
                                  thickness_share=args.thickness_share)
        kept = sum(len(bucket["texts"]) for bucket in buckets.values())
        if not kept:
            raise SystemExit("--coupled: the base model drew no caption right on these canvases; nothing to train on")
        log(f"data: {len(buckets)} canvases, {kept} coupled outlines, {time.time() - started_all:.0f} s")
    else:
        buckets = encode_outlines(pipe.vae, args.per_canvas, args.seed, canvases, args.thickness_share,
                                  filled=args.switch_sigma > 0)
        log(f"data: {len(buckets)} canvases x {args.per_canvas} outline scenes, {time.time() - started_all:.0f} s")

    transformer = pipe.transformer
    if args.whole_layers:
        parameters, originals = train_whole(transformer, args.target_modules)
    else:
        parameters = with_adapter(transformer, args)
    optimizer = torch.optim.AdamW(parameters, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.99))
    generator = torch.Generator().manual_seed(args.seed)
    rng = np.random.default_rng([args.seed, 8])
    txt_ids = torch.zeros(TEXT_LENGTH, 3)
    keys = sorted(buckets)
    state = {"step": 0, "elapsed": 0.0}

    def loss_at(step: int, fraction: float) -> tuple[torch.Tensor, dict]:
        width, height = keys[int(torch.randint(len(keys), (1,), generator=generator))]
        bucket = buckets[(width, height)]
        rows = torch.randint(len(bucket["mean"]), (args.batch,), generator=generator)

        def sampled(prefix: str) -> torch.Tensor:  # a fresh sample of each row's VAE posterior, packed
            std = (0.5 * bucket[f"{prefix}logvar"][rows]).exp()
            mean = bucket[f"{prefix}mean"][rows]
            return pack_latents((mean + std * torch.randn(std.shape, generator=generator) - shift) * scale)

        x0 = sampled("")
        if args.coupled:  # each row's own caption and noise; empty captions under fresh noise
            texts = ["" if rng.random() < args.empty_caption_rate else bucket["texts"][int(row)] for row in rows]
        else:
            scenes: list[Scene] = [scene_of(bucket["scenes"][int(row)], width, height) for row in rows]
            texts = ["" if rng.random() < args.empty_caption_rate else random_caption(scene, rng) for scene in scenes]
        pooled, sequence = encode_texts(pipe, texts)
        mu = schedule_mu(image_tokens(width, height)) + args.sigma_offset
        sigma = torch.sigmoid(mu + args.sigma_std * torch.randn(args.batch, generator=generator))
        noise = torch.randn(x0.shape, generator=generator)
        if args.coupled:
            coupled = torch.tensor([text != "" for text in texts])
            noise[coupled] = bucket["noise"][rows][coupled]
        if args.switch_sigma:
            x_t, target = switched_path(sampled("filled_"), x0, noise, sigma, args.switch_sigma)
        else:
            x_t, target = (1.0 - sigma[:, None, None]) * x0 + sigma[:, None, None] * noise, noise - x0
        velocity = transformer(hidden_states=x_t, timestep=sigma, pooled_projections=pooled,
                               encoder_hidden_states=sequence, txt_ids=txt_ids,
                               img_ids=image_ids(height // 4, width // 4), return_dict=False)[0]
        return F.mse_loss(velocity, target), {}

    train_adapter(transformer, optimizer, args, state, loss_at)
    if args.whole_layers:
        cut_adapter(transformer, originals, args.rank, args.target_modules)
        parameters = [p for p in transformer.parameters() if p.requires_grad]
    return finish(transformer, args, parameters, state, started_all)


def canvas_size(text: str) -> tuple[int, int]:
    """'64x64' -> (64, 64), one of the open world's canvases."""
    try:
        width, height = (int(value) for value in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a canvas is WIDTHxHEIGHT, e.g. 64x64") from None
    try:
        check_canvas(width, height)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text}: {error}") from None
    return width, height


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = shared_arguments(__doc__, DEFAULT_MODEL, DEFAULT_OUT, steps=2400)
    parser.add_argument("--per-canvas", type=int, default=40, help="outline scenes per canvas")
    parser.add_argument("--canvases", type=int, default=None, help="train on about this many canvases (smoke tests)")
    parser.add_argument("--canvas", type=canvas_size, nargs="+", default=None, metavar="WxH",
                        help="train on these canvases only (e.g. 64x64), instead of all 121")
    parser.add_argument("--sigma-offset", type=float, default=0.5,
                        help="added to the schedule's shift for the noise level's logit-normal mean")
    parser.add_argument("--coupled", type=int, default=0,
                        help="per canvas, the base model's own pictures as outlines under their noise (0: off)")
    parser.add_argument("--guidance-scale", type=float, default=3.0, help="true CFG of the --coupled pictures")
    parser.add_argument("--thickness-share", type=float, default=0.0,
                        help="ring width as a share of the shape's side, at least 4 px (0: 4 px on every shape)")
    parser.add_argument("--switch-sigma", type=float, default=0.0,
                        help="bend the training path at this noise level: above it the base model's filled "
                             "shapes (layout from the noise), below it straight on to the ring (0: off)")
    parser.add_argument("--whole-layers", action="store_true",
                        help="train the adapter's layers whole (try --lr 1e-4), then cut their change to --rank")
    parser.add_argument("--threads", type=int, default=2)
    args = checked(parser, argv)
    if args.whole_layers and args.alpha != args.rank:
        parser.error("--whole-layers writes lora_alpha = --rank (scaling 1): leave --alpha out")
    if args.whole_layers and args.init is not None:
        parser.error("--init continues an adapter; --whole-layers trains the layers whole and writes a new one")
    if not 0.0 <= args.switch_sigma < 1.0:
        parser.error("--switch-sigma is a noise level in [0, 1)")
    if args.switch_sigma and args.coupled:
        parser.error("--switch-sigma bends the path of drawn scenes; --coupled pictures keep their own noise")
    return args


def main(argv: list[str] | None = None) -> dict:
    return run(parse_args, train, argv)


if __name__ == "__main__":
    main()

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

    python -m tools.train_lora_v2 --seed 0 --steps 2400 --out assets/loras/shapes-flux-v2/outline.safetensors

Deterministic given --seed and --steps (same machine, torch build and --threads).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from tools.builtin_components import TEXT_LENGTH
from tools.shapes_world_v2 import Scene, random_caption, random_scene, render_outline
from tools.train_builtin import image_ids, pack_latents, to_tensor
from tools.train_builtin_v2 import CANVASES, image_tokens, schedule_mu, scene_of
from tools.train_lora import TARGET_MODULES, encode_texts, save_adapter
from tools.training_loop import cosine_lr, log, progress_fraction

DEFAULT_MODEL = Path("assets/shapes-flux-v2")
DEFAULT_OUT = Path("assets/loras/shapes-flux-v2/outline.safetensors")


@torch.no_grad()
def encode_outlines(vae, per_canvas: int, seed: int, canvases=CANVASES) -> dict:
    """{(width, height): {"mean", "logvar", "scenes"}}: `per_canvas` outline scenes on each canvas."""
    rng = np.random.default_rng([seed, 7])
    buckets = {}
    for width, height in canvases:
        scenes = [random_scene(rng, width, height) for _ in range(per_canvas)]
        posterior = vae.encode(to_tensor([render_outline(scene) for scene in scenes])).latent_dist
        buckets[(width, height)] = {"mean": posterior.mean, "logvar": posterior.logvar,
                                    "scenes": [(s.shape, s.color, s.background, s.side, s.cx, s.cy) for s in scenes]}
    return buckets


def train(args) -> dict:
    from diffusers import FluxPipeline
    from peft import LoraConfig

    started_all = time.time()
    torch.manual_seed(args.seed)
    pipe = FluxPipeline.from_pretrained(args.model, use_safetensors=True)
    for component in (pipe.vae, pipe.text_encoder, pipe.text_encoder_2, pipe.transformer):
        component.eval().requires_grad_(False)
    shift, scale = pipe.vae.config.shift_factor, pipe.vae.config.scaling_factor
    canvases = CANVASES if args.canvases is None else CANVASES[:: max(1, len(CANVASES) // args.canvases)]
    buckets = encode_outlines(pipe.vae, args.per_canvas, args.seed, canvases)
    log(f"data: {len(buckets)} canvases x {args.per_canvas} outline scenes, {time.time() - started_all:.0f} s")

    transformer = pipe.transformer
    transformer.add_adapter(LoraConfig(r=args.rank, lora_alpha=args.alpha, target_modules=list(args.target_modules),
                                       lora_dropout=0.0, init_lora_weights=True))
    parameters = [p for p in transformer.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.99))
    generator = torch.Generator().manual_seed(args.seed)
    rng = np.random.default_rng([args.seed, 8])
    txt_ids = torch.zeros(TEXT_LENGTH, 3)
    keys = sorted(buckets)
    transformer.train()
    loss_avg, step, started = None, 0, time.time()
    while True:
        fraction = progress_fraction(step, args.steps, time.time() - started, args.minutes)
        if fraction >= 1.0:
            break
        lr = cosine_lr(args.lr, fraction, step, warmup=args.warmup)
        for group in optimizer.param_groups:
            group["lr"] = lr
        width, height = keys[int(torch.randint(len(keys), (1,), generator=generator))]
        bucket = buckets[(width, height)]
        rows = torch.randint(len(bucket["mean"]), (args.batch,), generator=generator)
        std = (0.5 * bucket["logvar"][rows]).exp()
        x0 = pack_latents((bucket["mean"][rows] + std * torch.randn(std.shape, generator=generator) - shift) * scale)
        scenes: list[Scene] = [scene_of(bucket["scenes"][int(row)], width, height) for row in rows]
        texts = ["" if rng.random() < args.empty_caption_rate else random_caption(scene, rng) for scene in scenes]
        pooled, sequence = encode_texts(pipe, texts)
        mu = schedule_mu(image_tokens(width, height)) + args.sigma_offset
        sigma = torch.sigmoid(mu + args.sigma_std * torch.randn(args.batch, generator=generator))
        noise = torch.randn(x0.shape, generator=generator)
        x_t = (1.0 - sigma[:, None, None]) * x0 + sigma[:, None, None] * noise
        velocity = transformer(hidden_states=x_t, timestep=sigma, pooled_projections=pooled,
                               encoder_hidden_states=sequence, txt_ids=txt_ids,
                               img_ids=image_ids(height // 4, width // 4), return_dict=False)[0]
        loss = F.mse_loss(velocity, noise - x0)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        loss_avg = loss.item() if loss_avg is None else 0.98 * loss_avg + 0.02 * loss.item()
        step += 1
        if step % args.log_every == 0 or step == 1:
            elapsed = time.time() - started
            log(f"lora step {step} loss {loss.item():.4f} avg {loss_avg:.4f} lr {lr:.2e} "
                f"{step / elapsed:.2f} steps/s, {elapsed / 60:.1f} min")
    minutes = (time.time() - started) / 60
    save_adapter(transformer, args, args.out)
    summary = {"steps": step, "train_minutes": round(minutes, 2), "total_minutes": round((time.time() - started_all) / 60, 2),
               "loss_avg": round(loss_avg, 4) if loss_avg is not None else None, "file": str(args.out),
               "bytes": args.out.stat().st_size, "parameters": sum(p.numel() for p in parameters)}
    log("done: " + json.dumps(summary))
    return summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="the base model's diffusers folder")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the adapter file to write (.safetensors)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=2400)
    parser.add_argument("--minutes", type=float, default=0.0, help="time budget (0: --steps only, deterministic)")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--target-modules", nargs="+", default=list(TARGET_MODULES))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--per-canvas", type=int, default=40, help="outline scenes per canvas")
    parser.add_argument("--canvases", type=int, default=None, help="train on about this many canvases (smoke tests)")
    parser.add_argument("--empty-caption-rate", type=float, default=0.1)
    parser.add_argument("--sigma-offset", type=float, default=0.5,
                        help="added to the schedule's shift for the noise level's logit-normal mean")
    parser.add_argument("--sigma-std", type=float, default=1.0)
    parser.add_argument("--dtype", choices=("float16", "float32"), default="float16", help="of the saved weights")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--log-every", type=int, default=100)
    args = parser.parse_args(argv)
    args.alpha = float(args.rank)
    if args.out.suffix != ".safetensors":
        parser.error(f"--out {args.out}: the adapter file must end in .safetensors")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    return train(args)


if __name__ == "__main__":
    main()

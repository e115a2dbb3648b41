"""Train shapes-wan v2 (assets/shapes-wan-v2): the built-in video model at more than one size and
length, fine-tuned on CPU from shapes-wan (assets/shapes-wan).

shapes-wan v2 keeps shapes-wan's VAE, tokenizer and scheduler unchanged (a convolutional causal
VAE encodes any canvas; its round trips are scored per canvas by `ceiling`) and fine-tunes the
transformer and the text encoder on every canvas of `V2_CANVASES` (tools/moving_shapes_world.py):
64x64 x 9 frames, as before, and 96x64 x 13 frames. Each step trains a batch of clips and a batch
of first frames (one-frame videos, as shapes-wan did) of every canvas, in WanPipeline's
conventions (tools/train_video.py holds the loss).

Stages (run in order; each resumes from its own files in --work-dir):

    ceiling      round trips of held-out clips through the VAE, scored per canvas by the video
                 evaluator: the best the transformer can reach on each canvas.
    latents      every training scene x --renders-per-scene jittered renders, per canvas, encoded
                 once (posterior mean and log-variance).
    transformer  the fine-tuning run: EMA, cosine learning rate over the time budget.
    export       the WanPipeline folder (safetensors) + stepstudio.json: serving sizes 64x64 and
                 96x64, the training record.

    python -m tools.train_video_v2 --stage all --max-minutes 70 --threads 2
    python -m tools.evaluate_video --model assets/shapes-wan-v2 --canvas 64x64x9 96x64x13
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from tools.moving_shapes_world import V2_CANVASES, Canvas, caption, held_out_specs, render, training_specs
from tools.train_video import flow_matching_loss, to_video_tensor, tokenize
from tools.training_loop import Schedule, log, resume, run_stages, run_steps, save_atomically
from tools.video_components import build_tokenizer

DEFAULT_INIT = Path("assets/shapes-wan")


class VideoModels(torch.nn.Module):
    """The transformer and the text encoder of a shapes-wan folder, trained together."""

    def __init__(self, model_dir: Path):
        from diffusers import WanTransformer3DModel
        from transformers import UMT5EncoderModel

        super().__init__()
        self.transformer = WanTransformer3DModel.from_pretrained(model_dir / "transformer", use_safetensors=True)
        self.text_encoder = UMT5EncoderModel.from_pretrained(model_dir / "text_encoder", use_safetensors=True)


def load_vae(model_dir: Path):
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan.from_pretrained(model_dir / "vae", use_safetensors=True)
    return vae.eval().requires_grad_(False)


def latents_path(work_dir: Path, canvas: Canvas) -> Path:
    return work_dir / f"latents-{canvas.name}.pt"


@torch.no_grad()
def vae_ceiling(args) -> None:
    from tools.evaluate_video import evaluate_videos

    vae = load_vae(args.init_from)
    for canvas in V2_CANVASES:
        rng = np.random.default_rng([args.seed, 3])
        specs = held_out_specs()
        clips = to_video_tensor([render(spec, rng, canvas) for spec in specs])
        decoded = vae.decode(vae.encode(clips).latent_dist.mean).sample
        frames = ((decoded + 1.0) / 2.0).permute(0, 2, 3, 4, 1).numpy()
        scores = evaluate_videos([(caption(spec), clip) for spec, clip in zip(specs, frames)])
        log(f"vae ceiling {canvas.name} ({len(specs)} held-out clips): L1 {(decoded - clips).abs().mean():.4f} "
            + " ".join(f"{k} {v:.2f}" for k, v in scores.items()))


@torch.no_grad()
def encode_latents(args) -> None:
    vae = load_vae(args.init_from)
    specs = training_specs()
    for canvas in V2_CANVASES:
        path = latents_path(args.work_dir, canvas)
        if path.exists():
            log(f"latents {canvas.name}: already encoded")
            continue
        started = time.time()
        rng = np.random.default_rng([args.seed, 1, canvas.width, canvas.height, canvas.frames])
        means, logvars, scene_index = [], [], []
        for _ in range(args.renders_per_scene):
            for start in range(0, len(specs), 24):
                chunk = specs[start : start + 24]
                posterior = vae.encode(to_video_tensor([render(spec, rng, canvas) for spec in chunk])).latent_dist
                means.append(posterior.mean.half())
                logvars.append(posterior.logvar.half())
                scene_index.extend(range(start, start + len(chunk)))
        mean = torch.cat(means)
        log(f"latents {canvas.name}: {len(mean)} clips of {tuple(mean.shape[1:])} in "
            f"{(time.time() - started) / 60:.1f} min")
        save_atomically({"mean": mean, "logvar": torch.cat(logvars), "scene": torch.tensor(scene_index)}, path)


def train_transformer(args) -> None:
    checkpoint = args.work_dir / "transformer.pt"
    data = {canvas: torch.load(latents_path(args.work_dir, canvas), weights_only=False) for canvas in V2_CANVASES}
    specs = training_specs()
    tokenizer = build_tokenizer()  # shapes-wan's, built from the vocabulary as its folder's
    input_ids, attention_mask = tokenize(tokenizer, [caption(spec) for spec in specs] + [""])
    vae_config = json.loads((args.init_from / "vae" / "config.json").read_text())
    channel_mean = torch.tensor(vae_config["latents_mean"]).view(1, -1, 1, 1, 1)
    channel_std = torch.tensor(vae_config["latents_std"]).view(1, -1, 1, 1, 1)
    stats = (input_ids, attention_mask, len(specs), channel_mean, channel_std)

    torch.manual_seed(args.seed)
    models = VideoModels(args.init_from)
    ema = copy.deepcopy(models).requires_grad_(False)
    optimizer = torch.optim.AdamW(models.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.99))
    generator = torch.Generator().manual_seed(args.seed)
    state = resume(checkpoint, "transformer", models, optimizer, ema, generator) or {
        "step": 0, "elapsed": 0.0, "done": False, "loss_avg": None}
    if state["done"]:
        log("transformer: already trained")
        return

    def save(path: Path) -> None:
        save_atomically({"model": models.state_dict(), "ema": ema.state_dict(), "optimizer": optimizer.state_dict(),
                         "generator": generator.get_state(), "state": state,
                         "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}, path)

    def loss_at(step: int, fraction: float) -> tuple[torch.Tensor, dict]:
        return sum(
            flow_matching_loss(models, data[canvas], args.batch, None, generator, args, *stats)
            + flow_matching_loss(models, data[canvas], args.image_batch, 1, generator, args, *stats)
            for canvas in V2_CANVASES
        ) / len(V2_CANVASES), {}

    def keep_snapshots(progress: dict) -> None:
        if args.snapshot_every and progress["step"] % args.snapshot_every == 0:
            save(args.work_dir / f"transformer-{progress['step']}.pt")

    run_steps("transformer", state, models, optimizer, Schedule(args.lr, args.warmup, args.steps, args.max_minutes),
              loss_at, lambda: save(checkpoint), args.checkpoint_minutes, ema=ema, ema_decay=args.ema_decay,
              log_every=50, after_step=keep_snapshots)


def export(args) -> None:
    """shapes-wan's folder with the fine-tuned transformer and text encoder, and v2's serving card."""
    checkpoint = args.export_checkpoint or args.work_dir / "transformer.pt"
    saved = torch.load(checkpoint, weights_only=False)
    models = VideoModels(args.init_from)
    models.load_state_dict(saved["model" if args.export_raw else "ema"])
    # v1's components; the folder's own card (README.md) and contact sheet stay as they are.
    shutil.copytree(args.init_from, args.out, ignore=shutil.ignore_patterns("README.md", "contact_sheet.png"),
                    dirs_exist_ok=True)
    models.transformer.save_pretrained(args.out / "transformer", safe_serialization=True)
    models.text_encoder.save_pretrained(args.out / "text_encoder", safe_serialization=True)
    card = json.loads((args.init_from / "stepstudio.json").read_text())
    card["step_cache"] = args.step_cache  # measured on v2 at both canvases (assets/shapes-wan-v2/README.md)
    card["sizes"] = [f"{c.width}x{c.height}" for c in V2_CANVASES]
    card["frame_counts"] = sorted({c.frames for c in V2_CANVASES})
    card["training"] = {
        "init_from": str(args.init_from),
        "canvases": [c.name for c in V2_CANVASES],
        "steps": saved["state"]["step"],
        "minutes": round(saved["state"]["elapsed"] / 60, 1),
        "batch": args.batch, "image_batch": args.image_batch, "lr": args.lr, "seed": args.seed,
        "renders_per_scene": args.renders_per_scene,
        "weights": "raw" if args.export_raw else "ema",
        "before": card.get("training"),
    }
    (args.out / "stepstudio.json").write_text(json.dumps(card, indent=2) + "\n")
    log(f"export: wrote {args.out} (step {saved['state']['step']}, {'raw' if args.export_raw else 'EMA'} weights)")


# --stage's choices, in the order --stage all runs them.
STAGES = {"ceiling": vae_ceiling, "latents": encode_latents, "transformer": train_transformer, "export": export}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", choices=(*STAGES, "all"), default="all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init-from", type=Path, default=DEFAULT_INIT, help="the shapes-wan folder to start from")
    parser.add_argument("--out", type=Path, default=Path("assets/shapes-wan-v2"))
    parser.add_argument("--work-dir", type=Path, default=Path("/work/train-video-v2"), help="outside the repo")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--renders-per-scene", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100000)
    parser.add_argument("--max-minutes", type=float, default=70.0, help="time budget (0: steps only)")
    parser.add_argument("--batch", type=int, default=8, help="clips per canvas per step")
    parser.add_argument("--image-batch", type=int, default=32, help="first frames per canvas per step")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--ema-decay", type=float, default=0.995)
    parser.add_argument("--empty-caption-rate", type=float, default=0.1)
    parser.add_argument("--sigma-sampling", choices=("logit-normal", "shifted-uniform"), default="shifted-uniform")
    parser.add_argument("--checkpoint-minutes", type=float, default=3.0)
    parser.add_argument("--snapshot-every", type=int, default=0, help="keep a copy of the weights every N steps")
    parser.add_argument("--export-checkpoint", type=Path, default=None, help="default: <work-dir>/transformer.pt")
    parser.add_argument("--export-raw", action="store_true", help="export the raw weights instead of the EMA")
    parser.add_argument("--step-cache", type=float, default=0.1,
                        help="the serving step-caching threshold written to stepstudio.json (0: off)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    run_stages(parse_args(argv), STAGES)


if __name__ == "__main__":
    main()

"""Train the built-in video model (assets/shapes-wan) from a seed, on CPU.

Stages (run in order; each resumes from its own periodic checkpoint in --work-dir):

    vae          AutoencoderKLWan on fresh jittered clips of the training split: L1 + 0.5 MSE + KL,
                 plus 0.2 x the mean of each frame's worst 1% pixel errors. The loss is taken
                 before the decoder's clamp to [-1, 1] (a clamped pixel would get no gradient).
    ceiling      score VAE round trips of the held-out clips with tools/evaluate_video.py: the
                 best the transformer can reach (also works on a mid-run vae.pt).
    latents      encode every training clip x --renders-per-scene jittered renders once with the
                 frozen VAE; measure the per-channel latents_mean / latents_std.
    transformer  WanTransformer3DModel + UMT5 text encoder trained jointly with the rectified-flow
                 objective, in WanPipeline's conventions (timestep = 1000 x sigma, text embeddings
                 zeroed after the real tokens); ~10% empty captions so CFG with "" works; EMA.
                 --image-batch N adds N first frames per step, trained as one-frame videos (as Wan
                 trains on images beside videos): five times cheaper samples for the shapes.
                 A run is named (--run-name) and may start from another run's weights
                 (--init-from); the shipped model is one run, with image batches from step 0.
    export       write the WanPipeline folder (safetensors) + stepstudio.json: the EMA weights, or
                 the raw ones with --export-raw (the shipped model: its EMA lagged behind).

The trainer never sees the held-out split (tools/moving_shapes_world.py); only `ceiling`
renders it, to score the VAE. Each stage stops at its step count or its time budget, whichever
comes first; the log and the checkpoint record both. A time budget makes the learning-rate
cosine follow elapsed time, so the transformer records its schedule's progress at every step:
`--replay-schedule <checkpoint>` reruns that run step for step (same batches, same noise, same
learning rates). The commands that made the shipped model are in assets/shapes-wan/README.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from tools.moving_shapes_world import (
    FPS,
    FRAME_SIZE,
    NUM_FRAMES,
    caption,
    example_prompts,
    held_out_specs,
    random_spec,
    render,
    training_specs,
    vocabulary,
)
from tools.training_loop import Schedule, log, resume, run_stages, run_steps, save_atomically, train_vae_stage
from tools.video_components import (
    FLOW_SHIFT,
    TEXT_LENGTH,
    build_scheduler,
    build_text_encoder,
    build_tokenizer,
    build_transformer,
    build_vae,
)


def to_video_tensor(clips: list[list]) -> torch.Tensor:
    """Clips of PIL frames -> [B, 3, T, H, W] in [-1, 1] (WanPipeline's VideoProcessor convention)."""
    array = np.stack([np.stack([np.asarray(frame, dtype=np.float32) for frame in clip]) for clip in clips])
    return torch.from_numpy(array).permute(0, 4, 1, 2, 3) / 127.5 - 1.0


# ----------------------------------------------------------------------------- VAE


def decode_unclamped(vae, z: torch.Tensor) -> torch.Tensor:
    """AutoencoderKLWan._decode without its final clamp to [-1, 1]: the same causal frame-by-frame
    loop and feature cache, so what is trained is what WanPipeline later runs."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

    vae.clear_cache()
    x = vae.post_quant_conv(z)
    frames = []
    for i in range(z.shape[2]):
        vae._conv_idx = [0]
        frames.append(vae.decoder(x[:, :, i : i + 1], feat_cache=vae._feat_map, feat_idx=vae._conv_idx, first_chunk=i == 0))
    out = torch.cat(frames, dim=2)
    if vae.config.patch_size is not None:
        out = unpatchify(out, patch_size=vae.config.patch_size)
    vae.clear_cache()
    return out


def gaussian_kl(mean: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """KL to N(0, 1) per latent element, averaged over every axis (time included: the diffusers
    DiagonalGaussianDistribution.kl() sums only dims 1-3, which misses one axis of a 5-D latent)."""
    return 0.5 * (mean.pow(2) + logvar.exp() - 1.0 - logvar).mean()


def vae_loss(vae, clips: torch.Tensor, kl_weight: float) -> tuple[torch.Tensor, dict]:
    posterior = vae.encode(clips).latent_dist
    reconstruction = decode_unclamped(vae, posterior.sample())
    pixel_error = (reconstruction - clips).abs().mean(dim=1)  # [B, T, H, W]
    per_frame = pixel_error.flatten(2)  # [B, T, H*W]
    worst = per_frame.topk(max(1, per_frame.shape[2] // 100), dim=2).values.mean()
    l1 = pixel_error.mean()
    mse = F.mse_loss(reconstruction, clips)
    kl = gaussian_kl(posterior.mean, posterior.logvar)
    loss = l1 + 0.5 * mse + kl_weight * kl + 0.2 * worst
    return loss, {"l1": l1.item(), "worst1%": worst.item(), "kl": kl.item()}


def train_vae(args) -> None:
    torch.manual_seed(args.seed)
    specs = training_specs()

    def batch_at(step: int, _: np.random.Generator) -> torch.Tensor:
        rng = np.random.default_rng([args.seed, step])  # per step: a resumed run draws the same clips
        return to_video_tensor([render(random_spec(rng, specs), rng) for _ in range(args.vae_batch)])

    train_vae_stage(args, build_vae(), batch_at, vae_loss, warmup=args.vae_warmup, log_every=25)


def load_vae(work_dir: Path):
    vae = build_vae()
    vae.load_state_dict(torch.load(work_dir / "vae.pt", weights_only=False)["model"])
    return vae.eval().requires_grad_(False)


@torch.no_grad()
def vae_ceiling(args) -> dict[str, dict[str, float]]:
    """Round-trip the held-out clips (never seen in training) through the VAE, decoding the
    posterior mean and a posterior sample, and score them with the video evaluator: what the
    transformer can at best reach. Works on a mid-run checkpoint too."""
    from tools.evaluate_video import evaluate_videos

    vae = load_vae(args.work_dir)
    step = torch.load(args.work_dir / "vae.pt", weights_only=False)["state"]["step"]
    rng = np.random.default_rng([args.seed, 3])
    specs = held_out_specs() * 2
    clips = to_video_tensor([render(spec, rng) for spec in specs])
    posterior = vae.encode(clips).latent_dist
    generator = torch.Generator().manual_seed(args.seed)
    results = {}
    for name, latents in (("mean", posterior.mean), ("sample", posterior.sample(generator))):
        decoded = vae.decode(latents).sample  # clamped, as WanPipeline decodes
        frames = ((decoded + 1.0) / 2.0).permute(0, 2, 3, 4, 1).numpy()  # [N, T, H, W, 3] in [0, 1]
        results[name] = evaluate_videos([(caption(spec), clip) for spec, clip in zip(specs, frames)])
        l1 = (decoded - clips).abs().mean().item()
        log(f"vae ceiling at step {step} ({name} latents, {len(specs)} held-out clips): L1 {l1:.4f} "
            + " ".join(f"{k} {v:.2f}" for k, v in results[name].items()))
    return results


# ----------------------------------------------------------------------------- latents


@torch.no_grad()
def encode_latents(args) -> None:
    """Every training clip x --renders-per-scene jittered renders, encoded once (posterior mean and
    log-variance, fp16), plus the per-channel statistics that become latents_mean / latents_std."""
    path = args.work_dir / "latents.pt"
    if path.exists():
        log("latents: already encoded")
        return
    started = time.time()
    vae = load_vae(args.work_dir)
    specs = training_specs()
    rng = np.random.default_rng([args.seed, 1])
    means, logvars, scene_index = [], [], []
    for repeat in range(args.renders_per_scene):
        for start in range(0, len(specs), 48):
            chunk = specs[start : start + 48]
            posterior = vae.encode(to_video_tensor([render(spec, rng) for spec in chunk])).latent_dist
            means.append(posterior.mean.half())
            logvars.append(posterior.logvar.half())
            scene_index.extend(range(start, start + len(chunk)))
        log(f"latents: pass {repeat + 1}/{args.renders_per_scene}")
    mean = torch.cat(means)
    logvar = torch.cat(logvars)
    sample = mean.float() + torch.randn(mean.shape) * (0.5 * logvar.float()).exp()
    channel_mean = sample.mean(dim=(0, 2, 3, 4))
    channel_std = sample.std(dim=(0, 2, 3, 4))
    log(f"latents: {len(mean)} clips of {tuple(mean.shape[1:])} in {(time.time() - started) / 60:.1f} min; "
        f"channel std {channel_std.min():.3f}..{channel_std.max():.3f}")
    save_atomically(
        {"mean": mean, "logvar": logvar, "scene": torch.tensor(scene_index),
         "latents_mean": channel_mean.tolist(), "latents_std": channel_std.tolist()},
        path,
    )


# ----------------------------------------------------------------------------- transformer


def text_embeddings(text_encoder, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """As WanPipeline._get_t5_prompt_embeds: encode with the mask, then zero every position after
    the real tokens (an empty prompt is `</s>` followed by zeros)."""
    hidden = text_encoder(input_ids, attention_mask).last_hidden_state
    return hidden * attention_mask[..., None].to(hidden.dtype)


def tokenize(tokenizer, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and mask exactly as WanPipeline makes them (max_length padding)."""
    tokens = tokenizer(
        texts, padding="max_length", max_length=TEXT_LENGTH, truncation=True,
        add_special_tokens=True, return_attention_mask=True, return_tensors="pt",
    )
    return tokens.input_ids, tokens.attention_mask


def sample_sigmas(batch: int, generator: torch.Generator, args) -> torch.Tensor:
    """Noise levels for one batch.

    logit-normal     sigmoid(N(mean, std)): most samples in the middle, few above 0.95.
    shifted-uniform  u ~ U(0, 1) shifted as the scheduler shifts its uniform grid,
                     shift * u / (1 + (shift - 1) * u): exactly how often inference visits each
                     noise level. With shift 3 a fifth of the samples lie above sigma 0.92, where
                     the first steps decide the layout and the motion from pure noise.
    """
    if args.sigma_sampling == "shifted-uniform":
        u = torch.rand(batch, generator=generator)
        return FLOW_SHIFT * u / (1.0 + (FLOW_SHIFT - 1.0) * u)
    return torch.sigmoid(args.sigma_mean + args.sigma_std * torch.randn(batch, generator=generator))


def flow_matching_loss(models, data, batch: int, frames: int | None, generator, args, input_ids, attention_mask,
                       empty_index: int, channel_mean, channel_std) -> torch.Tensor:
    """The rectified-flow loss on `batch` training clips drawn at random (a fresh posterior sample,
    ~10% empty captions), on their first `frames` latent frames (None: all of them).

    frames=1 is how --image-batch trains images beside videos, as Wan does: the causal VAE encodes
    a clip's first frame alone, so latent frame 0 of a training clip is exactly the latent of that
    frame as a one-frame video (WanPipeline with num_frames=1). A frame costs a fifth of a clip
    (64 tokens instead of 320), so the text-to-shape binding gets five times the samples per
    second; the shape is the same in every frame of a clip, so what it learns carries over."""
    mean, logvar, scene = data["mean"], data["logvar"], data["scene"]
    rows = torch.randint(len(mean), (batch,), generator=generator)
    std = (0.5 * logvar[rows, :, :frames].float()).exp()
    latents = mean[rows, :, :frames].float() + std * torch.randn(std.shape, generator=generator)
    x0 = (latents - channel_mean) / channel_std  # what WanPipeline's latents are
    text_rows = scene[rows].clone()
    text_rows[torch.rand(batch, generator=generator) < args.empty_caption_rate] = empty_index
    sigma = sample_sigmas(batch, generator, args)
    noise = torch.randn(x0.shape, generator=generator)
    s = sigma.view(-1, 1, 1, 1, 1)
    prompt_embeds = text_embeddings(models.text_encoder, input_ids[text_rows], attention_mask[text_rows])
    velocity = models.transformer(
        hidden_states=(1.0 - s) * x0 + s * noise, timestep=sigma * 1000.0,
        encoder_hidden_states=prompt_embeds, return_dict=False,
    )[0]
    return F.mse_loss(velocity, noise - x0)


class VideoModels(torch.nn.Module):
    """The transformer and the text encoder, trained together."""

    def __init__(self, tokenizer, patch: int):
        super().__init__()
        self.transformer = build_transformer(patch)
        self.text_encoder = build_text_encoder(tokenizer)


def train_transformer(args) -> None:
    """One run of the transformer stage, named --run-name; --init-from starts it from another run's
    weights (a fine-tuning run: fresh optimizer, schedule and step count)."""
    checkpoint = args.work_dir / f"{args.run_name}.pt"
    data = torch.load(args.work_dir / "latents.pt", weights_only=False)
    specs = training_specs()
    tokenizer = build_tokenizer()
    input_ids, attention_mask = tokenize(tokenizer, [caption(spec) for spec in specs] + [""])
    empty_index = len(specs)

    torch.manual_seed(args.seed)
    if args.init_from is not None:  # a fine-tuning run keeps the architecture it starts from
        args.patch_size = torch.load(args.init_from, weights_only=False)["args"].get("patch_size", 4)
    models = VideoModels(tokenizer, args.patch_size)
    ema = copy.deepcopy(models).requires_grad_(False)
    optimizer = torch.optim.AdamW(models.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.99))
    state = {"step": 0, "elapsed": 0.0, "done": False, "loss_avg": None}
    state["fractions"] = []  # the schedule's progress at every step, for --replay-schedule
    generator = torch.Generator().manual_seed(args.seed)
    resumed = resume(checkpoint, args.run_name, models, optimizer, ema, generator)
    if resumed is not None:
        state = resumed
    elif args.init_from is not None:
        initial = torch.load(args.init_from, weights_only=False)
        models.load_state_dict(initial["model"])
        ema.load_state_dict(initial["ema"])
        log(f"{args.run_name}: starting from {args.init_from} (step {initial['state']['step']})")
    if state["done"]:
        log(f"{args.run_name}: already trained")
        return
    replay = None
    if args.replay_schedule is not None:  # a step-exact rerun of a time-budgeted run
        replay = torch.load(args.replay_schedule, weights_only=False)["state"]["fractions"]
        log(f"{args.run_name}: replaying the {len(replay)}-step schedule of {args.replay_schedule}")

    def save(path: Path) -> None:
        save_atomically(
            {"model": models.state_dict(), "ema": ema.state_dict(), "optimizer": optimizer.state_dict(),
             "generator": generator.get_state(), "state": state, "args": vars(args)},
            path,
        )

    channel_mean = torch.tensor(data["latents_mean"]).view(1, -1, 1, 1, 1)
    channel_std = torch.tensor(data["latents_std"]).view(1, -1, 1, 1, 1)
    captions_and_latent_stats = (input_ids, attention_mask, empty_index, channel_mean, channel_std)

    def loss_at(step: int, fraction: float) -> tuple[torch.Tensor, dict]:
        state.setdefault("fractions", []).append(fraction)
        loss = flow_matching_loss(models, data, args.batch, None, generator, args, *captions_and_latent_stats)
        if args.image_batch:  # first frames as one-frame videos
            loss = loss + flow_matching_loss(models, data, args.image_batch, 1, generator, args,
                                             *captions_and_latent_stats)
        return loss, {}

    def keep_snapshots(progress: dict) -> None:
        if args.snapshot_every and progress["step"] % args.snapshot_every == 0:
            save(args.work_dir / f"{args.run_name}-{progress['step']}.pt")  # for evaluating mid-run

    run_steps(args.run_name, state, models, optimizer, Schedule(args.lr, args.warmup, args.steps, args.max_minutes),
              loss_at, lambda: save(checkpoint), args.checkpoint_minutes, ema=ema, ema_decay=args.ema_decay,
              after_step=keep_snapshots,
              fraction_at=None if replay is None else (lambda step: replay[step] if step < len(replay) else 1.0))


# ----------------------------------------------------------------------------- export


def latent_frame_targets(clips: torch.Tensor, temporal: int, spatial: int) -> torch.Tensor:
    """[N, 3, T, H, W] in [-1, 1] -> [N, 3, latent T, H/spatial, W/spatial] in [0, 1]: each latent
    frame's pixels averaged (the causal VAE's first latent frame holds frame 0 alone, every later
    one the next `temporal` frames)."""
    first = clips[:, :, :1]
    rest = clips[:, :, 1:]
    n, c, t, h, w = rest.shape
    rest = rest.reshape(n, c, t // temporal, temporal, h, w).mean(dim=3)
    frames = torch.cat([first, rest], dim=2)
    pooled = F.avg_pool3d(frames, kernel_size=(1, spatial, spatial))
    return (pooled + 1.0) / 2.0


@torch.no_grad()
def preview_factors(vae, seed: int) -> tuple[list[list[float]], list[float]]:
    """Least-squares linear map from normalized latents (as the transformer sees them) to each
    latent frame's pixels, downsampled to the latent grid, in [0, 1] RGB."""
    rng = np.random.default_rng([seed, 2])
    clips = to_video_tensor([render(random_spec(rng), rng) for _ in range(256)])
    latents = vae.encode(clips).latent_dist.mean
    latents_mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    latents_std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    normalized = (latents - latents_mean) / latents_std
    targets = latent_frame_targets(clips, vae.config.scale_factor_temporal, vae.config.scale_factor_spatial)
    inputs = normalized.permute(0, 2, 3, 4, 1).reshape(-1, normalized.shape[1])
    inputs = torch.cat([inputs, torch.ones(len(inputs), 1)], dim=1)
    outputs = targets.permute(0, 2, 3, 4, 1).reshape(-1, 3)
    solution = torch.linalg.lstsq(inputs.double(), outputs.double()).solution.float()
    factors = [[round(v, 5) for v in row] for row in solution[:-1].tolist()]
    bias = [round(v, 5) for v in solution[-1].tolist()]
    return factors, bias


def transformer_runs(saved: dict) -> list[dict]:
    """The runs that made these weights, first run first: each one's steps and minutes, and the
    settings that decide its result (a fine-tuning run names the run it started from)."""
    runs = []
    while saved is not None:
        run_args = saved["args"]
        runs.append({
            "run": run_args.get("run_name", "transformer"),
            "seed": run_args["seed"],
            "patch_size": run_args.get("patch_size", 4),
            "steps": saved["state"]["step"],
            "minutes": round(saved["state"]["elapsed"] / 60, 1),
            "batch": run_args["batch"],
            "lr": run_args["lr"],
            "sigma_sampling": run_args.get("sigma_sampling", "logit-normal"),
            "image_batch": run_args.get("image_batch", 0),
        })
        parent = run_args.get("init_from")
        saved = torch.load(parent, weights_only=False) if parent else None
    return runs[::-1]


def export(args) -> None:
    from diffusers import WanPipeline

    checkpoint = args.export_checkpoint or args.work_dir / "transformer.pt"
    saved = torch.load(checkpoint, weights_only=False)
    statistics = torch.load(args.work_dir / "latents.pt", weights_only=False)
    vae_state = torch.load(args.work_dir / "vae.pt", weights_only=False)
    tokenizer = build_tokenizer()
    models = VideoModels(tokenizer, saved["args"].get("patch_size", 4))  # runs before the flag: 4
    models.load_state_dict(saved["ema" if not args.export_raw else "model"])
    vae = build_vae(
        latents_mean=[round(v, 5) for v in statistics["latents_mean"]],
        latents_std=[round(v, 5) for v in statistics["latents_std"]],
    )
    vae.load_state_dict(vae_state["model"])
    vae.eval()
    pipe = WanPipeline(
        tokenizer=tokenizer,
        text_encoder=models.text_encoder.eval(),
        vae=vae,
        scheduler=build_scheduler(),
        transformer=models.transformer.eval(),
    )
    args.out.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(args.out, safe_serialization=True)
    factors, bias = preview_factors(vae, args.seed)
    defaults = {
        "height": FRAME_SIZE,
        "width": FRAME_SIZE,
        "num_frames": NUM_FRAMES,
        "fps": FPS,
        "max_sequence_length": TEXT_LENGTH,
        "num_inference_steps": args.inference_steps,
        "guidance_scale": args.guidance_scale,
        "negative_prompt": "",
        "example_prompts": example_prompts(8, seed=7),
        "vocabulary": sorted(vocabulary()),
        "preview_rgb_factors": factors,
        "preview_rgb_bias": bias,
        "training": {
            "vae_steps": vae_state["state"]["step"],
            "vae_minutes": round(vae_state["state"]["elapsed"] / 60, 1),
            "transformer_runs": transformer_runs(saved),
            "weights": "raw" if args.export_raw else "ema",
        },
    }
    (args.out / "stepstudio.json").write_text(json.dumps(defaults, indent=2) + "\n")
    log(f"export: wrote {args.out} (step {saved['state']['step']}, {'raw' if args.export_raw else 'EMA'} weights)")


# ----------------------------------------------------------------------------- CLI


# --stage's choices, in the order --stage all runs them.
STAGES = {"vae": train_vae, "ceiling": vae_ceiling, "latents": encode_latents, "transformer": train_transformer,
          "export": export}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", choices=(*STAGES, "all"), default="all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("assets/shapes-wan"))
    parser.add_argument("--work-dir", type=Path, default=Path("/work/train-video"), help="checkpoints, outside the repo")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--checkpoint-minutes", type=float, default=3.0)
    parser.add_argument("--vae-steps", type=int, default=100000)
    parser.add_argument("--vae-minutes", type=float, default=30.0, help="time budget (0: steps only)")
    parser.add_argument("--vae-batch", type=int, default=8)
    parser.add_argument("--vae-lr", type=float, default=1e-3)
    parser.add_argument("--vae-warmup", type=int, default=100)
    parser.add_argument("--kl-weight", type=float, default=1e-3, help="per latent element")
    parser.add_argument("--renders-per-scene", type=int, default=6)
    parser.add_argument("--steps", type=int, default=100000, help="transformer steps")
    parser.add_argument("--max-minutes", type=float, default=0.0, help="transformer time budget (0: steps only)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--patch-size", type=int, choices=(2, 4), default=2,
                        help="transformer patch (1, p, p) on the 16x16 latents")
    parser.add_argument("--image-batch", type=int, default=0,
                        help="first frames trained as one-frame videos beside each batch of clips (0: clips only)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--ema-decay", type=float, default=0.999)
    parser.add_argument("--empty-caption-rate", type=float, default=0.1)
    parser.add_argument("--sigma-mean", type=float, default=math.log(FLOW_SHIFT) / 2,
                        help="logit-normal mean of the noise level")
    parser.add_argument("--sigma-std", type=float, default=1.0)
    parser.add_argument("--sigma-sampling", choices=("logit-normal", "shifted-uniform"), default="shifted-uniform")
    parser.add_argument("--run-name", default="transformer", help="the run's checkpoint is <work-dir>/<run-name>.pt")
    parser.add_argument("--init-from", type=Path, default=None, help="start from another run's checkpoint")
    parser.add_argument("--replay-schedule", type=Path, default=None,
                        help="take the learning-rate schedule, step by step, from this run's checkpoint")
    parser.add_argument("--snapshot-every", type=int, default=0, help="keep a copy of the weights every N steps")
    parser.add_argument("--inference-steps", type=int, default=20, help="num_inference_steps in stepstudio.json")
    parser.add_argument("--guidance-scale", type=float, default=4.0, help="CFG default written to stepstudio.json")
    parser.add_argument("--export-checkpoint", type=Path, default=None, help="default: <work-dir>/transformer.pt")
    parser.add_argument("--export-raw", action="store_true", help="export the raw weights instead of the EMA")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    run_stages(parse_args(argv), STAGES)


if __name__ == "__main__":
    main()

"""Train the built-in shapes model (assets/shapes-flux) from a seed, on CPU.

Stages (run in order; each resumes from its own periodic checkpoint in --work-dir):

    vae          AutoencoderKL on fresh jittered renders: L1 + 0.5 MSE + KL, plus 0.2 x the mean
                 of each image's worst 1% pixel errors (stray pixels otherwise break shape/size).
    latents      encode a balanced set (every scene x --renders-per-scene jittered renders) once
                 with the frozen VAE; measure the latent shift/scale.
    transformer  FluxTransformer2DModel + CLIP + T5 trained jointly with the rectified-flow
                 objective, in FluxPipeline's conventions (packed latents, img_ids/txt_ids,
                 sigma as timestep); ~10% empty captions so true CFG with "" works; EMA.
    export       write the diffusers folder (EMA weights, safetensors) + stepstudio.json.

The shipped checkpoint (assets/shapes-flux/README.md has the details) was made with:

    python -m tools.train_builtin --stage vae --seed 0 --vae-minutes 12 --vae-batch 16
    python -m tools.train_builtin --stage latents --seed 0 --renders-per-scene 8
    python -m tools.train_builtin --stage transformer --seed 0 --steps 100000 --max-minutes 70 --batch 16
    python -m tools.train_builtin --stage export --seed 0 --guidance-scale 3 --out assets/shapes-flux

--vae-minutes / --max-minutes are time budgets (the cosine schedule follows elapsed time); for a
step-exact rerun pass the recorded step counts with a budget of 0 instead.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from tools.builtin_components import (
    TEXT_LENGTH,
    build_clip_text_encoder,
    build_clip_tokenizer,
    build_scheduler,
    build_t5_text_encoder,
    build_t5_tokenizer,
    build_transformer,
    build_vae,
)
from tools.shapes_world import (
    all_specs,
    caption,
    example_prompts,
    random_spec,
    render,
    vocabulary,
)
from tools.training_loop import Schedule, log, resume, run_stages, run_steps, save_atomically, train_vae_stage


def to_tensor(images) -> torch.Tensor:
    """PIL images -> [B, 3, H, W] in [-1, 1] (the pipeline's VaeImageProcessor convention)."""
    array = np.stack([np.asarray(image, dtype=np.float32) for image in images])
    return torch.from_numpy(array).permute(0, 3, 1, 2) / 127.5 - 1.0


# ----------------------------------------------------------------------------- VAE


def vae_loss(vae, images: torch.Tensor, kl_weight: float) -> tuple[torch.Tensor, dict]:
    posterior = vae.encode(images).latent_dist
    reconstruction = vae.decode(posterior.sample()).sample
    pixel_error = (reconstruction - images).abs().mean(dim=1).flatten(1)  # [B, H*W]
    worst = pixel_error.topk(max(1, pixel_error.shape[1] // 100), dim=1).values.mean()
    l1 = pixel_error.mean()
    mse = F.mse_loss(reconstruction, images)
    kl = posterior.kl().mean() / posterior.mean[0].numel()
    loss = l1 + 0.5 * mse + kl_weight * kl + 0.2 * worst
    return loss, {"l1": l1.item(), "worst1%": worst.item(), "kl": kl.item()}


def train_vae(args) -> None:
    torch.manual_seed(args.seed)

    def batch_at(step: int, rng: np.random.Generator) -> torch.Tensor:
        specs = [random_spec(rng) for _ in range(args.vae_batch)]
        return to_tensor([render(spec, rng) for spec in specs])

    train_vae_stage(args, build_vae(), batch_at, vae_loss, warmup=100, log_every=50)


def load_vae(args):
    vae = build_vae()
    vae.load_state_dict(torch.load(args.work_dir / "vae.pt", weights_only=False)["model"])
    return vae.eval().requires_grad_(False)


# ----------------------------------------------------------------------------- latents


@torch.no_grad()
def encode_latents(args) -> None:
    """Balanced set: every scene, --renders-per-scene jittered renders each."""
    path = args.work_dir / "latents.pt"
    if path.exists():
        log("latents: already encoded")
        return
    vae = load_vae(args)
    specs = all_specs()
    rng = np.random.default_rng([args.seed, 1])
    means, logvars, scene_index = [], [], []
    for repeat in range(args.renders_per_scene):
        for start in range(0, len(specs), 256):
            chunk = specs[start : start + 256]
            posterior = vae.encode(to_tensor([render(spec, rng) for spec in chunk])).latent_dist
            means.append(posterior.mean.half())
            logvars.append(posterior.logvar.half())
            scene_index.extend(range(start, start + len(chunk)))
        log(f"latents: pass {repeat + 1}/{args.renders_per_scene}")
    mean = torch.cat(means)
    logvar = torch.cat(logvars)
    sample = mean.float() + torch.randn_like(mean, dtype=torch.float32) * (0.5 * logvar.float()).exp()
    shift = sample.mean().item()
    scale = 1.0 / sample.std().item()
    log(f"latents: {len(mean)} images, shift_factor {shift:.4f}, scaling_factor {scale:.4f}")
    save_atomically(
        {"mean": mean, "logvar": logvar, "scene": torch.tensor(scene_index), "shift": shift, "scale": scale}, path
    )


# ----------------------------------------------------------------------------- transformer


def pack_latents(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] -> [B, H/2 * W/2, 4C], exactly as FluxPipeline._pack_latents."""
    b, c, h, w = latents.shape
    latents = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return latents.reshape(b, (h // 2) * (w // 2), c * 4)


def image_ids(latent_height: int, latent_width: int) -> torch.Tensor:
    """As FluxPipeline._prepare_latent_image_ids for the packed grid."""
    ids = torch.zeros(latent_height // 2, latent_width // 2, 3)
    ids[..., 1] += torch.arange(latent_height // 2)[:, None]
    ids[..., 2] += torch.arange(latent_width // 2)[None, :]
    return ids.reshape(-1, 3)


class TextModels(torch.nn.Module):
    """The two text encoders trained jointly with the transformer."""

    def __init__(self, clip_tokenizer, t5_tokenizer):
        super().__init__()
        self.clip = build_clip_text_encoder(clip_tokenizer)
        self.t5 = build_t5_text_encoder(t5_tokenizer)

    def forward(self, clip_ids: torch.Tensor, t5_ids: torch.Tensor):
        pooled = self.clip(clip_ids, output_hidden_states=False).pooler_output
        sequence = self.t5(t5_ids, output_hidden_states=False)[0]
        return pooled, sequence


def tokenize_all(texts: list[str], clip_tokenizer, t5_tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids exactly as FluxPipeline makes them (max_length padding, no attention mask)."""
    clip_ids = clip_tokenizer(
        texts, padding="max_length", max_length=clip_tokenizer.model_max_length, truncation=True, return_tensors="pt"
    ).input_ids
    t5_ids = t5_tokenizer(
        texts, padding="max_length", max_length=TEXT_LENGTH, truncation=True, return_tensors="pt"
    ).input_ids
    return clip_ids, t5_ids


def sample_sigmas(batch: int, generator: torch.Generator, mean: float, std: float) -> torch.Tensor:
    """Logit-normal noise levels; mean > 0 leans to the noisier half, where shape is decided,
    and matches the inference schedule's shift (mu = 0.5 at 64x64)."""
    return torch.sigmoid(mean + std * torch.randn(batch, generator=generator))


def train_transformer(args) -> None:
    checkpoint = args.work_dir / "transformer.pt"
    data = torch.load(args.work_dir / "latents.pt", weights_only=False)
    specs = all_specs()
    clip_tokenizer, t5_tokenizer = build_clip_tokenizer(), build_t5_tokenizer()
    texts = [caption(spec) for spec in specs] + [""]
    clip_ids, t5_ids = tokenize_all(texts, clip_tokenizer, t5_tokenizer)
    empty_index = len(specs)

    torch.manual_seed(args.seed)
    transformer = build_transformer()
    text_models = TextModels(clip_tokenizer, t5_tokenizer)
    modules = torch.nn.ModuleDict({"transformer": transformer, "text": text_models})
    ema = copy.deepcopy(modules).requires_grad_(False)
    optimizer = torch.optim.AdamW(modules.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.99))
    generator = torch.Generator().manual_seed(args.seed)
    state = resume(checkpoint, "transformer", modules, optimizer, ema, generator) or {
        "step": 0, "elapsed": 0.0, "done": False, "loss_avg": None}
    if state["done"]:
        log("transformer: already trained")
        return

    def save(path: Path) -> None:
        save_atomically(
            {
                "model": modules.state_dict(),
                "ema": ema.state_dict(),
                "optimizer": optimizer.state_dict(),
                "generator": generator.get_state(),
                "state": state,
                "shift": data["shift"],
                "scale": data["scale"],
            },
            path,
        )

    mean, logvar, scene = data["mean"], data["logvar"], data["scene"]
    shift, scale = data["shift"], data["scale"]
    _, _, latent_h, latent_w = mean.shape
    img_ids = image_ids(latent_h, latent_w)
    txt_ids = torch.zeros(TEXT_LENGTH, 3)

    def loss_at(step: int, fraction: float) -> tuple[torch.Tensor, dict]:
        rows = torch.randint(len(mean), (args.batch,), generator=generator)
        std = (0.5 * logvar[rows].float()).exp()
        noise_free = mean[rows].float() + std * torch.randn(std.shape, generator=generator)
        x0 = pack_latents((noise_free - shift) * scale)
        text_rows = scene[rows].clone()
        text_rows[torch.rand(args.batch, generator=generator) < args.empty_caption_rate] = empty_index
        sigma = sample_sigmas(args.batch, generator, args.sigma_mean, args.sigma_std)
        noise = torch.randn(x0.shape, generator=generator)
        x_t = (1.0 - sigma[:, None, None]) * x0 + sigma[:, None, None] * noise
        pooled, sequence = text_models(clip_ids[text_rows], t5_ids[text_rows])
        velocity = transformer(
            hidden_states=x_t,
            timestep=sigma,
            pooled_projections=pooled,
            encoder_hidden_states=sequence,
            txt_ids=txt_ids,
            img_ids=img_ids,
            return_dict=False,
        )[0]
        return F.mse_loss(velocity, noise - x0), {}

    run_steps("transformer", state, modules, optimizer, Schedule(args.lr, args.warmup, args.steps, args.max_minutes),
              loss_at, lambda: save(checkpoint), args.checkpoint_minutes, ema=ema, ema_decay=args.ema_decay)


# ----------------------------------------------------------------------------- export


@torch.no_grad()
def preview_factors(vae, shift: float, scale: float, seed: int) -> tuple[list[list[float]], list[float]]:
    """Least-squares linear map from normalized latents ([16, 16, 16] per image) to the image
    downsampled to 16x16 in [0, 1] RGB, so a projection of the predicted x0 previews the image."""
    rng = np.random.default_rng([seed, 2])
    images = [render(random_spec(rng), rng) for _ in range(512)]
    latents = (vae.encode(to_tensor(images)).latent_dist.mean - shift) * scale  # [N, 16, 16, 16]
    targets = F.avg_pool2d((to_tensor(images) + 1.0) / 2.0, kernel_size=4)  # [N, 3, 16, 16]
    inputs = latents.permute(0, 2, 3, 1).reshape(-1, latents.shape[1])
    inputs = torch.cat([inputs, torch.ones(len(inputs), 1)], dim=1)
    outputs = targets.permute(0, 2, 3, 1).reshape(-1, 3)
    solution = torch.linalg.lstsq(inputs.double(), outputs.double()).solution.float()
    factors = [[round(v, 5) for v in row] for row in solution[:-1].tolist()]
    bias = [round(v, 5) for v in solution[-1].tolist()]
    return factors, bias


def export(args) -> None:
    from diffusers import FluxPipeline

    saved = torch.load(args.work_dir / "transformer.pt", weights_only=False)
    shift, scale = saved["shift"], saved["scale"]
    clip_tokenizer, t5_tokenizer = build_clip_tokenizer(), build_t5_tokenizer()
    transformer = build_transformer()
    text_models = TextModels(clip_tokenizer, t5_tokenizer)
    modules = torch.nn.ModuleDict({"transformer": transformer, "text": text_models})
    modules.load_state_dict(saved["ema" if not args.export_raw else "model"])
    vae = load_vae(args)
    vae.register_to_config(shift_factor=round(shift, 4), scaling_factor=round(scale, 4))
    pipe = FluxPipeline(
        scheduler=build_scheduler(),
        vae=vae,
        text_encoder=text_models.clip.eval(),
        tokenizer=clip_tokenizer,
        text_encoder_2=text_models.t5.eval(),
        tokenizer_2=t5_tokenizer,
        transformer=transformer.eval(),
    )
    args.out.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(args.out, safe_serialization=True)
    factors, bias = preview_factors(vae, shift, scale, args.seed)
    defaults = {
        "height": 64,
        "width": 64,
        "max_sequence_length": TEXT_LENGTH,
        "num_inference_steps": 20,
        "guidance_scale": args.guidance_scale,
        "negative_prompt": "",
        "example_prompts": example_prompts(8, seed=7),
        "vocabulary": sorted(vocabulary()),
        "preview_rgb_factors": factors,
        "preview_rgb_bias": bias,
        "training": {"seed": args.seed, "transformer_steps": saved["state"]["step"],
                     "transformer_minutes": round(saved["state"]["elapsed"] / 60, 1),
                     "weights": "raw" if args.export_raw else "ema"},
    }
    (args.out / "stepstudio.json").write_text(json.dumps(defaults, indent=2) + "\n")
    log(f"export: wrote {args.out} (step {saved['state']['step']}, {'raw' if args.export_raw else 'EMA'} weights)")


# ----------------------------------------------------------------------------- CLI


# --stage's choices, in the order --stage all runs them.
STAGES = {"vae": train_vae, "latents": encode_latents, "transformer": train_transformer, "export": export}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", choices=(*STAGES, "all"), default="all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("assets/shapes-flux"))
    parser.add_argument("--work-dir", type=Path, default=Path("/work/train_ckpt"), help="checkpoints, outside the repo")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--checkpoint-minutes", type=float, default=5.0)
    parser.add_argument("--vae-steps", type=int, default=100000)
    parser.add_argument("--vae-minutes", type=float, default=12.0, help="time budget (0: steps only)")
    parser.add_argument("--vae-batch", type=int, default=32)
    parser.add_argument("--vae-lr", type=float, default=2e-3)
    parser.add_argument("--kl-weight", type=float, default=1e-3, help="per latent element")
    parser.add_argument("--renders-per-scene", type=int, default=10)
    parser.add_argument("--steps", type=int, default=12000, help="transformer steps")
    parser.add_argument("--max-minutes", type=float, default=0.0, help="transformer time budget (0: steps only)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--ema-decay", type=float, default=0.999)
    parser.add_argument("--empty-caption-rate", type=float, default=0.1)
    parser.add_argument("--sigma-mean", type=float, default=0.5, help="logit-normal mean of the noise level")
    parser.add_argument("--sigma-std", type=float, default=1.0)
    parser.add_argument("--guidance-scale", type=float, default=4.0, help="true-CFG default written to stepstudio.json")
    parser.add_argument("--export-raw", action="store_true", help="export the raw weights instead of the EMA")
    return parser.parse_args()


def main() -> None:
    run_stages(parse_args(), STAGES)


if __name__ == "__main__":
    main()

"""Train shapes-flux v2 (every canvas from 48 to 128 px, shapes anywhere, captions that leave parts
out) from a seed, on CPU. The world is tools/shapes_world_v2.py; the components are v1's classes
and configs (tools/builtin_components.py) with the v2 vocabulary.

Stages (run in order; each resumes from its own periodic checkpoint in --work-dir):

    vae          AutoencoderKL on fresh renders, each batch one random canvas (v1's loss).
    latents      --per-canvas scenes on each of the 121 canvases, encoded once (posterior mean and
                 log-variance), with the scenes kept so captions are drawn afresh at every step.
    transformer  FluxTransformer2DModel + CLIP + T5 trained jointly (rectified flow, FluxPipeline's
                 conventions); each batch one canvas; each caption leaves parts out at random; 10%
                 empty captions for true CFG; the noise level's logit-normal mean is the inference
                 schedule's shift mu at that canvas's token count; EMA.
    export       the diffusers folder (EMA weights, safetensors) + stepstudio.json.

Time budgets (--vae-minutes, --max-minutes) drive the cosine schedules; record the step counts the
log prints to rerun a run step for step (pass them with a budget of 0).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from tools.builtin_components import (
    TEXT_LENGTH,
    V1_BLOCKS,
    build_clip_tokenizer,
    build_scheduler,
    build_t5_tokenizer,
    build_transformer,
    build_vae,
)
from tools.grow_transformer import grow_into
from tools.recolor_rows import recolor_sources
from tools.shapes_world_v2 import (
    CANVAS_SIDES,
    Scene,
    caption,
    random_canvas,
    random_caption,
    random_scene,
    render,
    vocabulary,
)
from tools.train_builtin import TextModels, image_ids, pack_latents, to_tensor, tokenize_all, vae_loss
from tools.training_loop import (Schedule, log, progress_fraction, resume, run_stages, run_steps, save_atomically,
                                 train_vae_stage)

CANVASES: tuple[tuple[int, int], ...] = tuple((w, h) for w in CANVAS_SIDES for h in CANVAS_SIDES)
# Canvases whose long side is at least this many times the short one count as wide (56 of 121).
WIDE_ASPECT = 1.4
# Canvases of at most this many pixels count as small (15 of 121: 48x48 to 64x64, 80x48): a small
# shape there spans about one token, and the sampler drops it more often than anywhere else.
SMALL_AREA = 64 * 64


def image_tokens(width: int, height: int) -> int:
    return (width // 8) * (height // 8)


def schedule_mu(tokens: int) -> float:
    """The scheduler's dynamic shift at this many image tokens (FluxPipeline's calculate_shift
    with the built-in scheduler's 64/256 tokens and 0.5/1.15 shifts)."""
    scheduler = build_scheduler().config
    slope = (scheduler.max_shift - scheduler.base_shift) / (scheduler.max_image_seq_len - scheduler.base_image_seq_len)
    return scheduler.base_shift + slope * (tokens - scheduler.base_image_seq_len)


# ----------------------------------------------------------------------------- VAE


def train_vae(args) -> None:
    torch.manual_seed(args.seed)

    def batch_at(step: int, rng: np.random.Generator) -> torch.Tensor:
        width, height = random_canvas(rng)
        return to_tensor([render(random_scene(rng, width, height)) for _ in range(args.vae_batch)])

    train_vae_stage(args, build_vae(), batch_at, vae_loss, warmup=100, log_every=50)


def load_vae(args):
    if args.vae_from:
        from diffusers import AutoencoderKL
        return AutoencoderKL.from_pretrained(args.vae_from / "vae").eval().requires_grad_(False)
    vae = build_vae()
    vae.load_state_dict(torch.load(args.work_dir / "vae.pt", weights_only=False)["model"])
    return vae.eval().requires_grad_(False)


def latent_normalization(vae, measured_shift: float, measured_scale: float) -> tuple[float, float]:
    """A VAE taken from a model folder keeps that model's normalization (a transformer
    initialized from the same folder learned in it); a VAE trained here uses what was measured."""
    if vae.config.shift_factor is not None and vae.config.scaling_factor != 1.0:
        return float(vae.config.shift_factor), float(vae.config.scaling_factor)
    return measured_shift, measured_scale


# ----------------------------------------------------------------------------- initialization


def copy_rows_by_token(new_embedding: torch.nn.Embedding, new_vocab: dict[str, int],
                       old_embedding: torch.nn.Embedding, old_vocab: dict[str, int]) -> int:
    """Copy the old model's embedding of every token both vocabularies hold (ids differ
    once words are added); new tokens keep their fresh initialization."""
    copied = 0
    with torch.no_grad():
        for token, new_id in new_vocab.items():
            old_id = old_vocab.get(token)
            if old_id is not None:
                new_embedding.weight[new_id] = old_embedding.weight[old_id]
                copied += 1
    return copied


def block_counts(args) -> tuple[int, int]:
    """(double-stream, single-stream) blocks of the transformer to train: --blocks, else the
    --init-from model's, else v1's."""
    if args.blocks:
        return tuple(args.blocks)
    if args.init_from:
        config = json.loads((args.init_from / "transformer" / "config.json").read_text())
        return config["num_layers"], config["num_single_layers"]
    return V1_BLOCKS


def initialize_from(folder: Path, transformer, text_models, clip_tokenizer, t5_tokenizer) -> None:
    """Start from a trained model folder of the same architecture (v1): the transformer as it is
    (grown by identity blocks when this one has more: `grow_into`), each text encoder with its token
    embeddings moved to the new vocabulary's ids."""
    from transformers import CLIPTextModel, CLIPTokenizer, T5EncoderModel, T5Tokenizer
    from diffusers import FluxTransformer2DModel

    grown = grow_into(transformer, FluxTransformer2DModel.from_pretrained(folder / "transformer").state_dict())
    if grown:
        log(f"init: transformer from {folder}, {grown} new blocks starting as the identity")
    for new_model, old_class, old_tokenizer_class, sub, new_tokenizer in (
        (text_models.clip, CLIPTextModel, CLIPTokenizer, "", clip_tokenizer),
        (text_models.t5, T5EncoderModel, T5Tokenizer, "_2", t5_tokenizer),
    ):
        old_model = old_class.from_pretrained(folder / f"text_encoder{sub}")
        old_tokenizer = old_tokenizer_class.from_pretrained(folder / f"tokenizer{sub}")
        new_state = new_model.state_dict()
        # Everything but the token embeddings (their row count is the vocabulary's) as it is.
        state = {k: v for k, v in old_model.state_dict().items() if v.shape == new_state[k].shape}
        skipped = set(new_state) - set(state)
        assert all("embed" in k or k == "shared.weight" for k in skipped), skipped
        new_model.load_state_dict({**new_state, **state})
        copied = copy_rows_by_token(new_model.get_input_embeddings(), new_tokenizer.get_vocab(),
                                    old_model.get_input_embeddings(), old_tokenizer.get_vocab())
        log(f"init: {type(new_model).__name__} from {folder}, {copied} of {len(new_tokenizer)} token rows copied")


# ----------------------------------------------------------------------------- latents


@torch.no_grad()
def encode_latents(args) -> None:
    path = args.work_dir / "latents.pt"
    if path.exists():
        log("latents: already encoded")
        return
    vae = load_vae(args)
    rng = np.random.default_rng([args.seed, 1])
    buckets = {}
    samples = []
    started = time.time()
    for index, (width, height) in enumerate(CANVASES):
        scenes = [random_scene(rng, width, height) for _ in range(args.per_canvas)]
        means, logvars = [], []
        for start in range(0, len(scenes), 64):
            posterior = vae.encode(to_tensor([render(s) for s in scenes[start:start + 64]])).latent_dist
            means.append(posterior.mean.half())
            logvars.append(posterior.logvar.half())
        mean, logvar = torch.cat(means), torch.cat(logvars)
        buckets[(width, height)] = {"mean": mean, "logvar": logvar,
                                    "scenes": [(s.shape, s.color, s.background, s.side, s.cx, s.cy) for s in scenes]}
        samples.append((mean[:16].float() + torch.randn(mean[:16].shape) * (0.5 * logvar[:16].float()).exp()).flatten())
        if index % 11 == 10:
            log(f"latents: {index + 1}/{len(CANVASES)} canvases, {time.time() - started:.0f} s")
    sample = torch.cat(samples)
    shift, scale = latent_normalization(vae, sample.mean().item(), 1.0 / sample.std().item())
    log(f"latents: {len(CANVASES)} canvases x {args.per_canvas}, shift_factor {shift:.4f}, scaling_factor {scale:.4f}")
    save_atomically({"buckets": buckets, "shift": shift, "scale": scale}, path)


# ----------------------------------------------------------------------------- transformer


def scene_of(row: tuple, width: int, height: int) -> Scene:
    shape, color, background, side, cx, cy = row
    return Scene(width, height, shape, color, background, side, cx, cy)


def canvas_picker(canvases: list[tuple[int, int]], wide_rate: float, small_rate: float, rng: np.random.Generator,
                  generator: torch.Generator):
    """Each batch's canvas. --wide-rate: a share of batches from the far-from-square canvases, where
    a shape's box drifts towards the canvas's own aspect; --small-rate: from the smallest canvases,
    where a small shape is most often left out; the rest (all, with both 0: the uniform draw and its
    random stream as before either existed) from every canvas alike."""
    wide = [canvas for canvas in canvases if max(canvas) >= WIDE_ASPECT * min(canvas)]
    small = [canvas for canvas in canvases if canvas[0] * canvas[1] <= SMALL_AREA]

    def pick_canvas() -> tuple[int, int]:
        if wide_rate or small_rate:
            draw = rng.random()
            for share, pool in ((wide_rate, wide), (small_rate, small)):
                if draw < share:
                    return pool[int(torch.randint(len(pool), (1,), generator=generator))]
                draw -= share
        return canvases[int(torch.randint(len(canvases), (1,), generator=generator))]

    return pick_canvas


def train_transformer(args) -> None:
    checkpoint = args.work_dir / "transformer.pt"
    data = torch.load(args.work_dir / "latents.pt", weights_only=False)
    buckets, shift, scale = data["buckets"], data["shift"], data["scale"]
    canvases = sorted(buckets)
    words = vocabulary()
    clip_tokenizer, t5_tokenizer = build_clip_tokenizer(words), build_t5_tokenizer(words)

    torch.manual_seed(args.seed)
    transformer = build_transformer(*(blocks := block_counts(args)))  # the checkpoints record `blocks`
    text_models = TextModels(clip_tokenizer, t5_tokenizer)
    if args.init_from:
        initialize_from(args.init_from, transformer, text_models, clip_tokenizer, t5_tokenizer)
    vae = load_vae(args) if args.recolor_rate else None
    modules = torch.nn.ModuleDict({"transformer": transformer, "text": text_models})
    ema = copy.deepcopy(modules).requires_grad_(False)
    optimizer = torch.optim.AdamW(modules.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.99))
    state = {"step": 0, "elapsed": 0.0, "done": False, "loss_avg": None}
    generator = torch.Generator().manual_seed(args.seed)
    rng = np.random.default_rng([args.seed, 3])
    resumed = resume(checkpoint, "transformer", modules, optimizer, ema, generator)
    if resumed is not None:
        rng = np.random.default_rng([args.seed, 3, resumed["step"]])
        state = resumed
    if state["done"] and progress_fraction(state["step"], args.steps, state["elapsed"], args.max_minutes) >= 1.0:
        log("transformer: already trained")
        return
    state["done"] = False  # a larger --steps or --max-minutes goes on training (the cosine restarts from there)

    def save(path: Path) -> None:
        save_atomically({"model": modules.state_dict(), "ema": ema.state_dict(), "optimizer": optimizer.state_dict(),
                         "generator": generator.get_state(), "state": state, "shift": shift, "scale": scale,
                         "blocks": blocks}, path)

    txt_ids = torch.zeros(TEXT_LENGTH, 3)

    pick_canvas = canvas_picker(canvases, args.wide_rate, args.small_rate, rng, generator)

    def loss_at(step: int, fraction: float) -> tuple[torch.Tensor, dict]:
        width, height = pick_canvas()
        bucket = buckets[(width, height)]
        rows = torch.randint(len(bucket["mean"]), (args.batch,), generator=generator)
        mean, logvar = bucket["mean"][rows].float(), bucket["logvar"][rows].float()
        x0 = pack_latents((mean + (0.5 * logvar).exp() * torch.randn(mean.shape, generator=generator) - shift) * scale)
        scenes = [scene_of(bucket["scenes"][int(row)], width, height) for row in rows]
        edits = [i for i in range(args.batch) if args.recolor_rate and rng.random() < args.recolor_rate]
        texts = [
            random_caption(scene, rng, drop=args.drop, name_color=True) if i in edits
            else "" if rng.random() < args.empty_caption_rate
            else random_caption(scene, rng, drop=args.drop)
            for i, scene in enumerate(scenes)
        ]
        clip_ids, t5_ids = tokenize_all(texts, clip_tokenizer, t5_tokenizer)
        mu = schedule_mu(image_tokens(width, height))
        sigma = torch.sigmoid(mu + args.sigma_std * torch.randn(args.batch, generator=generator))
        noise = torch.randn(x0.shape, generator=generator)
        source = x0
        if edits:
            source, sigma = recolor_sources(edits, scenes, x0, sigma, vae, shift, scale, rng, generator)
        x_t = (1.0 - sigma[:, None, None]) * source + sigma[:, None, None] * noise
        pooled, sequence = text_models(clip_ids, t5_ids)
        velocity = transformer(hidden_states=x_t, timestep=sigma, pooled_projections=pooled,
                               encoder_hidden_states=sequence, txt_ids=txt_ids,
                               img_ids=image_ids(height // 4, width // 4), return_dict=False)[0]
        # The velocity whose Euler step to sigma 0 lands on x0: noise - x0 on plain rows.
        return F.mse_loss(velocity, (x_t - x0) / sigma[:, None, None]), {}

    last_snapshot = state["elapsed"]

    def keep_snapshots(progress: dict) -> None:
        nonlocal last_snapshot
        if args.snapshot_minutes and progress["elapsed"] - last_snapshot > args.snapshot_minutes * 60:
            save(args.work_dir / f"transformer-{int(progress['elapsed'] / 60):04d}min.pt")
            last_snapshot = progress["elapsed"]

    run_steps("transformer", state, modules, optimizer, Schedule(args.lr, args.warmup, args.steps, args.max_minutes),
              loss_at, lambda: save(checkpoint), args.checkpoint_minutes, ema=ema, ema_decay=args.ema_decay,
              after_step=keep_snapshots)


# ----------------------------------------------------------------------------- export


@torch.no_grad()
def preview_factors(vae, shift: float, scale: float, seed: int) -> tuple[list[list[float]], list[float]]:
    """Least-squares map from normalized latents to the image averaged over 4x4 pixels, in [0, 1]
    RGB, fitted on renders of every canvas (the projection the engine's preview uses)."""
    rng = np.random.default_rng([seed, 2])
    inputs, outputs = [], []
    for _ in range(32):
        width, height = random_canvas(rng)
        images = to_tensor([render(random_scene(rng, width, height)) for _ in range(16)])
        latents = (vae.encode(images).latent_dist.mean - shift) * scale
        targets = F.avg_pool2d((images + 1.0) / 2.0, kernel_size=4)
        inputs.append(latents.permute(0, 2, 3, 1).reshape(-1, latents.shape[1]))
        outputs.append(targets.permute(0, 2, 3, 1).reshape(-1, 3))
    inputs = torch.cat(inputs)
    inputs = torch.cat([inputs, torch.ones(len(inputs), 1)], dim=1)
    solution = torch.linalg.lstsq(inputs.double(), torch.cat(outputs).double()).solution.float()
    return [[round(v, 5) for v in row] for row in solution[:-1].tolist()], [round(v, 5) for v in solution[-1].tolist()]


def example_prompts_v2(seed: int) -> list[str]:
    """Eight example prompts: the v1 form and shorter ones people type."""
    from tools.shapes_world_v2 import Named
    rng = np.random.default_rng(seed)
    forms = [Named(), Named(size=False, position=False), Named(size=False, background=False),
             Named(position=False), Named(size=False), Named(), Named(size=False, color=False, position=False),
             Named(background=False)]
    prompts = []
    for index, named in enumerate(forms):
        scene = random_scene(rng, 64, 64, size="large" if index % 2 else "small", position=None if index % 3 else "left")
        prompts.append(caption(scene, named, phrase_position=index % 2 == 1))
    return prompts


def export(args, checkpoint: Path | None = None, out: Path | None = None) -> None:
    from diffusers import FluxPipeline

    saved = torch.load(checkpoint or args.work_dir / "transformer.pt", weights_only=False)
    shift, scale = saved["shift"], saved["scale"]
    words = vocabulary()
    clip_tokenizer, t5_tokenizer = build_clip_tokenizer(words), build_t5_tokenizer(words)
    blocks = saved.get("blocks", V1_BLOCKS)  # checkpoints from before --blocks are v1's
    transformer = build_transformer(*blocks)
    text_models = TextModels(clip_tokenizer, t5_tokenizer)
    modules = torch.nn.ModuleDict({"transformer": transformer, "text": text_models})
    modules.load_state_dict(saved["ema" if not args.export_raw else "model"])
    vae = load_vae(args)
    vae.register_to_config(shift_factor=round(shift, 4), scaling_factor=round(scale, 4))
    pipe = FluxPipeline(scheduler=build_scheduler(), vae=vae, text_encoder=text_models.clip.eval(),
                        tokenizer=clip_tokenizer, text_encoder_2=text_models.t5.eval(), tokenizer_2=t5_tokenizer,
                        transformer=transformer.eval())
    out = out or args.out
    out.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(out, safe_serialization=True)
    factors, bias = preview_factors(vae, shift, scale, args.seed)
    defaults = {
        "height": 64,
        "width": 64,
        "size_range": [min(CANVAS_SIDES), max(CANVAS_SIDES)],
        "max_sequence_length": TEXT_LENGTH,
        "num_inference_steps": 20,
        "guidance_scale": args.guidance_scale,
        "negative_prompt": "",
        "example_prompts": example_prompts_v2(7),
        "vocabulary": sorted(words),
        "preview_rgb_factors": factors,
        "preview_rgb_bias": bias,
        "training": {"seed": args.seed, "transformer_steps": saved["state"]["step"],
                     "transformer_minutes": round(saved["state"]["elapsed"] / 60, 1),
                     "weights": "raw" if args.export_raw else "ema",
                     "init_from": str(args.init_from) if args.init_from else None, "recolor_rate": args.recolor_rate,
                     "wide_rate": args.wide_rate, "small_rate": args.small_rate,
                     "blocks": list(blocks)},
    }
    (out / "stepstudio.json").write_text(json.dumps(defaults, indent=2) + "\n")
    log(f"export: wrote {out} (step {saved['state']['step']}, {'raw' if args.export_raw else 'EMA'} weights)")


# ----------------------------------------------------------------------------- CLI


# --stage's choices, in the order --stage all runs them.
STAGES = {"vae": train_vae, "latents": encode_latents, "transformer": train_transformer, "export": export}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", choices=(*STAGES, "all"), default="all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("assets/shapes-flux"))
    parser.add_argument("--work-dir", type=Path, default=Path("/work/train_v2"), help="checkpoints, outside the repo")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--checkpoint-minutes", type=float, default=5.0)
    parser.add_argument("--snapshot-minutes", type=float, default=30.0, help="keep a copy this often (0: never)")
    parser.add_argument("--vae-from", type=Path, default=None,
                        help="a model folder whose VAE (and its normalization) to use instead of training one")
    parser.add_argument("--blocks", type=int, nargs=2, default=None, metavar=("DOUBLE", "SINGLE"),
                        help="default: --init-from's, else 2 4; more grows --init-from's by identity blocks")
    parser.add_argument("--init-from", type=Path, default=None,
                        help="a model folder of the same architecture to start the transformer and text encoders from")
    parser.add_argument("--vae-steps", type=int, default=100000)
    parser.add_argument("--vae-minutes", type=float, default=20.0, help="time budget (0: steps only)")
    parser.add_argument("--vae-batch", type=int, default=16)
    parser.add_argument("--vae-lr", type=float, default=2e-3)
    parser.add_argument("--kl-weight", type=float, default=1e-3, help="per latent element")
    parser.add_argument("--per-canvas", type=int, default=500, help="encoded scenes per canvas")
    parser.add_argument("--steps", type=int, default=1000000, help="transformer steps")
    parser.add_argument("--max-minutes", type=float, default=240.0, help="transformer time budget (0: steps only)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--ema-decay", type=float, default=0.999)
    parser.add_argument("--empty-caption-rate", type=float, default=0.1)
    parser.add_argument("--drop", type=float, default=0.35, help="chance each caption part is left out")
    parser.add_argument("--sigma-std", type=float, default=1.0)
    parser.add_argument("--recolor-rate", type=float, default=0.0,
                        help="share of rows trained as image-to-image from the scene in another colour")
    parser.add_argument("--wide-rate", type=float, default=0.0,
                        help=f"share of batches drawn from the canvases at least {WIDE_ASPECT}:1 (0: all alike)")
    parser.add_argument("--small-rate", type=float, default=0.0,
                        help=f"share of batches drawn from the canvases of at most {SMALL_AREA} pixels (0: all alike)")
    parser.add_argument("--guidance-scale", type=float, default=3.0, help="true-CFG default written to stepstudio.json")
    parser.add_argument("--export-raw", action="store_true", help="export the raw weights instead of the EMA")
    return parser.parse_args(argv)


def main() -> None:
    run_stages(parse_args(), STAGES)


if __name__ == "__main__":
    main()

"""Train the "outline" LoRA adapter for the built-in model (assets/shapes-flux), on CPU.

With the adapter the model draws the prompted shape as an outline (its border, ~4 px thick, in
the prompted colour; its inside the background colour); colour, shape, size, position and
background stay as prompted. No new words: the captions are the base model's own.

How (the base model's recipe, tools/train_builtin.py, with its helpers imported):
- data: the shapes world's scenes (tools/shapes_world.py) minus the held-out ones
  (`held_out_specs`: the 120 scenes of the evaluator's default prompt list, example_specs(120,
  seed 1234)), each drawn --renders-per-scene times with jitter by `render_outline` and encoded
  once by the frozen VAE (posterior mean and log-variance; a fresh posterior sample every step);
- text: the frozen CLIP and T5 encoders, run once over every caption (+ "" for the ~10% empty
  captions that keep true CFG working with the adapter on both CFG rows, as stepstudio and
  diffusers apply it);
- objective: rectified flow in FluxPipeline's conventions: packed latents, img_ids/txt_ids,
  sigma passed as the timestep, x_t = (1 - sigma) x0 + sigma noise, target noise - x0 (MSE);
  sigma = sigmoid(N(1.0, 1)), noisier than the base model's N(0.5, 1): whether a shape comes out
  filled or as a ring is decided early in sampling (outlined rate on the 120 held-out prompts
  after 1800-2400 steps: sigma mean 0.0 -> 0.77, 0.5 -> 0.85, 1.0 -> 0.94, 1.5 -> 0.89);
- adapter: PEFT LoRA (`transformer.add_adapter(LoraConfig(...))`) on the transformer only; the base
  weights and both text encoders stay frozen. AdamW, warmup then cosine, grad clip 1.0.
- output: `FluxPipeline.save_lora_weights` with the LoraConfig as the file's adapter metadata, the
  PEFT/diffusers format stepstudio's loader (pipelines/lora_adapters.py) reads; weights stored
  as float16 (--dtype) to keep the file small.

The shipped file (assets/loras/shapes-flux/README.md has the numbers) was made with:

    python -m tools.train_lora --seed 0 --steps 1800 --minutes 0 --rank 8 --threads 1 \\
        --out assets/loras/shapes-flux/outline.safetensors

Deterministic given --seed and --steps with --minutes 0 (same machine, torch build and --threads);
with --minutes > 0 training stops at the time budget and the cosine follows elapsed time, as in
tools/train_builtin.py.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from pipelines.loader import BUILTIN_MODEL_DIR
from tools.builtin_components import TEXT_LENGTH
from tools.shapes_world import OUTLINE_THICKNESS_PIXELS, ShapeSpec, all_specs, caption, example_specs, render_outline
from tools.train_builtin import image_ids, pack_latents, sample_sigmas, to_tensor, tokenize_all
from tools.training_loop import Schedule, log, run_steps

DEFAULT_MODEL = BUILTIN_MODEL_DIR  # the loader's own path to it, from any working directory
DEFAULT_OUT = Path("assets/loras/shapes-flux/outline.safetensors")
# The adapter's layers: every attention projection of both streams, the feed-forwards and the
# single blocks' MLP/output projections (PEFT matches these names at the end of a module name).
TARGET_MODULES: tuple[str, ...] = (
    "to_q", "to_k", "to_v", "to_out.0",
    "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
    "ff.net.0.proj", "ff.net.2",
    "proj_mlp", "proj_out",
)
# The evaluator's default prompt list (tools/evaluate_builtin.py: example_prompts(n, seed 1234),
# n <= 120 gives a subset of these 120 scenes) is held out of training.
HELD_OUT_SCENES, HELD_OUT_SEED = 120, 1234


def held_out_specs() -> list[ShapeSpec]:
    """Scenes the adapter never sees in training (every shape, size, position and colour)."""
    return example_specs(HELD_OUT_SCENES, seed=HELD_OUT_SEED)


def training_specs(max_scenes: int | None = None) -> list[ShapeSpec]:
    """Every scene but the held-out ones, in all_specs order; `max_scenes` keeps an even stride."""
    held_out = set(held_out_specs())
    specs = [spec for spec in all_specs() if spec not in held_out]
    if max_scenes is not None and max_scenes < len(specs):
        specs = [specs[i] for i in np.linspace(0, len(specs) - 1, max_scenes).round().astype(int)]
    return specs


@torch.no_grad()
def encode_outlines(vae, specs: list[ShapeSpec], renders: int, thickness: float, seed: int):
    """Posterior mean/log-variance of every scene's outline renders, and the scene of each row."""
    rng = np.random.default_rng([seed, 1])
    means, logvars, scenes = [], [], []
    for _ in range(renders):
        for start in range(0, len(specs), 256):
            chunk = specs[start : start + 256]
            posterior = vae.encode(to_tensor([render_outline(spec, rng, thickness) for spec in chunk])).latent_dist
            means.append(posterior.mean)
            logvars.append(posterior.logvar)
            scenes.extend(range(start, start + len(chunk)))
    return torch.cat(means), torch.cat(logvars), torch.tensor(scenes)


@torch.no_grad()
def encode_texts(pipe, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(pooled CLIP [N, 64], T5 sequence [N, 16, 64]) from the frozen encoders, with the token ids
    made exactly as FluxPipeline makes them (train_builtin.tokenize_all)."""
    clip_ids, t5_ids = tokenize_all(texts, pipe.tokenizer, pipe.tokenizer_2)
    pooled = pipe.text_encoder(clip_ids, output_hidden_states=False).pooler_output
    sequence = pipe.text_encoder_2(t5_ids, output_hidden_states=False)[0]
    return pooled, sequence


def lora_metadata(args) -> dict:
    return {"r": args.rank, "lora_alpha": args.alpha, "target_modules": list(args.target_modules),
            "lora_dropout": 0.0, "init_lora_weights": True}


def save_adapter(transformer, args, path: Path) -> None:
    """The PEFT adapter's weights (`transformer.<module>.lora_A/B.weight`) and its LoraConfig as
    metadata, in the file diffusers' FluxPipeline.save_lora_weights writes."""
    from peft.utils import get_peft_model_state_dict

    layers = {key: value.detach().to(getattr(torch, args.dtype)).contiguous()
              for key, value in get_peft_model_state_dict(transformer).items()}
    write_adapter(layers, lora_metadata(args), path)


def write_adapter(layers: dict[str, torch.Tensor], metadata: dict, path: Path) -> None:
    """`layers` (`<module>.lora_A/B.weight`) and their LoraConfig as the file diffusers'
    FluxPipeline.save_lora_weights writes, at `path`."""
    from diffusers import FluxPipeline

    path.parent.mkdir(parents=True, exist_ok=True)
    FluxPipeline.save_lora_weights(path.parent, transformer_lora_layers=layers,
                                   transformer_lora_adapter_metadata=metadata, weight_name=path.name)


def frozen_pipeline(args):
    """The base model's FluxPipeline, every component frozen: (pipe, latent shift, latent scale)."""
    from diffusers import FluxPipeline

    torch.manual_seed(args.seed)
    pipe = FluxPipeline.from_pretrained(args.model, use_safetensors=True)
    for component in (pipe.vae, pipe.text_encoder, pipe.text_encoder_2, pipe.transformer):
        component.eval().requires_grad_(False)
    return pipe, pipe.vae.config.shift_factor, pipe.vae.config.scaling_factor


def with_adapter(transformer, args) -> list:
    """Add the PEFT LoRA adapter to the transformer; its trainable parameters."""
    from peft import LoraConfig

    transformer.add_adapter(LoraConfig(r=args.rank, lora_alpha=args.alpha, target_modules=list(args.target_modules),
                                       lora_dropout=0.0, init_lora_weights=True))
    parameters = [p for p in transformer.parameters() if p.requires_grad]
    if args.init is not None:
        load_initial_adapter(transformer, args.init)
    log(f"lora: rank {args.rank}, alpha {args.alpha}, {sum(p.numel() for p in parameters):,} parameters "
        f"in {len(parameters) // 2} layers" + (f", from {args.init}" if args.init is not None else ""))
    return parameters


def load_initial_adapter(transformer, path: Path) -> None:
    """Copy a saved adapter's weights (the file `save_adapter` writes) into the freshly added one,
    so a run continues an earlier run's adapter (its optimizer state starts afresh). Every layer
    must match in name and shape: a different rank or target list is refused."""
    from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    saved = {key.removeprefix("transformer."): value for key, value in load_file(path).items()}
    expected = get_peft_model_state_dict(transformer)
    shapes = {key: tuple(value.shape) for key, value in saved.items()}
    wanted = {key: tuple(value.shape) for key, value in expected.items()}
    if shapes != wanted:
        differing = sorted(set(shapes.items()) ^ set(wanted.items()))[:3]
        raise SystemExit(f"--init {path}: its layers differ from this run's adapter (rank or targets), e.g. {differing}")
    set_peft_model_state_dict(transformer, {key: value.float() for key, value in saved.items()})


def train_adapter(transformer, optimizer, args, state: dict, loss_at, after_step=None) -> None:
    """Both outline trainers' loop: the shared step loop (tools/training_loop.run_steps) on the
    adapter's parameters; nothing checkpointed on the way (a run is minutes long; `finish` writes
    the adapter once)."""
    run_steps("lora", state, transformer, optimizer, Schedule(args.lr, args.warmup, args.steps, args.minutes),
              loss_at, save=lambda: None, checkpoint_minutes=math.inf, log_every=args.log_every,
              after_step=after_step)


def finish(transformer, args, parameters: list, state: dict, started_all: float) -> dict:
    """Save the adapter to args.out; the run's summary (logged)."""
    save_adapter(transformer, args, args.out)
    loss_avg = state.get("loss_avg")
    summary = {"steps": state["step"], "train_minutes": round(state["elapsed"] / 60, 2),
               "total_minutes": round((time.time() - started_all) / 60, 2),
               "loss_avg": round(loss_avg, 4) if loss_avg is not None else None, "file": str(args.out),
               "bytes": args.out.stat().st_size, "parameters": sum(p.numel() for p in parameters)}
    log("done: " + json.dumps(summary))
    return summary


def train(args) -> dict:
    started_all = time.time()
    pipe, shift, scale = frozen_pipeline(args)

    specs = training_specs(args.max_scenes)
    mean, logvar, scene = encode_outlines(pipe.vae, specs, args.renders_per_scene, args.thickness, args.seed)
    pooled_all, sequence_all = encode_texts(pipe, [caption(spec) for spec in specs] + [""])
    empty_index = len(specs)
    log(f"data: {len(specs)} scenes x {args.renders_per_scene} outline renders = {len(mean)} latents, "
        f"{time.time() - started_all:.0f} s")

    transformer = pipe.transformer
    parameters = with_adapter(transformer, args)
    optimizer = torch.optim.AdamW(parameters, lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.99))
    generator = torch.Generator().manual_seed(args.seed)
    img_ids = image_ids(mean.shape[2], mean.shape[3])
    txt_ids = torch.zeros(TEXT_LENGTH, 3)
    state = {"step": 0, "elapsed": 0.0}

    def loss_at(step: int, fraction: float) -> tuple[torch.Tensor, dict]:
        rows = torch.randint(len(mean), (args.batch,), generator=generator)
        std = (0.5 * logvar[rows]).exp()
        x0 = pack_latents((mean[rows] + std * torch.randn(std.shape, generator=generator) - shift) * scale)
        text_rows = scene[rows].clone()
        text_rows[torch.rand(args.batch, generator=generator) < args.empty_caption_rate] = empty_index
        sigma = sample_sigmas(args.batch, generator, args.sigma_mean, args.sigma_std)
        noise = torch.randn(x0.shape, generator=generator)
        x_t = (1.0 - sigma[:, None, None]) * x0 + sigma[:, None, None] * noise
        velocity = transformer(
            hidden_states=x_t,
            timestep=sigma,
            pooled_projections=pooled_all[text_rows],
            encoder_hidden_states=sequence_all[text_rows],
            txt_ids=txt_ids,
            img_ids=img_ids,
            return_dict=False,
        )[0]
        return F.mse_loss(velocity, noise - x0), {}

    def snapshot(state: dict) -> None:
        if args.save_every and state["step"] % args.save_every == 0 and state["step"] < args.steps:
            save_adapter(transformer, args, args.out.with_name(f"{args.out.stem}-step{state['step']}.safetensors"))

    train_adapter(transformer, optimizer, args, state, loss_at, after_step=snapshot)
    return finish(transformer, args, parameters, state, started_all)


def shared_arguments(description: str, model: Path, out: Path, steps: int) -> argparse.ArgumentParser:
    """The options both outline trainers take (this one and tools/train_lora_v2.py)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=model, help="the base model's diffusers folder")
    parser.add_argument("--out", type=Path, default=out, help="the adapter file to write (.safetensors)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--minutes", type=float, default=0.0, help="time budget (0: --steps only, deterministic)")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--alpha", type=float, default=None, help="lora_alpha (default: the rank, scaling 1)")
    parser.add_argument("--target-modules", nargs="+", default=list(TARGET_MODULES))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--empty-caption-rate", type=float, default=0.1)
    parser.add_argument("--sigma-std", type=float, default=1.0)
    parser.add_argument("--dtype", choices=("float16", "float32"), default="float16", help="of the saved weights")
    parser.add_argument("--log-every", type=int, default=100)
    parser.add_argument("--init", type=Path, default=None,
                        help="start from this adapter file's weights (same --rank and targets) instead of zero")
    return parser


def checked(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    args = parser.parse_args(argv)
    if args.alpha is None:
        args.alpha = float(args.rank)
    if args.out.suffix != ".safetensors":
        parser.error(f"--out {args.out}: the adapter file must end in .safetensors")
    return args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = shared_arguments(__doc__, DEFAULT_MODEL, DEFAULT_OUT, steps=1800)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--renders-per-scene", type=int, default=3)
    parser.add_argument("--max-scenes", type=int, default=None, help="train on fewer scenes (smoke tests)")
    parser.add_argument("--thickness", type=float, default=OUTLINE_THICKNESS_PIXELS, help="outline width, pixels")
    parser.add_argument("--sigma-mean", type=float, default=1.0,
                        help="logit-normal mean of the noise level (the base model used 0.5)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is fastest on a busy 2-core machine)")
    parser.add_argument("--save-every", type=int, default=0,
                        help="also write OUT-stepN.safetensors every N steps (0: only the final file)")
    return checked(parser, argv)


def run(parse, training, argv: list[str] | None) -> dict:
    """Parse the command line, set the thread count, train: both outline trainers' main."""
    args = parse(argv)
    torch.set_num_threads(args.threads)
    return training(args)


def main(argv: list[str] | None = None) -> dict:
    return run(parse_args, train, argv)


if __name__ == "__main__":
    main()

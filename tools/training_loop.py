"""Pieces the trainers (tools/train_*.py) share: logging, checkpoints that survive a kill, the
time-or-steps schedule, the EMA, and the step loop every stage runs (`run_steps`, `train_vae_stage`)."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch


def log(message: str) -> None:
    print(time.strftime("%H:%M:%S"), message, flush=True)


def save_atomically(state: dict, path: Path) -> None:
    """A kill mid-write leaves the previous checkpoint intact."""
    temporary = path.with_suffix(".tmp")
    torch.save(state, temporary)
    os.replace(temporary, path)


def progress_fraction(step: int, steps: int, elapsed: float, max_minutes: float) -> float:
    """Training stops at whichever comes first, the step count or the time budget;
    the learning-rate schedule follows the same fraction so its cosine always completes."""
    by_time = elapsed / (max_minutes * 60.0) if max_minutes > 0 else 0.0
    return min(1.0, max(step / steps, by_time))


def cosine_lr(base_lr: float, fraction: float, step: int, warmup: int, floor: float = 0.05) -> float:
    warm = min(1.0, (step + 1) / warmup)
    return base_lr * warm * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * fraction)))


def resume(checkpoint: Path, name: str, model: torch.nn.Module, optimizer, ema: torch.nn.Module | None = None,
           generator: torch.Generator | None = None) -> dict | None:
    """A killed run's state (its weights, EMA, optimizer and generator restored in place) when its
    checkpoint exists; None for a fresh run."""
    if not checkpoint.exists():
        return None
    saved = torch.load(checkpoint, weights_only=False)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    if ema is not None:
        ema.load_state_dict(saved["ema"])
    if generator is not None:
        generator.set_state(saved["generator"])
    state = saved["state"]
    log(f"{name}: resumed at step {state['step']} ({state['elapsed'] / 60:.1f} min done)")
    return state


def optimizer_step(loss: torch.Tensor, optimizer, parameters) -> None:
    """Backward, gradients clipped to norm 1, one optimizer step."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(parameters, 1.0)
    optimizer.step()


def ema_update(ema: torch.nn.Module, model: torch.nn.Module, decay: float) -> None:
    with torch.no_grad():
        for ema_param, param in zip(ema.parameters(), model.parameters()):
            ema_param.lerp_(param, 1.0 - decay)


@dataclass(frozen=True)
class Schedule:
    """A run's budget and learning rate: warm-up, then a cosine over the steps or the minutes,
    whichever ends first (0 minutes: steps only)."""

    base_lr: float
    warmup: int
    steps: int
    minutes: float


def run_steps(name: str, state: dict, model: torch.nn.Module, optimizer, schedule: Schedule,
              loss_at: Callable[[int, float], tuple[torch.Tensor, dict]], save: Callable[[], None],
              checkpoint_minutes: float, *, ema: torch.nn.Module | None = None, ema_decay: float = 0.999,
              log_every: int = 100, after_step: Callable[[dict], None] | None = None,
              fraction_at: Callable[[int], float] | None = None) -> None:
    """Train `model` from `state` (step, elapsed seconds; a resumed run's own) until the schedule
    ends: per step the learning rate, `loss_at(step, fraction)` (the loss and figures to log), one
    clipped optimizer step and the EMA's update; a checkpoint (`save`) every `checkpoint_minutes`
    and at the end, with the state marked done. `fraction_at` replaces the clock (a replayed
    schedule); `after_step` sees the state after each step (snapshots)."""
    started = time.time() - state["elapsed"]
    last_save = time.time()
    model.train()
    while True:
        step = state["step"]
        fraction = (fraction_at(step) if fraction_at is not None
                    else progress_fraction(step, schedule.steps, time.time() - started, schedule.minutes))
        if fraction >= 1.0:
            break
        lr = cosine_lr(schedule.base_lr, fraction, step, warmup=schedule.warmup)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss, figures = loss_at(step, fraction)
        optimizer_step(loss, optimizer, model.parameters())
        if ema is not None:
            ema_update(ema, model, min(ema_decay, (1 + step) / (10 + step)))
        state["step"] = step + 1
        state["elapsed"] = time.time() - started
        value = loss.item()
        state["loss_avg"] = value if state.get("loss_avg") is None else 0.98 * state["loss_avg"] + 0.02 * value
        if step % log_every == 0:
            details = "".join(f" {key} {figure:.4f}" for key, figure in figures.items())
            log(f"{name} step {step} loss {value:.4f} avg {state['loss_avg']:.4f}{details} lr {lr:.2e} "
                f"{state['step'] / max(state['elapsed'], 1e-6):.2f} steps/s {state['elapsed'] / 60:.1f} min, "
                f"{100 * fraction:.0f}% done")
        if time.time() - last_save > checkpoint_minutes * 60:
            save()
            last_save = time.time()
        if after_step is not None:
            after_step(state)
    state["done"] = True
    save()
    log(f"{name}: done, {state['step']} steps in {state['elapsed'] / 60:.1f} min")


def train_vae_stage(args, vae: torch.nn.Module, batch_at: Callable[[int, np.random.Generator], torch.Tensor],
                    vae_loss: Callable, warmup: int, log_every: int) -> None:
    """Every trainer's VAE stage: AdamW on `vae_loss(vae, batch, args.kl_weight)` over fresh
    renders (`batch_at(step, rng)`, the rng seeded from the seed and the step the run starts at),
    resuming from --work-dir's vae.pt."""
    checkpoint = args.work_dir / "vae.pt"
    optimizer = torch.optim.AdamW(vae.parameters(), lr=args.vae_lr, weight_decay=0.0)
    state = resume(checkpoint, "vae", vae, optimizer) or {"step": 0, "elapsed": 0.0, "done": False}
    if state["done"]:
        log("vae: already trained")
        return
    rng = np.random.default_rng([args.seed, state["step"]])

    def save() -> None:
        save_atomically({"model": vae.state_dict(), "optimizer": optimizer.state_dict(), "state": state}, checkpoint)

    run_steps("vae", state, vae, optimizer, Schedule(args.vae_lr, warmup, args.vae_steps, args.vae_minutes),
              lambda step, fraction: vae_loss(vae, batch_at(step, rng), args.kl_weight), save,
              args.checkpoint_minutes, log_every=log_every)


def run_stages(args, stages: dict[str, Callable]) -> None:
    """A trainer's main after parsing: --threads set, --work-dir made, then --stage run (with
    "all", every stage in order)."""
    torch.set_num_threads(args.threads)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    for name in stages if args.stage == "all" else (args.stage,):
        stages[name](args)

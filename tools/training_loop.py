"""Pieces the trainers (tools/train_*.py) share: logging,
checkpoints that survive a kill, the time-or-steps schedule and the EMA."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

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


def scheduled_lr(optimizer, base_lr: float, step: int, elapsed_s: float, steps: int, minutes: float,
                 warmup: int) -> float | None:
    """Set the optimizer's learning rate for this step (warmup, then cosine over steps or time);
    None once the run is over."""
    fraction = progress_fraction(step, steps, elapsed_s, minutes)
    if fraction >= 1.0:
        return None
    lr = cosine_lr(base_lr, fraction, step, warmup=warmup)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr

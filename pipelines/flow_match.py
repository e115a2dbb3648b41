"""Pieces shared by the flow-matching transformer families (FLUX, SD3, Qwen-Image)."""

from __future__ import annotations

from typing import Sequence

import torch

from pipelines.interface import RequestState


def flow_match_step(state: RequestState, prediction: torch.Tensor, pass_generator: bool = True) -> None:
    """Advance one request with its own FlowMatchEuler scheduler; keep x0 for the preview.

    `pass_generator`: as the family's diffusers pipeline does (it only matters for
    schedulers configured for stochastic sampling)."""
    scheduler = state.noise_scheduler
    if state.params.preview_every:
        # Flow matching: x_t = (1 - sigma) x0 + sigma noise and v = noise - x0, so x0 = x_t - sigma v
        # (FlowMatchEulerDiscreteScheduler.step returns no pred_original_sample).
        sigma = scheduler.sigmas[state.step_index].to(state.latents.device, state.latents.dtype)
        state.extra.predicted_x0 = state.latents - sigma * prediction
    kwargs = {"generator": state.generator} if pass_generator else {}
    state.latents = scheduler.step(prediction, state.current_timestep, state.latents, return_dict=False, **kwargs)[0]
    state.step_index += 1


def combine_interleaved_cfg(
    noise_pred: torch.Tensor, guidance: Sequence[tuple[bool, float]]
) -> list[torch.Tensor]:
    """One prediction per request from a forward whose rows are laid out request by request:
    [positive, (negative if CFG)], ... `guidance[i]` = (request i uses CFG, its scale)."""
    predictions, row = [], 0
    for uses_cfg, scale in guidance:
        prediction = noise_pred[row : row + 1]
        row += 1
        if uses_cfg:
            negative = noise_pred[row : row + 1]
            row += 1
            prediction = negative + scale * (prediction - negative)
        predictions.append(prediction)
    if row != len(noise_pred):
        raise RuntimeError(f"the forward returned {len(noise_pred)} rows but the batch laid out {row}.")
    return predictions

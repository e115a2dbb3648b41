"""The one row layout of a co-batched forward with classifier-free guidance, for every family.

A request with CFG needs two rows (its negative, or unconditional, text and its positive
text) at the same latents and timestep; a request without CFG needs one. One forward
carries them all, in this order:

    [negative rows of the CFG requests, in batch order] + [positive rows of every request, in batch order]

Why this order: for a single CFG request it is exactly the `torch.cat([negative, positive])`
that StableDiffusion(XL)Pipeline and StableDiffusion3Pipeline run, so those stay
float-identical to diffusers; requests with and without CFG mix freely (CFG is not part of
any batch key); and the positive rows are one contiguous block, in the batch's order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from pipelines.interface import RequestState

# (positive, negative, guidance scale) -> the guided prediction of one request
Guide = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]


def linear_guidance(positive: torch.Tensor, negative: torch.Tensor, scale: float) -> torch.Tensor:
    """negative + scale * (positive - negative), with the scale a Python float as diffusers has it."""
    return negative + scale * (positive - negative)


@dataclass(frozen=True)
class Row:
    """One row of the forward: a request's latents and timestep with one of its text conditionings."""

    state: RequestState
    text: Any  # the family's text row (tensors with a batch dim of 1)


@dataclass(frozen=True)
class CfgLayout:
    states: tuple[RequestState, ...]
    rows: tuple[Row, ...]
    negative_count: int

    order: tuple[int, ...] | None = None  # the batch index of each of `states`, when `of` reordered them

    @classmethod
    def of(cls, states: Sequence[RequestState], order_by: Callable[[RequestState], Any] | None = None) -> "CfgLayout":
        """`state.conditioning` must have `positive`, `negative` (None without CFG) and `cfg`.
        `order_by`: lay the requests out in this key's order (stable); `combine` still answers in
        batch order."""
        order = None
        if order_by is not None:
            order = tuple(sorted(range(len(states)), key=lambda index: order_by(states[index])))
            states = [states[index] for index in order]
        negatives = [Row(s, s.conditioning.negative) for s in states if s.conditioning.cfg]
        positives = [Row(s, s.conditioning.positive) for s in states]
        return cls(tuple(states), tuple(negatives + positives), len(negatives), order)

    def combine(self, prediction: torch.Tensor | Sequence[torch.Tensor], guide: Guide = linear_guidance) -> list[torch.Tensor]:
        """One prediction per request, in batch order, from the forward's output rows (stacked, or
        one tensor per row when the rows differ in size: a packed forward)."""
        rows = prediction.split(1) if isinstance(prediction, torch.Tensor) else tuple(prediction)
        if len(rows) != len(self.rows):
            raise RuntimeError(f"the forward returned {len(rows)} rows; the CFG layout has {len(self.rows)}.")
        negatives = iter(rows[: self.negative_count])
        results = []
        for state, positive in zip(self.states, rows[self.negative_count :]):
            conditioning = state.conditioning
            results.append(guide(positive, next(negatives), conditioning.guidance_scale) if conditioning.cfg else positive)
        if self.order is not None:
            in_batch_order = [None] * len(results)
            for position, index in enumerate(self.order):
                in_batch_order[index] = results[position]
            results = in_batch_order
        return results

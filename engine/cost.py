"""What a request costs the device: rows x tokens x steps.

- rows: model rows it puts in every forward (2 with true CFG: its negative row rides along);
- tokens: latent positions per row, the grid the denoiser sees (grows with width x height x frames);
- steps: denoise steps (a request that starts from an image runs only the last of them).

A forward's cost is the sum of its rows' tokens, so `per_step` is what one request adds to a
forward and `total` what it costs from admission to its image. The engine uses them for
per-caller limits on in-flight cost and for turn-taking between groups that can't share a
forward (see `engine.scheduler`).

A pipeline may state its own figures with the optional `forward_size(params) -> (rows, tokens)`
(`SizedForward`); otherwise they are estimated from the parameters and the model's size
multiple (pixels per token along each side): tokens = ceil(width / m) x ceil(height / m) x
frames, and rows = 2 when guidance_scale > 1 (most families then run classifier-free guidance;
an estimate that errs on the side of cost).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pipelines.interface import PipelineInfo
from pipelines.params import GenerationParams


@runtime_checkable
class SizedForward(Protocol):
    """Optional part of the step protocol: the pipeline's own account of one request's rows."""

    def forward_size(self, params: GenerationParams) -> tuple[int, int]:
        """(rows per forward, latent tokens per row) for these (defaults-resolved) parameters."""


@dataclass(frozen=True)
class RequestCost:
    rows: int
    tokens: int
    steps: int

    def __post_init__(self) -> None:
        for name in ("rows", "tokens", "steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")

    @property
    def per_step(self) -> int:
        """What this request adds to one forward: rows x tokens."""
        return self.rows * self.tokens

    @property
    def total(self) -> int:
        """rows x tokens x steps."""
        return self.per_step * self.steps


def estimated_forward_size(params: GenerationParams, info: PipelineInfo) -> tuple[int, int]:
    """(rows, tokens) from the parameters alone, for pipelines that don't say."""
    multiple = max(1, info.size_multiple)
    tokens = math.ceil(params.width / multiple) * math.ceil(params.height / multiple) * max(1, params.num_frames or 1)
    rows = 2 if (params.guidance_scale or 0.0) > 1.0 else 1
    return rows, tokens


def request_cost(pipeline: object, info: PipelineInfo, params: GenerationParams) -> RequestCost:
    """The cost of one (defaults-resolved) request on this pipeline."""
    if isinstance(pipeline, SizedForward):
        rows, tokens = pipeline.forward_size(params)
    else:
        rows, tokens = estimated_forward_size(params, info)
    return RequestCost(rows=rows, tokens=tokens, steps=params.denoise_steps)

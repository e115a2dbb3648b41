"""Many LoRA adapters in one forward: each row of a co-batched forward gets its own deltas.

The base weights run once for the whole batch, as without adapters. Every Linear or Conv2d
that some loaded adapter changes carries a forward hook; during a forward whose rows name
adapters, the hook adds to each row the sum of its adapters' `scale * up(down(x))`, computed for
all the forward's adapters at once: the down weights of the adapters in use are stacked into one
matrix (rank r_a each), the rows that name any adapter are gathered, multiplied by it, each
rank column scaled by its row's scale for that adapter (0 where the row does not name it),
multiplied by the stacked up weights and added back. Two small matmuls per layer however many
adapters the forward mixes: what vLLM's punica/S-LoRA kernels do for LLMs, with plain torch ops.
Rows without adapters cost nothing beyond the gather of the others; a forward where no row names
one runs no hook code beyond one attribute check per changed layer.

The same hooks serve adapters of the text encoders: a batched text encoding is a forward whose
rows are texts, each text encoded with the adapters of the request it belongs to
(DiffusersStepPipeline._encode_prompt_keys).

Why not PEFT's mixed-adapter batches (`adapter_names=` on its LoRA layers): they take ONE
adapter per row at that adapter's fixed scale, so two rows with the same adapter at 0.5 and 1,
or a row with two adapters, would need a PEFT adapter per (name, scale) combination, made while
requests arrive; and diffusers injects PEFT layers without the wrapper that threads the argument
through. Here the per-row scales are a matrix and a row's adapters simply add up.

Rows are the leading dimension of every hooked module's input and output (true of the
attention projections, feed-forwards and convolutions of every family served); the hook
checks it and names the module when a model breaks that rule. In a packed forward
(pipelines/packing.py) a stream's leading dimension is its tokens instead: the forward says which
row each token belongs to (`tokens(token_rows)`) and each token gets its row's deltas.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from pipelines.lora_adapters import LoraAdapter
from pipelines.lora_request import LoraUse

# Stacked weights kept per (layer, adapters of a forward); past this many adapter combinations
# the cache starts again (each entry is a copy of those adapters' weights of one layer).
MAX_STACKED_COMBINATIONS = 64


@dataclass(frozen=True)
class _ForwardPlan:
    """Which rows of one forward run which adapters, at which scales."""

    names: tuple[str, ...]  # the adapters any row names, sorted
    rows: torch.Tensor | None  # the rows that name any adapter (None: every row, in order)
    row_count: int  # rows of the whole forward
    scales: torch.Tensor  # (rows that name any, len(names)): each row's scale per adapter, 0 = unnamed
    row_loras: tuple[tuple[LoraUse, ...], ...]  # what each row of the forward names
    position: torch.Tensor  # (row_count,): each row's place among the rows that name any, -1 if none


def _plan_for(row_loras: tuple[tuple[LoraUse, ...], ...], device: torch.device, dtype: torch.dtype) -> _ForwardPlan:
    names = tuple(sorted({use.name for uses in row_loras for use in uses}))
    column = {name: index for index, name in enumerate(names)}
    named = [index for index, uses in enumerate(row_loras) if uses]
    scales = torch.zeros(len(named), len(names))
    for position, index in enumerate(named):
        for use in row_loras[index]:
            scales[position, column[use.name]] = use.scale
    every = len(named) == len(row_loras)
    position = torch.full((len(row_loras),), -1, dtype=torch.long)
    position[named] = torch.arange(len(named))
    return _ForwardPlan(names, None if every else torch.tensor(named, device=device), len(row_loras),
                        scales.to(device, dtype), row_loras, position.to(device))


@dataclass(frozen=True)
class _Stacked:
    """One layer's weights of the adapters of a forward, side by side."""

    down: torch.Tensor  # Linear: (sum of ranks, in); Conv2d: (sum of ranks, in, kh, kw)
    up: torch.Tensor  # Linear: (out, sum of ranks); Conv2d: (out, sum of ranks, 1, 1)
    columns: torch.Tensor  # for each rank column, its adapter's index in the plan's names


class RowLoras:
    """The adapters loaded for one pipeline, and the hooks that apply them row by row."""

    def __init__(self, modules: dict[str, nn.Module]) -> None:
        """`modules`: every module an adapter may change, by its full name ("transformer.x.to_q")."""
        self._modules = modules
        self._hooked: set[str] = set()
        self.adapters: dict[str, LoraAdapter] = {}
        self._plan: _ForwardPlan | None = None
        self._token_rows: torch.Tensor | None = None  # packed forwards: the row of each token of the stream
        self._stacked: dict[tuple[str, tuple[str, ...]], _Stacked | None] = {}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.adapters)

    def add(self, adapter: LoraAdapter) -> None:
        """Serve `adapter` from now on (its modules get a hook the first time an adapter changes them)."""
        if adapter.name in self.adapters:
            raise ValueError(f"a LoRA named {adapter.name!r} is already loaded for this model.")
        for module_name in adapter.modules:
            if module_name not in self._hooked:
                self._modules[module_name].register_forward_hook(self._hook(module_name))
                self._hooked.add(module_name)
        self.adapters[adapter.name] = adapter
        self._stacked.clear()

    @contextlib.contextmanager
    def rows(self, row_loras: Sequence[tuple[LoraUse, ...]], device: torch.device, dtype: torch.dtype) -> Iterator[None]:
        """For the forward inside: row i runs with the adapters `row_loras[i]` names."""
        if not any(row_loras):
            yield
            return
        self._plan = _plan_for(tuple(row_loras), device, dtype)
        try:
            yield
        finally:
            self._plan = None

    @contextlib.contextmanager
    def only_rows(self, rows: torch.Tensor | None) -> Iterator[None]:
        """Inside `rows(...)`: a forward over only these rows of it (their indices, in order; None:
        all of them), as step caching runs a model's later blocks for the rows that compute."""
        plan = self._plan
        if plan is None or rows is None:
            yield
            return
        subset = tuple(plan.row_loras[index] for index in rows.tolist())
        self._plan = _plan_for(subset, plan.scales.device, plan.scales.dtype) if any(subset) else None
        try:
            yield
        finally:
            self._plan = plan

    @contextlib.contextmanager
    def tokens(self, token_rows: torch.Tensor | None) -> Iterator[None]:
        """Inside `rows(...)`, during a packed forward: the hooked modules inside see one token per
        leading position, token i belonging to row `token_rows[i]` (None: rows, as usual)."""
        before = self._token_rows
        self._token_rows = token_rows
        try:
            yield
        finally:
            self._token_rows = before

    def _stacked_for(self, module_name: str, names: tuple[str, ...]) -> _Stacked | None:
        key = (module_name, names)
        if key not in self._stacked:
            if len(self._stacked) >= MAX_STACKED_COMBINATIONS * max(1, len(self._hooked)):
                self._stacked.clear()
            parts = [(index, self.adapters[name].modules.get(module_name)) for index, name in enumerate(names)]
            parts = [(index, weights) for index, weights in parts if weights is not None]
            self._stacked[key] = None if not parts else _Stacked(
                down=torch.cat([weights.down for _, weights in parts]),
                up=torch.cat([weights.up for _, weights in parts], dim=1),
                columns=torch.cat([torch.full((weights.down.shape[0],), index, dtype=torch.long,
                                              device=weights.down.device) for index, weights in parts]),
            )
        return self._stacked[key]

    def _hook(self, module_name: str):
        def add_row_deltas(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
            plan = self._plan
            if plan is None:
                return None
            stacked = self._stacked_for(module_name, plan.names)
            if stacked is None:  # none of this forward's adapters changes this layer
                return None
            x = args[0]
            row_scales, positions = plan.scales, plan.rows
            if self._token_rows is not None:  # a packed stream: each token takes its row's scales
                row_scales, positions = _token_scales(plan, self._token_rows)
            elif x.shape[0] != plan.row_count:
                raise RuntimeError(f"LoRA rows: {module_name} saw {x.shape[0]} rows, the forward has "
                                   f"{plan.row_count}: this model folds something else into the batch dimension.")
            if positions is not None and len(positions) == 0:
                return None
            rows = x if positions is None else x.index_select(0, positions)
            # (A text encoder may run in another dtype than the denoiser the scales were made for.)
            scales = row_scales[:, stacked.columns].to(stacked.down.dtype)
            delta = _delta(module, stacked, rows.to(stacked.down.dtype), scales)
            if positions is None:
                return output + delta.to(output.dtype)
            return output.index_add(0, positions, delta.to(output.dtype))

        return add_row_deltas


def _token_scales(plan: _ForwardPlan, token_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(scales of the tokens whose row names any adapter, those tokens' positions; None: all)."""
    place = plan.position.index_select(0, token_rows)
    if plan.rows is None:
        return plan.scales.index_select(0, place), None
    tokens = torch.nonzero(place >= 0).flatten()
    return plan.scales.index_select(0, place.index_select(0, tokens)), tokens


def _delta(module: nn.Module, stacked: _Stacked, x: torch.Tensor, column_scales: torch.Tensor) -> torch.Tensor:
    """up(scales * down(x)) for the stacked adapters; `column_scales`: (rows, sum of ranks)."""
    if isinstance(module, nn.Conv2d):
        hidden = F.conv2d(x, stacked.down, stride=module.stride, padding=module.padding, dilation=module.dilation)
        return F.conv2d(hidden * column_scales[:, :, None, None], stacked.up)
    hidden = F.linear(x, stacked.down)
    shape = (column_scales.shape[0],) + (1,) * (hidden.dim() - 2) + (column_scales.shape[1],)
    return F.linear(hidden * column_scales.view(shape), stacked.up)

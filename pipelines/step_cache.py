"""Step caching per row of a co-batched forward: a row whose model output will barely change
since the last step it computed skips the transformer's later blocks and reuses its residual.

Step caches (TeaCache; First Block Cache, diffusers' `FirstBlockCacheConfig` /
`apply_first_block_cache`) decide for a whole batch at once: they assume one request per forward.
Here rows are at different steps, with different prompts and thresholds, so every decision is
made per request, from that request's rows alone:

    1. the first block runs for every row (rule "first-block"; rule "teacache" only computes the
       first block's timestep-modulated input, a layer norm);
    2. each request compares that signal with its own memory (`StepCacheState`, kept in its
       request state, never shared) against its own threshold (`GenerationParams.step_cache`);
       the rows of a CFG request (negative and positive) decide together, as one;
    3. the rows that must compute are gathered, run through the remaining blocks, and scattered
       back; every other row adds its cached residual (the remaining blocks' output minus their
       input at the last step it computed) to this step's input of those blocks.

Because a decision depends on the request's own rows only, a request skips the same steps and
makes the same pixels (within float noise) alone or co-batched, in step mode or request mode.

The rules (both as their authors define them, per request instead of per batch):
- "first-block" (First Block Cache, diffusers' FBCHeadBlockHook): the first block's residual
  (its output minus its input); compute when mean|r - r_last| / mean|r_last| > threshold, r_last
  the residual at the last step that computed.
- "teacache" (TeaCache): the first block's modulated input m; the relative L1 change of m from
  the previous step is added up, and the request computes when the sum reaches the threshold
  (then it starts again from 0); the first and last steps always compute. TeaCache's fitted
  polynomial rescaling is per checkpoint and left out.

How it plugs into a family's forward: the family names its blocks (`BlockStack`); for one
forward the denoiser's block lists are swapped for a single stand-in module that runs all of
them (diffusers' own forward still does the embeddings before and the output layers after,
on every row). A forward where no row caches never swaps anything: today's code path.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, field
from typing import Callable, ContextManager, Iterator, Sequence

import torch
from torch import nn

from pipelines.cfg import CfgLayout
from pipelines.interface import RequestState

RULES = ("first-block", "teacache")
# Chosen by measurement on the built-in models (docs/benchmarks.md#step-caching): at the quality bar
# it saves more of the forward than "first-block", whose skipped rows still run the first block.
DEFAULT_RULE = "teacache"

# (first block, its inputs by name) -> the block's timestep-modulated input, one row per forward row
ModulatedInput = Callable[[nn.Module, dict], torch.Tensor]
# rows of the forward (None: all of them) -> a context in which a forward over only those rows runs
RowScope = Callable[[torch.Tensor | None], ContextManager]


@dataclass(frozen=True)
class BlockStack:
    """How a family's transformer runs its blocks (what a family file says for step caching)."""

    lists: tuple[str, ...]  # the denoiser's attributes holding its block ModuleLists, in the order they run
    returns: tuple[str, ...]  # what one block returns, in order, named as the block's inputs
    row_inputs: tuple[str, ...]  # block inputs with one row per forward row (the others are shared)
    modulated_input: ModulatedInput | None = None  # for rule "teacache"
    hidden: str = "hidden_states"  # the stream whose change the rules measure


@dataclass
class StepCacheState:
    """One request's cache memory (in its RequestExtra): written only by its own rows' decisions."""

    owner: int | None = None  # id() of the denoiser the residuals come from (Wan 2.2 has two experts)
    signal: torch.Tensor | None = None  # first-block: the residual at the last step computed; teacache: last m
    accumulated: float = 0.0  # teacache: the change added up since the last step computed
    residuals: dict[str, torch.Tensor] | None = None  # per stream: the remaining blocks' output - input


@dataclass(frozen=True, eq=False)
class CachedRequest:
    """One request of a forward: its rows (both rows of a CFG request) and its own cache."""

    state: RequestState
    rows: tuple[int, ...]
    cache: StepCacheState | None  # None: this request runs uncached (always computes)

    @property
    def threshold(self) -> float:
        return float(self.state.params.step_cache or 0.0)


def step_caching(cache: "RowStepCache | None", denoiser: nn.Module, layout: CfgLayout, row_scope: RowScope):
    """The per-row step cache for one forward over `layout` (each request's rows: both of a CFG
    request), when any of its requests caches (`state.extra.step_cache`); else nothing changes and
    the forward is exactly the uncached one."""
    if cache is None or not any(state.extra.step_cache is not None for state in layout.states):
        return contextlib.nullcontext()
    requests = [CachedRequest(state, tuple(index for index, row in enumerate(layout.rows) if row.state is state),
                              state.extra.step_cache) for state in layout.states]
    return cache.applied(denoiser, requests, row_scope)


def relative_l1(now: torch.Tensor, before: torch.Tensor) -> float:
    """mean |now - before| / mean |before| (diffusers' First Block Cache measure)."""
    return float((now - before).abs().mean() / before.abs().mean().clamp_min(1e-12))


class RowStepCache:
    """The step cache of one pipeline: its family's block stack and the rule it decides by."""

    def __init__(self, stack: BlockStack, rule: str = DEFAULT_RULE) -> None:
        self.stack = stack
        self.rule = rule

    @property
    def rule(self) -> str:
        return self._rule

    @rule.setter
    def rule(self, rule: str) -> None:
        if rule not in RULES:
            raise ValueError(f"step cache rule {rule!r} is not known: use one of {', '.join(RULES)}.")
        if rule == "teacache" and self.stack.modulated_input is None:
            raise ValueError("rule 'teacache' needs the family's modulated_input; this family has none.")
        self._rule = rule

    @contextlib.contextmanager
    def applied(self, denoiser: nn.Module, requests: Sequence[CachedRequest], row_scope: RowScope) -> Iterator[None]:
        """During the forward inside, `denoiser` runs its blocks through the per-row cache."""
        lists = [getattr(denoiser, name) for name in self.stack.lists]
        blocks = [block for blocks in lists for block in blocks]
        runner = _CachedBlocks(self, blocks, requests, row_scope, id(denoiser))
        modules = denoiser._modules  # swapped in place, for this forward only: diffusers' forward loops over them
        try:
            for index, name in enumerate(self.stack.lists):
                modules[name] = nn.ModuleList([runner] if index == 0 else [])
            yield
        finally:
            for name, original in zip(self.stack.lists, lists):
                modules[name] = original


class _CachedBlocks(nn.Module):
    """Stands in for the first block of a forward; runs every block, per row as decided."""

    def __init__(self, cache: RowStepCache, blocks: list[nn.Module], requests: Sequence[CachedRequest],
                 row_scope: RowScope, owner: int) -> None:
        super().__init__()
        object.__setattr__(self, "blocks", tuple(blocks))  # not registered: the denoiser still owns them
        self.cache, self.stack, self.requests, self.row_scope, self.owner = cache, cache.stack, requests, row_scope, owner
        self.signature = inspect.signature(blocks[0].forward)

    def forward(self, *args, **kwargs):
        values = dict(self.signature.bind(*args, **kwargs).arguments)
        hidden = self.stack.hidden
        if self.cache.rule == "first-block":
            base = {**values, **self._named(self.blocks[0](**values))}
            signal, blocks = base[hidden] - values[hidden], self.blocks[1:]
        else:
            base, blocks = values, self.blocks
            signal = self.stack.modulated_input(self.blocks[0], values)
        computes = [self._computes(request, signal) for request in self.requests]
        rows = sorted(row for request, yes in zip(self.requests, computes) if yes for row in request.rows)
        everyone = len(rows) == len(base[hidden])
        index = None if everyone else torch.tensor(rows, device=base[hidden].device, dtype=torch.long)
        computed = self._run(blocks, base, index) if rows else {}
        out = {}
        for name in self.stack.returns:
            out[name] = computed[name] if everyone else base[name].clone()
            if rows and not everyone:
                out[name].index_copy_(0, index, computed[name])
        position = {row: place for place, row in enumerate(rows)}
        for request, yes in zip(self.requests, computes):
            mine = torch.tensor(request.rows, device=base[hidden].device, dtype=torch.long)
            if yes:
                if request.cache is not None:
                    places = torch.tensor([position[row] for row in request.rows], device=mine.device)
                    request.cache.residuals = {name: computed[name].index_select(0, places)
                                               - base[name].index_select(0, mine) for name in self.stack.returns}
                continue
            for name in self.stack.returns:
                out[name].index_copy_(0, mine, base[name].index_select(0, mine) + request.cache.residuals[name])
        results = tuple(out[name] for name in self.stack.returns)
        return results if len(results) > 1 else results[0]

    def _named(self, output) -> dict:
        output = output if isinstance(output, tuple) else (output,)
        if len(output) != len(self.stack.returns):
            raise RuntimeError(f"a block returned {len(output)} tensors; its family's BlockStack names "
                               f"{len(self.stack.returns)}: {self.stack.returns}.")
        return dict(zip(self.stack.returns, output))

    def _run(self, blocks: Sequence[nn.Module], values: dict, rows: torch.Tensor | None) -> dict:
        """The blocks over the rows that compute (all of them when `rows` is None)."""
        call = dict(values)
        if rows is not None:
            for name in self.stack.row_inputs:
                call[name] = call[name].index_select(0, rows)
        with self.row_scope(rows):
            for block in blocks:
                call.update(self._named(block(**call)))
        return {name: call[name] for name in self.stack.returns}

    def _computes(self, request: CachedRequest, signal: torch.Tensor) -> bool:
        """Whether this request's rows run the remaining blocks at this step; updates its memory.
        Depends on the request's own rows only."""
        cache, state = request.cache, request.state
        if cache is None:
            return True
        if cache.owner != self.owner:  # a new request, or a Wan 2.2 request that changed experts
            cache.owner, cache.signal, cache.residuals, cache.accumulated = self.owner, None, None, 0.0
        mine = signal.index_select(0, torch.tensor(request.rows, device=signal.device, dtype=torch.long))
        fresh = cache.signal is None or cache.residuals is None
        if self.cache.rule == "first-block":
            computes = fresh or relative_l1(mine, cache.signal) > request.threshold
            if computes:
                cache.signal = mine
        else:
            edge = state.step_index == 0 or state.step_index == state.total_steps - 1
            if fresh or edge:
                computes, cache.accumulated = True, 0.0
            else:
                cache.accumulated += relative_l1(mine, cache.signal)
                computes = cache.accumulated >= request.threshold
                if computes:
                    cache.accumulated = 0.0
            cache.signal = mine
        _record_step(state.skipped_steps, state.step_index, skipped=not computes)
        return computes


def _record_step(skipped_steps: list[int], step: int, skipped: bool) -> None:
    """Note whether `step` reused the cache; a step run again (after a failed batched forward)
    replaces its first note."""
    if skipped_steps and skipped_steps[-1] == step:
        skipped_steps.pop()
    if skipped:
        skipped_steps.append(step)

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


def cached_requests(layout: CfgLayout) -> list[CachedRequest] | None:
    """The requests of a forward over `layout` with their rows (both rows of a CFG request), when
    any of them caches (`state.extra.step_cache`); None when none does."""
    if not any(state.extra.step_cache is not None for state in layout.states):
        return None
    return [CachedRequest(state, tuple(index for index, row in enumerate(layout.rows) if row.state is state),
                          state.extra.step_cache) for state in layout.states]


def step_caching(cache: "RowStepCache | None", denoiser: nn.Module, layout: CfgLayout, row_scope: RowScope):
    """The per-row step cache for one forward over `layout`, when any of its requests caches; else
    nothing changes and the forward is exactly the uncached one."""
    requests = cached_requests(layout) if cache is not None else None
    if requests is None:
        return contextlib.nullcontext()
    return cache.applied(denoiser, requests, row_scope)


class StackedRows:
    """How a stacked forward's block inputs hold their rows: row i is index i of the leading
    dimension of every per-row input (a packed forward's layout is pipelines/packing.PackedRows)."""

    def __init__(self, stack: BlockStack, device: torch.device) -> None:
        self.stack, self.device = stack, device

    def index(self, name: str, rows: Sequence[int]) -> torch.Tensor:
        """Where these rows lie along the leading dimension of the block input or output `name`."""
        return torch.tensor(list(rows), device=self.device, dtype=torch.long)

    def subset(self, values: dict, rows: Sequence[int]) -> dict:
        """The block inputs of a forward over only these rows."""
        index = self.index("", rows)
        return {**values, **{name: values[name].index_select(0, index) for name in self.stack.row_inputs}}

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
        """During the (stacked) forward inside, `denoiser` runs its blocks through the per-row cache."""
        lists = [getattr(denoiser, name) for name in self.stack.lists]
        blocks = [block for blocks in lists for block in blocks]
        stand_in = _CachedBlocks(self.decisions(requests, row_scope, id(denoiser)), blocks)
        modules = denoiser._modules  # swapped in place, for this forward only: diffusers' forward loops over them
        try:
            for index, name in enumerate(self.stack.lists):
                modules[name] = nn.ModuleList([stand_in] if index == 0 else [])
            yield
        finally:
            for name, original in zip(self.stack.lists, lists):
                modules[name] = original

    def decisions(self, requests: Sequence[CachedRequest], row_scope: RowScope, owner: int) -> "CachedRun":
        """The per-row runner of one forward's blocks (a packed forward calls it directly)."""
        return CachedRun(self, requests, row_scope, owner)


class _CachedBlocks(nn.Module):
    """Stands in for the first block of a stacked forward; runs every block through `run`."""

    def __init__(self, run: "CachedRun", blocks: list[nn.Module]) -> None:
        super().__init__()
        object.__setattr__(self, "blocks", tuple(blocks))  # not registered: the denoiser still owns them
        self.run = run
        self.signature = inspect.signature(blocks[0].forward)

    def forward(self, *args, **kwargs):
        values = dict(self.signature.bind(*args, **kwargs).arguments)
        stack = self.run.stack
        modulated = None if stack.modulated_input is None else (lambda v: stack.modulated_input(self.blocks[0], v))
        access = StackedRows(stack, values[stack.hidden].device)
        out = self.run(self.blocks, values, access, modulated)
        results = tuple(out[name] for name in stack.returns)
        return results if len(results) > 1 else results[0]


class CachedRun:
    """One forward's blocks, per request as each decides: run them, or reuse its residual."""

    def __init__(self, cache: RowStepCache, requests: Sequence[CachedRequest], row_scope: RowScope, owner: int) -> None:
        self.cache, self.stack, self.requests, self.row_scope, self.owner = cache, cache.stack, requests, row_scope, owner

    def __call__(self, blocks: Sequence, values: dict, access, modulated: Callable[[dict], torch.Tensor] | None) -> dict:
        """`blocks` (callables over the block inputs by name, returning the stack's `returns`) over
        `values`; `access` says where each request's rows lie (StackedRows, or PackedRows);
        `modulated` gives the first block's modulated input (rule "teacache"). Returns the streams."""
        hidden = self.stack.hidden
        if self.cache.rule == "first-block":
            base = {**values, **self._named(blocks[0](**values))}
            signal, blocks = base[hidden] - values[hidden], blocks[1:]
        else:
            base, signal = values, modulated(values)
        computes = [self._computes(request, signal.index_select(0, access.index(hidden, request.rows)))
                    for request in self.requests]
        rows = sorted(row for request, yes in zip(self.requests, computes) if yes for row in request.rows)
        everyone = len(rows) == sum(len(request.rows) for request in self.requests)
        computed = self._run(blocks, base, None if everyone else rows, access) if rows else {}
        out = {}
        for name in self.stack.returns:
            out[name] = computed[name] if everyone else base[name].clone()
            if rows and not everyone:
                out[name].index_copy_(0, access.index(name, rows), computed[name])
        for request, yes in zip(self.requests, computes):
            for name in self.stack.returns:
                mine = access.index(name, request.rows)
                if not yes:
                    out[name].index_copy_(0, mine, base[name].index_select(0, mine) + request.cache.residuals[name])
            if yes and request.cache is not None:
                request.cache.residuals = {name: out[name].index_select(0, access.index(name, request.rows))
                                           - base[name].index_select(0, access.index(name, request.rows))
                                           for name in self.stack.returns}
        return {**values, **out}

    def _named(self, output) -> dict:
        output = output if isinstance(output, tuple) else (output,)
        if len(output) != len(self.stack.returns):
            raise RuntimeError(f"a block returned {len(output)} tensors; its family's BlockStack names "
                               f"{len(self.stack.returns)}: {self.stack.returns}.")
        return dict(zip(self.stack.returns, output))

    def _run(self, blocks: Sequence, values: dict, rows: list[int] | None, access) -> dict:
        """The blocks over the rows that compute (all of them when `rows` is None)."""
        call = dict(values) if rows is None else access.subset(values, rows)
        scope = None if rows is None else torch.tensor(rows, dtype=torch.long)
        with self.row_scope(scope):
            for block in blocks:
                call.update(self._named(block(**call)))
        return {name: call[name] for name in self.stack.returns}

    def _computes(self, request: CachedRequest, mine: torch.Tensor) -> bool:
        """Whether this request's rows run the remaining blocks at this step; updates its memory.
        Depends on the request's own rows only (`mine`: its part of the signal)."""
        cache, state = request.cache, request.state
        if cache is None:
            return True
        if cache.owner != self.owner:  # a new request, or a Wan 2.2 request that changed experts
            cache.owner, cache.signal, cache.residuals, cache.accumulated = self.owner, None, None, 0.0
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

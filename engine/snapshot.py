"""Read-only views of the engine for the queue table, the graph view and the APIs.

The engine thread publishes a fresh `EngineSnapshot` after every step; readers on other
threads just take the latest reference (no locks, nothing mutable is shared).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.activity import EngineActivity
from engine.pauses import PauseState
from engine.request import RequestStatus

if TYPE_CHECKING:
    from engine.scheduler import Scheduler


@dataclass(frozen=True)
class RequestView:
    request_id: str
    session_id: str
    prompt: str
    state: str  # "waiting" | "running"
    step: int
    total: int
    position: int | None  # queue position while waiting, 1 = next
    submitted_at: float  # time.perf_counter() clock
    started_at: float | None
    batch: tuple[str, ...]  # request ids of the forward it is in now (shared tuple, includes itself)
    eta_s: float | None
    model: str = ""  # the loaded model that makes it
    paused: str = ""  # while waiting: why it can't start ("session": its queue is paused; "engine": all are)
    skipped: int = 0  # steps so far that reused its cached residual (step caching)
    size: str = ""  # "WIDTHxHEIGHT", with " x N frames" for a video: batch-mates of other sizes share forwards
    tokens: int = 0  # rows x latent tokens it puts in each forward (engine.cost)

    @property
    def batch_mates(self) -> tuple[str, ...]:
        """The other requests sharing its forward."""
        return tuple(r for r in self.batch if r != self.request_id)

    def waited_s(self, now: float | None = None) -> float:
        """Time spent waiting before the first step (so far, if still waiting)."""
        end = self.started_at if self.started_at is not None else (now or time.perf_counter())
        return max(0.0, end - self.submitted_at)


@dataclass(frozen=True)
class StageStats:
    """Mean wall time per request (encode, decode) or per step (denoise) over recent work."""

    encode_s: float | None = None
    denoise_step_s: float | None = None
    decode_s: float | None = None


@dataclass(frozen=True)
class EngineStats:
    mode: str
    max_batch_requests: int  # requests per forward (a CFG request puts 2 rows in it)
    current_batch_size: int  # requests in the forward now
    steps_per_s: float  # request-steps per second, recent
    forwards: int
    forwards_by_batch_size: dict[int, int] = field(default_factory=dict)  # requests per forward -> count
    finished: dict[str, int] = field(default_factory=dict)  # final status -> count
    completed_by_model: dict[str, int] = field(default_factory=dict)  # model -> completed requests
    stages: StageStats = StageStats()  # the whole engine's
    stages_by_model: dict[str, StageStats] = field(default_factory=dict)  # model -> its own stage times
    # Step caching: model rows that ran every block, and rows that reused their cached residual.
    rows_computed: int = 0
    rows_skipped: int = 0
    current_batch_tokens: int = 0  # rows x latent tokens of the forward now (engine.cost)


@dataclass(frozen=True)
class EngineSnapshot:
    taken_at: float
    requests: tuple[RequestView, ...]
    stats: EngineStats
    pauses: PauseState = PauseState()  # the engine's pause and the paused sessions

    @property
    def waiting(self) -> tuple[RequestView, ...]:
        return tuple(r for r in self.requests if r.state == "waiting")

    @property
    def running(self) -> tuple[RequestView, ...]:
        return tuple(r for r in self.requests if r.state == "running")


def size_text(params) -> str:
    frames = params.num_frames or 1
    return f"{params.width}x{params.height}" + (f" x {frames} frames" if frames > 1 else "")


def build_snapshot(scheduler: "Scheduler", activity: EngineActivity) -> EngineSnapshot:
    """The queue view of every unfinished request plus the engine figures, as of now."""
    now = time.perf_counter()
    pauses = scheduler.pauses.state
    step_s = activity.stage_means["denoise_step_s"]
    batch = set(scheduler.current_batch)
    groups = max(1, len({r.batch_key for r in scheduler.requests.values()}))
    views: list[RequestView] = []
    running = [r for r in scheduler.requests.values() if r.status == RequestStatus.RUNNING]
    for request in sorted(running, key=lambda r: r.arrival_index):
        remaining = request.total_steps - request.steps_done
        in_batch = request.request_id in batch
        views.append(
            RequestView(
                request_id=request.request_id,
                session_id=request.session_id,
                prompt=request.params.prompt,
                model=request.params.model or "",
                state="running",
                step=request.steps_done,
                total=request.total_steps,
                position=None,
                submitted_at=request.submitted_at,
                started_at=request.started_at,
                batch=scheduler.current_batch if in_batch else (),
                eta_s=None if step_s is None else remaining * step_s * groups,
                skipped=len(request.skipped_steps),
                size=size_text(request.params),
                tokens=request.cost.per_step,
            )
        )
    # Waiting requests: ETA = the work queued ahead of them spread over the batch's slots.
    ahead_steps = sum(r.total_steps - r.steps_done for r in running)
    for position, request in enumerate(scheduler.waiting_order(), start=1):
        eta = None
        if step_s is not None and not pauses.reason(request.session_id):  # a paused one has no ETA
            eta = (ahead_steps / scheduler.max_batch_requests + request.total_steps) * step_s
        views.append(
            RequestView(
                request_id=request.request_id,
                session_id=request.session_id,
                prompt=request.params.prompt,
                model=request.params.model or "",
                state="waiting",
                step=0,
                total=request.total_steps,
                position=position,
                submitted_at=request.submitted_at,
                started_at=None,
                batch=(),
                eta_s=eta,
                paused=pauses.reason(request.session_id),
                size=size_text(request.params),
                tokens=request.cost.per_step,
            )
        )
        ahead_steps += request.total_steps
    stats = EngineStats(
        mode=scheduler.mode,
        max_batch_requests=scheduler.max_batch_requests,
        current_batch_size=len(batch & scheduler.requests.keys()),
        steps_per_s=activity.steps_per_s(now),
        forwards=sum(activity.forwards_by_batch_size.values()),
        forwards_by_batch_size=dict(activity.forwards_by_batch_size),
        finished=dict(activity.finished),
        completed_by_model=dict(activity.completed_by_model),
        stages=StageStats(**activity.stage_means),
        stages_by_model={model: StageStats(**means) for model, means in activity.stage_means_by_model.items()},
        rows_computed=activity.rows_computed,
        rows_skipped=activity.rows_skipped,
        current_batch_tokens=sum(r.cost.per_step for r in scheduler.requests.values() if r.request_id in batch),
    )
    return EngineSnapshot(taken_at=now, requests=tuple(views), stats=stats, pauses=pauses)

"""Read-only views of the engine for the queue table, the graph view and the APIs.

The engine thread publishes a fresh `EngineSnapshot` after every step; readers on other
threads just take the latest reference (no locks, nothing mutable is shared).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


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
    max_batch: int
    current_batch_size: int
    steps_per_s: float  # request-steps per second, recent
    forwards: int
    forwards_by_batch_size: dict[int, int] = field(default_factory=dict)
    finished: dict[str, int] = field(default_factory=dict)  # final status -> count
    stages: StageStats = StageStats()
    phase: str = "idle"  # what the engine thread does now: idle | encode | denoise | decode


@dataclass(frozen=True)
class EngineSnapshot:
    taken_at: float
    requests: tuple[RequestView, ...]
    stats: EngineStats

    @property
    def waiting(self) -> tuple[RequestView, ...]:
        return tuple(r for r in self.requests if r.state == "waiting")

    @property
    def running(self) -> tuple[RequestView, ...]:
        return tuple(r for r in self.requests if r.state == "running")

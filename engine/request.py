"""A request as the engine's scheduler tracks it (its tensors live in the runner's state cache)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Hashable

from engine.cost import RequestCost
from engine.events import RequestHandle
from pipelines.params import GenerationParams


class RequestStatus(enum.IntEnum):
    """Ordered: a request only ever moves to a larger value (WAITING -> RUNNING -> one FINISHED_*)."""

    WAITING = 0
    RUNNING = 1
    FINISHED_COMPLETED = 2
    FINISHED_ABORTED = 3
    FINISHED_ERROR = 4

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_COMPLETED


@dataclass(frozen=True)
class PreparedRequest:
    """A request checked and priced, not yet admitted: what `prepare` answers (the engine's own
    submit, and a Serve replica for the facade's router and admission, use the same one)."""

    params: GenerationParams  # complete: the model named, its defaults and a seed filled in
    batch_key: Hashable  # equal keys share a forward (scoped to the model)
    cost: RequestCost  # rows x tokens x steps: per-session limits and turn-taking


@dataclass
class Request:
    # --- fixed at submission ---
    request_id: str
    session_id: str
    params: GenerationParams  # complete (defaults and seed resolved)
    batch_key: Hashable
    handle: RequestHandle
    arrival_index: int  # global submission order, for FIFO tie-breaks
    cost: RequestCost  # rows x tokens x steps: limits and turn-taking by cost

    # --- written only by the scheduler ---
    status: RequestStatus = RequestStatus.WAITING
    queue_rank: int = 0  # its place in its session's order (arrival order until the session moves it)
    steps_done: int = 0
    submitted_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    # The Completed/Aborted/Failed event, emitted by the engine once the slot is released.
    final_event: object = None
    # Denoise steps the request really takes, once the runner knows them: some noise
    # schedulers take more than num_inference_steps (PNDM: one more).
    scheduled_steps: int | None = None
    # Steps that reused the request's cached residual instead of the model's later blocks (step caching).
    skipped_steps: tuple[int, ...] = ()
    # Rows x tokens of the forwards that ran without it since it last stepped, while it sat out
    # as an outlier (see engine.scheduler: a large request beside small ones).
    held_back_cost: int = 0

    @property
    def total_steps(self) -> int:
        return self.scheduled_steps or self.params.denoise_steps

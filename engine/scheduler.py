"""The service scheduler: decides, at every step boundary, which requests run the next forward.

It is the only place that changes a request's status. Policy:

- Requests share a forward only when their batch keys are equal ("a group").
- Groups with work take turns weighted by cost (fair queueing): each group counts the
  cost of the forwards it ran (the sum of its rows' tokens, see `engine.cost`), and the
  group that has run the least goes next; a group that arrives starts level with the
  least-served one. So a 1024x1024 group and a 64x64 group get equal device time: the
  small one runs 256 forwards for each forward of the large one, and no group starves.
- Step mode: the chosen group's running requests plus waiting ones of the same key,
  up to `max_batch_requests` and the group's token budget (`token_budget(key)`: the rows x
  tokens one forward may hold, see `engine.cost`), run one step together; a newcomer joins at
  the next boundary. Admission stops at the first request that doesn't fit the budget, so a
  request larger than the whole budget waits until its group's forward is empty, then runs
  alone: never refused for being big, never passed over for ever by smaller ones.
- Outliers sit out (step mode): a running request whose rows x tokens exceed
  `OUTLIER_FACTOR` times those of the rest of the forward together (a 128x128 request beside
  one 48x48 request) sits the step out, so the small one keeps its own pace instead of the
  large one's (a forward's time grows with its tokens: on the CPU the two together take about
  four times the small one's step). It sits out only until the forwards that ran without it
  add up to `HOLD_LIMIT` times its own step, then runs with them, so it keeps at least a fifth
  of the device and never starves; beside several requests (the usual mix) it is no outlier.
- Request mode: once a group of up to `max_batch_requests` requests is admitted it runs
  alone until all of its members finish (the classic "one batch at a time" server).
- Admission is fair across sessions: sessions take turns (fewest requests running first,
  then the one admitted least recently), each session's own requests in its own order (arrival
  order, unless the session moved one: `move`; other sessions' order is never touched).
- Paused queues (`engine.pauses`): a paused session's waiting requests, or every waiting request
  while the engine is paused, are not admitted; they keep their place and are listed after the
  ones that can start, each told why it waits (`Queued.paused`). Running requests go on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Hashable, Literal

from engine.events import Aborted, Completed, Failed, Progress, Queued, Started, Timings
from engine.pauses import Pauses
from engine.request import Request, RequestStatus

Mode = Literal["step", "request"]

OUTLIER_FACTOR = 2  # a request sits out when its rows x tokens exceed this many times the others'
HOLD_LIMIT = 4  # ... until the forwards run without it add up to this many times its own step


@dataclass(frozen=True)
class SchedulerOutput:
    batch: tuple[Request, ...] = ()  # requests of the next forward, in row order
    new: tuple[Request, ...] = ()  # admitted now: the runner must prepare_encode them first

    @property
    def is_empty(self) -> bool:
        return not self.batch


@dataclass(frozen=True)
class RowResult:
    """What the runner reports for one request after a step."""

    request_id: str
    steps_done: int = 0
    total_steps: int = 0  # the request's real step count (0: unknown, use num_inference_steps)
    preview: object = None  # a small PIL image, or None
    images: tuple = ()  # decoded media (a separate result, after the request's last step)
    is_video: bool = False
    error: str | None = None
    error_stage: str = "engine"
    skipped_steps: tuple[int, ...] = ()  # steps so far that reused the request's cached residual (step caching)


@dataclass(frozen=True)
class RunnerOutput:
    rows: tuple[RowResult, ...]  # one result per request
    batch_size: int  # requests in the forward that ran (0 if every request failed before it)
    forward_rows: int = 0  # model rows in that forward (a CFG request has 2)
    skipped_rows: int = 0  # of those, rows that reused their request's cached residual (step caching)


@dataclass
class _Group:
    served: int  # cost of the forwards this group ran (its place in the turns)
    created: int  # tie-break: the older group first
    running: list[Request] = field(default_factory=list)
    waiting: list[Request] = field(default_factory=list)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def can_run(self, pauses: Pauses) -> bool:
        """Whether this group has a step to run now: running requests, or waiting ones not paused."""
        return bool(self.running) or any(not pauses.reason(r.session_id) for r in self.waiting)


class Scheduler:
    def __init__(self, mode: Mode = "step", max_batch_requests: int = 8, pauses: Pauses | None = None,
                 token_budget: Callable[[Hashable], int | None] | None = None) -> None:
        if mode not in ("step", "request"):
            raise ValueError(f"mode={mode!r} is not supported: use 'step' or 'request'.")
        if isinstance(max_batch_requests, bool) or not isinstance(max_batch_requests, int) or max_batch_requests < 1:
            raise ValueError(f"max_batch_requests={max_batch_requests!r} must be an integer of at least 1.")
        self.mode: Mode = mode
        self.max_batch_requests = max_batch_requests  # requests per forward (a CFG request has 2 rows)
        # batch key -> rows x tokens one forward of that group may hold (None: no budget, rows only)
        self.token_budget = token_budget or (lambda key: None)
        self.pauses = pauses or Pauses()  # read at every admission; changed by callers' threads
        self.requests: dict[str, Request] = {}  # every unfinished request
        self._groups: dict[Hashable, _Group] = {}
        self._groups_created = 0
        self._running_by_session: dict[str, int] = {}
        self._last_admitted: dict[str, int] = {}  # session -> admission counter value
        self._admissions = 0
        self._freed: list[str] = []  # running requests ended outside a step: the runner frees them
        self._finished: list[Request] = []  # ended since the last take_finished()
        self._last_position: dict[str, tuple[int, str]] = {}  # request id -> (position, why paused)
        self.current_batch: tuple[str, ...] = ()

    # ---------------------------------------------------------------- queries
    @property
    def has_work(self) -> bool:
        return bool(self.requests)

    @property
    def can_run(self) -> bool:
        """Whether a step would run now (False while everything left waits in paused queues)."""
        return any(group.can_run(self.pauses) for group in self._groups.values())

    @property
    def num_waiting(self) -> int:
        return sum(len(g.waiting) for g in self._groups.values())

    @property
    def num_running(self) -> int:
        return sum(len(g.running) for g in self._groups.values())

    def waiting_order(self) -> list[Request]:
        """Waiting requests in the order they would be admitted (1st = position 1); those in paused
        queues after all that can start, in the order they would start once resumed."""
        order = self._admission_order([r for g in self._groups.values() for r in g.waiting])
        return [r for r in order if not self.pauses.reason(r.session_id)] + \
               [r for r in order if self.pauses.reason(r.session_id)]

    def _admission_order(self, waiting: list[Request]) -> list[Request]:
        """Round-robin over sessions, so one session's twenty requests can't block another's one."""
        by_session: dict[str, list[Request]] = {}
        for request in sorted(waiting, key=lambda r: r.queue_rank):
            by_session.setdefault(request.session_id, []).append(request)
        sessions = sorted(
            by_session,
            key=lambda s: (self._running_by_session.get(s, 0), self._last_admitted.get(s, -1), by_session[s][0].queue_rank),
        )
        order: list[Request] = []
        for turn in range(max((len(q) for q in by_session.values()), default=0)):
            order.extend(by_session[s][turn] for s in sessions if turn < len(by_session[s]))
        return order

    # ---------------------------------------------------------------- commands
    def add(self, request: Request) -> None:
        request.submitted_at = request.submitted_at or time.perf_counter()
        request.queue_rank = request.arrival_index
        self.requests[request.request_id] = request
        group = self._groups.get(request.batch_key)
        if group is None:
            # A newcomer starts level with the least-served group: no catching up on the past.
            level = min((g.served for g in self._groups.values()), default=0)
            group = self._groups[request.batch_key] = _Group(served=level, created=self._groups_created)
            self._groups_created += 1
        group.waiting.append(request)
        self._publish_positions()

    def abort(self, request_id: str, reason: str, cause: str = "cancelled") -> bool:
        """End a waiting or running request now (we are between steps). False if already ended."""
        return self._end(request_id, RequestStatus.FINISHED_ABORTED, Aborted(reason, cause=cause))

    def move(self, request_id: str, before_id: str | None = None) -> bool:
        """Put a waiting request first in its session's order (`before_id` None) or just before
        another waiting request of the same session. Only that session's requests change places:
        they swap the ranks they hold, so every other session keeps its turns. False (nothing
        moves) when either request is not waiting or they belong to different sessions."""
        request = self.requests.get(request_id)
        before = self.requests.get(before_id) if before_id is not None else None
        if request is None or request.status != RequestStatus.WAITING:
            return False
        if before_id is not None and (before is None or before.status != RequestStatus.WAITING
                                      or before.session_id != request.session_id):
            return False
        own = sorted((r for g in self._groups.values() for r in g.waiting if r.session_id == request.session_id),
                     key=lambda r: r.queue_rank)
        ranks = [r.queue_rank for r in own]
        if before is not request:  # "before itself" leaves it where it is
            own.remove(request)
            own.insert(0 if before is None else own.index(before), request)
        for rank, mine in zip(ranks, own):
            mine.queue_rank = rank
        self._publish_positions()
        return True

    def session_requests(self, session_id: str, running: bool) -> list[str]:
        """The ids of a session's waiting requests (and its running ones, with `running`)."""
        return [r.request_id for r in self.requests.values() if r.session_id == session_id
                and (r.status == RequestStatus.WAITING or (running and r.status == RequestStatus.RUNNING))]

    def publish_positions(self) -> None:
        """Tell waiting requests their place again (after a pause or resume changed it)."""
        self._publish_positions()

    def fail(self, request_id: str, message: str, stage: str = "engine") -> bool:
        """End a waiting or running request with an error now. False if already ended."""
        return self._end(request_id, RequestStatus.FINISHED_ERROR, Failed(message, stage=stage))

    def abort_all(self, reason: str, cause: str = "cancelled") -> None:
        for request_id in list(self.requests):
            self.abort(request_id, reason, cause)

    def fail_all(self, message: str) -> None:
        for request_id in list(self.requests):
            self.fail(request_id, message)

    def _end(self, request_id: str, status: RequestStatus, event) -> bool:
        request = self.requests.get(request_id)
        if request is None:
            return False
        was_running = request.status == RequestStatus.RUNNING
        self._finish(request, status, event)
        if was_running:
            self._freed.append(request_id)
        self._publish_positions()
        return True

    def take_freed(self) -> list[str]:
        freed, self._freed = self._freed, []
        return freed

    def take_finished(self) -> list[Request]:
        """Requests ended since the last call; their `final_event` is still to be emitted."""
        finished, self._finished = self._finished, []
        return finished

    # ---------------------------------------------------------------- schedule
    def schedule(self) -> SchedulerOutput:
        key = self._next_group_key()
        if key is None:
            self.current_batch = ()
            return SchedulerOutput()
        group = self._groups[key]
        new: list[Request] = []
        may_admit = self.mode == "step" or not group.running
        if may_admit:
            free_slots = self.max_batch_requests - len(group.running)
            budget = self.token_budget(key)
            tokens = sum(request.cost.per_step for request in group.running)
            startable = [r for r in group.waiting if not self.pauses.reason(r.session_id)]
            for request in self._admission_order(startable)[: max(free_slots, 0)]:
                fits = budget is None or tokens + request.cost.per_step <= budget
                if not fits and group.running:  # waits, first in line, until the forward has room
                    break
                new.append(request)
                self._admit(group, request)
                tokens += request.cost.per_step
        batch = tuple(group.running[: self.max_batch_requests])
        if self.mode == "step":
            batch = self._without_outliers(batch)
        group.served += sum(request.cost.per_step for request in batch)
        now = time.perf_counter()
        for request in new:
            request.started_at = now
            request.handle.emit(Started(batch_size=len(batch)))
        if new:
            self._publish_positions()
        self.current_batch = tuple(r.request_id for r in batch)
        return SchedulerOutput(batch=batch, new=tuple(new))

    @staticmethod
    def _without_outliers(batch: tuple[Request, ...]) -> tuple[Request, ...]:
        """The batch less the requests that sit this step out (see the module docstring)."""
        kept = list(batch)
        while len(kept) > 1:
            largest = max(kept, key=lambda r: r.cost.per_step)
            others = sum(r.cost.per_step for r in kept) - largest.cost.per_step
            if largest.cost.per_step <= OUTLIER_FACTOR * others \
                    or largest.held_back_cost >= HOLD_LIMIT * largest.cost.per_step:
                break
            kept = [r for r in kept if r is not largest]
        ran = sum(r.cost.per_step for r in kept)
        for request in batch:
            request.held_back_cost = 0 if any(r is request for r in kept) else request.held_back_cost + ran
        return tuple(kept)

    def _next_group_key(self) -> Hashable | None:
        if self.mode == "request":
            # A request-batch in flight keeps the engine until it is done.
            for key, group in self._groups.items():
                if group.running:
                    return key
        with_work = [(group.served, group.created, key) for key, group in self._groups.items()
                     if group.can_run(self.pauses)]
        return min(with_work, key=lambda entry: entry[:2])[2] if with_work else None

    def _admit(self, group: _Group, request: Request) -> None:
        group.waiting.remove(request)
        group.running.append(request)
        request.status = RequestStatus.RUNNING
        self._running_by_session[request.session_id] = self._running_by_session.get(request.session_id, 0) + 1
        self._last_admitted[request.session_id] = self._admissions
        self._admissions += 1

    # ---------------------------------------------------------------- update
    def update(self, output: RunnerOutput) -> None:
        now = time.perf_counter()
        for row in output.rows:
            request = self.requests.get(row.request_id)
            if request is None:  # aborted while its step ran
                continue
            if row.error is not None:
                self._finish(request, RequestStatus.FINISHED_ERROR, Failed(row.error, stage=row.error_stage))
                continue
            request.steps_done = row.steps_done
            request.skipped_steps = row.skipped_steps
            if row.total_steps:
                request.scheduled_steps = row.total_steps
            if not row.images:
                request.handle.emit(
                    Progress(
                        step=row.steps_done,
                        total=request.total_steps,
                        batch_size=output.batch_size,
                        preview=row.preview,
                        skipped=len(row.skipped_steps),
                    )
                )
            else:
                timings = Timings(request.submitted_at, request.started_at, now)
                self._finish(
                    request,
                    RequestStatus.FINISHED_COMPLETED,
                    Completed(
                        images=tuple(row.images),
                        seed=request.params.seed,
                        params=request.params,
                        timings=timings,
                        is_video=row.is_video,
                        skipped_steps=row.skipped_steps,
                    ),
                )
        self._publish_positions()

    def _finish(self, request: Request, status: RequestStatus, event) -> None:
        group = self._groups[request.batch_key]
        if request.status == RequestStatus.RUNNING:
            group.running.remove(request)
            self._running_by_session[request.session_id] -= 1
            if not self._running_by_session[request.session_id]:
                del self._running_by_session[request.session_id]
        else:
            group.waiting.remove(request)
        if not group.has_work:
            del self._groups[request.batch_key]
        request.status = status
        request.finished_at = time.perf_counter()
        del self.requests[request.request_id]
        self._last_position.pop(request.request_id, None)
        if not any(r.session_id == request.session_id for r in self.requests.values()):
            self._last_admitted.pop(request.session_id, None)
        # Not emitted here: the engine first frees the request's slot, so a caller who
        # resubmits as soon as it hears "completed" is never refused for a stale slot.
        request.final_event = event
        self._finished.append(request)

    def _publish_positions(self) -> None:
        """Tell each waiting request its queue position when it changed."""
        for position, request in enumerate(self.waiting_order(), start=1):
            place = (position, self.pauses.reason(request.session_id))
            if self._last_position.get(request.request_id) != place:
                self._last_position[request.request_id] = place
                request.handle.emit(Queued(position=position, paused=place[1]))

"""Admission control: the requests in flight, per session, and whether one more may come in.

One ledger per front door: `Engine` keeps one for its own requests and the Ray Serve facade
(serve/replicated_engine.py) one for every request it relays to its replicas, so the queue, a
session's count and a session's cost mean the same on both. Each refusal is counted once in
the owner's `requests_rejected` counter (labelled by reason).

The ledger's lock also orders what its owner does on admitting and on closing (`admitting`'s
body, `close`'s `then`): a submit's work queued while admitting always comes before the stop
queued by a close, so no request is ever stranded behind the engine's end.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from typing import Callable, Generic, Iterator, Protocol, TypeVar

from engine.cost import RequestCost
from engine.limits import (
    EngineClosedError,
    EngineFailedError,
    QueueFullError,
    ServingLimits,
    SessionLimitError,
)


class Admissible(Protocol):
    """What the ledger reads of an entry (an engine `Request`, or the facade's relayed request)."""

    @property
    def request_id(self) -> str: ...

    @property
    def session_id(self) -> str: ...

    @property
    def cost(self) -> RequestCost: ...


Entry = TypeVar("Entry", bound=Admissible)


class AdmissionLedger(Generic[Entry]):
    """Every unfinished request by id, each session's count and cost, and the open/closed door.

    `rejected`: a Prometheus counter labelled by reason ("closed", "queue_full", "session_limit").
    `owner`: who is closing, in the refusal's message ("the engine", "the studio").
    `on_count`: told the number in flight after every change (under the lock), e.g. a gauge's `set`."""

    def __init__(self, rejected, owner: str = "the engine", on_count: Callable[[int], None] | None = None) -> None:
        self._rejected = rejected
        self._owner = owner
        self._on_count = on_count
        self._lock = threading.Lock()
        self._closed = False
        self._failure: str | None = None
        self._entries: dict[str, Entry] = {}
        self._count_by_session: Counter[str] = Counter()
        self._cost_by_session: Counter[str] = Counter()

    # ------------------------------------------------------------------ reading
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def failure(self) -> str | None:
        """Why the owner can never run again (set by `close(failure=...)`), or None."""
        return self._failure

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def get(self, request_id: str) -> Entry | None:
        with self._lock:
            return self._entries.get(request_id)

    def entries(self) -> list[Entry]:
        """Every request in flight now, in admission order."""
        with self._lock:
            return list(self._entries.values())

    # ------------------------------------------------------------------ admitting and releasing
    def check_open(self) -> None:
        """EngineClosedError (EngineFailedError after a crash) once closed, counted as "closed"."""
        if self._closed:
            self._rejected.labels("closed").inc()
            if self._failure is not None:
                raise EngineFailedError(f"{self._failure}; no new requests are accepted.")
            raise EngineClosedError(f"{self._owner} is shutting down; no new requests are accepted.")

    @contextlib.contextmanager
    def admitting(self, entry: Entry, limits: ServingLimits, unit_cost: int, *,
                  count_no_room: bool = True) -> Iterator[None]:
        """Take `entry` in, or raise EngineClosedError, QueueFullError or SessionLimitError. The
        body runs under the lock, after the entry is counted (an error in it takes the entry out);
        it must not call the ledger again (the lock is not reentrant).

        `limits`: max_queue, max_per_session and max_session_cost (in units of `unit_cost`, the
        cost of the model's default request). `count_no_room=False` leaves the no-room refusals
        (queue, session) uncounted, for a caller that keeps the request waiting (a workflow run's
        own queue): it has not been refused."""
        with self._lock:
            self.check_open()
            try:
                self._check_room(entry, limits, unit_cost)
            except (QueueFullError, SessionLimitError) as refusal:
                if count_no_room:
                    self._rejected.labels("queue_full" if isinstance(refusal, QueueFullError) else "session_limit").inc()
                raise
            self._add(entry)
            try:
                yield
            except BaseException:
                self._remove(entry)
                raise

    def release(self, entries: list[Entry]) -> list[Entry]:
        """Free the slots of requests that ended; returns those still held (each is released once)."""
        released = []
        with self._lock:
            for entry in entries:
                if entry.request_id in self._entries:
                    self._remove(entry)
                    released.append(entry)
        return released

    def close(self, then: Callable[[], None] | None = None, failure: str | None = None) -> bool:
        """Shut the door for good: False when it already was. `then` runs under the lock (it must not
        call the ledger), only for the call that closes it; `failure` (the owner crashed) is kept
        even when already closed."""
        with self._lock:
            if failure is not None:
                self._failure = failure
            if self._closed:
                return False
            self._closed = True
            if then is not None:
                then()
            return True

    # ------------------------------------------------------------------ under the lock
    def _check_room(self, entry: Entry, limits: ServingLimits, unit_cost: int) -> None:
        session = entry.session_id
        if len(self._entries) >= limits.max_queue:
            raise QueueFullError(f"the queue is full ({limits.max_queue} requests in flight); try again shortly.")
        in_flight = self._count_by_session[session]
        if in_flight >= limits.max_per_session:
            raise SessionLimitError(
                f"this session already has {in_flight} requests in flight "
                f"(limit {limits.max_per_session}); wait for one to finish or cancel one."
            )
        limit = limits.max_session_cost
        if limit is not None and in_flight:
            held = self._cost_by_session[session] / unit_cost
            wanted = entry.cost.total / unit_cost
            if held + wanted > limit:
                raise SessionLimitError(
                    f"this session's requests in flight already cost {held:.1f} default requests and this one "
                    f"costs {wanted:.1f} (rows x tokens x steps); the limit is {limit:g}: wait for one to finish "
                    "or cancel one."
                )

    def _add(self, entry: Entry) -> None:
        self._entries[entry.request_id] = entry
        self._count_by_session[entry.session_id] += 1
        self._cost_by_session[entry.session_id] += entry.cost.total
        self._counted()

    def _remove(self, entry: Entry) -> None:
        if self._entries.pop(entry.request_id, None) is None:
            return
        session = entry.session_id
        self._count_by_session[session] -= 1
        self._cost_by_session[session] -= entry.cost.total
        if self._count_by_session[session] <= 0:
            del self._count_by_session[session]
            del self._cost_by_session[session]
        self._counted()

    def _counted(self) -> None:
        if self._on_count is not None:
            self._on_count(len(self._entries))

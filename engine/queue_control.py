"""Pause, resume, reorder and clear queues: the engine's members for it, and their commands.

A session acts on its own queue only (every call names the session, and a request of another
session is refused with PermissionError, as `cancel` does); an operator pauses the whole engine.
Every call returns at once; what it changes on the engine thread (an abort, a move, the positions
told to waiting requests) happens at the next step boundary, as a cancel does:

    engine.pause_queue("tab-1")                        # its waiting requests stay queued, "paused"
    engine.pause_queue("tab-1", until=time.time() + 60)  # ... for a minute at most
    engine.pause_queue("tab-1", abort_running=True)    # ... and its running ones are aborted
    engine.move_request(request_id, "tab-1")           # first of tab-1's own waiting requests
    engine.move_request(request_id, "tab-1", before=other_id)
    engine.clear_queue("tab-1", include_running=True)  # abort all of tab-1's requests
    engine.resume_queue("tab-1")
    engine.pause_engine(); engine.resume_engine()      # nothing new starts; running ones finish
    engine.pause_reason("tab-1")                       # "" | "session" | "engine", as of now
    engine.watch_pauses(keep)                          # keep(state) after every change (a database)

Pauses stop admission only, so a paused request keeps its place and loses no work: it has not
started. A session's pause ends by itself `ServingLimits.pause_expiry_s` after it was made (or at
an earlier `until`); the engine thread wakes then, so the queue runs again at once. The pause
state itself lives in `engine.pauses.Pauses` (read by the scheduler).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from engine.pauses import PauseState, pause_end

PAUSE_ABORT_REASON = "aborted: its queue was paused"
CLEAR_REASON = "cleared from its queue"


@dataclass(frozen=True)
class AbortSessionRequests:
    """End a session's waiting and/or running requests (a clear, or a pause that aborts)."""

    session_id: str
    waiting: bool
    running: bool
    reason: str
    requested_at: float


@dataclass(frozen=True)
class MoveRequest:
    request_id: str
    before_id: str | None


@dataclass(frozen=True)
class PausesChanged:
    """Wakes the engine thread: waiting requests learn their new place (and a resumed queue starts)."""


QUEUE_COMMANDS = (AbortSessionRequests, MoveRequest, PausesChanged)


class QueueControl:
    """`Engine`'s queue members (a mixin: it uses the engine's ledger, pauses, scheduler and commands)."""

    # ------------------------------------------------------------------ callers' side
    def pause_queue(self, session_id: str, *, abort_running: bool = False, until: float | None = None) -> None:
        """Stop admitting `session_id`'s waiting requests (they stay queued, told "paused");
        with `abort_running`, its running requests are aborted at the next step boundary,
        otherwise they finish. The pause ends by itself at `until` (unix seconds), at most the
        server's `pause_expiry_s` from now (None: that limit); ValueError for an `until` that is
        not a number."""
        self._pauses.set_session(session_id, True, pause_end(until, self.limits.pause_expiry_s))
        if abort_running:
            self._commands.put(AbortSessionRequests(session_id, waiting=False, running=True,
                                                    reason=PAUSE_ABORT_REASON, requested_at=time.perf_counter()))
        self._commands.put(PausesChanged())

    def resume_queue(self, session_id: str) -> None:
        """Admit `session_id`'s waiting requests again (in their order, at their turns)."""
        if self._pauses.set_session(session_id, False):
            self._commands.put(PausesChanged())

    def pause_engine(self) -> None:
        """An operator's pause: no waiting request of anyone starts; running ones finish."""
        if self._pauses.set_engine(True):
            self._commands.put(PausesChanged())

    def resume_engine(self) -> None:
        if self._pauses.set_engine(False):
            self._commands.put(PausesChanged())

    def pause_reason(self, session_id: str) -> str:
        """Why `session_id`'s waiting requests don't start, as of now: "" (they do), "session"
        (it paused its queue) or "engine" (an operator paused everything)."""
        return self._pauses.reason(session_id)

    @property
    def pause_state(self) -> PauseState:
        """The engine's pause and the paused sessions (with when each ends), as of now."""
        return self._pauses.state

    def watch_pauses(self, watcher: Callable[[PauseState], None]) -> None:
        """Call `watcher(state)` after every later pause or resume (of a session or the engine),
        on the caller's thread, before its call returns: how a studio keeps them across restarts.
        A session's pause that ends by itself is no call: the state says when each one ends."""
        self._pauses.watch(watcher)

    def move_request(self, request_id: str, session_id: str, *, before: str | None = None) -> bool:
        """Move one of `session_id`'s waiting requests to the front of its own queue, or just
        before another of its waiting requests (`before`). Other sessions' order is untouched.
        PermissionError for another session's request; False when a request is unknown or has
        ended. One that has started by the next step boundary stays where it is."""
        for named in (request_id, before):
            if named is None:
                continue
            request = self._ledger.get(named)
            if request is None:
                return False
            if request.session_id != session_id:
                raise PermissionError(f"request {named[:8]} belongs to another session; it can't be moved from here.")
        self._commands.put(MoveRequest(request_id, before))
        return True

    def clear_queue(self, session_id: str, *, include_running: bool = False) -> int:
        """Abort `session_id`'s waiting requests (and its running ones, with `include_running`)
        at the next step boundary. Returns how many of its requests were in flight when asked
        (running ones counted only with `include_running`)."""
        # Counted before the command is queued: the engine thread may abort them (and drop them
        # from the ledger) the moment it is, before this thread counts.
        count = sum(1 for request in self._ledger.entries() if request.session_id == session_id
                    and (include_running or request.started_at is None))
        self._commands.put(AbortSessionRequests(session_id, waiting=True, running=include_running,
                                                reason=CLEAR_REASON, requested_at=time.perf_counter()))
        return count

    # ------------------------------------------------------------------ engine thread
    def _apply_queue_command(self, command) -> None:
        if isinstance(command, AbortSessionRequests):
            waiting = self._scheduler.session_requests(command.session_id, running=False)
            both = self._scheduler.session_requests(command.session_id, running=True)
            chosen = (waiting if command.waiting else []) + \
                     ([rid for rid in both if rid not in waiting] if command.running else [])
            for request_id in chosen:
                self._scheduler.abort(request_id, command.reason)
            self._runner.free(self._scheduler.take_freed())
            if chosen:
                self.metrics.cancel_latency.observe(time.perf_counter() - command.requested_at)
        elif isinstance(command, MoveRequest):
            self._scheduler.move(command.request_id, command.before_id)
        elif isinstance(command, PausesChanged):
            self._scheduler.publish_positions()

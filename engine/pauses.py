"""Which queues are paused: the whole engine (an operator's maintenance pause) and single sessions.

Callers change it from their own threads (`Engine.pause_queue`, `Engine.pause_engine`, ...) and
read it back at once, so a front end that just paused a queue shows it paused; the scheduler
reads it at every admission, so a pause takes effect at the next step boundary. A paused queue
only stops admission: its waiting requests keep their place, its running ones go on (aborting
them is a separate, explicit command).

A session's pause may end by itself: it carries its end (unix seconds, so it means the same
after a restart and in another process), and from then on it is gone from the state. The
operator's pause ends only when the operator resumes. Whoever keeps the pauses across restarts
`watch`es them: every change a caller makes is handed over before that caller's call returns.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable

log = logging.getLogger(__name__)

# Why a waiting request does not start (RequestView.paused, Queued.paused, the studio's Status).
NOT_PAUSED = ""
PAUSED_BY_SESSION = "session"  # its own session paused its queue
PAUSED_BY_ENGINE = "engine"  # an operator paused the whole engine


@dataclass(frozen=True)
class PauseState:
    """The pauses as of one moment (published in every EngineSnapshot)."""

    engine: bool = False
    sessions: frozenset[str] = frozenset()
    # (session, unix seconds its pause ends by itself) for the paused sessions whose pause ends.
    ends: tuple[tuple[str, float], ...] = ()

    def reason(self, session_id: str) -> str:
        """Why `session_id`'s waiting requests don't start: the engine's pause wins, as it is the
        one the session can't lift itself."""
        if self.engine:
            return PAUSED_BY_ENGINE
        return PAUSED_BY_SESSION if session_id in self.sessions else NOT_PAUSED

    def ends_at(self, session_id: str) -> float | None:
        """When `session_id`'s pause ends by itself (unix seconds); None: not paused, or only a resume ends it."""
        return next((end for session, end in self.ends if session == session_id), None)

    @property
    def next_end(self) -> float | None:
        """The earliest end of a session's pause (unix seconds), or None."""
        return min((end for _, end in self.ends), default=None)

    def with_session(self, session_id: str, until: float | None) -> "PauseState":
        ends = tuple(sorted((s, e) for s, e in self.ends if s != session_id))
        if until is not None:
            ends = tuple(sorted(ends + ((session_id, until),)))
        return replace(self, sessions=self.sessions | {session_id}, ends=ends)

    def without_session(self, session_id: str) -> "PauseState":
        return replace(self, sessions=self.sessions - {session_id},
                       ends=tuple((s, e) for s, e in self.ends if s != session_id))

    def as_of(self, now: float) -> "PauseState":
        """This state without the session pauses that have ended by `now`."""
        ended = {session for session, end in self.ends if end <= now}
        if not ended:
            return self
        return replace(self, sessions=self.sessions - ended, ends=tuple((s, e) for s, e in self.ends if s not in ended))


def pause_end(until: float | None, expiry_s: float | None, now: float | None = None) -> float | None:
    """When a caller's pause ends (unix seconds): `until` when given, but at most `expiry_s` after
    `now` (the server's limit, ServingLimits.pause_expiry_s); None: only a resume ends it."""
    if until is not None and (isinstance(until, bool) or not isinstance(until, (int, float)) or math.isnan(until)):
        raise ValueError(f"until={until!r} must be a time in unix seconds (a number), or None for the server's "
                         "pause expiry.")
    latest = None if expiry_s is None else (time.time() if now is None else now) + expiry_s
    if until is None or math.isinf(until):
        return latest
    return until if latest is None else min(until, latest)


class Pauses:
    """The live pause state, safe to change from any thread. `clock`: unix seconds (tests pass their own)."""

    def __init__(self, engine_paused: bool = False, clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._state = PauseState(engine=engine_paused)
        self._next_end: float | None = None
        self._watchers: list[Callable[[PauseState], None]] = []
        self._telling = threading.Lock()  # watchers hear every change in order, each with the newest state

    @property
    def state(self) -> PauseState:
        """The pauses as of now (a session's pause that has ended is gone)."""
        if self._next_end is not None and self._clock() >= self._next_end:
            with self._lock:
                self._set(self._state.as_of(self._clock()))
        return self._state  # immutable: readers take the reference

    def reason(self, session_id: str) -> str:
        return self.state.reason(session_id)

    def seconds_to_next_end(self) -> float | None:
        """How long until a session's pause ends by itself (0 when one is due); None when none will."""
        end = self._next_end
        return None if end is None else max(0.0, end - self._clock())

    def set_engine(self, paused: bool) -> bool:
        """Pause or resume the whole engine; False when it was so already."""
        with self._lock:
            if self._state.engine == paused:
                return False
            self._set(replace(self._state, engine=paused))
        self._tell()
        return True

    def set_session(self, session_id: str, paused: bool, until: float | None = None) -> bool:
        """Pause one session's queue until `until` (unix seconds; None: until resumed), or resume it;
        False when it was so already."""
        with self._lock:
            state = self._state.as_of(self._clock())
            if paused and session_id in state.sessions and state.ends_at(session_id) == until:
                return False
            if not paused and session_id not in state.sessions:
                return False
            self._set(state.with_session(session_id, until) if paused else state.without_session(session_id))
        self._tell()
        return True

    def watch(self, watcher: Callable[[PauseState], None]) -> None:
        """Hand every later change (not a pause ending by itself) to `watcher(state)`, on the thread
        that made it, before its call returns. Changes made at once on two threads are told in
        order, each with the newest state, so the last state told is the one in force."""
        with self._telling:
            self._watchers.append(watcher)

    def _set(self, state: PauseState) -> None:
        self._state = state
        self._next_end = state.next_end

    def _tell(self) -> None:
        with self._telling:
            state = self.state
            for watcher in self._watchers:
                try:
                    watcher(state)
                except Exception:  # noqa: BLE001 - the pause holds; only keeping it elsewhere failed
                    log.exception("a watcher of the paused queues failed")

"""Which queues are paused: the whole engine (an operator's maintenance pause) and single sessions.

Callers change it from their own threads (`Engine.pause_queue`, `Engine.pause_engine`, ...) and
read it back at once, so a front end that just paused a queue shows it paused; the scheduler
reads it at every admission, so a pause takes effect at the next step boundary. A paused queue
only stops admission: its waiting requests keep their place, its running ones go on (aborting
them is a separate, explicit command).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

# Why a waiting request does not start (RequestView.paused, Queued.paused, the studio's Status).
NOT_PAUSED = ""
PAUSED_BY_SESSION = "session"  # its own session paused its queue
PAUSED_BY_ENGINE = "engine"  # an operator paused the whole engine


@dataclass(frozen=True)
class PauseState:
    """The pauses as of one moment (published in every EngineSnapshot)."""

    engine: bool = False
    sessions: frozenset[str] = frozenset()

    def reason(self, session_id: str) -> str:
        """Why `session_id`'s waiting requests don't start: the engine's pause wins, as it is the
        one the session can't lift itself."""
        if self.engine:
            return PAUSED_BY_ENGINE
        return PAUSED_BY_SESSION if session_id in self.sessions else NOT_PAUSED


class Pauses:
    """The live pause state, safe to change from any thread."""

    def __init__(self, engine_paused: bool = False) -> None:
        self._lock = threading.Lock()
        self._state = PauseState(engine=engine_paused)

    @property
    def state(self) -> PauseState:
        return self._state  # immutable: readers take the reference, no lock needed

    def reason(self, session_id: str) -> str:
        return self._state.reason(session_id)

    def set_engine(self, paused: bool) -> bool:
        """Pause or resume the whole engine; False when it was so already."""
        with self._lock:
            if self._state.engine == paused:
                return False
            self._state = PauseState(engine=paused, sessions=self._state.sessions)
            return True

    def set_session(self, session_id: str, paused: bool) -> bool:
        """Pause or resume one session's queue; False when it was so already."""
        with self._lock:
            if (session_id in self._state.sessions) == paused:
                return False
            sessions = self._state.sessions | {session_id} if paused else self._state.sessions - {session_id}
            self._state = PauseState(engine=self._state.engine, sessions=frozenset(sessions))
            return True

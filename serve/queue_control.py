"""Queue control on engine replicas: not offered yet. Each replica's engine can pause, reorder and
clear its own queue, but a session's requests spread over replicas, and the facade keeps no queue of
its own to pause; the members are here so the studio runs on the facade unchanged and says so."""

from __future__ import annotations

from engine import NOT_PAUSED, PauseState

UNAVAILABLE = ("pausing, reordering and clearing queues is not available with --replicas: each replica "
               "queues its own requests. Cancel requests one by one, or run one engine (without --replicas).")


class QueueControlUnavailable:
    """`ReplicatedEngine`'s queue members: a clear NotImplementedError, and nothing ever paused."""

    def pause_queue(self, session_id: str, *, abort_running: bool = False, until: float | None = None) -> None:
        raise NotImplementedError(UNAVAILABLE)

    def resume_queue(self, session_id: str) -> None:
        raise NotImplementedError(UNAVAILABLE)

    def move_request(self, request_id: str, session_id: str, *, before: str | None = None) -> bool:
        raise NotImplementedError(UNAVAILABLE)

    def clear_queue(self, session_id: str, *, include_running: bool = False) -> int:
        raise NotImplementedError(UNAVAILABLE)

    def pause_engine(self) -> None:
        raise NotImplementedError(UNAVAILABLE)

    def resume_engine(self) -> None:
        raise NotImplementedError(UNAVAILABLE)

    def pause_reason(self, session_id: str) -> str:
        return NOT_PAUSED

    @property
    def pause_state(self) -> PauseState:
        return PauseState()

    def watch_pauses(self, watcher) -> None:
        """Nothing is ever paused here: there is nothing to tell."""

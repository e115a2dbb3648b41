"""A caller's own queue, from any front end: pause, resume, clear, move one request, and how it
stands. The gradio_client endpoints, the HTTP API and the page all act through these functions,
each on the caller's own session (the engine refuses another session's request with
PermissionError); each answers a small JSON-ready dict, the same on every front end.

With Ray Serve replicas the same calls reach every replica (serve/queue_control.py): they may wait
for the replicas' answers, so front ends call them from worker threads.
"""

from __future__ import annotations

import time

from engine import EngineClient
from studio.queue_snapshot import format_seconds


def queue_state(engine: EngineClient, session_id: str, now: float | None = None) -> dict:
    """How the caller's queue stands now: paused by itself (until when) or by the operator, and its
    requests. `now`: unix seconds (default: the clock's)."""
    mine = [view for view in engine.snapshot().requests if view.session_id == session_id]
    state = engine.pause_state
    paused = session_id in state.sessions
    ends_at = state.ends_at(session_id)
    ends_in = None if ends_at is None else max(0.0, ends_at - (time.time() if now is None else now))
    return {
        "paused": paused,  # by the caller (it can resume it)
        # Unix seconds the caller's pause ends by itself (None: not paused, or only a resume ends it).
        "paused_until": ends_at,
        "pause_ends_in_s": None if ends_in is None else round(ends_in, 1),
        "engine_paused": state.engine,  # by the operator (only the operator can resume it)
        "waiting": sum(1 for view in mine if view.state == "waiting"),
        "running": sum(1 for view in mine if view.state == "running"),
        "message": _state_message(paused, state.engine, ends_in),
    }


def engine_paused_message() -> str:
    return "the studio is paused by its operator: nothing new starts until it is resumed"


def pause_end_words(ends_in_s: float | None) -> str:
    """" (it resumes by itself in 59 m 12 s)", or "" for a pause only a resume ends."""
    return "" if ends_in_s is None else f" (it resumes by itself in {format_seconds(ends_in_s)})"


def _state_message(paused: bool, engine_paused: bool, ends_in_s: float | None) -> str:
    if engine_paused:
        return engine_paused_message() + ("; your queue is paused too" + pause_end_words(ends_in_s) if paused else "")
    if paused:
        return "your queue is paused: your queued requests wait; resume to start them" + pause_end_words(ends_in_s)
    return "your queue runs"


def pause_own_queue(engine: EngineClient, session_id: str, abort_running: bool = False) -> dict:
    if not isinstance(abort_running, bool):
        raise ValueError(f"abort_running must be true or false, got {abort_running!r}.")
    engine.pause_queue(session_id, abort_running=abort_running)
    return {**queue_state(engine, session_id), "paused": True, "abort_running": abort_running}


def resume_own_queue(engine: EngineClient, session_id: str) -> dict:
    engine.resume_queue(session_id)
    return {**queue_state(engine, session_id), "paused": False}


def clear_own_queue(engine: EngineClient, session_id: str, include_running: bool = False) -> dict:
    if not isinstance(include_running, bool):
        raise ValueError(f"include_running must be true or false, got {include_running!r}.")
    cleared = engine.clear_queue(session_id, include_running=include_running)
    what = "queued and running" if include_running else "queued"
    return {"cleared": cleared, "include_running": include_running,
            "message": f"{cleared} of your {what} requests end at the next step boundary"}


def move_own_request(engine: EngineClient, session_id: str, request_id: str, before: str | None = None) -> dict:
    """Move one of the caller's queued requests to the front of its queue, or before another of
    its own. `request_id` and `before` are full ids (the page and the APIs resolve short ones)."""
    for name, value in (("request_id", request_id), ("before", before)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"{name} must be a request id (text), got {value!r}.")
    moved = engine.move_request(request_id, session_id, before=before)
    where = "to the front of your queue" if before is None else f"before {before[:8]}"
    message = f"moving {where} at the next step boundary (if it is still queued)" if moved else \
        "unknown or already finished"
    return {"request_id": request_id, "before": before, "moved": moved, "message": message}

"""Paused queues across restarts: the pauses kept in the store are made again at start, then every
later pause or resume is kept as it happens.

    restored = keep_pauses(engine, store, start_paused=False, operator_can_resume=True)   # at start

A caller's pause comes back with its end (it ends by itself then; one whose end passed while the
studio was down is not made again). The operator's pause comes back only when the operator can lift
it (an admin key is configured): without one, nothing could ever resume a studio paused before the
restart, so the pause is dropped, with a warning. `--start-paused` pauses the engine either way.
Each change is saved before the call that made it returns (engine.watch_pauses), so a caller told
"paused" finds its queue paused after a crash too.
"""

from __future__ import annotations

import logging
import time

from engine import EngineClient, PauseState
from studio.store.store import StudioStore

log = logging.getLogger(__name__)


def keep_pauses(engine: EngineClient, store: StudioStore, *, start_paused: bool,
                operator_can_resume: bool) -> PauseState:
    """Pause again what `store` kept, then keep every change in it. Returns the pauses restored."""
    saved = store.pauses()
    now = time.time()
    if saved.engine and not operator_can_resume and not start_paused:
        log.warning("the operator's pause from before the restart is lifted: no --admin-key is configured, so "
                    "nothing could resume it (start with --admin-key to keep it, or with --start-paused)")
    if start_paused or (saved.engine and operator_can_resume):
        engine.pause_engine()
        log.info("the engine is paused (%s): requests queue and none starts until an operator resumes it "
                 "(POST /v1/admin/resume with the --admin-key)",
                 "--start-paused" if start_paused else "paused before the restart")
    sessions = 0
    for session in sorted(saved.sessions):
        ends_at = saved.ends_at(session)
        if ends_at is not None and ends_at <= now:
            continue  # it ended while the studio was down
        engine.pause_queue(session, until=ends_at)  # None: this server's --pause-expiry from now
        sessions += 1
    if sessions:
        log.info("%d callers' paused queues are paused again after the restart", sessions)
    restored = engine.pause_state
    engine.watch_pauses(store.save_pauses)
    store.save_pauses(restored)  # without what ended or was lifted
    return restored

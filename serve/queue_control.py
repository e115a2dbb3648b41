"""Queue control over engine replicas: pause, resume, move and clear, as on one engine.

Each replica's engine queues the part of a session's requests that was routed to it, so:

- the pauses live here (`engine.Pauses`, what `pause_state` answers and the studio keeps across
  restarts) and every change is sent to every replica (Serve's `broadcast`), each with the same end,
  before the call returns; a session's requests that reach a replica later find it paused there. A
  replica that missed a change (it was being replaced) is told the whole state when its report
  disagrees (`keep_replicas_paused`, every refresh);
- a clear reaches every replica, and the facade ends its own requests still on their way to one;
- a move is sent with the replica's own request ids and applies on the replica that holds the
  request: a request moves before another only when both wait on the same replica.

Calls block until every replica has answered (at most `call_timeout_s`): front ends make them from
worker threads, never from an event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import replace
from typing import Callable

from ray.serve.exceptions import DeploymentUnavailableError

from engine import CLEAR_REASON, PauseState, pause_end
from serve.wire import Answered

log = logging.getLogger(__name__)


def same_pauses(replica: PauseState, ours: PauseState) -> bool:
    """Whether a replica holds the pauses the facade holds (the ends to the millisecond)."""
    def ends(state: PauseState) -> set[tuple[str, float]]:
        return {(session, round(end, 3)) for session, end in state.ends}

    return replica.engine == ours.engine and replica.sessions == ours.sessions and ends(replica) == ends(ours)


class ReplicatedQueueControl:
    """`ReplicatedEngine`'s queue members (a mixin: it uses the facade's pauses, ledger, handle and loop)."""

    # ------------------------------------------------------------------ callers' side
    def pause_queue(self, session_id: str, *, abort_running: bool = False, until: float | None = None) -> None:
        """As `Engine.pause_queue`, on every replica: the end is chosen here, once, so all agree."""
        until = pause_end(until, self.limits.pause_expiry_s)
        self._pauses.set_session(session_id, True, until)
        self._show_pauses()
        self._broadcast("pause_queue", session_id, abort_running=abort_running, until=until)

    def resume_queue(self, session_id: str) -> None:
        self._pauses.set_session(session_id, False)
        self._show_pauses()
        self._broadcast("resume_queue", session_id)

    def pause_engine(self) -> None:
        self._pauses.set_engine(True)
        self._show_pauses()
        self._broadcast("pause_engine")

    def resume_engine(self) -> None:
        self._pauses.set_engine(False)
        self._show_pauses()
        self._broadcast("resume_engine")

    def pause_reason(self, session_id: str) -> str:
        return self._pauses.reason(session_id)

    @property
    def pause_state(self) -> PauseState:
        return self._pauses.state

    def watch_pauses(self, watcher: Callable[[PauseState], None]) -> None:
        self._pauses.watch(watcher)

    def move_request(self, request_id: str, session_id: str, *, before: str | None = None) -> bool:
        """As `Engine.move_request`, on the replica holding the request. ValueError when `before`
        waits on another replica (each replica has its own queue); False for a request unknown,
        ended, or not on a replica yet."""
        flights = []
        for named in (request_id, before):
            if named is None:
                continue
            flight = self._ledger.get(named)
            if flight is None or flight.engine_request_id is None:
                return False
            if flight.session_id != session_id:
                raise PermissionError(f"request {named[:8]} belongs to another session; it can't be moved from here.")
            flights.append(flight)
        if len(flights) == 2 and flights[0].replica_id != flights[1].replica_id:
            raise ValueError(
                f"request_id={request_id[:8]} waits on {flights[0].replica} and before={before[:8]} on "
                f"{flights[1].replica}: with --replicas each replica queues its own requests, so a request moves "
                f"only before another on the same replica, or to the front of its queue (before=None).")
        ids = [flight.engine_request_id for flight in flights]
        answers = self._broadcast("move_request", ids[0], session_id, before=ids[1] if before is not None else None)
        return any(answer is True for answer in answers)

    def clear_queue(self, session_id: str, *, include_running: bool = False) -> int:
        """As `Engine.clear_queue`, on every replica; the session's requests not on a replica yet
        end here. Returns how many of its requests were in flight when asked."""
        on_the_way = [flight for flight in self._ledger.entries()
                      if flight.session_id == session_id and flight.engine_request_id is None]
        for flight in on_the_way:
            self._soon(self._stop_flight, flight, CLEAR_REASON, "cancelled")
        answers = self._broadcast("clear_queue", session_id, include_running=include_running)
        return len(on_the_way) + sum(answer for answer in answers if isinstance(answer, int))

    # ------------------------------------------------------------------ the relay loop
    async def keep_replicas_paused(self, reports) -> None:
        """After a refresh: tell every replica the whole pause state when one of them holds other
        pauses (a replica started after a change, or one that missed a broadcast)."""
        ours = self._pauses.state
        if all(same_pauses(report.snapshot.pauses, ours) for report in reports if report.alive):
            return
        try:
            await self._handle.broadcast("apply_pauses", ours).results_async(
                timeout_s=self.call_timeout_s, return_exceptions=True)
        except (TimeoutError, DeploymentUnavailableError):
            log.warning("the replicas could not be told the paused queues; trying again at the next refresh")

    # ------------------------------------------------------------------ internals
    def _show_pauses(self) -> None:
        """The snapshot the views read says the new pauses at once (the replicas' reports follow)."""
        self._snapshot = replace(self._snapshot, pauses=self._pauses.state)

    def _broadcast(self, method: str, *args, **kwargs) -> list:
        """Every live replica's answer to `method`. Serve's broadcast skips a replica it finds
        busy for a moment, so the replicas the board knows and that did not answer are asked again
        (and only they) until each has, or `call_timeout_s` has passed."""
        call_id = uuid.uuid4().hex  # a replica asked again repeats its answer rather than act twice

        async def call() -> dict[str, object]:
            heard: dict[str, object] = {}
            deadline = time.monotonic() + self.call_timeout_s
            only = None
            while True:
                try:
                    sent = self._handle.broadcast(method, *args, only=only, call_id=call_id, **kwargs)
                    answers = await sent.results_async(timeout_s=max(deadline - time.monotonic(), 0.1),
                                                       return_exceptions=True)
                except (TimeoutError, DeploymentUnavailableError):  # no replica now: the next refresh tells them
                    answers = []
                for answer in answers:
                    if isinstance(answer, Answered):
                        heard.setdefault(answer.replica_id, answer.value)
                    elif isinstance(answer, Exception):
                        log.warning("a replica did not take %s: %s", method, answer)  # a refresh tells it the pauses
                missing = {report.replica_id for report in self._board.reports if report.alive} - heard.keys()
                if not missing or time.monotonic() >= deadline:
                    if missing:
                        log.warning("%s reached no answer from %s within %g s", method, sorted(missing),
                                    self.call_timeout_s)
                    return heard
                only = frozenset(missing)
                await asyncio.sleep(0.05)

        return list(self._call(call, self.call_timeout_s + 2).values())

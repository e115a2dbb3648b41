"""One request's life as its caller sees it: engine events in, one `Status` out.

Every front end follows its requests through this module: `/generate` and `/generate_video`
(studio.api.gradio_endpoints), workflow runs of the page and of `/run_workflow`
(studio.workflows.run), `/v1/images` (studio.api.http_routes) and `/v1/videos`
(studio.api.video_jobs). Each turns a `Status` into its own wire format; none reads engine
events itself.

    tracker = RequestTracker(engine.submit(params, session_id=...))
    async for status, event in tracker.updates():   # as submitted (event None), then one per event
        ...
    final = await tracker.final()                    # or only the last one
    status_of(handle)                                # the status now, for callers that poll

Cancel and "the caller went away" are handled here: `RequestTracker.cancel()` asks the engine
once (from any thread, non-blocking), and closing or cancelling `updates()` / `final()` (a
closed tab, a Gradio cancel, an HTTP client that hung up, an error) calls it in a `finally:`,
so an abandoned request frees its batch slot at the next step boundary.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import AsyncIterator

from engine import Aborted, Completed, Event, Failed, GenerationParams, Progress, Queued, RequestHandle, Started

WAITING = "waiting"  # not at the engine yet (a workflow branch in its run's own queue)
QUEUED, RUNNING = "queued", "running"
COMPLETED, ABORTED, FAILED = "completed", "aborted", "failed"
FINAL_STATES = (COMPLETED, ABORTED, FAILED)


@dataclass(frozen=True)
class Status:
    """What a caller knows about one request after an engine event (immutable)."""

    request_id: str | None  # None while the request is not at the engine yet
    state: str  # WAITING | QUEUED | RUNNING | COMPLETED | ABORTED | FAILED
    step: int  # denoise steps done
    total: int
    position: int | None  # place in the engine's queue while queued (1 = next)
    batch_size: int  # rows in the forward that made the latest step (the request and its batch mates)
    seed: int
    message: str = ""  # why it was aborted or failed
    preview: object = field(default=None, repr=False, compare=False)  # the latest (a PIL image, or video frames)
    result: Completed | None = field(default=None, repr=False, compare=False)
    ended_by: Aborted | Failed | None = None  # the engine's own word on why it stopped
    paused: str = ""  # while queued: why it can't start ("session": its queue is paused; "engine": all are)
    skipped: int = 0  # steps that reused the request's cached residual (step caching)

    @classmethod
    def waiting(cls, params: GenerationParams) -> "Status":
        """A request its caller holds back (complete params: defaults and seed filled in)."""
        return cls(None, WAITING, 0, params.denoise_steps, None, 0, params.seed)

    @classmethod
    def submitted(cls, handle: RequestHandle) -> "Status":
        """A request the engine has just taken, before any event."""
        return cls(handle.request_id, QUEUED, 0, handle.params.denoise_steps, None, 0, handle.seed)

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def is_shutdown(self) -> bool:
        """Aborted because the server is shutting down (not by its caller)."""
        return isinstance(self.ended_by, Aborted) and self.ended_by.cause == "shutdown"

    @property
    def is_engine_failure(self) -> bool:
        """Failed because the engine itself failed (not one step of this request's pipeline)."""
        return isinstance(self.ended_by, Failed) and self.ended_by.stage == "engine"

    def stopped(self, state: str, message: str) -> "Status":
        """Ended by its caller's side before the engine had a say (cancelled while held back,
        or refused by a closing engine)."""
        return replace(self, state=state, position=None, message=message, paused="")

    def as_dict(self) -> dict:
        """The plain fields, JSON-ready (no preview, result or event)."""
        return {"request_id": self.request_id, "state": self.state, "step": self.step, "total": self.total,
                "position": self.position, "batch_size": self.batch_size, "seed": self.seed,
                "message": self.message, "paused": self.paused, "skipped": self.skipped}


def status_after(status: Status, event: Event) -> Status:
    """The status once `event` has happened: the one translation of engine events."""
    if isinstance(event, Queued):
        return replace(status, state=QUEUED, position=event.position, paused=event.paused)
    if isinstance(event, Started):
        return replace(status, state=RUNNING, position=None, batch_size=event.batch_size, paused="")
    if isinstance(event, Progress):
        return replace(status, state=RUNNING, position=None, step=event.step, total=event.total,
                       batch_size=event.batch_size, preview=status.preview if event.preview is None else event.preview,
                       skipped=event.skipped)
    if isinstance(event, Completed):
        return replace(status, state=COMPLETED, position=None, step=status.total, result=event,
                       skipped=len(event.skipped_steps))
    if isinstance(event, Aborted):
        return replace(status, state=ABORTED, position=None, message=event.reason, ended_by=event)
    if isinstance(event, Failed):
        return replace(status, state=FAILED, position=None, message=event.message, ended_by=event)
    return status


def status_of(handle: RequestHandle) -> Status:
    """The request's status now, from every event the engine has emitted for it so far (for
    callers that poll rather than follow a stream)."""
    status = Status.submitted(handle)
    for event in handle.history:
        status = status_after(status, event)
    return status


class RequestTracker:
    """One submitted request, followed by one caller."""

    def __init__(self, handle: RequestHandle) -> None:
        self.handle = handle
        self.status = Status.submitted(handle)  # as of the last event this tracker passed on
        self._lock = threading.Lock()
        self._cancel_asked = False

    @property
    def request_id(self) -> str:
        return self.handle.request_id

    def cancel(self) -> bool:
        """Ask the engine to stop the request at its next step boundary (non-blocking, any
        thread). The engine is asked once: False when it was asked already or the request ended."""
        with self._lock:
            if self._cancel_asked or self.status.is_final:
                return False
            self._cancel_asked = True
        self.handle.cancel()
        return True

    async def updates(self) -> AsyncIterator[tuple[Status, Event | None]]:
        """The status as it is (event None), then (status, event) after each engine event until
        the final one. Closing or cancelling this generator before then cancels the request."""
        try:
            yield self.status, None
            async for event in self.handle.stream():
                self.status = status_after(self.status, event)
                yield self.status, event
        finally:
            self.cancel()  # nothing to ask once the request has ended

    async def final(self) -> Status:
        """The status once the request has ended. Cancelling the wait cancels the request."""
        async for _ in self.updates():
            pass
        return self.status

"""At start: the work accepted before a restart (or a crash) runs again, in the order it was accepted.

    report = resume_accepted(engine, durable, outputs, video_jobs, max_age_s=86400)   # a thread

Each request starts again from step 0 with the parameters it was accepted with (its seed
included, so it makes the same picture), under its engine session, and is followed by the server
(studio.store.durable): its result joins its owner's history, a video job finishes as it would
have. The engine's per-session limits apply as to any request: what it has no room for yet waits
and goes as earlier ones end. A request accepted longer than `max_age_s` ago is not run again
(its video job fails, saying so).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol

from engine import AdmissionError, EngineClient, EngineClosedError, RequestHandle
from studio.store.durable import DurableRequests, finish_image
from studio.store.store import AcceptedRequest

if TYPE_CHECKING:
    from studio.outputs import OutputStore

log = logging.getLogger(__name__)

RETRY_ADMISSION_S = 0.25  # how often a request the engine has no room for yet is offered again


class WaitingJob(Protocol):
    """A video job accepted before the restart whose request is to run again."""

    id: str

    def attach(self, handle: RequestHandle, restarts: int) -> None:
        """Its new request (run again after `restarts` restarts)."""


class SavedJobs(Protocol):
    def load(self) -> list[WaitingJob]:
        """The jobs kept from before the restart, into memory; returns the unfinished ones."""


class ResumableVideoJobs(Protocol):
    """What a restart needs of the HTTP API's video jobs (studio.api.video_routes.VideoJobs has it):
    said here, so the store never imports the API above it."""

    store: SavedJobs

    def follow(self, job: WaitingJob, entry: AcceptedRequest) -> None:
        """Finish the job when its request ends."""

    def fail(self, job: WaitingJob, code: str, message: str, in_same_commit: Callable[[], None] | None = None) -> None:
        """End the job with an error (and `in_same_commit`'s store writes in its commit)."""


@dataclass
class ResumeReport:
    """What a restart found and did (the page tells each returning owner its count)."""

    resumed_by_owner: Counter = field(default_factory=Counter)  # history owner -> requests resumed
    dropped: int = 0  # too old, or no longer valid for this server
    request_ids: set[str] = field(default_factory=set)  # the engine requests run again (the queue says so)
    # history owner -> the engine sessions its resumed work runs in (the tabs that started it are
    # gone: a returning browser's tab adopts them, studio.workflows.registry.RunRegistry.adopt)
    sessions_by_owner: dict[str, set[str]] = field(default_factory=dict)

    def resumed_for(self, owner: str, session: str, count: int = 1) -> None:
        """Count `count` requests of `owner` resumed in engine session `session`."""
        self.resumed_by_owner[owner] += count
        self.sessions_by_owner.setdefault(owner, set()).add(session)

    @property
    def resumed(self) -> int:
        return sum(self.resumed_by_owner.values())


def resume_accepted(engine: EngineClient, durable: DurableRequests, outputs: "OutputStore",
                    video_jobs: ResumableVideoJobs, max_age_s: float, report: ResumeReport | None = None) -> ResumeReport:
    """Load the video jobs, then submit every accepted request again, on a thread of its own.
    `report` (a new one when None) counts what was resumed."""
    report = ResumeReport() if report is None else report
    waiting_jobs = {job.id: job for job in video_jobs.store.load()}
    pending = durable.store.pending()
    for job_id in set(waiting_jobs) - {entry.video_id for entry in pending}:
        _fail_job(video_jobs, waiting_jobs.pop(job_id), "it was accepted before a restart, and its request was lost")
    if not pending:
        return report
    log.info("resuming %d accepted requests from before the restart", len(pending))
    thread = threading.Thread(target=_resume_all, args=(engine, durable, outputs, video_jobs, waiting_jobs, pending,
                                                        max_age_s, report), name="stepstudio-resume", daemon=True)
    thread.start()
    return report


def _resume_all(engine, durable, outputs, video_jobs, waiting_jobs, pending, max_age_s, report) -> None:
    for entry in pending:
        job = waiting_jobs.get(entry.video_id) if entry.kind == "video_job" else None
        if time.time() - entry.accepted_at > max_age_s or (entry.kind == "video_job" and job is None):
            _drop(durable, video_jobs, entry, job, f"it was accepted more than {max_age_s:g} s before the restart")
            report.dropped += 1
            continue
        handle = _submit_when_room(engine, entry)
        if isinstance(handle, str):  # refused: the server's limits changed since
            _drop(durable, video_jobs, entry, job, handle)
            report.dropped += 1
            continue
        if handle is None:  # the engine is closing: what is left stays accepted for the next start
            return
        entry = durable.store.resumed(entry)
        report.request_ids.add(handle.request_id)
        if job is not None:
            job.attach(handle, entry.restarts)
            video_jobs.follow(job, entry)
        else:
            durable.follow(handle, entry, finish_image(outputs))
        report.resumed_for(entry.owner, entry.session)
    log.info("resumed %d accepted requests (%d not run again)", report.resumed, report.dropped)


def _submit_when_room(engine: EngineClient, entry: AcceptedRequest):
    """The new handle; a message when the server refuses the request now; None once it is closing."""
    while True:
        try:
            return engine.submit(entry.params, session_id=entry.session, from_waiting_queue=True)
        except EngineClosedError:
            return None
        except AdmissionError:
            if not engine.accepting:
                return None
            time.sleep(RETRY_ADMISSION_S)  # the session's earlier requests make room as they end
        except ValueError as error:
            return f"this server no longer takes it: {error}"


def _drop(durable: DurableRequests, video_jobs: ResumableVideoJobs, entry: AcceptedRequest, job, why: str) -> None:
    log.warning("accepted request %d (%s) is not run again: %s", entry.id, entry.kind, why)
    if job is not None:
        _fail_job(video_jobs, job, why, in_same_commit=lambda: durable.store.finished(entry))
    else:
        durable.store.finished(entry)


def _fail_job(video_jobs: ResumableVideoJobs, job, why: str, in_same_commit=None) -> None:
    video_jobs.fail(job, "not_resumed", f"not run again after the restart: {why}.", in_same_commit)

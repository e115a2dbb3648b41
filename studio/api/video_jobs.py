"""Video jobs of the HTTP API (`/v1/videos`): per caller, bounded, expiring, and kept in the
studio's durable store (studio.store), so a job outlives a restart.

A job is one engine request plus what its caller may download once it finished. Its status
and progress are the request's tracker status now (studio.tracker `status_of`, from the events
the engine thread has emitted as each step ended), so `retrieve` always tells the step the
engine is at; the job's files and its end time are written once, when it finishes.

The store is bounded three ways, so no caller can crowd the others out:
- per caller: at most `max_jobs_per_owner` jobs; a new one pushes out that caller's oldest
  finished job, and is refused while all of them are still running;
- in all: at most `max_jobs` jobs and `max_bytes` of files; when full, the caller holding the
  most finished jobs gives up its oldest one (running jobs are never pushed out: the engine's
  per-session limits bound those);
- in time: a finished job (completed or failed) is dropped `ttl_s` after it finished.
Jobs are looked up by id AND owner: another caller's job is as unknown as a missing one.

Every change to the jobs is written to the store's `video_jobs` table as it happens; at start
`VideoJobStore.load()` reads them back: finished jobs as they were (their files on disk), the
others waiting for studio.store.recovery to run them again (`attach` gives them their new request).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Literal

from engine import GenerationParams, RequestHandle
from studio.api.video_files import VideoFiles
from studio.store.store import StudioStore
from studio.tracker import ABORTED, COMPLETED, FAILED, RUNNING, RequestTracker, status_of

JobStatus = Literal["queued", "in_progress", "completed", "failed"]


class VideoStoreFull(Exception):
    """No room for another job of this caller now (HTTP 429)."""


@dataclass(frozen=True)
class VideoError:
    code: str
    message: str


@dataclass
class VideoJob:
    # --- fixed at creation ---
    id: str
    owner: str  # the engine session of the caller
    handle: RequestHandle | None  # None: not running in this process yet (from before a restart)
    fps: int
    created_at: float  # unix seconds
    params: GenerationParams | None = None  # complete (the seed filled in); the handle's when not given
    restarts: int = 0  # how often it was run again after a restart
    tracker: RequestTracker | None = field(init=False, repr=False)  # follows the request; its cancel is the job's
    # --- written once, by the store's finish(), when the job ends ---
    files: VideoFiles | None = None
    error: VideoError | None = None
    finished_at: float | None = None

    def __post_init__(self) -> None:
        if self.params is None:
            self.params = self.handle.params
        self.tracker = None if self.handle is None else RequestTracker(self.handle)

    def attach(self, handle: RequestHandle, restarts: int) -> None:
        """Follow the request that runs this job again after a restart."""
        self.handle, self.restarts, self.tracker = handle, restarts, RequestTracker(handle)

    def cancel(self) -> None:
        if self.tracker is not None:
            self.tracker.cancel()

    @property
    def is_finished(self) -> bool:
        return self.finished_at is not None

    @property
    def status(self) -> JobStatus:
        if self.files is not None:
            return "completed"
        if self.failure is not None:
            return "failed"
        if self.handle is None:
            return "queued"  # waiting to run again after a restart
        # Completed but not encoded yet is still in progress: nothing can be downloaded before.
        if status_of(self.handle).state in (RUNNING, COMPLETED):
            return "in_progress"
        return "queued"

    @property
    def failure(self) -> VideoError | None:
        """Why the job failed: its own error, or the engine's final word (before the job's
        follower has written it down)."""
        if self.error is not None:
            return self.error
        if self.handle is None or self.is_finished:
            return None
        now = status_of(self.handle)
        if now.state == FAILED:
            return VideoError("engine_failed" if now.is_engine_failure else "generation_failed", now.message)
        if now.state == ABORTED:
            return VideoError("shutting_down" if now.is_shutdown else "cancelled", now.message)
        return None

    @property
    def progress(self) -> int:
        """0-100 from the engine's denoise steps; 100 only once the video can be downloaded."""
        if self.files is not None:
            return 100
        if self.handle is None:
            return 0
        now = status_of(self.handle)
        return min(99, 100 * now.step // now.total) if now.total else 0


class VideoJobStore:
    def __init__(
        self,
        max_jobs: int = 128,
        max_bytes: int = 256 * 2**20,
        ttl_s: float = 3600.0,
        max_jobs_per_owner: int = 16,
        clock: Callable[[], float] = time.time,
        store: StudioStore | None = None,
    ) -> None:
        """`store`: where the jobs are kept (None: a store in memory, for this process only)."""
        for name, value in (("max_jobs", max_jobs), ("max_bytes", max_bytes), ("max_jobs_per_owner", max_jobs_per_owner)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s!r}.")
        self.max_jobs = max_jobs
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.max_jobs_per_owner = max_jobs_per_owner
        self._clock = clock
        self.store = store if store is not None else StudioStore.open(None)
        self._lock = threading.RLock()
        self._jobs: OrderedDict[str, VideoJob] = OrderedDict()  # oldest first
        self._bytes = 0

    # ------------------------------------------------------------------ adding
    def make_room(self, owner: str) -> None:
        """Push out finished jobs until `owner` may add one; VideoStoreFull when it can't.
        Call it before submitting to the engine, then `add` with no await in between."""
        with self._lock:
            self._make_room(owner)

    def add(self, job: VideoJob) -> None:
        with self._lock:
            self._make_room(job.owner)
            self.store.add_video_job(job.id, job.owner, job.params, job.fps, job.created_at)
            self._jobs[job.id] = job

    def load(self) -> list[VideoJob]:
        """The jobs the store holds (from before a restart) into this store; returns the unfinished
        ones, which wait for their request (`VideoJob.attach`). A finished job whose files are gone is
        dropped."""
        waiting = []
        with self._lock:
            for row in self.store.video_jobs():
                job = VideoJob(id=row.id, owner=row.owner, handle=None, fps=row.fps, created_at=row.created_at,
                               params=row.params, finished_at=row.finished_at,
                               files=None if row.files is None else VideoFiles.from_record(row.files),
                               error=None if row.error is None else VideoError(*row.error))
                if job.files is not None and not job.files.exist():
                    self.store.remove_video_job(job.id)
                    continue
                self._jobs[job.id] = job
                self._bytes += job.files.size_bytes if job.files is not None else 0
                if not job.is_finished:
                    waiting.append(job)
            self._drop_expired()
        return waiting

    def by_id(self, job_id: str) -> VideoJob | None:
        """A job whoever owns it (for the server's own follower)."""
        with self._lock:
            return self._jobs.get(job_id)

    def _make_room(self, owner: str) -> None:
        self._drop_expired()
        own = [job for job in self._jobs.values() if job.owner == owner]
        if len(own) >= self.max_jobs_per_owner:
            finished = [job for job in own if job.is_finished]
            if not finished:
                raise VideoStoreFull(
                    f"this caller already has {len(own)} videos in progress (limit {self.max_jobs_per_owner}); "
                    "wait for one to finish or delete one."
                )
            self._drop(finished[0])
        while len(self._jobs) >= self.max_jobs:
            if not self._drop_oldest_finished_of_largest_owner(keep=None):
                raise VideoStoreFull(
                    f"the server holds {len(self._jobs)} videos in progress, its limit; try again shortly."
                )

    # ------------------------------------------------------------------ reading and deleting
    def get(self, job_id: str, owner: str) -> VideoJob | None:
        with self._lock:
            self._drop_expired()
            job = self._jobs.get(job_id)
            return job if job is not None and job.owner == owner else None

    def jobs_of(self, owner: str) -> list[VideoJob]:
        """The caller's jobs, oldest first."""
        with self._lock:
            self._drop_expired()
            return [job for job in self._jobs.values() if job.owner == owner]

    def remove(self, job_id: str, owner: str) -> VideoJob | None:
        with self._lock:
            self._drop_expired()
            job = self._jobs.get(job_id)
            if job is None or job.owner != owner:
                return None
            self._drop(job)
            return job

    def __len__(self) -> int:
        with self._lock:
            self._drop_expired()
            return len(self._jobs)

    @property
    def total_bytes(self) -> int:
        with self._lock:
            self._drop_expired()
            return self._bytes

    # ------------------------------------------------------------------ finishing
    def finish(self, job: VideoJob, files: VideoFiles | None = None, error: VideoError | None = None,
               in_same_commit: Callable[[], None] | None = None) -> bool:
        """Record how a job ended (its files, or why it failed); False when it is no longer
        stored (deleted meanwhile). Files that alone pass the byte limit fail the job instead (and
        are removed). `in_same_commit`: more store writes that land with the job's end."""
        with self._lock:
            if self._jobs.get(job.id) is not job:
                return False
            if files is not None and files.size_bytes > self.max_bytes:
                files.remove()
                files, error = None, VideoError(
                    "video_too_large",
                    f"the finished video takes {files.size_bytes} bytes, above this server's store of "
                    f"{self.max_bytes} bytes: ask for fewer frames or a smaller size.",
                )
            finished_at = self._clock()
            with self.store.transaction():
                self.store.finish_video_job(job.id, finished_at, None if files is None else files.as_record(),
                                            None if error is None else (error.code, error.message))
                if in_same_commit is not None:
                    in_same_commit()
            if files is not None:
                files.commit()
            job.files, job.error, job.finished_at = files, error, finished_at
            if files is not None:
                self._bytes += files.size_bytes
                while self._bytes > self.max_bytes and self._drop_oldest_finished_of_largest_owner(keep=job):
                    pass
            return True

    def expires_at(self, job: VideoJob) -> float | None:
        return None if job.finished_at is None else job.finished_at + self.ttl_s

    # ------------------------------------------------------------------ internals (under the lock)
    def _drop_oldest_finished_of_largest_owner(self, keep: VideoJob | None) -> bool:
        finished: dict[str, list[VideoJob]] = {}
        for job in self._jobs.values():
            if job.is_finished and job is not keep:
                finished.setdefault(job.owner, []).append(job)
        if not finished:
            return False
        largest = max(finished, key=lambda owner: len(finished[owner]))
        self._drop(finished[largest][0])
        return True

    def _drop_expired(self) -> None:
        now = self._clock()
        for job in [job for job in self._jobs.values() if job.is_finished and job.finished_at + self.ttl_s <= now]:
            self._drop(job)

    def _drop(self, job: VideoJob) -> None:
        del self._jobs[job.id]
        self.store.remove_video_job(job.id)
        if job.files is not None:
            self._bytes -= job.files.size_bytes
            job.files.remove()

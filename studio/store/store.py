"""The studio's durable state, over one SQLite database (studio.store.database): the requests it
accepted and has not finished, the workflow runs with branches still owed, the video jobs and the
`url` images of the HTTP API, each caller's history index, and the paused queues.

    store = StudioStore.open(Path("outputs"))          # <outputs>/studio.db; StudioStore.open(None): in memory
    entry = store.accept("image", session, owner, params)          # once the engine has taken it
    store.finished(entry)                                             # it ended without a result
    with store.transaction():                                         # it ended with one: in one commit,
        store.add_history(item); store.finished(entry)                # its index row in, its entry out
    store.pending()                                                   # at start: what to resume, in order
    store.save_pauses(engine.pause_state); store.pauses()             # the paused queues (studio.store.pauses)
    entry = await store.off_loop(store.accept, "image", ...)          # from asyncio: on the store's writer thread

The rule that makes a result exactly-once: a request's entry leaves `accepted` in the same
transaction that files its result (studio.outputs writes the files first, under names that say
they are unfinished, and renames them after the commit). A crash before the commit leaves the entry,
so the request runs again; after it, the index holds the result, and the next start finishes the
renames (`OutputStore.finish_partial_files`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from engine import GenerationParams, PauseState
from studio.store.database import DATABASE_FILE, open_database, release_lock
from studio.store.records import params_from_record, params_record


T = TypeVar("T")


@dataclass(frozen=True)
class AcceptedRequest:
    """A request the studio accepted and has not finished (a row of `accepted`)."""

    id: int  # its place in the order of acceptance
    kind: str  # "image" | "video_job"
    session: str
    owner: str
    params: GenerationParams
    video_id: str | None
    accepted_at: float
    restarts: int


@dataclass(frozen=True)
class VideoJobRow:
    id: str
    owner: str
    params: GenerationParams
    fps: int
    created_at: float
    finished_at: float | None
    error: tuple[str, str] | None  # (code, message)
    files: dict | None  # {"paths": {variant: path}, "size_bytes": n}


@dataclass(frozen=True)
class JournaledRun:
    """A workflow run whose branches have not all ended (a row of `workflow_runs`)."""

    id: str
    session: str
    owner: str
    source: str  # the workflow JSON as it was sent
    seeds: dict[str, int]  # sampler -> the seed it drew
    saves_workflow: bool
    accepted_at: float
    restarts: int
    ended: dict[int, str | None]  # branch -> its saved picture (None: it ended without one)


class StudioStore:
    def __init__(self, connection: sqlite3.Connection, path: Path | None) -> None:
        self.path = path  # None: in memory (--no-save)
        self._db = connection
        self._lock = threading.RLock()  # one connection, used from the event loop and worker threads
        self._depth = 0
        # Writes asyncio code awaits (off_loop): one thread, so they commit in the order asked.
        self._writer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="stepstudio-store")

    @classmethod
    def open(cls, folder: Path | None) -> "StudioStore":
        """The store of an outputs folder (StoreError when its database can't be used); None: in memory."""
        if folder is None:
            return cls(open_database(None), None)
        folder = Path(folder)
        path = folder / DATABASE_FILE
        return cls(open_database(path, history_folder=folder / "history"), path)

    @property
    def is_durable(self) -> bool:
        return self.path is not None

    async def off_loop(self, write: Callable[..., T], *args) -> T:
        """`write(*args)` (store writes: each commit is synced, a millisecond or, on a slow disk, far
        more) on the store's writer thread, awaited: the event loop serves everyone else meanwhile.
        Writes asked this way run one at a time, in the order asked. A caller cancelled while it
        waits does not stop the write: put what must follow it (following the request) in `write`."""
        return await asyncio.wrap_future(self._writer.submit(write, *args))

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        with self._lock:
            self._db.close()
            if self.path is not None:
                release_lock(self.path)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """One commit for everything inside (nested ones join the outer one)."""
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            self._db.execute("BEGIN IMMEDIATE")
            self._depth = 1
            try:
                yield
            except BaseException:
                self._depth = 0
                self._db.execute("ROLLBACK")
                raise
            self._depth = 0
            self._db.execute("COMMIT")

    def _execute(self, sql: str, values: tuple = ()) -> sqlite3.Cursor:
        with self.transaction():
            return self._db.execute(sql, values)

    def _rows(self, sql: str, values: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, values).fetchall()

    # ------------------------------------------------------------------ accepted requests
    def accept(self, kind: str, session: str, owner: str, params: GenerationParams,
               video_id: str | None = None) -> AcceptedRequest:
        """Record a request the engine has taken (its params complete: the seed filled in)."""
        text, init_png, mask_png = params_record(params)
        now = time.time()
        cursor = self._execute(
            "INSERT INTO accepted (kind, session, owner, params, init_image, mask_image, video_id, accepted_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (kind, session, owner, text, init_png, mask_png, video_id, now))
        return AcceptedRequest(cursor.lastrowid, kind, session, owner, params, video_id, now, 0)

    def finished(self, entry: AcceptedRequest) -> None:
        """The request ended (with its result filed in the same transaction, or without one)."""
        self._execute("DELETE FROM accepted WHERE id = ?", (entry.id,))

    def resumed(self, entry: AcceptedRequest) -> AcceptedRequest:
        """Count one more restart for a request run again."""
        self._execute("UPDATE accepted SET restarts = restarts + 1 WHERE id = ?", (entry.id,))
        return AcceptedRequest(entry.id, entry.kind, entry.session, entry.owner, entry.params, entry.video_id,
                               entry.accepted_at, entry.restarts + 1)

    def pending(self) -> list[AcceptedRequest]:
        """Every accepted request not finished, in the order they were accepted."""
        rows = self._rows("SELECT id, kind, session, owner, params, init_image, mask_image, video_id, accepted_at,"
                          " restarts FROM accepted ORDER BY id")
        return [AcceptedRequest(row[0], row[1], row[2], row[3], params_from_record(row[4], row[5], row[6]),
                                row[7], row[8], row[9]) for row in rows]

    # ------------------------------------------------------------------ workflow runs
    def accept_run(self, run_id: str, session: str, owner: str, source: str, seeds: dict[str, int],
                   saves_workflow: bool) -> None:
        """Record a workflow run the engine started taking (its branches end one by one)."""
        self._execute("INSERT INTO workflow_runs (id, session, owner, source, seeds, saves_workflow, accepted_at)"
                      " VALUES (?, ?, ?, ?, ?, ?, ?)",
                      (run_id, session, owner, source, json.dumps(seeds), int(saves_workflow), time.time()))

    def branch_ended(self, run_id: str, branch: int, path: str | None) -> None:
        """One branch of a run ended: with its result saved at `path` (in the commit that indexes
        it), or without one (failed, or cancelled by its caller)."""
        self._execute("INSERT OR REPLACE INTO workflow_branches (run_id, branch, path) VALUES (?, ?, ?)",
                      (run_id, branch, path))

    def run_finished(self, run_id: str) -> None:
        """Every branch of the run ended (or its caller stopped it): nothing of it is owed."""
        self._execute("DELETE FROM workflow_runs WHERE id = ?", (run_id,))

    def run_resumed(self, run_id: str) -> None:
        self._execute("UPDATE workflow_runs SET restarts = restarts + 1 WHERE id = ?", (run_id,))

    def pending_runs(self) -> list[JournaledRun]:
        """Every workflow run with branches still owed, in the order they started."""
        runs = self._rows("SELECT id, session, owner, source, seeds, saves_workflow, accepted_at, restarts"
                          " FROM workflow_runs ORDER BY accepted_at, rowid")
        ended: dict[str, dict[int, str | None]] = {}
        for run_id, branch, path in self._rows("SELECT run_id, branch, path FROM workflow_branches"):
            ended.setdefault(run_id, {})[branch] = path
        return [JournaledRun(row[0], row[1], row[2], row[3], json.loads(row[4]), bool(row[5]), row[6], row[7],
                             ended.get(row[0], {})) for row in runs]

    # ------------------------------------------------------------------ video jobs
    def add_video_job(self, job_id: str, owner: str, params: GenerationParams, fps: int, created_at: float) -> None:
        self._execute("INSERT INTO video_jobs (id, owner, params, fps, created_at) VALUES (?, ?, ?, ?, ?)",
                      (job_id, owner, params_record(params)[0], fps, created_at))

    def finish_video_job(self, job_id: str, finished_at: float, files: dict | None,
                         error: tuple[str, str] | None) -> None:
        self._execute("UPDATE video_jobs SET finished_at = ?, files = ?, error_code = ?, error_message = ? WHERE id = ?",
                      (finished_at, None if files is None else json.dumps(files),
                       None if error is None else error[0], None if error is None else error[1], job_id))

    def remove_video_job(self, job_id: str) -> None:
        self._execute("DELETE FROM video_jobs WHERE id = ?", (job_id,))

    def video_jobs(self) -> list[VideoJobRow]:
        """Every video job, oldest first."""
        rows = self._rows("SELECT id, owner, params, fps, created_at, finished_at, error_code, error_message, files"
                          " FROM video_jobs ORDER BY created_at, rowid")
        return [VideoJobRow(row[0], row[1], params_from_record(row[2], None, None), row[3], row[4], row[5],
                            None if row[6] is None else (row[6], row[7] or ""),
                            None if row[8] is None else json.loads(row[8])) for row in rows]

    # ------------------------------------------------------------------ url images of the HTTP API
    def add_url_image(self, name: str, owner: str, size: int, expires_at: float) -> None:
        self._execute("INSERT INTO url_images (name, owner, size, expires_at) VALUES (?, ?, ?, ?)",
                      (name, owner, size, expires_at))

    def remove_url_image(self, name: str) -> None:
        self._execute("DELETE FROM url_images WHERE name = ?", (name,))

    def url_images(self) -> list[tuple[str, str, int, float]]:
        """Every kept url image as (name, owner, size, expires_at), the first to expire first."""
        return self._rows("SELECT name, owner, size, expires_at FROM url_images ORDER BY expires_at, rowid")

    # ------------------------------------------------------------------ paused queues
    def save_pauses(self, state: PauseState) -> None:
        """Keep `state` as the pauses in force, in place of those kept (one commit)."""
        with self.transaction():
            self._db.execute("DELETE FROM pauses")
            if state.engine:
                self._db.execute("INSERT INTO pauses (scope, session, ends_at) VALUES ('engine', '', NULL)")
            self._db.executemany("INSERT INTO pauses (scope, session, ends_at) VALUES ('session', ?, ?)",
                                 [(session, state.ends_at(session)) for session in sorted(state.sessions)])

    def pauses(self) -> PauseState:
        """The pauses kept (a session's whose end has passed too: whoever pauses again drops it)."""
        rows = self._rows("SELECT scope, session, ends_at FROM pauses")
        sessions = {session: ends_at for scope, session, ends_at in rows if scope == "session"}
        return PauseState(engine=any(scope == "engine" for scope, _, _ in rows), sessions=frozenset(sessions),
                          ends=tuple(sorted((s, end) for s, end in sessions.items() if end is not None)))

    # ------------------------------------------------------------------ the history index
    def add_history(self, item: dict) -> None:
        """One saved result (studio.outputs.SavedOutput's fields)."""
        self._execute(
            "INSERT INTO history (owner, path, poster, kind, created, parameters, settings, has_workflow)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (item["owner"], item["path"], item["poster"], item["kind"], item["created"], item["parameters"],
             json.dumps(item["settings"]), int(item["has_workflow"])))

    def history(self, owner: str, limit: int) -> list[dict]:
        """An owner's saved results, newest first."""
        rows = self._rows("SELECT owner, path, poster, kind, created, parameters, settings, has_workflow FROM history"
                          " WHERE owner = ? ORDER BY created DESC, id DESC LIMIT ?", (owner, limit))
        return [{"owner": row[0], "path": row[1], "poster": row[2], "kind": row[3], "created": row[4],
                 "parameters": row[5], "settings": json.loads(row[6]), "has_workflow": bool(row[7])} for row in rows]

    def is_indexed(self, path: str) -> bool:
        return bool(self._rows("SELECT 1 FROM history WHERE path = ? OR poster = ?", (path, path)))

    def adopt(self, old_owner: str, new_owner: str) -> None:
        """File every result of `old_owner` under `new_owner`."""
        self._execute("UPDATE history SET owner = ? WHERE owner = ?", (new_owner, old_owner))

    def counts(self) -> dict[str, int]:
        """Rows per table (for logs and benchmarks)."""
        return {table: self._rows(f"SELECT count(*) FROM {table}")[0][0]
                for table in ("accepted", "video_jobs", "history", "workflow_runs", "workflow_branches",
                              "url_images", "pauses")}

"""The studio's SQLite database: opened once per process, its schema versioned and migrated at start.

    connection = open_database(Path("outputs/studio.db"), history_folder=Path("outputs/history"))
    connection = open_database(None)            # --no-save: in memory, gone with the process

WAL mode lets readers (the History tab, `videos.retrieve`) read beside the one writer, and every
commit is synced (`synchronous=FULL`): what a caller was told is accepted survives a crash or a
power cut. `PRAGMA user_version` is the schema's version; each migration below brings it one up,
in one transaction. A database this code can't use is never reset silently: a file that is not a
database, one from a newer studio, or one another studio holds raises StoreError, whose message
says what to do (the CLI exits with status 2 then).

One studio per database: a lock file beside it (`studio.db.lock`, flock) is held for the
process's life, because two studios on one folder would both resume the same accepted work.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import sqlite3
import threading
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)

DATABASE_FILE = "studio.db"
BUSY_TIMEOUT_S = 5.0  # how long a write waits for a lock another connection holds


class StoreError(Exception):
    """The database can't be used as it is; the message names the file and a way out."""


# ---------------------------------------------------------------------------- migrations
def _schema_1(connection: sqlite3.Connection, history_folder: Path | None) -> None:
    """The first schema: accepted requests, video jobs and the history index (the index imported
    from the `history/<owner>.jsonl` files studios before it wrote)."""
    _run_statements(connection, """
        CREATE TABLE accepted (              -- requests accepted and not finished, in their order
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            kind TEXT NOT NULL,              -- 'image' (a /generate-family request) | 'video_job'
            session TEXT NOT NULL,           -- the engine session it runs for
            owner TEXT NOT NULL,             -- whose history its result joins ('' = not saved)
            params TEXT NOT NULL,            -- studio.store.records: GenerationParams as JSON
            init_image BLOB,                 -- PNG
            mask_image BLOB,                 -- PNG
            video_id TEXT,                   -- the video job it makes (kind 'video_job')
            accepted_at REAL NOT NULL,
            restarts INTEGER NOT NULL DEFAULT 0  -- how often it was resumed after a restart
        );
        CREATE TABLE video_jobs (
            id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,             -- the caller's engine session
            params TEXT NOT NULL,
            fps INTEGER NOT NULL,
            created_at REAL NOT NULL,
            finished_at REAL,
            error_code TEXT,
            error_message TEXT,
            files TEXT                       -- JSON: the downloads' paths and their size in bytes
        );
        CREATE TABLE history (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            owner TEXT NOT NULL,
            path TEXT NOT NULL UNIQUE,
            poster TEXT,
            kind TEXT NOT NULL,
            created REAL NOT NULL,
            parameters TEXT NOT NULL,
            settings TEXT NOT NULL,
            has_workflow INTEGER NOT NULL
        );
        CREATE INDEX history_by_owner ON history (owner, created);
    """)
    for path in sorted(history_folder.glob("*.jsonl")) if history_folder and history_folder.is_dir() else ():
        imported = 0
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                item = json.loads(line)
                connection.execute(
                    "INSERT OR IGNORE INTO history (owner, path, poster, kind, created, parameters, settings,"
                    " has_workflow) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (item["owner"], item["path"], item.get("poster"), item["kind"], float(item["created"]),
                     item["parameters"], json.dumps(item.get("settings") or {}), int(bool(item.get("has_workflow")))))
                imported += 1
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a crash, as the files' reader skipped it
        log.info("history index: %d results imported from %s", imported, path.name)


def _run_statements(connection: sqlite3.Connection, script: str) -> None:
    """Each statement of `script` inside the open transaction (executescript would commit first).
    Statements are split at every ";": none may appear in a comment."""
    for statement in script.split(";"):
        if statement.strip():
            connection.execute(statement)


def _schema_2(connection: sqlite3.Connection, history_folder: Path | None) -> None:
    """Workflow runs (the editor's and the Simple tab's) until every branch has ended, and how each
    branch ended, so a restart runs the rest."""
    _run_statements(connection, """
        CREATE TABLE workflow_runs (
            id TEXT PRIMARY KEY,             -- the run's id
            session TEXT NOT NULL,           -- the engine session it runs for
            owner TEXT NOT NULL,             -- whose history its results join
            source TEXT NOT NULL,            -- the workflow JSON as it was sent (pictures as data URLs)
            seeds TEXT NOT NULL,             -- JSON: the seed each sampler drew, so it runs again the same
            saves_workflow INTEGER NOT NULL, -- its results carry the workflow (the editor's runs)
            accepted_at REAL NOT NULL,
            restarts INTEGER NOT NULL DEFAULT 0
        );
        CREATE TABLE workflow_branches (     -- the branches of a run that ended
            run_id TEXT NOT NULL REFERENCES workflow_runs (id) ON DELETE CASCADE,
            branch INTEGER NOT NULL,
            path TEXT,                       -- its saved picture (a video's poster), NULL when it ended without one
            PRIMARY KEY (run_id, branch)
        )
    """)


def _schema_3(connection: sqlite3.Connection, history_folder: Path | None) -> None:
    """The HTTP API's `response_format="url"` images (files in <outputs>/url-images/), so a URL
    a caller was given answers across a restart until it expires."""
    _run_statements(connection, """
        CREATE TABLE url_images (
            name TEXT PRIMARY KEY,           -- the file's random name, the URL's last part
            owner TEXT NOT NULL,             -- the caller's engine session (its share of the room)
            size INTEGER NOT NULL,           -- bytes
            expires_at REAL NOT NULL         -- unix seconds
        );
        CREATE INDEX url_images_by_expiry ON url_images (expires_at)
    """)


def _schema_4(connection: sqlite3.Connection, history_folder: Path | None) -> None:
    """Paused queues: each caller's pause of its own queue (with when it ends by itself) and the
    operator's pause of the whole engine, so a restart pauses them again (studio.store.pauses)."""
    _run_statements(connection, """
        CREATE TABLE pauses (
            scope TEXT NOT NULL CHECK (scope IN ('engine', 'session')),
            session TEXT NOT NULL,           -- the paused engine session ('' for the engine's pause)
            ends_at REAL,                    -- unix seconds it ends by itself, NULL when only a resume ends it
            PRIMARY KEY (scope, session)
        )
    """)


# The migrations in order: MIGRATIONS[k] brings a database from version k to k + 1.
MIGRATIONS: list[Callable[[sqlite3.Connection, Path | None], None]] = [_schema_1, _schema_2, _schema_3, _schema_4]
SCHEMA_VERSION = len(MIGRATIONS)


# ---------------------------------------------------------------------------- one studio per file
_held_locks: dict[str, tuple[int, int]] = {}  # database path -> (lock file descriptor, users here)
_locks_guard = threading.Lock()


def _hold_lock(path: Path) -> None:
    """Take the database's lock file for this process (several opens in one process share it)."""
    key = str(path.resolve())
    with _locks_guard:
        if key in _held_locks:
            descriptor, users = _held_locks[key]
            _held_locks[key] = (descriptor, users + 1)
            return
        descriptor = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 32, 0).decode("ascii", "replace").strip() or "another process"
            os.close(descriptor)
            raise StoreError(f"{path} is in use by another studio (pid {holder}): stop it first, or start this "
                             "one with another --outputs folder (or --no-save).") from None
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, str(os.getpid()).encode(), 0)
        _held_locks[key] = (descriptor, 1)


def release_lock(path: Path) -> None:
    key = str(path.resolve())
    with _locks_guard:
        if key not in _held_locks:
            return
        descriptor, users = _held_locks[key]
        if users > 1:
            _held_locks[key] = (descriptor, users - 1)
            return
        del _held_locks[key]
        os.close(descriptor)  # closing it releases the flock


# ---------------------------------------------------------------------------- opening
def open_database(path: Path | None, history_folder: Path | None = None) -> sqlite3.Connection:
    """The database at `path` (made when missing) at SCHEMA_VERSION; None: one in memory.
    `history_folder`: where the history files of earlier studios are, for the first migration.
    Raises StoreError (see the module docstring)."""
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:  # a file where the folder goes, no permission, a read-only disk
            raise StoreError(f"the outputs folder {path.parent} can't be made: {error.strerror or error} "
                             "(pick another --outputs, or --no-save).") from None
        _hold_lock(path)
    try:
        connection = _connect(path)
        _migrate(connection, path, history_folder)
    except BaseException:
        if path is not None:
            release_lock(path)
        raise
    return connection


def _connect(path: Path | None) -> sqlite3.Connection:
    where = ":memory:" if path is None else str(path)
    # Autocommit mode: every transaction is an explicit `with store.transaction()` (BEGIN IMMEDIATE).
    connection = sqlite3.connect(where, timeout=BUSY_TIMEOUT_S, check_same_thread=False, isolation_level=None)
    try:
        if path is not None:
            mode = connection.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise StoreError(f"{path} can't use write-ahead logging (journal mode {mode!r}): put --outputs on "
                                 "a local disk.")
        connection.execute("PRAGMA synchronous=FULL")
        connection.execute("PRAGMA foreign_keys=ON")
        return connection
    except sqlite3.DatabaseError as error:
        connection.close()
        raise _unusable(path, error) from None


def _migrate(connection: sqlite3.Connection, path: Path | None, history_folder: Path | None) -> None:
    try:
        # Read under the write lock, so two studios starting at once can't both migrate.
        connection.execute("BEGIN IMMEDIATE")
        try:
            version = connection.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{path} has schema version {version}, newer than this studio knows ({SCHEMA_VERSION}): it was "
                    "written by a newer stepstudio. Run that version, or start this one with another --outputs "
                    "folder; the file is left as it is.")
            if version == 0 and _has_tables(connection):
                raise StoreError(f"{path} is an SQLite database, but not a studio's: move it away, or choose "
                                 "another --outputs folder.")
            for number in range(version, SCHEMA_VERSION):
                MIGRATIONS[number](connection, history_folder)
            connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        if version < SCHEMA_VERSION:
            log.info("%s: schema migrated from version %d to %d", path or "the in-memory store", version,
                     SCHEMA_VERSION)
        if path is not None:
            problem = connection.execute("PRAGMA quick_check").fetchone()[0]
            if problem != "ok":
                raise sqlite3.DatabaseError(f"integrity check: {problem}")
    except sqlite3.DatabaseError as error:
        connection.close()
        raise _unusable(path, error) from None


def _has_tables(connection: sqlite3.Connection) -> bool:
    return connection.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0] > 0


def _unusable(path: Path | None, error: sqlite3.DatabaseError) -> StoreError:
    text = str(error)
    if "locked" in text or "busy" in text:
        return StoreError(f"{path} is locked by another process ({text}) for more than {BUSY_TIMEOUT_S:g} s: stop "
                          "whatever holds it (another studio, a database browser), then start again.")
    return StoreError(
        f"{path} can't be read as the studio's database ({text}). Nothing was changed. To start afresh, move it "
        f"away (e.g. `mv {path} {path}.broken`, and its -wal and -shm files): the saved images stay in their "
        "folders, but the queue of accepted work and the History index in it are not recovered.")

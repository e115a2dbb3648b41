"""PNG files the HTTP API serves for `response_format="url"`: bounded, expiring, and kept across
a restart when the studio saves its outputs.

Names are random and unguessable (the URL is the only key to someone's image). The store
holds at most `max_files` files and `max_bytes` bytes, and every file disappears `ttl_s`
seconds after it was stored. Room is shared fairly: one owner (an API caller) holds at most
`max_files_per_owner` files (its own oldest go first), and when the whole store is full the
owner holding the most files gives up its oldest. So no caller can push others' images out
by generating many of its own.

Where the bytes live: in memory (`folder=None`), or as files in `folder` (`<outputs>/url-images/`)
indexed in the studio's durable store (its `url_images` table), so a URL a caller was given still
answers after a restart until it expires. A file is written (and synced) before its row is
committed, and its row removed before the file: a crash between the two leaves a file without a
row, which the next start deletes (`load`); a row never points at a file that was never written.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from studio.store.store import StudioStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _StoredFile:
    owner: str
    size: int
    expires_at: float  # unix seconds (the store's clock)
    data: bytes | None  # the PNG in memory; None: it is the file of that name in the store's folder


class ImageFileStore:
    def __init__(
        self,
        max_files: int = 256,
        max_bytes: int = 256 * 2**20,
        ttl_s: float = 3600.0,
        clock: Callable[[], float] = time.time,
        max_files_per_owner: int | None = None,  # None: an eighth of max_files (at least 1)
        folder: Path | None = None,
        store: StudioStore | None = None,
    ) -> None:
        """`folder` and `store`: keep the files in `folder`, indexed in `store` (both or neither;
        call `load()` once at start to take back what an earlier process kept)."""
        if (folder is None) != (store is None):
            raise ValueError("folder and store go together: give both to keep images across a restart, or neither.")
        for name, value in (("max_files", max_files), ("max_bytes", max_bytes), ("ttl_s", ttl_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}.")
        per_owner = max(1, max_files // 8) if max_files_per_owner is None else max_files_per_owner
        if isinstance(per_owner, bool) or not isinstance(per_owner, int) or per_owner < 1:
            raise ValueError(f"max_files_per_owner must be a positive integer, got {per_owner!r}.")
        self.max_files = max_files
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.max_files_per_owner = per_owner
        self._clock = clock
        self.folder = folder
        self._store = store
        self._lock = threading.Lock()
        self._files: OrderedDict[str, _StoredFile] = OrderedDict()  # oldest first
        self._by_owner: dict[str, OrderedDict[str, None]] = {}  # owner -> its names, oldest first
        self._bytes = 0

    def put(self, png: bytes, owner: str = "") -> str:
        """Store one PNG for `owner`; returns its name (e.g. 'Zx3...q.png')."""
        if len(png) > self.max_bytes:
            raise ValueError(f"an image of {len(png)} bytes does not fit a store of {self.max_bytes} bytes.")
        name = f"{secrets.token_urlsafe(24)}.png"
        if self.folder is not None:  # written and synced before its row exists (blocking: call it off the event loop)
            self.folder.mkdir(parents=True, exist_ok=True)
            with open(self.folder / name, "wb") as file:
                file.write(png)
                file.flush()
                os.fsync(file.fileno())
        with self._lock, self._transaction():
            now = self._clock()
            self._drop_expired(now)
            own = self._by_owner.get(owner, {})
            while len(own) >= self.max_files_per_owner:
                self._drop(next(iter(own)))
            while self._files and (len(self._files) >= self.max_files or self._bytes + len(png) > self.max_bytes):
                largest_owner = max(self._by_owner, key=lambda o: (len(self._by_owner[o]), o == owner))
                self._drop(next(iter(self._by_owner[largest_owner])))
            self._add(name, _StoredFile(owner, len(png), now + self.ttl_s, None if self.folder else png))
            if self._store is not None:
                self._store.add_url_image(name, owner, len(png), now + self.ttl_s)
        return name

    def get(self, name: str) -> bytes | None:
        """The PNG stored under `name`, or None when unknown or expired."""
        with self._lock:
            self._drop_expired(self._clock())
            stored = self._files.get(name)
        if stored is None or stored.data is not None:
            return None if stored is None else stored.data
        try:
            return (self.folder / name).read_bytes()
        except FileNotFoundError:  # dropped (and deleted) since it was looked up
            return None

    def load(self) -> int:
        """Take back the images an earlier process kept (the unexpired ones, oldest first), and
        delete the files no row names (written just before a crash, or left by a drop cut short).
        Returns how many images are served again."""
        if self._store is None:
            return 0
        with self._lock:
            for name, owner, size, expires_at in self._store.url_images():
                self._add(name, _StoredFile(owner, size, expires_at, None))
            self._drop_expired(self._clock())
            kept = len(self._files)
        for path in self.folder.glob("*") if self.folder.is_dir() else ():
            if path.name not in self._files:
                path.unlink(missing_ok=True)
        if kept:
            log.info("%d url images kept from before the restart", kept)
        return kept

    def __len__(self) -> int:
        with self._lock:
            self._drop_expired(self._clock())
            return len(self._files)

    @property
    def total_bytes(self) -> int:
        with self._lock:
            self._drop_expired(self._clock())
            return self._bytes

    def _transaction(self):
        """One commit for every row a call adds or removes (no store: nothing to commit)."""
        return self._store.transaction() if self._store is not None else _NO_TRANSACTION

    def _add(self, name: str, stored: _StoredFile) -> None:
        self._files[name] = stored
        self._by_owner.setdefault(stored.owner, OrderedDict())[name] = None
        self._bytes += stored.size

    def _drop_expired(self, now: float) -> None:
        # Insertion order is expiry order (one ttl for all), so expired files are at the front.
        if not self._files or next(iter(self._files.values())).expires_at > now:
            return
        with self._transaction():
            while self._files and next(iter(self._files.values())).expires_at <= now:
                self._drop(next(iter(self._files)))

    def _drop(self, name: str) -> None:
        stored = self._files.pop(name)
        self._bytes -= stored.size
        own = self._by_owner[stored.owner]
        del own[name]
        if not own:
            del self._by_owner[stored.owner]
        if self._store is not None:
            self._store.remove_url_image(name)  # the row first: a crash after it leaves a file the next start deletes
            (self.folder / name).unlink(missing_ok=True)


_NO_TRANSACTION = contextlib.nullcontext()

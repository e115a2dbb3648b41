"""PNG files the HTTP API serves for `response_format="url"`: in memory, bounded, expiring.

Names are random and unguessable (the URL is the only key to someone's image). The store
holds at most `max_files` files and `max_bytes` bytes, and every file disappears `ttl_s`
seconds after it was stored. Room is shared fairly: one owner (an API caller) holds at most
`max_files_per_owner` files (its own oldest go first), and when the whole store is full the
owner holding the most files gives up its oldest. So no caller can push others' images out
by generating many of its own.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class _StoredFile:
    data: bytes
    owner: str
    expires_at: float


class ImageFileStore:
    def __init__(
        self,
        max_files: int = 256,
        max_bytes: int = 256 * 2**20,
        ttl_s: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
        max_files_per_owner: int | None = None,  # None: an eighth of max_files (at least 1)
    ) -> None:
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
        self._lock = threading.Lock()
        self._files: OrderedDict[str, _StoredFile] = OrderedDict()  # oldest first
        self._by_owner: dict[str, OrderedDict[str, None]] = {}  # owner -> its names, oldest first
        self._bytes = 0

    def put(self, png: bytes, owner: str = "") -> str:
        """Store one PNG for `owner`; returns its name (e.g. 'Zx3...q.png')."""
        if len(png) > self.max_bytes:
            raise ValueError(f"an image of {len(png)} bytes does not fit a store of {self.max_bytes} bytes.")
        name = f"{secrets.token_urlsafe(24)}.png"
        with self._lock:
            now = self._clock()
            self._drop_expired(now)
            own = self._by_owner.get(owner, {})
            while len(own) >= self.max_files_per_owner:
                self._drop(next(iter(own)))
            while self._files and (len(self._files) >= self.max_files or self._bytes + len(png) > self.max_bytes):
                largest_owner = max(self._by_owner, key=lambda o: (len(self._by_owner[o]), o == owner))
                self._drop(next(iter(self._by_owner[largest_owner])))
            self._files[name] = _StoredFile(png, owner, now + self.ttl_s)
            self._by_owner.setdefault(owner, OrderedDict())[name] = None
            self._bytes += len(png)
        return name

    def get(self, name: str) -> bytes | None:
        """The PNG stored under `name`, or None when unknown or expired."""
        with self._lock:
            self._drop_expired(self._clock())
            stored = self._files.get(name)
            return None if stored is None else stored.data

    def __len__(self) -> int:
        with self._lock:
            self._drop_expired(self._clock())
            return len(self._files)

    @property
    def total_bytes(self) -> int:
        with self._lock:
            self._drop_expired(self._clock())
            return self._bytes

    def _drop_expired(self, now: float) -> None:
        # Insertion order is expiry order (one ttl for all), so expired files are at the front.
        while self._files and next(iter(self._files.values())).expires_at <= now:
            self._drop(next(iter(self._files)))

    def _drop(self, name: str) -> None:
        stored = self._files.pop(name)
        self._bytes -= len(stored.data)
        own = self._by_owner[stored.owner]
        del own[name]
        if not own:
            del self._by_owner[stored.owner]

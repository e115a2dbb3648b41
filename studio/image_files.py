"""PNG files the HTTP API serves for `response_format="url"`: in memory, bounded, expiring.

Names are random and unguessable (the URL is the only key to someone's image). The store
holds at most `max_files` files and `max_bytes` bytes; the oldest go first when it is
full, and every file disappears `ttl_s` seconds after it was stored.
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
    expires_at: float


class ImageFileStore:
    def __init__(
        self,
        max_files: int = 256,
        max_bytes: int = 256 * 2**20,
        ttl_s: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for name, value in (("max_files", max_files), ("max_bytes", max_bytes), ("ttl_s", ttl_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}.")
        self.max_files = max_files
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._files: OrderedDict[str, _StoredFile] = OrderedDict()  # oldest first
        self._bytes = 0

    def put(self, png: bytes) -> str:
        """Store one PNG; returns its name (e.g. 'Zx3...q.png')."""
        if len(png) > self.max_bytes:
            raise ValueError(f"an image of {len(png)} bytes does not fit a store of {self.max_bytes} bytes.")
        name = f"{secrets.token_urlsafe(24)}.png"
        with self._lock:
            now = self._clock()
            self._drop_expired(now)
            while self._files and (len(self._files) >= self.max_files or self._bytes + len(png) > self.max_bytes):
                self._drop_oldest()
            self._files[name] = _StoredFile(png, now + self.ttl_s)
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
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        _, stored = self._files.popitem(last=False)
        self._bytes -= len(stored.data)

"""Slows down guessing of API keys and passwords, per client host.

A failed attempt is answered only after `delay_s`, and the attempts of one host are checked
one at a time, so a host can't try more than one guess per `delay_s`, even in parallel. After
`max_failures` failures within `window_s` the host is locked out for `lockout_s`: its
attempts are refused (HTTP 429) without being checked. A success forgets the host's failures.

Hosts are the TCP peers the server sees: behind a reverse proxy every caller is the proxy,
so put the rate limit in the proxy there.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable


@dataclass
class _Host:
    failures: deque = field(default_factory=deque)  # times of recent failures
    locked_until: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class LockedOut(Exception):
    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"too many failed attempts from this address; try again in {retry_after_s:.0f} s.")
        self.retry_after_s = retry_after_s


class FailedAttempts:
    def __init__(
        self,
        delay_s: float = 1.0,
        max_failures: int = 10,
        window_s: float = 60.0,
        lockout_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.delay_s = delay_s
        self.max_failures = max_failures
        self.window_s = window_s
        self.lockout_s = lockout_s
        self._clock = clock
        self._hosts: dict[str, _Host] = {}

    def check_not_locked(self, host: str) -> None:
        """Raise LockedOut while `host` is locked out."""
        entry = self._hosts.get(host)
        now = self._clock()
        if entry is not None and entry.locked_until > now:
            raise LockedOut(entry.locked_until - now)

    @contextlib.asynccontextmanager
    async def one_at_a_time(self, host: str) -> AsyncIterator[None]:
        """Hold `host`'s turn while one of its attempts is checked (LockedOut while locked)."""
        self.check_not_locked(host)
        entry = self._hosts.setdefault(host, _Host())
        async with entry.lock:
            self.check_not_locked(host)
            yield

    async def attempt(self, host: str, check: Callable[[], bool]) -> bool:
        """Run one credential `check` for `host`: LockedOut while locked; a False result costs
        `delay_s` before it is returned."""
        async with self.one_at_a_time(host):
            ok = check()
            if not ok:
                await self.failed(host)
        if ok:
            self.succeeded(host)
        return ok

    async def failed(self, host: str) -> None:
        """Count a failure of `host` (locking it out past the limit), then wait `delay_s`."""
        entry = self._hosts.setdefault(host, _Host())
        now = self._clock()
        entry.failures.append(now)
        while entry.failures and entry.failures[0] <= now - self.window_s:
            entry.failures.popleft()
        if len(entry.failures) >= self.max_failures:
            entry.locked_until = now + self.lockout_s
            entry.failures.clear()
        await asyncio.sleep(self.delay_s)
        self._prune(now)

    def succeeded(self, host: str) -> None:
        self._forget(host)

    def _forget(self, host: str) -> None:
        entry = self._hosts.get(host)
        if entry is not None and not entry.lock.locked() and entry.locked_until <= self._clock():
            del self._hosts[host]

    def _prune(self, now: float) -> None:
        """Forget hosts with nothing left to remember (bounded memory under many hosts)."""
        if len(self._hosts) < 1024:
            return
        for host, entry in list(self._hosts.items()):
            stale = not entry.failures or entry.failures[-1] <= now - self.window_s
            if stale and entry.locked_until <= now and not entry.lock.locked():
                del self._hosts[host]

"""The facade's own event loop thread, where every call to a replica is made and every request's
relay task runs (`ReplicatedEngine` is one: a mixin)."""

from __future__ import annotations

import asyncio
import contextvars
import threading

from engine import EngineClosedError


class RelayLoop:
    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="stepstudio-replicas", daemon=True)
        self._stopped = threading.Event()  # set once the loop has closed (or was never started)

    def _call(self, make_awaitable, timeout_s: float):
        """Await `make_awaitable()` on the relay loop (where every replica call is made) and wait
        for its result from this, another, thread.

        The relay loop runs each call in an empty context, never the caller's: inside the
        ingress, the caller's context holds the Serve request context of its HTTP call, and every
        replica call made under it would carry that call's internal request id; Serve's router
        tells calls apart by that id, so the second call of one HTTP request would never be routed."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("a blocking replica call on the relay loop itself would never finish.")

        async def run():
            return await make_awaitable()

        try:
            future = contextvars.Context().run(asyncio.run_coroutine_threadsafe, run(), self._loop)
        except RuntimeError:  # the loop is closed
            raise EngineClosedError("the studio is shutting down; no new requests are accepted.") from None
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    def _soon(self, callback, *args) -> None:
        """Run `callback` on the relay loop, outside the caller's context (see `_call`)."""
        self._loop.call_soon_threadsafe(callback, *args, context=contextvars.Context())

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()
            self._stopped.set()

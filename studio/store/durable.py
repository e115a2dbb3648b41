"""Accepted requests followed to their end by the server, whoever else watches them.

    durable = DurableRequests(store)
    future = await durable.accept("image", handle, owner, finish_image(outputs))   # from asyncio
    future = durable.follow(handle, entry, finish_image(outputs))   # entry: store.accept(...), from a thread
    saved = await asyncio.wrap_future(future)                        # once it is filed (or ended)

A caller's stream (a gradio_client `/generate`, a video job's poller) may go at any time; the
record of what the studio accepted must not go with it. So the end of every accepted request is
handled here, on one finisher thread, in the order requests end: a result is saved and its entry
leaves the store in one commit; a request that failed or was cancelled by its caller leaves it;
one aborted because the studio is stopping stays, and runs again at the next start
(studio.store.recovery).
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
from typing import TYPE_CHECKING, Any, Callable

from engine import Aborted, Completed, Event, RequestHandle
from studio.store.store import AcceptedRequest, StudioStore

if TYPE_CHECKING:
    from studio.outputs import OutputStore

log = logging.getLogger(__name__)

# How one kind of request ends: (its entry, its final event) -> what callers wait for.
Finish = Callable[[AcceptedRequest, Event], Any]


def stays_accepted(event: Event) -> bool:
    """Whether a request that ended so is still owed: the studio stopped under it."""
    return isinstance(event, Aborted) and event.cause == "shutdown"


class DurableRequests:
    def __init__(self, store: StudioStore) -> None:
        self.store = store
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._finish_in_order, name="stepstudio-finisher", daemon=True)
        self._thread.start()

    async def accept(self, kind: str, handle: RequestHandle, owner: str, finish: Finish, *,
                     video_id: str | None = None, before: Callable[[], None] | None = None
                     ) -> concurrent.futures.Future:
        """Record `handle`'s request as accepted (its params complete: the seed filled in) and follow
        it with `finish`; returns `follow`'s future. The synced commit runs on the store's writer
        thread (StudioStore.off_loop), never on the event loop, and is done when this returns: answer
        the caller after it. `before()`: writes of its own to make first, on that thread (an error
        there propagates, and nothing is accepted). A request accepted is followed to its end even
        when the awaiting caller is cancelled meanwhile."""
        def accept_and_follow() -> concurrent.futures.Future:
            if before is not None:
                before()
            entry = self.store.accept(kind, handle.session_id, owner, handle.params, video_id=video_id)
            return self.follow(handle, entry, finish)

        return await self.store.off_loop(accept_and_follow)

    def follow(self, handle: RequestHandle, entry: AcceptedRequest, finish: Finish) -> concurrent.futures.Future:
        """Finish `entry` with `finish` when `handle`'s request ends; the future has its answer."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        handle.when_final(lambda event: self._work.put((entry, event, finish, future)))
        return future

    def _finish_in_order(self) -> None:
        while True:
            entry, event, finish, future = self._work.get()
            try:
                if stays_accepted(event):
                    future.set_result(None)
                    continue
                future.set_result(finish(entry, event))
            except Exception as error:  # noqa: BLE001 - one request's end never stops the others'
                log.exception("accepted request %d could not be finished", entry.id)
                try:  # a result that can't be written (a full disk) is not run again at every start
                    self.store.finished(entry)
                except Exception:  # noqa: BLE001
                    log.exception("accepted request %d stays accepted", entry.id)
                future.set_exception(error)


def finish_image(outputs: "OutputStore", workflow: dict | None = None) -> Finish:
    """A /generate-family request's end: its result saved to its owner's history, in the commit
    that ends its entry."""

    def finish(entry: AcceptedRequest, event: Event):
        if isinstance(event, Completed) and outputs.enabled and entry.owner:
            return outputs.save(event, entry.owner, workflow, in_same_commit=lambda _: outputs.index.finished(entry))
        outputs.index.finished(entry)
        return None

    return finish

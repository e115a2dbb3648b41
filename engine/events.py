"""Events the engine sends about one request, and the handle a caller reads them from.

The engine thread emits; any number of consumers read, from threads (`handle.events()`)
or from asyncio (`async for event in handle.stream()`), without polling: thread readers
block on a queue, asyncio readers are woken through `loop.call_soon_threadsafe`.
A consumer that subscribes late first receives every event emitted so far.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AsyncIterator, Callable, Iterator, Union

if TYPE_CHECKING:
    from PIL import Image

    from pipelines.params import GenerationParams


@dataclass(frozen=True)
class Queued:
    position: int  # 1 = next to be admitted
    paused: str = ""  # why it can't start now: "" | "session" (its queue is paused) | "engine" (all are)


@dataclass(frozen=True)
class Started:
    batch_size: int


@dataclass(frozen=True)
class Progress:
    step: int  # steps done, 1..total
    total: int
    batch_size: int  # rows in the forward that made this step
    preview: "Image.Image | None" = None
    skipped: int = 0  # steps so far that reused the request's cached residual (step caching)


@dataclass(frozen=True)
class Timings:
    submitted_at: float
    started_at: float  # first denoise step began (admission)
    finished_at: float

    @property
    def total_s(self) -> float:
        return self.finished_at - self.submitted_at


@dataclass(frozen=True)
class Completed:
    images: "tuple[Image.Image, ...]"  # one image, or the frames of a video
    seed: int
    params: "GenerationParams"
    timings: Timings
    is_video: bool = False
    # The steps (0-based) that reused the request's cached residual instead of running the model's
    # later blocks (step caching, GenerationParams.step_cache); empty without it.
    skipped_steps: tuple[int, ...] = ()


@dataclass(frozen=True)
class Aborted:
    reason: str
    cause: str = "cancelled"  # "cancelled" (by its caller) | "shutdown" (the engine is closing)


@dataclass(frozen=True)
class Failed:
    message: str
    stage: str = "engine"  # which step-protocol method failed (or "engine")


Event = Union[Queued, Started, Progress, Completed, Aborted, Failed]
FINAL_EVENTS = (Completed, Aborted, Failed)


class _LoopDelivery:
    """Hands events to one asyncio loop, waking it once per engine step instead of per event.

    Waking a loop from another thread writes to its self-pipe; with 32 requests in a batch
    that would be 32 syscalls (and 32 thread switches) per step. Events wait here until the
    emitting thread calls `deliver_pending()` at the end of its burst (the engine does
    after every step and every batch of commands).

    The registry holds loops weakly (a closed, dropped loop is freed with its deliveries)."""

    _per_loop: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopDelivery]" = weakref.WeakKeyDictionary()
    _with_pending: "set[_LoopDelivery]" = set()
    _registry_lock = threading.Lock()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # a strong reference would keep the registry's key alive
        self._pending: deque = deque()

    @classmethod
    def for_loop(cls, loop: asyncio.AbstractEventLoop) -> "_LoopDelivery":
        with cls._registry_lock:
            delivery = cls._per_loop.get(loop)
            if delivery is None:
                delivery = cls._per_loop[loop] = cls(loop)
            return delivery

    def deliver(self, inbox: asyncio.Queue, event: "Event") -> None:
        with self._registry_lock:
            self._pending.append((inbox, event))
            self._with_pending.add(self)

    @classmethod
    def wake_all(cls) -> None:
        with cls._registry_lock:
            ready = list(cls._with_pending)
            cls._with_pending.clear()
        for delivery in ready:
            loop = delivery._loop()
            try:
                if loop is None:
                    raise RuntimeError("the loop is gone")
                loop.call_soon_threadsafe(delivery._flush)
            except RuntimeError:  # the consumer's loop is closed: nobody is listening any more
                with cls._registry_lock:
                    delivery._pending.clear()

    def _flush(self) -> None:
        with self._registry_lock:
            items = list(self._pending)
            self._pending.clear()
        for inbox, event in items:
            inbox.put_nowait(event)


def deliver_pending() -> None:
    """Wake every asyncio consumer that has events waiting (call after a burst of emits)."""
    _LoopDelivery.wake_all()


@dataclass
class RequestHandle:
    """The caller's side of one submitted request."""

    request_id: str
    session_id: str
    params: "GenerationParams"  # complete: model defaults and seed filled in
    _cancel: Callable[[str, str], None] = field(repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _history: list = field(default_factory=list, repr=False)
    _listeners: list = field(default_factory=list, repr=False)

    @property
    def seed(self) -> int:
        return self.params.seed

    # --- engine side ---
    def emit(self, event: Event) -> None:
        with self._lock:
            self._history.append(event)
            listeners = list(self._listeners)
        for deliver in listeners:
            deliver(event)

    @property
    def last_event(self) -> "Event | None":
        with self._lock:
            return self._history[-1] if self._history else None

    @property
    def history(self) -> "tuple[Event, ...]":
        """Every event emitted so far, in order."""
        with self._lock:
            return tuple(self._history)

    # --- consumer side ---
    def cancel(self) -> None:
        """Ask the engine to abort this request at the next step boundary (non-blocking)."""
        self._cancel(self.request_id, self.session_id)

    def _subscribe(
        self, deliver: Callable[[Event], None], replay: Callable[[Event], None] | None = None
    ) -> Callable[[], None]:
        """Replay past events through `replay` (default: `deliver`), then receive live ones."""
        with self._lock:
            for event in self._history:
                (replay or deliver)(event)
            self._listeners.append(deliver)

        def unsubscribe() -> None:
            with self._lock:
                if deliver in self._listeners:
                    self._listeners.remove(deliver)

        return unsubscribe

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        """Blocking iterator for threads; ends after the final event.

        Raises TimeoutError when no event arrives within `timeout` seconds."""
        inbox: queue.SimpleQueue = queue.SimpleQueue()
        unsubscribe = self._subscribe(inbox.put)
        try:
            while True:
                try:
                    event = inbox.get(timeout=timeout)
                except queue.Empty:
                    raise TimeoutError(f"no event for request {self.request_id} in {timeout} s") from None
                yield event
                if isinstance(event, FINAL_EVENTS):
                    return
        finally:
            unsubscribe()

    async def stream(self) -> AsyncIterator[Event]:
        """Async iterator for asyncio code; ends after the final event."""
        delivery = _LoopDelivery.for_loop(asyncio.get_running_loop())
        inbox: asyncio.Queue = asyncio.Queue()
        # Past events go straight into the inbox (we are on the loop's thread); live ones
        # arrive through the engine's once-per-step wake-up.
        unsubscribe = self._subscribe(lambda event: delivery.deliver(inbox, event), replay=inbox.put_nowait)
        try:
            while True:
                event = await inbox.get()
                yield event
                if isinstance(event, FINAL_EVENTS):
                    return
        finally:
            unsubscribe()

    def when_final(self, callback: Callable[[Event], None]) -> None:
        """Call `callback(final event)` once the request ends (at once when it has ended), on the
        thread that emits it (the engine's): it must be quick and never raise. For owners that
        must see the end whatever the caller does (a durable record of the request)."""
        done = threading.Event()  # the replay and a live delivery may race: call it once

        def deliver(event: Event) -> None:
            if isinstance(event, FINAL_EVENTS) and not done.is_set():
                done.set()
                callback(event)

        self._subscribe(deliver)

    def result(self, timeout: float | None = None) -> Event:
        """Block until the request ends; returns its final event (Completed, Aborted or Failed)."""
        final = None
        for final in self.events(timeout=timeout):
            pass
        return final

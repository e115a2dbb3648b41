"""What crosses the process boundary between an engine replica and the studio's facade.

A replica's `generate` stream sends `Admitted` (or `Rejected`) first, then one item per engine
event: the engine's own event dataclasses, except `Progress`, whose preview travels as JPEG
bytes (`WireProgress`): a preview is shown once and replaced a step later, so a few KB of JPEG
beat a raw bitmap. Final images travel as PIL images (pickled raw: lossless, no encode cost).

Times: the engine stamps events and snapshots with its own `time.perf_counter()`. The facade
shifts them by the replica's clock offset (`shifted`), so waited times and ETAs stay right when
a replica runs on another machine.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass, replace

from PIL import Image

from engine import (
    Completed,
    EngineClosedError,
    EngineFailedError,
    EngineSnapshot,
    Event,
    Progress,
    QueueFullError,
    ServingLimits,
    SessionLimitError,
)
from pipelines.interface import PipelineInfo

PREVIEW_JPEG_QUALITY = 85


_ERRORS_BY_KIND: dict[str, type[Exception]] = {
    "invalid": ValueError,
    "queue_full": QueueFullError,
    "session_limit": SessionLimitError,
    "closed": EngineClosedError,
    "failed": EngineFailedError,
}


@dataclass(frozen=True)
class Rejected:
    """The replica refused: `kind` names the engine's error (see `as_error`)."""

    kind: str  # "invalid" | "queue_full" | "session_limit" | "closed" | "failed"
    message: str
    replica_id: str

    @classmethod
    def of(cls, error: Exception, replica_id: str) -> "Rejected":
        # Most specific first: EngineFailedError is an EngineClosedError is an AdmissionError.
        for kind in ("failed", "closed", "session_limit", "queue_full", "invalid"):
            if isinstance(error, _ERRORS_BY_KIND[kind]):
                return cls(kind, str(error), replica_id)
        raise TypeError(f"{type(error).__name__} is not an engine refusal") from error

    @property
    def is_replica_trouble(self) -> bool:
        """The replica can't take it (full, closed, broken): another replica may."""
        return self.kind in ("queue_full", "closed", "failed")

    def as_error(self) -> Exception:
        return _ERRORS_BY_KIND[self.kind](self.message)


@dataclass(frozen=True)
class Admitted:
    """First item of a `generate` stream: the replica's engine took the request."""

    request_id: str  # the id in the replica's engine (its snapshot shows this one)
    replica_id: str  # Serve's unique id of the replica
    replica: str  # its label, e.g. "replica 0"


@dataclass(frozen=True)
class WireProgress:
    step: int
    total: int
    batch_size: int
    preview: bytes | tuple[bytes, ...] | None  # JPEG: one image, or a video's frames
    sent_at: float = 0.0  # the replica's perf_counter() when it was sent (the relay's latency)
    skipped: int = 0  # steps so far that reused the request's cached residual (step caching)


@dataclass(frozen=True)
class Answered:
    """A replica's answer to a queue call sent to every replica, with who gave it: Serve's
    broadcast silently skips a replica it finds busy for a moment, so the facade asks again the
    replicas it did not hear from (serve/queue_control.py)."""

    replica_id: str
    value: object = None


@dataclass(frozen=True)
class ReplicaDescription:
    """What one replica serves; every replica of a deployment describes the same thing."""

    infos: dict[str, PipelineInfo]  # every model it serves, by name, the default first
    limits: dict[str, ServingLimits]  # by model, resolved for it (max_size set)
    mode: str
    max_batch_requests: int
    unit_cost: int  # the cost of the default model's default request
    with_unknown_words: frozenset[str]  # models whose pipeline lists the prompt words it never learned


@dataclass(frozen=True)
class ReplicaReport:
    """One replica now: its engine's snapshot and metrics, and whether its engine runs."""

    replica_id: str
    replica: str  # label
    pid: int
    device: str
    clock: float  # the replica's perf_counter() when the report was made
    snapshot: EngineSnapshot
    metrics: bytes  # Prometheus text of its engine
    alive: bool
    failure: str | None


# ---------------------------------------------------------------------------- previews
def encode_image(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="JPEG", quality=PREVIEW_JPEG_QUALITY)
    return buffer.getvalue()


def decode_image(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def event_to_wire(event: Event) -> object:
    """On the replica: the engine event as it is sent."""
    if isinstance(event, Progress):
        preview = event.preview
        if isinstance(preview, (list, tuple)):
            preview = tuple(encode_image(frame) for frame in preview)
        elif preview is not None:
            preview = encode_image(preview)
        return WireProgress(event.step, event.total, event.batch_size, preview, time.perf_counter(), event.skipped)
    return event


def event_from_wire(item: object, clock_offset: float = 0.0) -> Event:
    """In the facade: the engine event again (previews decoded, times on the local clock)."""
    if isinstance(item, WireProgress):
        preview = item.preview
        if isinstance(preview, tuple):
            preview = [decode_image(frame) for frame in preview]
        elif preview is not None:
            preview = decode_image(preview)
        return Progress(item.step, item.total, item.batch_size, preview, skipped=item.skipped)
    if isinstance(item, Completed) and clock_offset:
        timings = item.timings
        return replace(item, timings=replace(
            timings, submitted_at=timings.submitted_at + clock_offset, started_at=timings.started_at + clock_offset,
            finished_at=timings.finished_at + clock_offset))
    return item


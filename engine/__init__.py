"""The step engine: one embedded thread serving many diffusion requests step by step.

Never imports gradio: the studio and the HTTP API sit on top of this package.
"""

from engine.admission import AdmissionLedger
from engine.client import ClientMetrics, EngineClient
from engine.cost import RequestCost, SizedForward
from engine.engine import SHUTDOWN_REASON, Engine
from engine.events import Aborted, Completed, Event, Failed, Progress, Queued, RequestHandle, Started, Timings
from engine.limits import (
    AdmissionError,
    EngineClosedError,
    EngineFailedError,
    QueueFullError,
    ServingLimits,
    SessionLimitError,
)
from engine.request import PreparedRequest, RequestStatus
from engine.snapshot import EngineSnapshot, EngineStats, RequestView
from pipelines.params import GenerationParams

__all__ = [
    "SHUTDOWN_REASON",
    "Aborted",
    "AdmissionError",
    "AdmissionLedger",
    "ClientMetrics",
    "Completed",
    "Engine",
    "EngineClient",
    "EngineClosedError",
    "EngineFailedError",
    "EngineSnapshot",
    "EngineStats",
    "Event",
    "Failed",
    "GenerationParams",
    "PreparedRequest",
    "Progress",
    "QueueFullError",
    "Queued",
    "RequestCost",
    "RequestHandle",
    "RequestStatus",
    "RequestView",
    "ServingLimits",
    "SessionLimitError",
    "SizedForward",
    "Started",
    "Timings",
]

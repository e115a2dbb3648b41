"""The step engine: one embedded thread serving many diffusion requests step by step.

Never imports gradio: the studio and the HTTP API sit on top of this package.
"""

from engine.admission import AdmissionLedger
from engine.client import ClientMetrics, EngineClient
from engine.cost import RequestCost, SizedForward
from engine.engine import SHUTDOWN_REASON, Engine
from engine.events import (
    FINAL_EVENTS,
    Aborted,
    Completed,
    Event,
    Failed,
    Progress,
    Queued,
    RequestHandle,
    Started,
    Timings,
    deliver_pending,
)
from engine.limits import (
    AdmissionError,
    EngineClosedError,
    EngineFailedError,
    QueueFullError,
    ServingLimits,
    SessionLimitError,
)
from engine.models import ModelSet
from engine.pauses import NOT_PAUSED, PauseState, Pauses, pause_end
from engine.queue_control import CLEAR_REASON, PAUSE_ABORT_REASON
from engine.request import PreparedRequest, RequestStatus
from engine.snapshot import EngineSnapshot, EngineStats, RequestView, StageStats
from engine.warmup import warm_up
from pipelines.params import GenerationParams

# Exported for front ends that are engines themselves, and for the processes that build one: the
# Ray Serve facade (serve/) relays events as the engine thread does (FINAL_EVENTS, deliver_pending),
# names its models as Engine does (ModelSet), keeps the pauses of every replica's queues as Engine
# keeps its own (Pauses, PauseState, NOT_PAUSED, pause_end) and ends cleared requests with the
# same reasons (CLEAR_REASON, PAUSE_ABORT_REASON), sums replicas' stage times (StageStats); app.py and
# the replicas warm an engine up (warm_up). serve/ and studio/ import only these names
# (tests/test_import_boundaries.py), so what an engine offers them is decided here.

__all__ = [
    "SHUTDOWN_REASON",
    "Aborted",
    "AdmissionError",
    "AdmissionLedger",
    "CLEAR_REASON",
    "ClientMetrics",
    "Completed",
    "Engine",
    "EngineClient",
    "EngineClosedError",
    "EngineFailedError",
    "EngineSnapshot",
    "EngineStats",
    "Event",
    "FINAL_EVENTS",
    "Failed",
    "GenerationParams",
    "ModelSet",
    "NOT_PAUSED",
    "PAUSE_ABORT_REASON",
    "PauseState",
    "Pauses",
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
    "StageStats",
    "Started",
    "Timings",
    "deliver_pending",
    "pause_end",
    "warm_up",
]

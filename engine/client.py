"""The engine as the studio sees it: every member a front end may use, and nothing more.

Two classes implement it: `engine.Engine` (one embedded engine thread) and
`serve.replicated_engine.ReplicatedEngine` (engine replicas on Ray Serve, behind one facade).
A front end typed with `EngineClient` runs on either unchanged; tests/test_engine_client.py
checks that both offer every member below with a compatible signature.

Whoever builds an engine also starts it (`start()`), so starting is not part of the interface.
"""

from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable

from engine.events import RequestHandle
from engine.limits import ServingLimits
from engine.models import ModelSet
from engine.pauses import PauseState
from engine.request import PreparedRequest
from engine.snapshot import EngineSnapshot
from pipelines.interface import PipelineInfo
from pipelines.params import GenerationParams


@runtime_checkable
class ClientMetrics(Protocol):
    """The engine's metrics as the studio uses them."""

    @property
    def branches_waiting(self):
        """A Prometheus gauge the studio's workflow runs set: their branches waiting for room."""

    def exposition(self) -> bytes:
        """Every metric in the Prometheus text format (for /metrics)."""


@runtime_checkable
class EngineClient(Protocol):
    # ------------------------------------------------------------------ what is served
    @property
    def models(self) -> ModelSet:
        """Names, the default, `resolve(name)`, and `models[name]` (its `info`; `unknown_words` when
        the model can tell)."""

    @property
    def info(self) -> PipelineInfo:
        """The default model's info."""

    @property
    def infos(self) -> dict[str, PipelineInfo]:
        """Every model's info, by name (the default first)."""

    @property
    def limits(self) -> ServingLimits:
        """The server's caps for the default model."""

    def limits_for(self, model: str | None) -> ServingLimits:
        """The server's caps as they apply to one model (ValueError for a model not served)."""

    @property
    def mode(self) -> str:
        """How requests share the device: "step" (they join a running batch at every step) or "request"."""

    @property
    def max_batch_requests(self) -> int:
        """Most requests in one forward (a CFG request puts two rows in it)."""

    # ------------------------------------------------------------------ requests
    def prepare_params(self, params: GenerationParams) -> GenerationParams:
        """The model named, its defaults and a seed filled in, the limits applied (ValueError)."""

    def prepare(self, params: GenerationParams) -> PreparedRequest:
        """`prepare_params`, with the request's batch key and cost."""

    def submit(self, params: GenerationParams, session_id: str = "default", *,
               from_waiting_queue: bool = False) -> RequestHandle:
        """Queue a request; ValueError for bad parameters, AdmissionError when full or closed.
        `from_waiting_queue=True`: a refusal for want of room is not counted as a refusal (the
        caller keeps the request waiting)."""

    def cancel(self, request_id: str, session_id: str | None = None, *, admin: bool = False) -> bool:
        """Abort at the next step boundary; PermissionError for another session's request."""

    # ------------------------------------------------------------------ queues (engine.queue_control)
    def pause_queue(self, session_id: str, *, abort_running: bool = False, until: float | None = None) -> None:
        """Stop admitting the session's waiting requests; `abort_running` also aborts its running ones.
        The pause ends by itself at `until` (unix seconds), at most `limits.pause_expiry_s` from now."""

    def resume_queue(self, session_id: str) -> None:
        """Admit the session's waiting requests again."""

    def move_request(self, request_id: str, session_id: str, *, before: str | None = None) -> bool:
        """Move one of the session's waiting requests to the front of its queue (or before another of
        its own); PermissionError for another session's request, False for an unknown one."""

    def clear_queue(self, session_id: str, *, include_running: bool = False) -> int:
        """Abort the session's waiting (and, with `include_running`, running) requests; how many."""

    def pause_engine(self) -> None:
        """An operator's pause: nothing new starts; running requests finish."""

    def resume_engine(self) -> None:
        """Lift the operator's pause."""

    def pause_reason(self, session_id: str) -> str:
        """Why the session's waiting requests don't start: "", "session" or "engine"."""

    @property
    def pause_state(self) -> PauseState:
        """The engine's pause and the paused sessions (with when each ends), as of now."""

    def watch_pauses(self, watcher: Callable[[PauseState], None]) -> None:
        """`watcher(state)` after every later pause or resume, before that call returns."""

    # ------------------------------------------------------------------ watching
    def snapshot(self) -> EngineSnapshot:
        """Every request in flight and the engine's figures, as last published."""

    @property
    def metrics(self) -> ClientMetrics: ...

    @property
    def is_alive(self) -> bool:
        """Whether requests can run now."""

    @property
    def accepting(self) -> bool:
        """Whether `submit` takes new requests (False once shut down)."""

    @property
    def failure(self) -> str | None:
        """Why nothing can run (a crash, no replica up), or None."""

    # ------------------------------------------------------------------ stopping
    def shutdown(self, reason: str = ...) -> None:
        """Stop admission and abort every request at its next step boundary. Non-blocking."""

    def wait_stopped(self, timeout: float | None = None) -> bool:
        """Block until stopped; False on timeout."""

    def close(self, timeout: float = 30.0) -> None:
        """`shutdown()`, then wait until stopped (TimeoutError after `timeout`)."""

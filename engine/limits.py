"""Server-side caps a deployment configures, checked at submission before anything queues."""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.params import GenerationParams


class AdmissionError(Exception):
    """The request is valid but cannot be taken now (HTTP 429 / 503 material)."""


class QueueFullError(AdmissionError):
    pass


class SessionLimitError(AdmissionError):
    pass


class EngineClosedError(AdmissionError):
    pass


@dataclass(frozen=True)
class ServingLimits:
    max_steps: int = 100
    max_size: int = 1024  # largest width or height in pixels
    max_frames: int = 129
    max_queue: int = 256  # waiting + running requests, all sessions
    max_per_session: int = 16  # waiting + running requests of one session

    def __post_init__(self) -> None:
        for name in ("max_steps", "max_size", "max_frames", "max_queue", "max_per_session"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")

    def check(self, params: GenerationParams) -> None:
        """Raise ValueError when a (defaults-resolved) request exceeds this server's caps."""
        if params.num_inference_steps > self.max_steps:
            raise ValueError(
                f"num_inference_steps={params.num_inference_steps} is above this server's limit: "
                f"allowed is 1..{self.max_steps}."
            )
        for name in ("width", "height"):
            value = getattr(params, name)
            if value > self.max_size:
                raise ValueError(f"{name}={value} is above this server's limit of {self.max_size} pixels.")
        if params.num_frames > self.max_frames:
            raise ValueError(f"num_frames={params.num_frames} is above this server's limit of {self.max_frames}.")

"""Server-side caps a deployment configures, checked at submission before anything queues."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipelines.errors import ParamError
from pipelines.interface import PipelineInfo
from pipelines.params import GenerationParams


class AdmissionError(Exception):
    """The request is valid but cannot be taken now (HTTP 429 / 503 material)."""


class QueueFullError(AdmissionError):
    pass


class SessionLimitError(AdmissionError):
    pass


class EngineClosedError(AdmissionError):
    """The engine was shut down, or crashed (then it is an EngineFailedError)."""


class EngineFailedError(EngineClosedError):
    """The engine thread crashed: nothing runs until the process is restarted."""


@dataclass(frozen=True)
class ServingLimits:
    max_steps: int = 100
    # Largest width or height in pixels. None: the model's largest size (its card's size range,
    # else the larger of its default width and height), so one request can't cost many times
    # what the model is made for.
    max_size: int | None = None
    max_frames: int = 129
    max_queue: int = 256  # waiting + running requests, all sessions
    max_per_session: int = 16  # waiting + running requests of one session
    # In-flight cost one session may hold, in units of the model's default request
    # (rows x tokens x steps, see engine.cost). None: no cost cap, only the count above.
    # A session with nothing in flight may always submit one request (within the caps above).
    max_session_cost: float | None = None
    # A caller's pause of its own queue ends by itself this many seconds after it was made (its
    # queue runs again), so a forgotten pause can't hold a caller's requests for ever. None: only
    # a resume ends it. (The operator's pause of the whole engine has no end.)
    pause_expiry_s: float | None = 3600.0

    def __post_init__(self) -> None:
        for name in ("max_steps", "max_frames", "max_queue", "max_per_session"):
            _check_positive_int(name, getattr(self, name))
        if self.max_size is not None:
            _check_positive_int("max_size", self.max_size)
        cost = self.max_session_cost
        if cost is not None and (isinstance(cost, bool) or not isinstance(cost, (int, float)) or not cost > 0):
            raise ValueError(f"max_session_cost must be a positive number or None, got {cost!r}.")
        expiry = self.pause_expiry_s
        if expiry is not None and (isinstance(expiry, bool) or not isinstance(expiry, (int, float))
                                   or not 0 < expiry < float("inf")):
            raise ValueError(f"pause_expiry_s must be a positive number of seconds or None (a pause lasts until "
                             f"resumed), got {expiry!r}.")

    def resolved_for(self, info: PipelineInfo) -> "ServingLimits":
        """These limits with `max_size=None` replaced by the model's largest size: the top of its
        card's size range, else the largest side of its card's sizes and its default size."""
        if self.max_size is not None:
            return self
        if info.size_range is not None:
            return replace(self, max_size=info.size_range[1])
        sides = [side for size in info.supported_sizes for side in size]
        return replace(self, max_size=max(info.defaults.width, info.defaults.height, *sides))

    def check(self, params: GenerationParams) -> None:
        """Raise ValueError when a (defaults-resolved) request exceeds this server's caps."""
        check_text(params)
        self.check_values(params.num_inference_steps, params.width, params.height, params.num_frames)

    def check_values(self, num_inference_steps: int | None = None, width: int | None = None,
                     height: int | None = None, num_frames: int | None = None) -> None:
        """The same caps on raw values (None: not given). Front ends call it before building
        GenerationParams, so a value far out of range gets this server's range in its message,
        not the much wider absolute one."""
        if num_inference_steps is not None and num_inference_steps < 1:
            raise ParamError("num_inference_steps",
                             f"num_inference_steps={num_inference_steps} is out of range: allowed is 1..{self.max_steps}.")
        if num_inference_steps is not None and num_inference_steps > self.max_steps:
            raise ParamError(
                "num_inference_steps",
                f"num_inference_steps={num_inference_steps} is above this server's limit: "
                f"allowed is 1..{self.max_steps}."
            )
        if self.max_size is not None:
            for name, value in (("width", width), ("height", height)):
                if value is not None and value > self.max_size:
                    raise ParamError(name, f"{name}={value} is above this server's limit of {self.max_size} pixels.")
        if num_frames is not None and num_frames > self.max_frames:
            raise ParamError("num_frames", f"num_frames={num_frames} is above this server's limit of {self.max_frames}.")


def check_text(params: GenerationParams) -> None:
    """Refuse text no tokenizer can take: lone surrogates ('\\ud800') pass str checks, not UTF-8."""
    for name in ("prompt", "negative_prompt"):
        text = getattr(params, name)
        if text is None:
            continue
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ParamError(
                name,
                f"{name} has a lone surrogate ({text[error.start]!r}) at character {error.start}: "
                "send valid Unicode text."
            ) from None


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")

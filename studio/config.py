"""The studio's command-line options as one immutable value (built by app.py, read everywhere)."""

from __future__ import annotations

from dataclasses import dataclass

from engine import ServingLimits

MODES = ("step", "request")


def parse_auth(text: str | None) -> tuple[str, str] | None:
    """'USER:PASS' -> ("USER", "PASS"); None stays None."""
    if text is None:
        return None
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise ValueError(f"auth={text!r} is not USER:PASS (both parts non-empty, separated by ':').")
    return user, password


@dataclass(frozen=True)
class StudioOptions:
    model: str = "builtin"  # "builtin", "toy", a local diffusers folder or a hub id
    mode: str = "step"  # engine service mode: "step" (co-batch per step) or "request"
    max_batch: int = 8
    host: str = "127.0.0.1"
    port: int = 7860
    share: bool = False
    auth: tuple[str, str] | None = None
    preview_every: int = 2  # live preview every this many steps (0 = never)
    preview_max_px: int = 256  # longest side of a live preview image
    max_steps: int = 100
    max_size: int = 1024
    max_per_session: int = 4
    show_prompts: bool = False  # show other sessions' prompts in the queue view
    device: str | None = None
    dtype: str | None = None
    compile: bool = False  # torch.compile the denoiser, then warm up at the model's default size
    prompt_cache: int = 32  # prompt embeddings kept for reuse (0 = off)
    queue_refresh_s: float = 0.5  # how often the queue and graph views refresh

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} is not supported: use one of {', '.join(MODES)}.")
        for name in ("max_batch", "max_steps", "max_size", "max_per_session", "preview_max_px"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if isinstance(self.preview_every, bool) or not isinstance(self.preview_every, int) or self.preview_every < 0:
            raise ValueError(f"preview_every must be an integer >= 0 (0 = no previews), got {self.preview_every!r}.")
        if isinstance(self.prompt_cache, bool) or not isinstance(self.prompt_cache, int) or self.prompt_cache < 0:
            raise ValueError(f"prompt_cache must be an integer >= 0 (0 = no cache), got {self.prompt_cache!r}.")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port={self.port} is out of range: allowed is 0..65535.")
        if not self.queue_refresh_s > 0:
            raise ValueError(f"queue_refresh_s must be > 0, got {self.queue_refresh_s!r}.")

    @property
    def limits(self) -> ServingLimits:
        return ServingLimits(max_steps=self.max_steps, max_size=self.max_size, max_per_session=self.max_per_session)

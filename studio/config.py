"""The studio's command-line options as one immutable value (built by app.py, read everywhere)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from engine import ServingLimits
from pipelines.memory_plan import MEMORY_CHOICES
from pipelines.params import MAX_STEP_CACHE

MODES = ("step", "request")
_KEY_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


def parse_auth(text: str | None) -> tuple[str, str] | None:
    """'USER:PASS' -> ("USER", "PASS"); None stays None."""
    if text is None:
        return None
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise ValueError(f"auth={text!r} is not USER:PASS (both parts non-empty, separated by ':').")
    return user, password


def parse_api_key(text: str) -> tuple[str, str]:
    """'NAME:KEY' -> ("NAME", "KEY"): the name is what the queue view and limits know the caller by."""
    name, sep, key = text.partition(":")
    if not sep or not key or not _KEY_NAME.fullmatch(name):
        raise ValueError(
            "api_key must be NAME:KEY, the name 1-64 letters, digits, '.', '_' or '-' and the key non-empty "
            f"(got {len(text)} characters{', no' if not sep else ''} ':')."  # never echo a key
        )
    return name, key


def read_admin_key_file(path: str | Path) -> str:
    """The first line that is not blank or a '#' comment."""
    for line in Path(path).read_text().splitlines():
        if line.strip() and not line.strip().startswith("#"):
            return line.strip()
    raise ValueError(f"{path} holds no admin key (one line with the key; '#' lines are comments).")


def read_api_keys_file(path: str | Path) -> list[tuple[str, str]]:
    """NAME:KEY lines (blank lines and '#' comments skipped)."""
    keys = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            keys.append(parse_api_key(line))
        except ValueError as error:
            raise ValueError(f"{path}, line {number}: {error}") from None
    return keys


@dataclass(frozen=True)
class StudioOptions:
    model: str = "builtin"  # "builtin", "builtin-video", "toy", a local diffusers folder or a hub id
    more_models: tuple[str, ...] = ()  # further models the same engine serves (the first is the default)
    mode: str = "step"  # engine service mode: "step" (co-batch per step) or "request"
    max_batch: int = 8
    # Rows x latent tokens one forward may hold (engine.cost); None: max_batch of each model's
    # default request. Lets one large request share a forward with several small ones.
    max_tokens: int | None = None
    host: str = "127.0.0.1"
    port: int = 7860
    share: bool = False
    auth: tuple[str, str] | None = None
    preview_every: int = 2  # live preview every this many steps (0 = never)
    preview_max_px: int = 256  # longest side of a live preview image
    max_steps: int = 100
    max_size: int | None = None  # None: the model's default size (64 for the built-in model)
    # Requests one tab or client may have in flight: one batch's worth, so a workflow's grid
    # can fill a forward (a run with more branches queues the rest itself).
    max_per_session: int = 8
    max_branches: int = 64  # engine requests one workflow run may make
    # In-flight cost one session may hold, in default requests of the loaded model (rows x
    # tokens x steps); a session with nothing in flight may always submit one request.
    max_session_cost: float | None = 32.0
    # Per-user keys of the HTTP API, (NAME, KEY) pairs. With --auth USER:PASS, PASS is also
    # the key named USER.
    api_keys: tuple[tuple[str, str], ...] = ()
    show_prompts: bool = False  # show other sessions' prompts in the queue view
    # The operator's key for /v1/admin/ (pause and resume the whole engine); None: no admin routes.
    admin_key: str | None = None
    start_paused: bool = False  # the engine starts paused: nothing runs until an operator resumes it
    # A caller's pause of its own queue ends by itself after this many seconds; None: only a resume
    # ends it (engine.ServingLimits.pause_expiry_s).
    pause_expiry_s: float | None = 3600.0
    outputs: str | None = "outputs"  # where finished results are saved (None: --no-save)
    # Accepted work older than this at a restart is not run again (studio.store.recovery).
    resume_max_age_s: float = 86400.0
    device: str | None = None
    dtype: str | None = None
    compile: bool = False  # torch.compile the denoiser, then warm up at the model's default size
    memory: str = "auto"  # the memory plan (pipelines/memory_plan.py): auto, resident, offload, fp8, lowvram
    denoiser_file: str | None = None  # a quantized (GGUF) file for the first model's denoiser
    prompt_cache: int = 32  # prompt embeddings kept for reuse (0 = off)
    # Step caching's threshold for requests that do not say (pipelines/step_cache.py; 0 = off);
    # None: each model's own default (its stepstudio.json's).
    step_cache: float | None = None
    # LoRA adapters: --lora [MODEL:]NAME=PATH options (pipelines.lora_files.LoraOption), and the
    # folder of per-model adapter subfolders read besides the built-in ones.
    loras: tuple = ()
    lora_folder: str = "loras"
    queue_refresh_s: float = 0.5  # how often the queue and graph views refresh
    temp_file_ttl_s: int = 3600  # Gradio's temp files (previews, results) are deleted after this
    request_timeout_s: float = 30.0  # a request's headers and body must arrive within this
    shutdown_timeout_s: float = 5.0  # SIGTERM: how long in-flight calls get to be answered

    def __post_init__(self) -> None:
        if self.memory not in MEMORY_CHOICES:
            raise ValueError(f"memory={self.memory!r} must be one of {', '.join(MEMORY_CHOICES)}.")
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} is not supported: use one of {', '.join(MODES)}.")
        for name in ("max_batch", "max_steps", "max_per_session", "max_branches", "preview_max_px", "temp_file_ttl_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if self.max_tokens is not None and (isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int)
                                            or self.max_tokens < 1):
            raise ValueError(f"max_tokens must be a positive integer or None (from --max-batch), got {self.max_tokens!r}.")
        size = self.max_size
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(f"max_size must be a positive integer or None (the model's size), got {size!r}.")
        cost = self.max_session_cost
        if cost is not None and (isinstance(cost, bool) or not isinstance(cost, (int, float)) or not cost > 0):
            raise ValueError(f"max_session_cost must be a positive number or None (no cost limit), got {cost!r}.")
        expiry = self.pause_expiry_s
        if expiry is not None and (isinstance(expiry, bool) or not isinstance(expiry, (int, float))
                                   or not 0 < expiry < float("inf")):
            raise ValueError(f"pause_expiry_s={expiry!r} is not allowed: use a positive number of seconds, or None "
                             "(--pause-expiry 0) for pauses that only a resume ends.")
        for name in ("request_timeout_s", "shutdown_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}.")
        if self.admin_key is not None and (not isinstance(self.admin_key, str) or not self.admin_key.strip()):
            raise ValueError("admin_key must be a non-empty string (or None: no admin routes).")
        if self.admin_key is not None and self.admin_key in self.http_api_keys.values():
            raise ValueError("admin_key is also an HTTP API key: give the operator a key of its own.")
        names = [name for name, _ in self.api_keys]
        if len(set(names)) != len(names):
            raise ValueError(f"two API keys share a name: {sorted(n for n in set(names) if names.count(n) > 1)}.")
        if isinstance(self.preview_every, bool) or not isinstance(self.preview_every, int) or self.preview_every < 0:
            raise ValueError(f"preview_every must be an integer >= 0 (0 = no previews), got {self.preview_every!r}.")
        if isinstance(self.prompt_cache, bool) or not isinstance(self.prompt_cache, int) or self.prompt_cache < 0:
            raise ValueError(f"prompt_cache must be an integer >= 0 (0 = no cache), got {self.prompt_cache!r}.")
        threshold = self.step_cache
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                      or not 0 <= threshold <= MAX_STEP_CACHE):
            raise ValueError(f"step_cache={threshold!r} is not allowed: use a threshold in 0..{MAX_STEP_CACHE:g} "
                             "(0 = off; higher skips more steps, e.g. 0.1).")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port={self.port} is out of range: allowed is 0..65535.")
        if not self.queue_refresh_s > 0:
            raise ValueError(f"queue_refresh_s must be > 0, got {self.queue_refresh_s!r}.")

    @property
    def models(self) -> tuple[str, ...]:
        return (self.model, *self.more_models)

    @property
    def limits(self) -> ServingLimits:
        return ServingLimits(max_steps=self.max_steps, max_size=self.max_size, max_per_session=self.max_per_session,
                             max_session_cost=self.max_session_cost, pause_expiry_s=self.pause_expiry_s)

    @property
    def http_api_keys(self) -> dict[str, str]:
        """{name: key} for the HTTP API: the --api-key pairs, and the --auth password as USER's key."""
        keys = dict(self.api_keys)
        if self.auth is not None:
            keys.setdefault(self.auth[0], self.auth[1])
        return keys

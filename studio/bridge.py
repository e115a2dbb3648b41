"""The bridge from engine events to Gradio outputs.

`follow_request` is the one async generator every Generate handler is built on: it submits
to the shared engine, relays `handle.stream()` one event at a time, and its `finally:` asks
the engine to drop the request (non-blocking). Gradio stops a handler by cancelling its task
or closing its generator (a client's `job.cancel()`, a closed tab, an error), and every one
of those paths runs that `finally`, so an abandoned request frees its batch slot at the next
step boundary. The Cancel button and `/cancel` ask the engine instead: the stream then ends
with an `Aborted` event that the handler shows.

Identity: `session_id_of` turns a Gradio request into the engine session it acts for. Gradio
lets a client choose its `session_hash`, so that string is never used as is: the engine
session is "ui:" + a keyed hash (a key only this process knows) of the login name and the
session hash. It can't be chosen to equal anyone else's, and never one of the HTTP API's
sessions (those start with "http:").
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import html
import math
import secrets
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import AsyncIterator, Iterator

import gradio as gr
from PIL import Image

from engine import (
    Aborted,
    AdmissionError,
    Completed,
    Engine,
    Event,
    Failed,
    GenerationParams,
    Progress,
    Queued,
    Started,
)
from studio.media import write_mp4

RANDOM_SEED = -1  # API value meaning "pick a random seed"


# ---------------------------------------------------------------------------- status
@dataclass(frozen=True)
class Status:
    """What a session is told about its request after each engine event (JSON-ready)."""

    request_id: str
    state: str  # "queued" | "running" | "completed" | "aborted" | "failed"
    step: int
    total: int
    position: int | None
    batch_size: int
    seed: int
    message: str = ""

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def is_final(self) -> bool:
        return self.state in ("completed", "aborted", "failed")


def initial_status(request_id: str, params: GenerationParams) -> Status:
    return Status(request_id, "queued", 0, params.num_inference_steps, None, 0, params.seed)


def status_after(status: Status, event: Event) -> Status:
    """The status once `event` has happened."""
    if isinstance(event, Queued):
        return replace(status, state="queued", position=event.position)
    if isinstance(event, Started):
        return replace(status, state="running", position=None, batch_size=event.batch_size)
    if isinstance(event, Progress):
        return replace(status, state="running", position=None, step=event.step, total=event.total,
                       batch_size=event.batch_size)
    if isinstance(event, Completed):
        return replace(status, state="completed", position=None, step=status.total, message="done")
    if isinstance(event, Aborted):
        return replace(status, state="aborted", position=None, message=event.reason)
    if isinstance(event, Failed):
        return replace(status, state="failed", position=None, message=event.message)
    return status


# ---------------------------------------------------------------------------- inputs
def _parsed(name: str, value: object) -> object:
    """API callers may send numbers as text ("64", "NaN"): parse them, name the field if not."""
    if not isinstance(value, str):
        return value
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {value!r}.") from None


def whole_number(name: str, value: object) -> int | None:
    """A form/API number as an int (None stays None = the model default)."""
    if value is None or value == "":
        return None
    value = _parsed(name, value)
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a whole number, got {value!r}.")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    raise ValueError(f"{name} must be a whole number, got {value!r}.")


def number(name: str, value: object) -> float | None:
    if value is None or value == "":
        return None
    value = _parsed(name, value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}.")
    return float(value)


def chosen_seed(seed: object) -> int | None:
    """None or a negative seed means random (the engine picks one and reports it)."""
    value = whole_number("seed", seed)
    return None if value is None or value < 0 else value


@dataclass(frozen=True)
class FormValues:
    """The generate form as the user filled it in (raw Gradio values)."""

    prompt: str
    negative_prompt: str | None = None
    width: object = None
    height: object = None
    steps: object = None
    guidance_scale: object = None
    seed: object = RANDOM_SEED
    model: object = None  # a loaded model's name; None or "" = the default model
    num_frames: object = None  # video models; None or 0 = the model's default

    def model_name(self, engine: Engine) -> str:
        """The loaded model this form asks for (ValueError naming the loaded ones)."""
        if self.model is not None and not isinstance(self.model, str):
            raise ValueError(f"model must be a model's name (text), got {type(self.model).__name__}.")
        return engine.models.resolve(self.model or None)

    def to_params(self, preview_every: int, engine: Engine) -> GenerationParams:
        """Raises ValueError naming the bad field."""
        model = self.model_name(engine)
        negative = self.negative_prompt if engine.infos[model].uses_negative_prompt else None
        frames = whole_number("num_frames", self.num_frames)
        width, height = whole_number("width", self.width), whole_number("height", self.height)
        steps = whole_number("steps", self.steps)
        engine.limits_for(model).check_values(steps, width, height, frames or None)  # this server's ranges first
        return GenerationParams(
            prompt=self.prompt if isinstance(self.prompt, str) else "",
            negative_prompt=negative if negative else None,
            width=width,
            height=height,
            num_inference_steps=steps,
            guidance_scale=number("guidance_scale", self.guidance_scale),
            seed=chosen_seed(self.seed),
            preview_every=preview_every,
            num_frames=frames or None,
            model=model,
        )


def user_error(message: str, title: str) -> gr.Error:
    """A gr.Error for the user's own mistake or a busy server: shown as text (the modal renders
    HTML), and no traceback in the server's log for it."""
    return gr.Error(html.escape(message, quote=False), title=title, print_exception=False)


@contextlib.contextmanager
def engine_errors_as_gradio() -> Iterator[None]:
    """Show the engine's own message to the user for bad input or a full server."""
    try:
        yield
    except (ValueError, AdmissionError) as exc:
        raise user_error(str(exc), "Request not accepted") from None


# ---------------------------------------------------------------------------- the stream
@dataclass(frozen=True)
class Update:
    status: Status
    event: Event | None  # None for the first update (submitted, nothing happened yet)


async def follow_request(engine: Engine, form: FormValues, session_id: str, preview_every: int,
                         makes: str | None = None) -> AsyncIterator[Update]:
    """Submit one request and yield an Update per engine event until it ends. `makes`: "image"
    or "video", when the caller can only take that kind (the model must make it).

    Closing or cancelling this generator cancels the request (non-blocking)."""
    with engine_errors_as_gradio():
        params = form.to_params(preview_every, engine)
        kind = engine.infos[params.model].output_kind
        if makes is not None and kind != makes:
            other = "/generate_video" if kind == "video" else "/generate"
            raise ValueError(f"model={params.model!r} makes {kind}s, not {makes}s: use {other} for it.")
        handle = engine.submit(params, session_id=session_id)
    status = initial_status(handle.request_id, handle.params)
    try:
        yield Update(status, None)
        async for event in handle.stream():
            status = status_after(status, event)
            yield Update(status, event)
            if isinstance(event, Aborted) and event.cause == "shutdown":
                raise user_error(f"The server is shutting down: {event.reason}. Try again once it is back.",
                                 "Server shutting down")
    finally:
        handle.cancel()  # a no-op once the request has ended


UI_SESSION_PREFIX = "ui:"
_SESSION_KEY = secrets.token_bytes(32)  # per process: engine sessions can't be computed from outside


def session_id_of(request: gr.Request | None) -> str:
    """The engine session a Gradio caller acts for (see the module docstring): 'ui:' + a keyed
    hash of its login name and Gradio session hash."""
    session = getattr(request, "session_hash", None)
    user = getattr(request, "username", None)
    text = f"{user if isinstance(user, str) else ''}\0{session if isinstance(session, str) else ''}"
    digest = hmac.new(_SESSION_KEY, text.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()
    return UI_SESSION_PREFIX + digest[:24]


def own_request_id(engine: Engine, request_id: object, session_id: str) -> str:
    """A request id as a caller typed it: the full id, or a short one (as the queue view shows)
    that matches exactly one of the caller's own requests. gr.Error for anything but text."""
    if not isinstance(request_id, str):
        raise user_error(
            f"request_id must be text (a request id from /generate's status), got {type(request_id).__name__}.",
            "Bad request id",
        )
    request_id = request_id.strip()
    if len(request_id) >= 32:
        return request_id
    matches = [v.request_id for v in engine.snapshot().requests
               if v.session_id == session_id and v.request_id.startswith(request_id)]
    return matches[0] if request_id and len(matches) == 1 else request_id


def cancel_own_request(engine: Engine, request_id: object, session_id: str) -> dict:
    """Cancel one of the caller's requests (the /cancel endpoint): gr.Error for someone else's."""
    full_id = own_request_id(engine, request_id, session_id)
    try:
        cancelled = engine.cancel(full_id, session_id)
    except PermissionError as exc:
        raise user_error(str(exc), "Not your request") from None
    message = "cancelling at the next step boundary" if cancelled else "unknown or already finished"
    return {"request_id": full_id, "cancelled": cancelled, "message": message}


# ---------------------------------------------------------------------------- media
def preview_image(image: Image.Image, max_px: int) -> Image.Image:
    """A small preview to send: shrunk to at most `max_px` (the page enlarges small ones)."""
    if max(image.size) <= max_px:
        return image
    scaled = image.copy()
    scaled.thumbnail((max_px, max_px))
    return scaled


VIDEO_DIR = Path(tempfile.gettempdir()) / "stepstudio-videos"
VIDEO_FILE_TTL_S = 600  # Gradio copies a returned file into its own cache; ours can go soon after


def frames_to_video(frames: tuple[Image.Image, ...], fps: int = 16) -> str:
    """Write frames to an mp4 file and return its path. Gradio copies it into its cache (and
    cleans that); the files here older than VIDEO_FILE_TTL_S go whenever a new one is written."""
    VIDEO_DIR.mkdir(exist_ok=True)
    remove_files_older_than(VIDEO_DIR, VIDEO_FILE_TTL_S)
    handle = tempfile.NamedTemporaryFile(prefix="stepstudio-", suffix=".mp4", delete=False, dir=VIDEO_DIR)
    handle.close()
    return str(write_mp4(frames, handle.name, fps))


def remove_files_older_than(folder: Path, age_s: float) -> int:
    """Delete the files in `folder` last modified more than `age_s` ago; returns how many."""
    cutoff = time.time() - age_s
    removed = 0
    for path in folder.iterdir():
        with contextlib.suppress(OSError):  # another process may have removed it already
            if path.is_file() and path.stat().st_mtime < cutoff:
                path.unlink()
                removed += 1
    return removed


def final_media(completed: Completed, fps: int = 16) -> Image.Image | str:
    """The image, or the path of the video, of a finished request."""
    if completed.is_video:
        return frames_to_video(completed.images, fps=fps)
    return completed.images[0]


def settings_caption(completed: Completed) -> str:
    params = completed.params
    prompt = params.prompt if len(params.prompt) <= 60 else params.prompt[:57] + "..."
    return (
        f"{prompt} | seed {completed.seed} | {params.num_inference_steps} steps | "
        f"{params.width}x{params.height} | guidance {params.guidance_scale:g}"
    )

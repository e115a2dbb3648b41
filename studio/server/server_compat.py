"""Every use of Gradio's and uvicorn's private internals, in one place, behind a version check.

The studio needs a few things neither library offers publicly: the Gradio app that
`mount_gradio_app` mounts, the JSON a custom component's event sent, whether Gradio's queue still
owes a client its last messages, which session a /call stream reads, one event's asyncio task,
the sets of temp files a Blocks wrote, how many inputs each endpoint takes, a cached picture
written once instead of again in place; and from uvicorn, a
deadline on receiving a request (an `H11Protocol` subclass) and a first signal that stops the
server gracefully (a `uvicorn.Server` subclass). Each is one small function or class here, whose
docstring says what it reads; nothing else in the studio touches a private name of either.

Read in gradio 6.31 and uvicorn 0.54 (h11 0.16). `check_installed` runs when the app is built
(and in tests/test_server_compat.py): a version outside `RANGES` is a warning that names what to
pin; an internal that is gone is a RuntimeError that names it, rather than a wrong answer later.
Under a Gradio outside its range the guards' workarounds (`GRADIO_IN_RANGE`) leave Gradio's own
behaviour alone. Like `pipelines/diffusers_api.py` for diffusers.

This module never imports gradio (versions are read from the installed metadata): the CLI
imports studio.server.temp_files, which uses it, before gradio reads GRADIO_TEMP_DIR.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import re
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import h11
import uvicorn
from starlette.routing import Mount
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- versions
@dataclass(frozen=True)
class VersionRange:
    package: str
    read_in: str  # the version whose internals this module was written against
    at_least: str
    below: str

    @property
    def pin(self) -> str:
        return f"{self.package}>={self.at_least},<{self.below}"

    def contains(self, version: str) -> bool:
        return _release(self.at_least) <= _release(version) < _release(self.below)


RANGES = (
    VersionRange("gradio", "6.31.0", "6.0", "7"),  # pyproject.toml allows the same
    # 0.29: cooperative signal handling (the caught signal is raised again once the server is done).
    VersionRange("uvicorn", "0.54.0", "0.29", "1"),
)


def _release(version: str) -> tuple[int, ...]:
    """(6, 31, 0) for "6.31.0", "6.31.0rc1" or "6.31.0+local": the numeric release only."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in match.group().split(".")) if match else (0,)


def installed_versions() -> dict[str, str]:
    """The installed version of each package in RANGES (None when it is not installed)."""
    versions = {}
    for allowed in RANGES:
        try:
            versions[allowed.package] = metadata.version(allowed.package)
        except metadata.PackageNotFoundError:
            versions[allowed.package] = None
    return versions


def version_warnings(versions: dict[str, str | None] | None = None) -> list[str]:
    """One sentence per package whose version is outside the range this module was read in."""
    versions = installed_versions() if versions is None else versions
    found = []
    for allowed in RANGES:
        version = versions.get(allowed.package)
        if version is not None and not allowed.contains(version):
            found.append(
                f"{allowed.package} {version} is outside the versions studio/server/server_compat.py was "
                f"checked with (read in {allowed.read_in}): install '{allowed.pin}' if the studio misbehaves")
    return found


GRADIO_IN_RANGE = RANGES[0].contains(installed_versions()["gradio"] or "0")


def internal_problems(demo=None, gradio_app=None) -> list[str]:
    """What is missing among the internals relied on here: uvicorn's always, a Blocks' and its
    mounted app's when given (after `demo.queue()`)."""
    found = []
    for owner, names in ((H11Protocol, ("connection_made", "data_received", "on_response_complete",
                                         "connection_lost")), (uvicorn.Server, ("startup", "handle_exit"))):
        found += [f"uvicorn's {owner.__name__}.{name} is gone" for name in names if not hasattr(owner, name)]
    # The protocol's state lives in attributes its methods set; their names are in the methods' code.
    set_by = (H11Protocol.__init__.__code__.co_names + H11Protocol.connection_made.__code__.co_names
              + H11Protocol.data_received.__code__.co_names)
    found += [f"uvicorn's H11Protocol no longer keeps self.{name}" for name in ("conn", "cycle", "loop", "transport")
              if name not in set_by]
    if demo is not None:
        queue = getattr(demo, "_queue", None)
        for name in ("pending_event_ids_session", "pending_messages_per_session", "event_ids_to_events"):
            if not hasattr(queue, name):
                found.append(f"gradio's Blocks._queue.{name} is gone")
        for name in ("temp_file_sets", "fns", "blocks", "has_launched"):
            if not hasattr(demo, name):
                found.append(f"gradio's Blocks.{name} is gone")
        from gradio import processing_utils  # loaded already: a Blocks exists

        checker = getattr(processing_utils, "_check_allowed", None)
        if checker is None or "has_launched" not in checker.__code__.co_names:
            found.append("gradio's processing_utils._check_allowed no longer reads Blocks.has_launched")
        found += [f"gradio's processing_utils.{name} is gone" for name in ("save_pil_to_cache", "encode_pil_to_bytes",
                                                                            "hash_bytes")
                  if not hasattr(processing_utils, name)]
    if gradio_app is not None and not hasattr(gradio_app, "stop_event"):
        found.append("gradio's App.stop_event is gone")
    return found


def check_installed(demo=None, gradio_app=None) -> None:
    """Warn about versions outside RANGES; raise RuntimeError naming every missing internal."""
    for warning in version_warnings():
        log.warning("%s", warning)
    found = internal_problems(demo, gradio_app)
    if found:
        versions = installed_versions()
        raise RuntimeError(
            f"gradio {versions['gradio']} / uvicorn {versions['uvicorn']} changed what stepstudio relies on: "
            f"{'; '.join(found)}. Install {' and '.join(repr(allowed.pin) for allowed in RANGES)}, or update "
            "studio/server/server_compat.py for these versions.")


# ---------------------------------------------------------------------------- Gradio: the app and its events
def mounted_gradio_app(app):
    """The Gradio app (gradio.routes.App) that `gr.mount_gradio_app(app, demo, path="/")` mounted:
    the one that serves the page (`demo.app` is another one, made by `queue()`). Read from the
    Starlette Mount it adds at path "" (the "/" it was given, stripped)."""
    return next(route.app for route in app.routes if isinstance(route, Mount) and route.path == "")


def check_file_paths_like_launch(demo) -> None:
    """Make Gradio check the file paths callers send, as `launch()` does.

    Gradio (`processing_utils._check_allowed`) checks that a file input was uploaded by the caller,
    and that a returned file lies in an allowed folder, only for a Blocks whose `has_launched` is
    set; `mount_gradio_app` never sets it, so a caller could otherwise name any file on the server
    (`{"path": "/etc/passwd"}`) as a file input and have it read."""
    demo.has_launched = True


def event_payload(event) -> dict:
    """The JSON object a custom component's `trigger(name, payload)` sent with an event
    (`gr.EventData._data`); {} when it sent something else."""
    data = getattr(event, "_data", None)
    return data if isinstance(data, dict) else {}


def cap_events_at_once(demo, count: int) -> None:
    """How many events Gradio runs at once (its default of 40 would cap concurrent sessions).
    `Blocks.max_threads`, read by `queue()`: set it before that call when mounting."""
    demo.max_threads = count


def stop_open_streams(gradio_app) -> None:
    """End the heartbeat streams of open pages (the mounted app's `stop_event`, an asyncio.Event:
    call on the server's loop)."""
    gradio_app.stop_event.set()


# ---------------------------------------------------------------------------- Gradio: the queue
# Event streams. Every stream of one session reads the same asyncio.Queue
# (`_queue.pending_messages_per_session[session_hash]`): each message goes to whichever reader
# takes it first, and a reader that disconnects marks the session's running events dead
# (`clean_events(session_hash=...)`), so their results are never sent.
QUEUE_DATA = "/gradio_api/queue/data"  # GET ?session_hash=...
CALL_PREFIX = "/gradio_api/call/"  # GET call/{api_name}/{event_id} and call/v2/{api_name}/{event_id}
CANCEL = "/gradio_api/cancel"  # POST {"session_hash", "fn_index", "event_id"}
# A fn_index no event has (Gradio numbers them from 0): Gradio's /cancel given it kills no task.
NO_TASK_FN_INDEX = -1


def has_unsent_answers(demo) -> bool:
    """Whether Gradio's queue still holds an event of some session or a message not yet streamed
    (`_queue.pending_event_ids_session`, `_queue.pending_messages_per_session`). True when those
    can't be read: the caller then waits its deadline out."""
    queue = getattr(demo, "_queue", None)
    if queue is None:
        return False
    try:
        return (any(queue.pending_event_ids_session.values())
                or any(messages.qsize() for messages in list(queue.pending_messages_per_session.values())))
    except (AttributeError, RuntimeError):
        return True


def call_stream_event_id(path: str) -> str | None:
    """The event id of a GET .../call/{api_name}/{event_id} (the /call door's stream), else None."""
    if not path.startswith(CALL_PREFIX):
        return None
    parts = path[len(CALL_PREFIX):].split("/")
    if len(parts) == 3 and parts[0] == "v2":
        parts = parts[1:]
    return parts[1] if len(parts) == 2 and all(parts) else None


def session_of_event(demo, event_id: str) -> str | None:
    """The session whose messages a /call stream of `event_id` reads, found as Gradio finds it
    (`simple_predict_get`): a held event's own (`_queue.event_ids_to_events`), else the session
    still waiting for it (`_queue.pending_event_ids_session`), else the event id itself (what an
    event joined without a session hash uses)."""
    queue = getattr(demo, "_queue", None)
    if not GRADIO_IN_RANGE or queue is None:
        return None
    event = queue.event_ids_to_events.get(event_id)
    if event is not None:
        return event.session_hash
    return next((session for session, ids in queue.pending_event_ids_session.items() if event_id in ids), event_id)


def ends_stream(chunk: bytes) -> bool:
    """Whether a chunk of a queue/data stream carries Gradio's last message (`close_stream`)."""
    return b'"msg":"close_stream"' in chunk


def event_task_name(session_hash: str, fn_index: int, event_id: str) -> str:
    """The name Gradio gives the asyncio task of a (non-batched) event (`utils.set_task_name`);
    its own /cancel kills every task named `{session_hash}_{fn_index}<gradio-sep>...`."""
    return f"{session_hash}_{fn_index}<gradio-sep>{event_id}"


async def cancel_event_task(session_hash: str, fn_index: int, event_id: str) -> None:
    """Cancel the one asyncio task that runs this event, and wait for it to end."""
    name = event_task_name(session_hash, fn_index, event_id)
    tasks = [task for task in asyncio.all_tasks() if task.get_name() == name]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# ---------------------------------------------------------------------------- Gradio: the Blocks
@dataclass(frozen=True)
class Endpoint:
    fn_index: int
    api_name: str | None
    input_count: int
    shown_input_count: int  # the inputs the API shows (Gradio fills in the hidden ones)
    # The last inputs whose handler parameter has a default: a call may leave them out (the
    # studio's guard sends None for them), so an endpoint can gain an optional input.
    optional_tail: int = 0


def endpoints(demo) -> list[Endpoint]:
    """Every event of a Blocks, with its inputs counted (`Blocks.fns`, `BlockFunction.inputs`,
    `BlockFunction.fn`, `Block.skip_api`)."""
    found = []
    for index, fn in demo.fns.items():
        inputs = list(fn.inputs)
        shown = [block for block in inputs if not getattr(block, "skip_api", False)]
        found.append(Endpoint(index, fn.api_name or None, len(inputs), len(shown),
                              _defaulted_tail(fn.fn, len(inputs))))
    return found


def _defaulted_tail(handler, input_count: int) -> int:
    """How many of the handler's last input parameters have a default (0 when it can't tell)."""
    try:
        parameters = list(inspect.signature(handler).parameters.values())[:input_count]
    except (TypeError, ValueError):
        return 0
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if len(parameters) < input_count or any(p.kind not in positional for p in parameters):
        return 0
    tail = 0
    for parameter in reversed(parameters):
        if parameter.default is inspect.Parameter.empty:
            break
        tail += 1
    return tail


def temp_file_sets(demo) -> list[set]:
    """The sets of paths that Gradio adds every file it writes to its cache for `demo` to
    (`Blocks.temp_file_sets`). Handlers add to them from other threads: copy one before reading."""
    return list(demo.temp_file_sets)


def paths_kept_in_cache(demo) -> set[str]:
    """The cached files a component keeps on purpose (`Block.keep_in_cache`: examples, defaults)."""
    keep: set = set()
    for block in list(demo.blocks.values()):
        keep.update(getattr(block, "keep_in_cache", ()))
    return keep


def cache_pictures_without_rewriting() -> None:
    """Make Gradio leave a picture it has cached already alone instead of writing it again.

    Gradio (`processing_utils.save_pil_to_cache`, which every component that is given a PIL image
    uses) names a cached picture by its content's hash and writes it again at that path each time
    it is sent, truncating it first: the Simple tab's gallery sends every earlier result again with
    each new one, so a page still fetching a picture from the update before reads it short (see
    studio/server/file_answers.py). The replacement writes a new picture under a temporary name and
    renames it into place, and only touches one that is there already (its name says what it
    holds), as Gradio's own `save_file_to_cache` does for files. Leaves Gradio alone outside the
    versions this was read in."""
    if not GRADIO_IN_RANGE:
        return
    from gradio import processing_utils

    if getattr(processing_utils.save_pil_to_cache, "writes_once", False):
        return

    def save_pil_to_cache(img, cache_dir: str, name: str = "image", format: str = "webp") -> str:  # noqa: A002
        data = processing_utils.encode_pil_to_bytes(img, format)
        folder = Path(cache_dir) / processing_utils.hash_bytes(data)
        folder.mkdir(exist_ok=True, parents=True)
        path = (folder / f"{name}.{format}").resolve()
        with contextlib.suppress(OSError):
            if path.stat().st_size == len(data):
                os.utime(path)  # sent again: the sweeper ages it from now
                return str(path)
        handle, staging = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.")
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.replace(staging, path)
        return str(path)

    save_pil_to_cache.writes_once = True
    processing_utils.save_pil_to_cache = save_pil_to_cache


# ---------------------------------------------------------------------------- uvicorn
class TimedH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, plus a deadline for receiving each request: a client that
    sends half its headers (or half its body) and stalls is answered 408 and disconnected
    instead of holding a connection forever. Reads `self.conn` (h11), `self.cycle`,
    `self.transport` and `self.loop`, and extends `on_response_complete`."""

    request_timeout_s = 30.0

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline = None
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR):
            self._disarm()  # the whole request is in: the handler may take as long as it needs

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request on this kept-alive connection

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.request_timeout_s, self._timed_out)

    def _disarm(self) -> None:
        if getattr(self, "_deadline", None) is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:  # no request under way: say why we hang up
            self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        self.transport.close()


def timed_protocol(timeout_s: float) -> type[TimedH11Protocol]:
    """The protocol class to give `uvicorn.Config(http=...)`, with its deadline set."""
    return type("TimedH11Protocol", (TimedH11Protocol,), {"request_timeout_s": timeout_s})


class GracefulServer(uvicorn.Server):
    """uvicorn whose first SIGTERM / Ctrl-C runs `on_first_signal(signal_number)` (which ends the
    server when it is done) instead of stopping at once; a second Ctrl-C forces the exit. Overrides
    `handle_exit` (uvicorn's signal handler) and `startup` (to keep the serving loop)."""

    def __init__(self, config: uvicorn.Config, on_first_signal) -> None:
        super().__init__(config)
        self._on_first_signal = on_first_signal
        self.signalled = False
        self.loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets=None) -> None:
        self.loop = asyncio.get_running_loop()  # Gradio's asyncio objects must be touched on it
        await super().startup(sockets=sockets)

    def handle_exit(self, sig: int, frame) -> None:
        if self.signalled or self.should_exit:
            super().handle_exit(sig, frame)
            return
        self.signalled = True
        self._on_first_signal(sig)

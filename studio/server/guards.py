"""Guards in front of the whole studio app (Gradio's routes included), as ASGI middleware.

- Unsafe methods (POST, PUT, PATCH, DELETE) with a body must send it as JSON. A web page can
  send text/plain, a form or multipart to any site without asking the browser first (no CORS
  preflight), so accepting those would let any page a user visits act on a studio the user
  can reach (a no-login localhost one). The two routes that need a form are let through:
  Gradio's login (a form) and its file upload (multipart; it only stores a file).
- Gradio's login is slowed down per client host: a wrong password is answered after a delay,
  one attempt of a host at a time, and a run of them locks the host out (429): see
  `studio.server.throttle` (shared with the HTTP API's key checks).
- Gradio answers every error of a direct call (/gradio_api/run/..., no queue) with a 500, even
  a gr.Error that says what the caller did wrong. Those become 400; any other failure stays 500.
- A call of a named endpoint (run, call, queue/join) must send as many values as the endpoint
  has inputs: Gradio itself fails a short list with a 500 (and a traceback in the log) and
  silently drops extra values.
- Every JSON body may nest lists and objects at most `MAX_JSON_DEPTH` deep: Python's JSON parser
  (Gradio's and ours) fails deeper ones with a RecursionError, a 500.
- A session hash (queue/join, calls, cancel, queue/data) is 1 to 128 letters, digits and - _ . :
  (gradio_client sends a uuid4, the browser about 11 random base-36 characters). Gradio fails an
  empty one with a 500, and keys its queue and task names (`..._<gradio-sep>...`) on them.
- A session's event stream is open to one connection at a time (409 for a second): Gradio gives
  each message to whichever stream of the session reads it first, and a second stream that
  disconnects ends the session's running events unanswered (see `studio.server.server_compat`).
- gradio_client's `job.cancel()` (POST /gradio_api/cancel) cancels that one event: Gradio's own
  cancel kills every running event of the endpoint in the session but completes only the one
  named, so the client's other jobs of that endpoint would wait forever.

The HTTP API's own routes check their bodies themselves (to answer in OpenAI's error shape),
so /v1/ is left to them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from itertools import accumulate

from starlette.datastructures import QueryParams
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from studio.server import server_compat
from studio.server.throttle import FailedAttempts, LockedOut

_UNSAFE = {"POST", "PUT", "PATCH", "DELETE"}
_FORM_ROUTES = {
    "/login": "application/x-www-form-urlencoded",
    "/login/": "application/x-www-form-urlencoded",
    "/gradio_api/upload": "multipart/form-data",
    "/gradio_api/process_recording": "multipart/form-data",
}
_LOGIN_ROUTES = {"/login", "/login/"}
_DIRECT_CALLS = ("/gradio_api/run/", "/gradio_api/api/")
_NAMED_CALLS = ("/gradio_api/run/", "/gradio_api/api/", "/gradio_api/call/v2/", "/gradio_api/call/")
_QUEUE_JOIN = "/gradio_api/queue/join"
_WRONG_LOGIN_STATUS = 400  # what Gradio answers to wrong credentials

# As deep as pydantic's JSON parser goes (it reads the /v1 routes' bodies); a workflow needs about 6.
MAX_JSON_DEPTH = 200
# JSON strings (their brackets are text), and what a bracket does to the depth.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_DEPTH_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
_NOT_BRACKETS = bytes(set(range(256)) - set(_DEPTH_STEP))

_SESSION_HASH = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_SESSION_HASH_RULE = (
    "session_hash must be text of 1 to 128 letters, digits, '-', '_', '.' or ':' (a random id per tab or client)")


class StudioGuards:
    def __init__(
        self, app: ASGIApp, attempts: FailedAttempts,
        input_counts: Mapping[str | int, server_compat.Endpoint] | None = None,
        demo=None,
    ) -> None:
        self.app = app
        self.attempts = attempts
        # Each endpoint's inputs, by api name and by fn_index (see `input_counts`).
        self.input_counts = input_counts or {}
        self.demo = demo  # the Blocks whose queue the /call streams read (see server_compat)
        # The session hashes whose event stream is open, each with a token of the connection holding it.
        self._streams: dict[str, object] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        if scope["method"] == "GET":
            await self._get(scope, receive, send)
            return
        if scope["method"] not in _UNSAFE:
            await self.app(scope, receive, send)
            return
        headers = {name.lower(): value for name, value in scope.get("headers", [])}
        media = headers.get(b"content-type", b"").decode("latin-1").partition(";")[0].strip().lower()
        has_body = headers.get(b"content-length", b"0") not in (b"0", b"") or b"transfer-encoding" in headers
        is_json = media == "application/json" or (media.startswith("application/") and media.endswith("+json"))
        if has_body and not is_json and media != _FORM_ROUTES.get(scope["path"]):
            shown = repr(media[:100]) if media else "none"
            await _json(send, 415, f"Content-Type {shown} is not accepted here: send JSON.")
            return
        if scope["path"] in _LOGIN_ROUTES:
            await self._login(scope, receive, send)
            return
        if has_body and is_json:
            body = await _read_all(receive)
            problem = _depth_problem(body)
            if problem is None:
                problem, passed_on = self._checked_call(scope["path"], body)
                if passed_on is not body:
                    body, scope = passed_on, _with_content_length(scope, len(passed_on))
            if problem is not None:
                await _gradio_error(send, problem)
                return
            if scope["path"] == server_compat.CANCEL and server_compat.GRADIO_IN_RANGE:
                body = await _cancel_one_event(body)
                scope = _with_content_length(scope, len(body))
            receive = _replay(body, receive)
        if scope["path"].startswith(_DIRECT_CALLS):
            await self.app(scope, receive, _caller_errors_as_400(send))
            return
        await self.app(scope, receive, send)

    async def _get(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Event streams: a valid session hash, and one stream a session."""
        session = None
        if scope["path"] == server_compat.QUEUE_DATA:
            session = QueryParams(scope.get("query_string", b"")).get("session_hash")
            problem = _session_hash_problem(session)
            if problem is not None:
                await _gradio_error(send, problem)
                return
        elif (event_id := server_compat.call_stream_event_id(scope["path"])) is not None:
            session = server_compat.session_of_event(self.demo, event_id)
        if session is None:
            await self.app(scope, receive, send)
            return
        if session in self._streams:
            await _gradio_error(send, (
                f"session {session!r} is already being streamed to another connection: one stream a session "
                "(the first caller's answers stay with it); open it again once that stream has ended."
            ), status=409, title="Conflict")
            return
        token = self._streams[session] = object()

        def release() -> None:
            if self._streams.get(session) is token:  # a later stream of the session may hold it already
                del self._streams[session]

        async def send_then_release_at_the_end(message: Message) -> None:
            if message["type"] == "http.response.body" and (
                    not message.get("more_body") or server_compat.ends_stream(message.get("body", b""))):
                release()  # before the client sees the end (and may open its next stream)
            await send(message)

        try:
            await self.app(scope, receive, send_then_release_at_the_end)
        finally:
            release()

    def _checked_call(self, path: str, body: bytes) -> tuple[str | None, bytes]:
        """What is wrong with a call's JSON body (its session hash, how many values), if anything,
        and the body to pass on (null for left-out optional inputs, see `_with_defaults`)."""
        if not (path in (_QUEUE_JOIN, server_compat.CANCEL) or path.startswith(_NAMED_CALLS)):
            return None, body
        try:
            payload = json.loads(body)
        except ValueError:
            return None, body  # Gradio answers malformed JSON with a 422 itself
        if not isinstance(payload, dict):
            return None, body
        if path == _QUEUE_JOIN or payload.get("session_hash") is not None:  # optional for direct calls
            problem = _session_hash_problem(payload.get("session_hash"))
            if problem is not None:
                return problem, body
        if path == server_compat.CANCEL or not isinstance(payload.get("data"), list):
            return None, body
        if path == _QUEUE_JOIN:
            key = payload.get("fn_index")
            if isinstance(key, bool) or not isinstance(key, int):
                return None, body
        else:
            key = path.rstrip("/").rpartition("/")[2]
        endpoint = self.input_counts.get(key)
        if endpoint is None:
            return None, body
        got, counts = len(payload["data"]), _allowed_counts(endpoint)
        if got in counts:
            return None, _with_defaults(body, payload, endpoint)
        wanted = " or ".join(str(n) for n in sorted(counts))
        return f"this endpoint takes {wanted} values in 'data' (one per input), got {got}.", body

    async def _login(self, scope: Scope, receive: Receive, send: Send) -> None:
        host = scope["client"][0] if scope.get("client") else "unknown"
        try:
            async with self.attempts.one_at_a_time(host):
                succeeded = []

                async def send_after_checking(message: Message) -> None:
                    if message["type"] == "http.response.start":
                        if message["status"] == _WRONG_LOGIN_STATUS:
                            await self.attempts.failed(host)  # the wrong password's answer waits
                        elif message["status"] < 400:
                            succeeded.append(True)
                    await send(message)

                await self.app(scope, receive, send_after_checking)
        except LockedOut as locked:
            await _json(send, 429, str(locked), {"retry-after": str(max(1, round(locked.retry_after_s)))})
            return
        if succeeded:
            self.attempts.succeeded(host)


def input_counts(demo) -> dict[str | int, server_compat.Endpoint]:
    """Each event of a Blocks with its input counts, by api name and by fn_index."""
    counts: dict[str | int, server_compat.Endpoint] = {}
    for endpoint in server_compat.endpoints(demo):
        counts[endpoint.fn_index] = endpoint
        if endpoint.api_name:
            counts[endpoint.api_name] = endpoint
    return counts


def _allowed_counts(endpoint: server_compat.Endpoint) -> frozenset[int]:
    """How many values a call may send: all its inputs, only those the API shows (Gradio fills in
    the hidden ones), or all but some of the last ones that have defaults (`_with_defaults`)."""
    least = endpoint.input_count - endpoint.optional_tail
    return frozenset({endpoint.input_count, endpoint.shown_input_count, *range(least, endpoint.input_count)})


def _with_defaults(body: bytes, payload: dict, endpoint: server_compat.Endpoint) -> bytes:
    """A call that leaves out some last inputs that have defaults, with null sent for them (the
    handler's default then applies): an endpoint that gains an optional input keeps its callers."""
    got = len(payload["data"])
    if got in (endpoint.input_count, endpoint.shown_input_count):
        return body
    return json.dumps({**payload, "data": payload["data"] + [None] * (endpoint.input_count - got)}).encode()


def _depth_problem(body: bytes) -> str | None:
    """Whether JSON text nests lists and objects deeper than MAX_JSON_DEPTH, found without
    parsing it (a parser would recurse that deep first). Brackets inside strings are text."""
    brackets = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    if max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0) <= MAX_JSON_DEPTH:
        return None
    return (f"the request body nests lists and objects more than {MAX_JSON_DEPTH} levels deep; "
            f"at most {MAX_JSON_DEPTH} are accepted.")


def _session_hash_problem(session_hash) -> str | None:
    if isinstance(session_hash, str) and _SESSION_HASH.fullmatch(session_hash):
        return None
    if session_hash is None:
        shown = "none"
    elif not isinstance(session_hash, str):
        shown = type(session_hash).__name__
    elif len(session_hash) > 128:
        shown = f"{len(session_hash)} characters"
    else:
        shown = repr(session_hash)
    return f"{_SESSION_HASH_RULE}, got {shown}."


async def _cancel_one_event(body: bytes) -> bytes:
    """Cancel the one event a /cancel names, and give back the body for Gradio's own /cancel
    with an fn_index that names no task: Gradio then only completes that event (its client
    stops waiting) instead of killing every running event of the endpoint in the session."""
    try:
        payload = json.loads(body)
    except ValueError:
        return body  # Gradio answers malformed JSON with a 422
    if not isinstance(payload, dict):
        return body
    session_hash, fn_index, event_id = (payload.get(key) for key in ("session_hash", "fn_index", "event_id"))
    if not (isinstance(session_hash, str) and isinstance(event_id, str) and type(fn_index) is int):
        return body  # Gradio answers a malformed cancel with a 422
    await server_compat.cancel_event_task(session_hash, fn_index, event_id)
    return json.dumps({**payload, "fn_index": server_compat.NO_TASK_FN_INDEX}).encode()


async def _read_all(receive: Receive) -> bytes:
    """The whole request body (Gradio reads it whole as well)."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the app the body read already, then the client's next messages."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _with_content_length(scope: Scope, length: int) -> Scope:
    headers = [(name, value) for name, value in scope["headers"] if name.lower() != b"content-length"]
    return {**scope, "headers": [*headers, (b"content-length", str(length).encode())]}


async def _gradio_error(send: Send, message: str, status: int = 400, title: str = "Bad request") -> None:
    """An error in the shape Gradio gives a gr.Error (gradio_client shows `error` as the message)."""
    body = json.dumps({"error": message, "duration": 10, "visible": True, "title": title}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _caller_errors_as_400(send: Send) -> Send:
    """Wrap `send`: a 500 whose JSON body carries a gr.Error's message goes out as 400."""
    held: list[Message] = []

    async def send_with_status(message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] == 500:
            held.append(message)
            return
        if held and message["type"] == "http.response.body":
            start = held.pop()
            if not message.get("more_body") and _is_gradio_error(message.get("body", b"")):
                start = {**start, "status": 400}
            await send(start)
        await send(message)

    return send_with_status


def _is_gradio_error(body: bytes) -> bool:
    try:
        payload = json.loads(body)
    except ValueError:
        return False
    # A gr.Error's payload has a title; any other exception's has none (and says nothing useful).
    return isinstance(payload, dict) and bool(payload.get("error")) and "title" in payload


async def _json(send: Send, status: int, detail: str, extra_headers: dict[str, str] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(name.encode(), value.encode()) for name, value in (extra_headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})

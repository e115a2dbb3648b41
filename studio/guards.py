"""Guards in front of the whole studio app (Gradio's routes included), as ASGI middleware.

- Unsafe methods (POST, PUT, PATCH, DELETE) with a body must send it as JSON. A web page can
  send text/plain, a form or multipart to any site without asking the browser first (no CORS
  preflight), so accepting those would let any page a user visits act on a studio the user
  can reach (a no-login localhost one). The two routes that need a form are let through:
  Gradio's login (a form) and its file upload (multipart; it only stores a file).
- Gradio's login is slowed down per client host: a wrong password is answered after a delay,
  one attempt of a host at a time, and a run of them locks the host out (429): see
  `studio.throttle` (shared with the HTTP API's key checks).
- Gradio answers every error of a direct call (/gradio_api/run/..., no queue) with a 500, even
  a gr.Error that says what the caller did wrong. Those become 400; any other failure stays 500.
- A call of a named endpoint (run, call, queue/join) must send as many values as the endpoint
  has inputs: Gradio itself fails a short list with a 500 (and a traceback in the log) and
  silently drops extra values.

The HTTP API's own routes check their bodies themselves (to answer in OpenAI's error shape),
so /v1/ is left to them.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from typing import Mapping

from studio.throttle import FailedAttempts, LockedOut

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
_MAX_CALL_BODY = 1 << 20  # larger call bodies are passed on unchecked (files go through the upload route)
_WRONG_LOGIN_STATUS = 400  # what Gradio answers to wrong credentials


class StudioGuards:
    def __init__(
        self, app: ASGIApp, attempts: FailedAttempts, input_counts: Mapping[str | int, frozenset[int]] | None = None
    ) -> None:
        self.app = app
        self.attempts = attempts
        # How many values each endpoint takes, by api name and by fn_index (see `input_counts`).
        self.input_counts = input_counts or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _UNSAFE or scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        headers = {name.lower(): value for name, value in scope.get("headers", [])}
        media = headers.get(b"content-type", b"").decode("latin-1").partition(";")[0].strip().lower()
        has_body = headers.get(b"content-length", b"0") not in (b"0", b"") or b"transfer-encoding" in headers
        allowed = {"application/json", _FORM_ROUTES.get(scope["path"])}
        if has_body and media not in allowed and not (media.startswith("application/") and media.endswith("+json")):
            shown = repr(media[:100]) if media else "none"
            await _json(send, 415, f"Content-Type {shown} is not accepted here: send JSON.")
            return
        if scope["path"] in _LOGIN_ROUTES:
            await self._login(scope, receive, send)
            return
        if scope["path"] == _QUEUE_JOIN or scope["path"].startswith(_NAMED_CALLS):
            body, complete = await _read_up_to(receive, _MAX_CALL_BODY)
            problem = self._arity_problem(scope["path"], body) if complete else None  # a huge body: the app's to judge
            if problem is not None:
                await _gradio_error(send, problem)
                return
            receive = _replay(body, complete, receive)
        if scope["path"].startswith(_DIRECT_CALLS):
            await self.app(scope, receive, _caller_errors_as_400(send))
            return
        await self.app(scope, receive, send)

    def _arity_problem(self, path: str, body: bytes) -> str | None:
        try:
            payload = json.loads(body)
        except ValueError:
            return None  # Gradio answers malformed JSON with a 422 itself
        if not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
            return None
        if path == _QUEUE_JOIN:
            key = payload.get("fn_index")
            if isinstance(key, bool) or not isinstance(key, int):
                return None
        else:
            key = path.rstrip("/").rpartition("/")[2]
        counts = self.input_counts.get(key)
        got = len(payload["data"])
        if counts is None or got in counts:
            return None
        wanted = " or ".join(str(n) for n in sorted(counts))
        return f"this endpoint takes {wanted} values in 'data' (one per input), got {got}."

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


def input_counts(demo) -> dict[str | int, frozenset[int]]:
    """For each event of a Blocks: how many values a call may send, by api name and by fn_index
    (all its inputs, or only those the API shows: Gradio fills in the hidden ones)."""
    counts: dict[str | int, frozenset[int]] = {}
    for index, fn in demo.fns.items():
        inputs = list(fn.inputs)
        shown = [block for block in inputs if not getattr(block, "skip_api", False)]
        allowed = frozenset({len(inputs), len(shown)})
        counts[index] = allowed
        if fn.api_name:
            counts[fn.api_name] = allowed
    return counts


async def _read_up_to(receive: Receive, limit: int) -> tuple[bytes, bool]:
    """The request body, read until its end or past `limit` bytes: (what was read, whether it
    is the whole body)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), True
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body"):
            return b"".join(chunks), True
        if size > limit:
            return b"".join(chunks), False


def _replay(body: bytes, complete: bool, receive: Receive) -> Receive:
    """A receive that gives the app the body read already, then the client's next messages."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": not complete}
        return await receive()

    return replay


async def _gradio_error(send: Send, message: str) -> None:
    """A 400 in the shape Gradio gives a gr.Error (gradio_client shows `error` as the message)."""
    body = json.dumps({"error": message, "duration": 10, "visible": True, "title": "Bad request"}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
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

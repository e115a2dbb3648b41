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

The HTTP API's own routes check their bodies themselves (to answer in OpenAI's error shape),
so /v1/ is left to them.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

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
_WRONG_LOGIN_STATUS = 400  # what Gradio answers to wrong credentials


class StudioGuards:
    def __init__(self, app: ASGIApp, attempts: FailedAttempts) -> None:
        self.app = app
        self.attempts = attempts

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
        if scope["path"].startswith(_DIRECT_CALLS):
            await self.app(scope, receive, _caller_errors_as_400(send))
            return
        await self.app(scope, receive, send)

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

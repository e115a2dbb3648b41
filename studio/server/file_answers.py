"""A file Gradio sends (`GET /gradio_api/file=...`: previews, results, History's pictures) goes
out whole, or not at all.

Gradio's file route answers with Starlette's FileResponse: it takes the Content-Length from a stat,
sends the headers, then opens the file and reads it to its end. A file that changes under it
arrives short or long: one rewritten in place (Gradio's `save_pil_to_cache` writes a picture it
is given again at the same path, truncating it first), or deleted between the stat and the open
(the temp-file sweeper, studio.server.temp_files). The server then fails in the middle of an
answer whose headers are gone: h11 raises `LocalProtocolError: Too little data for declared
Content-Length`, uvicorn logs its traceback, and the browser logs ERR_CONTENT_LENGTH_MISMATCH and
shows the picture's alt text.

`WholeFileAnswers` reads Gradio's whole answer before sending any of it, and sends it only when
its body is as long as its headers say and as the file is once read: a stable copy in memory, so
what happens to the file afterwards no longer matters. An answer that came out another length,
or failed after its headers, is asked for again a moment later (the file has settled by then, or is gone: Gradio
then answers 403 before any header); after ATTEMPTS such answers the caller gets a 404 that says
why. Files over
MAX_BUFFERED_BYTES (longer videos of real models stay far below it) are passed through as
Gradio streams them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

FILE_ROUTE = "/gradio_api/file="
ATTEMPTS = 3
RETRY_PAUSE_S = 0.05
MAX_BUFFERED_BYTES = 64 * 2**20


class _Answer:
    """One attempt's answer, held back until it is known to be whole (or, past the size limit,
    passed straight on)."""

    def __init__(self, send: Send, max_bytes: int) -> None:
        self._send = send
        self._max_bytes = max_bytes
        self.start: Message | None = None
        self.declared: int | None = None
        self.chunks: list[bytes] = []
        self.size = 0
        self.ended = False
        self.passed_on = False  # too large to hold: sent on as it comes

    async def take(self, message: Message) -> None:
        if self.passed_on:
            await self._send(message)
            return
        if message["type"] == "http.response.start":
            self.start = message
            length = dict(message.get("headers", [])).get(b"content-length")
            self.declared = int(length) if length is not None and length.isdigit() else None
            if self.declared is not None and self.declared > self._max_bytes:
                self.passed_on = True
                await self._send(message)
        elif message["type"] == "http.response.body":
            body = message.get("body", b"")
            self.chunks.append(body)
            self.size += len(body)
            self.ended = not message.get("more_body", False)

    @property
    def whole(self) -> bool:
        """Ended, and as long as declared (a file's answer, 200 or 206; others are taken as they are)."""
        if self.start is None or not self.ended:
            return False
        return self.start["status"] not in (200, 206) or self.declared is None or self.size == self.declared

    async def send(self) -> None:
        await self._send(self.start)
        await self._send({"type": "http.response.body", "body": b"".join(self.chunks), "more_body": False})


class WholeFileAnswers:
    """ASGI middleware: Gradio's file answers go out whole (see the module's docstring)."""

    def __init__(self, app: ASGIApp, attempts: int = ATTEMPTS, max_buffered_bytes: int = MAX_BUFFERED_BYTES) -> None:
        self.app = app
        self.attempts = attempts
        self.max_buffered_bytes = max_buffered_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET" or not scope["path"].startswith(FILE_ROUTE):
            await self.app(scope, receive, send)
            return
        for attempt in range(1, self.attempts + 1):
            if attempt > 1:
                await asyncio.sleep(RETRY_PAUSE_S * (attempt - 1))  # a writer under way has a moment to finish
            answer = _Answer(send, self.max_buffered_bytes)
            try:
                await self.app(scope, receive, answer.take)
            except Exception as exc:  # noqa: BLE001 - the file went between the stat and the open
                if answer.passed_on:
                    raise
                log.info("%s failed while it was read (%s: %s); attempt %d of %d",
                         scope["path"][:200], type(exc).__name__, exc, attempt, self.attempts)
                continue
            if answer.passed_on:
                return
            if answer.whole and _unchanged(scope["path"][len(FILE_ROUTE):], answer):
                await answer.send()
                return
            log.info("%s changed while it was read (%d bytes of %s); attempt %d of %d",
                     scope["path"][:200], answer.size, answer.declared, attempt, self.attempts)
        await _changed(send, self.attempts)


def _unchanged(path: str, answer: _Answer) -> bool:
    """Whether a whole file's answer is as long as the file is now: a file being rewritten in place
    can be read, consistently, while it is still short, or empty (truncated, not yet written: no
    file the studio sends is empty). A file deleted since was read whole. (Gradio compresses text files,
the editor's scripts and styles: their answers are compared with their headers only.)"""
    if answer.start["status"] != 200 or b"content-encoding" in dict(answer.start.get("headers", [])):
        return True  # an error, part of the file (a Range request) or a compressed one: nothing to compare
    if answer.size == 0:
        return False
    try:
        return os.stat(path).st_size == answer.size
    except OSError:
        return True


async def _changed(send: Send, attempts: int) -> None:
    body = json.dumps({"detail": f"The file changed or was deleted each time it was read ({attempts} tries): "
                                 "it is being replaced or is gone; ask for it again."}).encode()
    await send({"type": "http.response.start", "status": 404,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})

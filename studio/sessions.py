"""Who a Gradio caller is to the engine, and cancelling one's own requests.

Gradio lets a client choose its `session_hash`, so that string is never used as is: the engine
session is "ui:" + a keyed hash (a key only this process knows) of the login name and the
session hash. It can't be chosen to equal anyone else's, and never one of the HTTP API's
sessions (those start with "http:").
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import TYPE_CHECKING

from engine import EngineClient
from studio.user_errors import user_error

if TYPE_CHECKING:
    import gradio as gr

UI_SESSION_PREFIX = "ui:"
SESSION_KEY = secrets.token_bytes(32)  # per process: engine sessions can't be computed from outside


def session_id_of(request: "gr.Request | None") -> str:
    """The engine session a Gradio caller acts for (see the module docstring): 'ui:' + a keyed
    hash of its login name and Gradio session hash."""
    session = getattr(request, "session_hash", None)
    user = getattr(request, "username", None)
    text = f"{user if isinstance(user, str) else ''}\0{session if isinstance(session, str) else ''}"
    digest = hmac.new(SESSION_KEY, text.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()
    return UI_SESSION_PREFIX + digest[:24]


def own_request_id(engine: EngineClient, request_id: object, session_id: str) -> str:
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


def cancel_own_request(engine: EngineClient, request_id: object, session_id: str) -> dict:
    """Cancel one of the caller's requests (the /cancel endpoint): gr.Error for someone else's."""
    full_id = own_request_id(engine, request_id, session_id)
    try:
        cancelled = engine.cancel(full_id, session_id)
    except PermissionError as exc:
        raise user_error(str(exc), "Not your request") from None
    message = "cancelling at the next step boundary" if cancelled else "unknown or already finished"
    return {"request_id": full_id, "cancelled": cancelled, "message": message}

"""The gradio_client endpoints for a caller's own queue: `/pause_queue`, `/resume_queue`,
`/clear_queue`, `/move_request` and `/queue_state`. Each acts on the caller's session only
(the session gradio_client's `Client` is), through studio.queue_actions, as the HTTP API and the
page do; errors come back as gr.Error with the engine's own message.

    client.predict(False, api_name="/pause_queue")        # abort_running=False: running ones finish
    client.predict(request_id, "", api_name="/move_request")  # "" = to the front; or another id
    client.predict(False, api_name="/clear_queue")        # include_running=False
    client.predict(api_name="/resume_queue")
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import gradio as gr

from engine import EngineClient
from studio import queue_actions
from studio.sessions import own_request_id, session_id_of
from studio.user_errors import user_error


@contextlib.contextmanager
def _queue_errors() -> Iterator[None]:
    try:
        yield
    except PermissionError as exc:
        raise user_error(str(exc), "Not your request") from None
    except ValueError as exc:
        raise user_error(str(exc), "Bad request") from None


def wire_queue_endpoints(engine: EngineClient) -> None:
    def pause_queue(abort_running: bool = False, request: gr.Request = None) -> dict:
        """Pause YOUR queue: your queued requests stay queued (their status says paused: "session")
        and none starts until /resume_queue, or until the pause ends by itself (paused_until, the
        server's --pause-expiry). abort_running=true also aborts your running requests at the next
        step boundary; otherwise they finish."""
        with _queue_errors():
            return queue_actions.pause_own_queue(engine, session_id_of(request), abort_running)

    def resume_queue(request: gr.Request = None) -> dict:
        """Resume YOUR queue: your queued requests start again, in their order."""
        with _queue_errors():
            return queue_actions.resume_own_queue(engine, session_id_of(request))

    def clear_queue(include_running: bool = False, request: gr.Request = None) -> dict:
        """Abort YOUR queued requests (and your running ones with include_running=true) at the
        next step boundary; answers how many."""
        with _queue_errors():
            return queue_actions.clear_own_queue(engine, session_id_of(request), include_running)

    def move_request(request_id: str, before: str = "", request: gr.Request = None) -> dict:
        """Move one of YOUR queued requests to the front of your queue (before=""), or just before
        another of your queued requests (before=its request_id). Others' order is untouched."""
        session = session_id_of(request)
        with _queue_errors():
            full_id = own_request_id(engine, request_id, session)
            target = own_request_id(engine, before, session) if isinstance(before, str) and before.strip() else None
            return queue_actions.move_own_request(engine, session, full_id, target)

    def queue_state(request: gr.Request = None) -> dict:
        """Whether YOUR queue is paused (paused_until: the unix time it resumes by itself) and whether
        the operator paused the studio, and how many of your requests wait and run."""
        return queue_actions.queue_state(engine, session_id_of(request))

    for handler in (pause_queue, resume_queue, clear_queue, move_request, queue_state):
        gr.api(handler, api_name=handler.__name__, queue=False)

"""The page's controls for the tab's own queue: Pause, Resume, Clear and a line saying how it stands.

One set under the Simple tab's queue and one on the editor's run bar (its browser code moves the
row and the line there); both act on the tab's engine session through studio.queue_actions, as the
gradio_client endpoints and the HTTP API do (and on the sessions the tab adopted after a restart:
RunRegistry.sessions_of). Clear also cancels the tab's requests still held back in their run's own
queue (a workflow's branches beyond the session's limit), so nothing of the cleared queue starts
afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from engine import EngineClient
from studio import queue_actions
from studio.server.server_compat import event_payload
from studio.sessions import session_id_of
from studio.user_errors import user_error
from studio.tracker import QUEUED, WAITING
from studio.workflows.registry import RunRegistry


@dataclass(frozen=True)
class QueueControls:
    pause: gr.Button
    resume: gr.Button
    clear: gr.Button
    note: gr.Markdown  # "your queue is paused", "the studio is paused by its operator", ...


def build_queue_controls(prefix: str, paused_at_start: bool) -> QueueControls:
    """`prefix`: the elements' id prefix (e.g. "ss" gives #ss-pause-queue, in the row #ss-queue-row)."""
    with gr.Row(elem_id=f"{prefix}-queue-row"):
        pause = gr.Button("Pause queue", size="sm", elem_id=f"{prefix}-pause-queue")
        resume = gr.Button("Resume queue", size="sm", elem_id=f"{prefix}-resume-queue")
        clear = gr.Button("Clear queued", size="sm", variant="stop", elem_id=f"{prefix}-clear-queue")
    start = ("The studio started paused by its operator (--start-paused, or paused before a restart): nothing "
             "starts until its operator resumes it; the "
             "Queue view says when it runs again.") if paused_at_start else ""
    note = gr.Markdown(start, elem_id=f"{prefix}-queue-note")
    return QueueControls(pause, resume, clear, note)


def wire_queue_controls(engine: EngineClient, registry: RunRegistry, controls: QueueControls, name: str) -> None:
    """`name`: the events' private api names' stem (each tab's own)."""
    def note(state: dict) -> str:
        return state["message"][0].upper() + state["message"][1:] + "."

    def pause(request: gr.Request) -> str:
        session = session_id_of(request)
        for each in registry.sessions_of(session):
            queue_actions.pause_own_queue(engine, each)
        return note(queue_actions.queue_state(engine, session))

    def resume(request: gr.Request) -> str:
        session = session_id_of(request)
        for each in registry.sessions_of(session):
            queue_actions.resume_own_queue(engine, each)
        return note(queue_actions.queue_state(engine, session))

    def clear(request: gr.Request) -> str:
        session = session_id_of(request)
        held_back = 0
        for run in registry.runs_of(session):
            for branch in run.branches:
                if branch.state == WAITING or (branch.state == QUEUED and branch.request_id is None):
                    held_back += run.cancel_branch(branch.branch.index)
        cleared = held_back + sum(queue_actions.clear_own_queue(engine, each)["cleared"]
                                  for each in registry.sessions_of(session))
        return f"Cleared {cleared} queued request{'s' if cleared != 1 else ''}; running ones go on. " + \
            note(queue_actions.queue_state(engine, session))

    for button, handler in ((controls.pause, pause), (controls.resume, resume), (controls.clear, clear)):
        button.click(handler, outputs=controls.note, queue=False, api_name=f"ui_{name}_{handler.__name__}_queue",
                     api_visibility="private", show_progress="hidden")


def move_from_page(engine: EngineClient, registry: RunRegistry, event: gr.EventData, request: gr.Request) -> bool:
    """A row's ⤒ sent {action: "front", request_id}: move it first in its session's queue (the
    tab's, or one it adopted). False for any other press (a cancel)."""
    data = event_payload(event)
    if data.get("action") != "front":
        return False
    sessions = registry.sessions_of(session_id_of(request))
    request_id = data.get("request_id")
    session = next((view.session_id for view in engine.snapshot().requests
                    if view.request_id == request_id and view.session_id in sessions), sessions[0])
    try:
        queue_actions.move_own_request(engine, session, request_id)
    except (PermissionError, ValueError) as exc:
        raise user_error(str(exc), "Can't move it") from None
    return True

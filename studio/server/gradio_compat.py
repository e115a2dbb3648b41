"""The Gradio internals the studio's guards (studio.server.guards) rely on, in one place.

Read in gradio 6.31 (`gradio/routes.py`: `queue_data`, `simple_predict_get`, `cancel_event`;
`gradio/queueing.py`: `Queue.push`, `Queue.process_events`; `gradio/utils.py`: `set_task_name`,
`cancel_tasks`). `SUPPORTED` is False under another major version: the guards then leave
Gradio's own behaviour alone rather than act on internals that may have moved.
"""

from __future__ import annotations

import asyncio

import gradio

SUPPORTED = gradio.__version__.split(".")[0] == "6"

# Event streams. Every stream of one session reads the same asyncio.Queue
# (`_queue.pending_messages_per_session[session_hash]`): each message goes to whichever reader
# takes it first, and a reader that disconnects marks the session's running events dead
# (`clean_events(session_hash=...)`), so their results are never sent.
QUEUE_DATA = "/gradio_api/queue/data"  # GET ?session_hash=...
CALL_PREFIX = "/gradio_api/call/"  # GET call/{api_name}/{event_id} and call/v2/{api_name}/{event_id}
CANCEL = "/gradio_api/cancel"  # POST {"session_hash", "fn_index", "event_id"}
# A fn_index no event has (Gradio numbers them from 0): Gradio's /cancel given it kills no task.
NO_TASK_FN_INDEX = -1


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
    (`simple_predict_get`): a held event's own, else the session still waiting for it, else the
    event id itself (what an event joined without a session hash uses)."""
    queue = getattr(demo, "_queue", None)
    if not SUPPORTED or queue is None:
        return None
    event = queue.event_ids_to_events.get(event_id)
    if event is not None:
        return event.session_hash
    return next((session for session, ids in queue.pending_event_ids_session.items() if event_id in ids), event_id)


def ends_stream(chunk: bytes) -> bool:
    """Whether a chunk of a queue/data stream carries Gradio's last message (`close_stream`)."""
    return b'"msg":"close_stream"' in chunk


async def cancel_event_task(session_hash: str, fn_index: int, event_id: str) -> None:
    """Cancel the one asyncio task that runs this event, and wait for it to end. Gradio names
    each (non-batched) event's task `{session_hash}_{fn_index}<gradio-sep>{event_id}`; its own
    /cancel kills every task named `{session_hash}_{fn_index}<gradio-sep>...`."""
    name = f"{session_hash}_{fn_index}<gradio-sep>{event_id}"
    tasks = [task for task in asyncio.all_tasks() if task.get_name() == name]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)

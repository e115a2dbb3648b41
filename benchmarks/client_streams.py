"""A way around gradio_client's race between a new call and the close of its event stream.

gradio_client (2.7) reads every job of a Client from one event stream, which the server closes
once the session has nothing pending. A call submitted after the previous result but before the
client's reader thread has read that close is filed under the closing stream and fails with
CancelledError, though the server runs it (tests/test_gradio_client_race.py shows it). On a
loaded machine (a busy GIL delays the reader) that gap is real: the stress callers and the
tests' clients wait for a closing stream to close before they send the next call."""

from __future__ import annotations

import time

from gradio_client import Client


def wait_for_closed_stream(client: Client, timeout_s: float = 5.0) -> None:
    """Return once the client's stream is closed or still has jobs of ours pending (then the
    server keeps it open): a call sent now is never filed under a stream about to close."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with client.pending_lock:
            if not client.stream_open or client.pending_event_ids:
                return
        time.sleep(0.005)


class SettledClient(Client):
    """A Client whose calls each wait for a closing stream first (predict goes through submit)."""

    def submit(self, *args, **kwargs):
        wait_for_closed_stream(self)
        return super().submit(*args, **kwargs)

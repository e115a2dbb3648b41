"""gradio_client's race between a new call and the close of its event stream, and the stress
callers' way around it (benchmarks/client_streams.py).

A Client reads all its jobs from one event stream, which the server closes once the session has
nothing pending. Here the client's reader reads that close only once the next call was sent (as
a loaded GIL can make it): a call sent in that gap is filed under the closing stream and raises
CancelledError though the server ran it. If gradio_client stops doing this, the first test fails:
the wait can go."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import types

import gradio as gr
import pytest
from gradio_client import Client
import gradio_client.client as client_module

from benchmarks.client_streams import SettledClient, wait_for_closed_stream

# How long the reader waits, on reading a close, for the next call to be sent: the race needs
# no clock (a call sent in that time always lands in the closing stream), this only bounds the
# wait when no call comes (the last one, or a client that waits for the close).
READER_WAIT_S = 1.0


@pytest.fixture
def slow_reader_client(monkeypatch):
    """A Client on a one-line app whose reader thread, on reading the server's close_stream,
    first lets the next call be sent (as a busy GIL can): the gap of the race, held open."""
    sent = threading.Condition()
    calls_sent = [0]

    def send_data(self, *args, **kwargs):
        event_id = original_send_data(self, *args, **kwargs)
        with sent:
            calls_sent[0] += 1
            sent.notify_all()
        return event_id

    def loads(text, *args, **kwargs):
        value = json.loads(text, *args, **kwargs)
        if isinstance(value, dict) and value.get("msg") == "close_stream":
            with sent:
                before = calls_sent[0]
                sent.wait_for(lambda: calls_sent[0] > before, timeout=READER_WAIT_S)
        return value

    original_send_data = Client.send_data
    monkeypatch.setattr(Client, "send_data", send_data)
    monkeypatch.setattr(client_module, "json", types.SimpleNamespace(
        loads=loads, dumps=json.dumps, dump=json.dump, load=json.load, JSONDecodeError=json.JSONDecodeError))
    demo = gr.Interface(lambda text: text.upper(), gr.Textbox(), gr.Textbox(), api_name="echo")
    _, url, _ = demo.launch(prevent_thread_lock=True, quiet=True, server_name="127.0.0.1", server_port=None)
    try:
        yield Client(url, verbose=False)
    finally:
        demo.close()


def _answers(client: Client, calls: int, wait: bool) -> list[str]:
    answers = []
    for number in range(calls):
        if wait:
            wait_for_closed_stream(client)
        try:
            answers.append(client.predict(f"call {number}", api_name="/echo"))
        except concurrent.futures.CancelledError:
            answers.append("CancelledError")
    return answers


def test_a_call_sent_while_the_stream_closes_is_lost_by_the_client(slow_reader_client):
    answers = _answers(slow_reader_client, 4, wait=False)
    # Every call right after a result lands in the closing stream: every second one is lost.
    assert answers == ["CALL 0", "CancelledError", "CALL 2", "CancelledError"]


def test_waiting_for_the_closed_stream_loses_no_call(slow_reader_client):
    assert _answers(slow_reader_client, 4, wait=True) == ["CALL 0", "CALL 1", "CALL 2", "CALL 3"]


def test_a_settled_client_loses_no_call(slow_reader_client):
    settled = SettledClient(slow_reader_client.src, verbose=False)
    answers = [settled.predict(f"call {number}", api_name="/echo") for number in range(3)]
    assert answers == ["CALL 0", "CALL 1", "CALL 2"]

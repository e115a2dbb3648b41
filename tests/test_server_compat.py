"""studio/server/server_compat.py against the installed Gradio and uvicorn: the versions are in
the range it was read in, every internal it relies on is there, and each wrapper reads what its
docstring says it reads."""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
import time

import gradio as gr
import pytest
import uvicorn
from gradio.routes import App
from gradio.utils import set_task_name
from PIL import Image

from engine import Engine
from pipelines.toy import ToyPipeline
from studio.config import StudioOptions
from studio.server import server_compat
from studio.app import build_app


@pytest.fixture(scope="module")
def app():
    engine = Engine(ToyPipeline())  # never started: building the app is all these tests need
    yield build_app(engine, StudioOptions(model="toy", port=0, outputs=None))
    engine.close()


def _queued_demo(**options) -> gr.Blocks:
    with gr.Blocks() as demo:
        text, number, state = gr.Textbox(), gr.Number(), gr.State(0)
        out = gr.Textbox()
        gr.Button().click(lambda a, b, c: a, inputs=[text, number, state], outputs=out, api_name="echo")
    demo.queue(**options)
    return demo


def test_the_installed_versions_are_in_range_and_have_every_internal(app):
    versions = server_compat.installed_versions()
    assert versions["gradio"] == gr.__version__ and versions["uvicorn"] == uvicorn.__version__
    assert server_compat.version_warnings() == []
    assert server_compat.GRADIO_IN_RANGE
    assert server_compat.internal_problems(app.state.demo, app.state.gradio_app) == []
    server_compat.check_installed(app.state.demo, app.state.gradio_app)  # neither warns nor raises


def test_a_version_outside_the_range_is_a_warning_that_names_what_to_pin():
    assert server_compat.version_warnings({"gradio": "6.31.0rc1", "uvicorn": "0.54.0+local"}) == []
    found = server_compat.version_warnings({"gradio": "7.0.0", "uvicorn": "0.28.2"})
    assert len(found) == 2
    assert found[0].startswith("gradio 7.0.0 is outside") and "'gradio>=6.0,<7'" in found[0]
    assert found[1].startswith("uvicorn 0.28.2 is outside") and "'uvicorn>=0.29,<1'" in found[1]
    assert server_compat.version_warnings({"gradio": None, "uvicorn": "0.60.1"}) == []  # not installed: no claim


def test_a_missing_internal_is_an_error_that_names_it_and_the_versions_to_install():
    class ChangedBlocks:  # what a Gradio that renamed its queue and cache sets would hand over
        def __init__(self) -> None:
            self.fns, self.blocks = {}, {}

    with pytest.raises(RuntimeError) as raised:
        server_compat.check_installed(ChangedBlocks(), gradio_app=object())
    message = str(raised.value)
    assert "gradio's Blocks._queue.pending_event_ids_session is gone" in message
    assert "gradio's Blocks.temp_file_sets is gone" in message
    assert "gradio's App.stop_event is gone" in message
    assert "'gradio>=6.0,<7' and 'uvicorn>=0.29,<1'" in message


def test_the_mounted_gradio_app_is_the_one_serving_the_page_and_its_streams_can_be_stopped(app):
    gradio_app = server_compat.mounted_gradio_app(app)
    assert isinstance(gradio_app, App) and gradio_app is not app.state.demo.app
    assert gradio_app.get_blocks() is app.state.demo
    assert not gradio_app.stop_event.is_set()
    server_compat.stop_open_streams(gradio_app)
    assert gradio_app.stop_event.is_set()


def test_an_events_payload_is_the_object_its_component_sent():
    target = gr.Textbox(render=False)
    assert server_compat.event_payload(gr.EventData(target, {"run_id": "r1", "index": 2})) == {"run_id": "r1", "index": 2}
    assert server_compat.event_payload(gr.EventData(target, "not an object")) == {}
    assert server_compat.event_payload(gr.EventData(target, None)) == {}


def test_endpoints_count_every_input_and_those_the_api_shows():
    demo = _queued_demo()
    assert server_compat.endpoints(demo) == [server_compat.Endpoint(0, "echo", 3, 2)]  # the State is hidden


def test_the_cap_on_events_at_once_reaches_gradios_queue():
    with gr.Blocks() as demo:
        gr.Textbox()
    server_compat.cap_events_at_once(demo, 77)
    demo.queue()
    assert demo._queue.max_thread_count == 77


def test_unsent_answers_and_the_session_of_an_event_are_read_from_gradios_queue():
    demo = _queued_demo()
    assert server_compat.has_unsent_answers(demo) is False
    assert server_compat.session_of_event(demo, "event-1") == "event-1"  # joined without a session
    demo._queue.pending_event_ids_session["tab-a"] = {"event-1"}  # as queue/join records a waiting event
    assert server_compat.has_unsent_answers(demo) is True
    assert server_compat.session_of_event(demo, "event-1") == "tab-a"
    demo._queue.pending_event_ids_session["tab-a"].clear()
    assert server_compat.has_unsent_answers(demo) is False
    assert server_compat.has_unsent_answers(None) is False and server_compat.session_of_event(None, "e") is None


def test_one_events_task_is_found_by_the_name_gradio_gives_it():
    async def scenario():
        tasks = {}
        for event_id in ("ev-1", "ev-2"):
            tasks[event_id] = asyncio.create_task(asyncio.sleep(60))
            set_task_name(tasks[event_id], "tab-a", 3, event_id, batch=False)  # Gradio's own naming
        assert tasks["ev-1"].get_name() == server_compat.event_task_name("tab-a", 3, "ev-1")
        await server_compat.cancel_event_task("tab-a", 3, "ev-1")
        cancelled = tasks["ev-1"].cancelled(), tasks["ev-2"].done()
        tasks["ev-2"].cancel()
        return cancelled

    assert asyncio.run(scenario()) == (True, False)


def test_temp_file_sets_and_the_files_kept_in_cache_are_gradios(tmp_path):
    picture = tmp_path / "default.png"
    Image.new("RGB", (8, 8), (200, 0, 0)).save(picture)
    with gr.Blocks() as demo:
        image = gr.Image(value=str(picture))
    kept = server_compat.paths_kept_in_cache(demo)
    assert kept == {image.value["path"]} and image.value["path"] != str(picture)  # Gradio's cached copy
    sets = server_compat.temp_file_sets(demo)
    assert sets and all(isinstance(files, set) for files in sets)
    assert image.value["path"] in set().union(*sets)


def test_the_timed_protocol_answers_a_stalled_request_408_and_serves_whole_ones():
    async def hello(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    signals = []
    config = uvicorn.Config(hello, log_level="warning", http=server_compat.timed_protocol(0.3), lifespan="off")
    server = server_compat.GracefulServer(config, on_first_signal=signals.append)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.loop is not None  # kept at startup: the loop Gradio's objects live on
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert client.recv(4096).endswith(b"ok")
            client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # half a request on the kept-alive connection
            answer = b""
            while chunk := client.recv(4096):
                answer += chunk
        assert answer == b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        server.handle_exit(signal.SIGTERM, None)  # the first signal asks; it doesn't stop uvicorn
        assert signals == [signal.SIGTERM] and not server.should_exit
        server.handle_exit(signal.SIGTERM, None)  # a second one is uvicorn's own
        thread.join(20)
        assert server.should_exit and not thread.is_alive()
    finally:
        server.should_exit = True
        thread.join(5)
        sock.close()

"""The studio app (Gradio and the HTTP API together) under borrowed identities, cross-site
posts, guessed passwords, bad ids, a stop while requests run, and its temp files."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time

import httpx
import pytest
from gradio_client.exceptions import AppError

from engine import Engine
from pipelines.toy import ToyPipeline
from studio.config import StudioOptions
from studio.server import server_compat
from studio.app import build_app
from studio.server.serving import StudioServer
from studio.server.temp_files import delete_temp_files
from studio.sessions import session_id_of
from tests.engine_helpers import StepGate
from tests.studio_helpers import connect
from tests.test_http_api import assert_openai_error, raw_post, wait_until


@contextlib.contextmanager
def studio(pipeline=None, **options):
    config = StudioOptions(model="toy", port=0, **{"outputs": None, **options})  # outputs: no shared folder
    engine = Engine(pipeline or ToyPipeline(), limits=config.limits).start()
    app = build_app(engine, config)
    server = StudioServer(app, "127.0.0.1", 0).start()
    try:
        yield server, engine, app
    finally:
        server.stop()
        engine.close()


def run(server: StudioServer, api_name: str, data: list, session_hash: str, **extra) -> httpx.Response:
    """A direct (no queue) call of a named endpoint, with the session hash the caller chooses."""
    return httpx.post(f"{server.url}gradio_api/run/{api_name}", json={"data": data, "session_hash": session_hash},
                      timeout=30, **extra)


def test_a_gradio_caller_cannot_act_as_an_http_caller_even_knowing_its_session():
    gate = StepGate(1)
    with studio(ToyPipeline(on_forward=gate)) as (server, engine, _):
        busy = raw_post(server.url.rstrip("/"), {"prompt": "an http caller's secret", "num_inference_steps": 5})
        gate.wait()  # its request is running, and stays so
        (view,) = engine.snapshot().requests
        assert view.session_id == "http:host:127.0.0.1"

        # A Gradio client may pick any session_hash: it picks the HTTP caller's engine session.
        seen = run(server, "queue", [], session_hash=view.session_id).json()["data"][0]["requests"]
        assert [(r["mine"], r["prompt"]) for r in seen] == [(False, "(hidden)")]
        cancel = run(server, "cancel", [view.request_id], session_hash=view.session_id)
        assert cancel.status_code == 400 and "belongs to another session" in cancel.json()["error"]
        gate.release()
        busy.close()


def test_engine_sessions_of_gradio_callers_are_keyed_and_namespaced():
    class Caller:
        def __init__(self, session_hash, username=None):
            self.session_hash, self.username = session_hash, username

    a, b = session_id_of(Caller("tab-a")), session_id_of(Caller("tab-b"))
    assert a.startswith("ui:") and b.startswith("ui:") and a != b
    assert session_id_of(Caller("tab-a")) == a  # stable for one tab
    assert session_id_of(Caller("tab-a", username="eve")) != a  # the login name is part of it
    assert session_id_of(Caller("http:host:127.0.0.1")).startswith("ui:")
    assert "tab-a" not in a


def test_cancel_with_a_number_for_an_id_is_a_clear_400():
    with studio() as (server, _, _):
        response = run(server, "cancel", [12345], session_hash="s")
        assert response.status_code == 400
        assert response.json()["error"] == "request_id must be text (a request id from /generate's status), got int."
        assert run(server, "cancel", ["nope"], session_hash="s").json()["data"][0]["cancelled"] is False


def test_cross_site_form_and_text_posts_are_refused():
    with studio() as (server, engine, _):
        body = '{"data": ["a red circle", "", 64, 64, 2, 1.0, -1], "session_hash": "x"}'
        for path in ("gradio_api/queue/join", "gradio_api/call/generate", "gradio_api/run/queue"):
            for content_type in ("text/plain", "application/x-www-form-urlencoded"):
                refused = httpx.post(server.url + path, content=body, headers={"content-type": content_type})
                assert refused.status_code == 415, (path, content_type, refused.text)
        assert engine.snapshot().stats.finished == {} and engine.pipeline.encoded == []
        assert run(server, "queue", [], session_hash="x").status_code == 200  # JSON passes


def test_wrong_passwords_are_slowed_down_then_locked_out():
    with studio(auth=("me", "secret")) as (server, _, app):
        app.state.attempts.delay_s, app.state.attempts.max_failures = 0.2, 3
        for guess in ("a", "b", "c"):
            started = time.monotonic()
            wrong = httpx.post(server.url + "login", data={"username": "me", "password": guess})
            assert wrong.status_code == 400 and time.monotonic() - started >= 0.2
        locked = httpx.post(server.url + "login", data={"username": "me", "password": "secret"})
        assert locked.status_code == 429 and "too many failed attempts" in locked.json()["detail"]
        # The HTTP API's keys count against the same host.
        refused = httpx.get(server.url + "v1/models", headers={"authorization": "Bearer secret"})
        assert_openai_error(refused, 429, code="too_many_failed_attempts")


def test_the_right_password_still_logs_in():
    with studio(auth=("me", "secret")) as (server, _, _):
        assert httpx.post(server.url + "login", data={"username": "me", "password": "secret"}).status_code == 200


def test_a_rejected_input_logs_no_traceback(capfd):
    with studio() as (server, _, _):
        client = connect(server.url)
        with pytest.raises(AppError, match="prompt is empty"):
            client.predict(prompt="   ", negative_prompt="", width=64, height=64, steps=2, guidance_scale=1.0,
                           seed=-1, api_name="/generate")
        # A lone surrogate can't even be encoded by a client library; a raw JSON escape carries it.
        body = '{"data": ["a \\ud800 b", "", 64, 64, 2, 1.0, -1, ""]}'
        posted = httpx.post(server.url + "gradio_api/call/generate", content=body,
                            headers={"content-type": "application/json"}, timeout=10)
        events = httpx.get(server.url + f"gradio_api/call/generate/{posted.json()['event_id']}", timeout=10).text
        assert "event: error" in events and "prompt has a lone surrogate" in events
    assert "Traceback" not in capfd.readouterr().err


def test_stopping_answers_every_caller_then_ends():
    # 200 steps of 50 ms: both calls are still running when the stop comes.
    with studio(ToyPipeline(step_delay_s=0.05), max_steps=200) as (server, engine, _):
        client = connect(server.url)
        job = client.submit(prompt="a gradio caller", negative_prompt="", width=64, height=64, steps=200,
                            guidance_scale=1.0, seed=1, api_name="/generate")
        answers = []
        http_call = threading.Thread(target=lambda: answers.append(httpx.post(
            server.url + "v1/images/generations", json={"prompt": "an http caller", "num_inference_steps": 200},
            timeout=30)))
        http_call.start()
        wait_until(lambda: len(engine.snapshot().running) == 2, timeout=30, what="both requests to run")
        # The stop closes Gradio's queue once every answer has left, not once its deadline has
        # passed: each answer is seen sent when the wait for them ends (no clock in this test).
        sent_when_closing = []
        wait_for_answers = server._wait_for_gradio_answers

        def recording(deadline: float) -> None:
            wait_for_answers(deadline)
            sent_when_closing.append(not server_compat.has_unsent_answers(server._demo))

        server._wait_for_gradio_answers = recording
        server.stop()
        http_call.join(30)
        assert sent_when_closing == [True]
        assert_openai_error(answers[0], 503, code="shutting_down")
        with pytest.raises(AppError, match="The server is shutting down"):
            job.result(timeout=30)
        assert engine.wait_stopped(0) and engine.requests_in_flight == 0
        assert engine.snapshot().stats.finished == {"aborted": 2}


def test_gradio_temp_files_go_after_their_time_and_all_when_the_studio_stops():
    with studio(preview_every=1) as (server, _, app):
        client = connect(server.url)
        for seed in (1, 2):
            client.predict(prompt="a red circle", negative_prompt="", width=64, height=64, steps=4,
                           guidance_scale=1.0, seed=seed, api_name="/generate")
        demo = app.state.demo
        files = sorted({path for files in demo.temp_file_sets for path in files})
        assert len(files) >= 4 and all(os.path.exists(path) for path in files)
        old, new = files[: len(files) // 2], files[len(files) // 2:]
        for path in old:
            os.utime(path, (time.time() - 7200, time.time() - 7200))  # two hours old
        assert delete_temp_files(demo, older_than_s=3600) == len(old)
        assert [os.path.exists(path) for path in files] == [False] * len(old) + [True] * len(new)
    assert not any(os.path.exists(path) for path in files)


def test_half_sent_headers_are_answered_408_and_disconnected():
    with studio(request_timeout_s=0.3) as (server, _, _):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # and then nothing
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout")
        # A whole request on a fresh connection is served as usual.
        assert httpx.get(server.url + "healthz").status_code == 200


def test_video_files_written_for_gradio_do_not_pile_up(tmp_path, monkeypatch):
    from PIL import Image

    from studio import media
    from studio.server.temp_files import TempFolder

    monkeypatch.setattr(media, "VIDEOS", TempFolder("videos", ttl_s=media.VIDEO_FILE_TTL_S, parent=tmp_path))
    folder = tmp_path / "videos"
    folder.mkdir()
    old = folder / "stepstudio-old.mp4"
    old.write_bytes(b"an hour-old video")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    frames = tuple(Image.new("RGB", (16, 16), (i * 40, 0, 0)) for i in range(5))
    path = media.frames_to_video(frames, fps=4)
    assert not old.exists()
    assert [p.name for p in folder.iterdir()] == [os.path.basename(path)] and os.path.getsize(path) > 0

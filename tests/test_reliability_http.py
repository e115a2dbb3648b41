"""The HTTP API under hostile or broken callers: CSRF-able bodies, unknown routes, half-sent
requests, guessed keys, rotated keys, a caller flooding the image store, a crashed engine."""

from __future__ import annotations

import socket
import threading
import time

import fastapi
import httpx
import pytest

from engine import Engine, Failed, GenerationParams, ServingLimits
from pipelines.toy import ToyPipeline
from studio.api.http_routes import HttpApiConfig, build_router
from tests.engine_helpers import StepGate
from tests.test_http_api import assert_openai_error, raw_post, running_api, wait_until


def read_response(sock: socket.socket) -> str:
    """One whole HTTP response (headers and a Content-Length body) from a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _content_length(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data.decode()


def _content_length(data: bytes) -> int:
    for line in data.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


@pytest.fixture(scope="module")
def open_api():
    with running_api() as api:
        yield api


def test_a_text_plain_post_is_refused_and_never_runs(open_api):
    # A web page can send text/plain (or a form) to any site without a CORS preflight.
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
        headers = {"content-type": content_type} if content_type else {}
        response = open_api.http.post("/v1/images/generations", content=b'{"prompt": "csrf"}', headers=headers)
        assert_openai_error(response, 415, code="unsupported_media_type")
    assert open_api.pipeline.encoded == []
    ok = open_api.http.post("/v1/images/generations", content=b'{"prompt": "fine"}',
                            headers={"content-type": "application/json; charset=utf-8"})
    assert ok.status_code == 200


@pytest.mark.parametrize(("method", "path", "status", "allow"), [
    ("GET", "/v1/images/variations", 404, None),
    ("GET", "/v1/images/edits", 405, "POST"),
    ("POST", "/v1/chat/completions", 404, None),
    ("DELETE", "/v1/nothing/here", 404, None),
    ("GET", "/v1/images/generations", 405, "POST"),
    ("PUT", "/v1/models", 405, "GET"),
    ("DELETE", "/v1/models/toy", 405, "GET"),
])
def test_unknown_v1_paths_and_methods_answer_in_openais_shape(open_api, method, path, status, allow):
    response = open_api.http.request(method, path)
    error = assert_openai_error(response, status, code="unknown_url" if status == 404 else "method_not_allowed")
    assert path in error["message"]
    assert response.headers.get("allow") == allow


def test_a_half_sent_body_is_timed_out_with_408():
    with running_api(config=HttpApiConfig(body_timeout_s=0.3)) as api:
        host, port = api.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n" + b'{"prompt": "a')
            answer = read_response(sock)
        assert answer.startswith("HTTP/1.1 408")
        assert '"code":"request_timeout"' in answer and "did not arrive within 0.3 s" in answer
        assert api.pipeline.encoded == []


def test_wrong_keys_are_slowed_down_then_locked_out():
    config = HttpApiConfig(api_keys={"alice": "sk-alice"}, failed_key_delay_s=0.2, max_failed_keys=3)
    with running_api(config=config) as api:
        for attempt in range(3):
            started = time.monotonic()
            response = api.http.get("/v1/models", headers={"authorization": f"Bearer guess-{attempt}"})
            assert_openai_error(response, 401, code="invalid_api_key")
            assert time.monotonic() - started >= 0.2  # each wrong key costs the delay
        # The third failure locked this host out: even the right key is refused, unchecked.
        locked = api.http.get("/v1/models", headers={"authorization": "Bearer sk-alice"})
        error = assert_openai_error(locked, 429, code="too_many_failed_attempts")
        assert error["type"] == "rate_limit_error" and int(locked.headers["retry-after"]) >= 59


def test_parallel_guesses_from_one_host_wait_their_turn():
    config = HttpApiConfig(api_keys={"alice": "sk-alice"}, failed_key_delay_s=0.2, max_failed_keys=100)
    with running_api(config=config) as api:
        codes = []

        def guess(i: int) -> None:
            with httpx.Client(base_url=api.url, timeout=30) as http:
                codes.append(http.get("/v1/models", headers={"authorization": f"Bearer guess-{i}"}).status_code)

        started = time.monotonic()
        threads = [threading.Thread(target=guess, args=(i,)) for i in range(5)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert codes == [401] * 5
        assert time.monotonic() - started >= 5 * 0.2  # one guess at a time, not five at once


def test_without_keys_a_made_up_bearer_token_does_not_make_a_new_session():
    with running_api(step_delay_s=0.01, limits=ServingLimits(max_per_session=1)) as api:
        busy = raw_post(api.url, {"prompt": "first", "num_inference_steps": 100}, {"authorization": "Bearer a"})
        wait_until(lambda: api.engine.snapshot().running, what="the first call to start")
        assert api.engine.snapshot().running[0].session_id == "http:host:127.0.0.1"
        rotated = api.http.post("/v1/images/generations", json={"prompt": "second"}, headers={"authorization": "Bearer b"})
        assert_openai_error(rotated, 429, code="session_limit")
        busy.close()


def test_one_caller_cannot_push_anothers_images_out_of_the_store():
    config = HttpApiConfig(api_keys={"a": "sk-a", "b": "sk-b"}, image_store_max_files=4, image_store_files_per_caller=2)
    with running_api(config=config) as api:
        def url_image(key: str) -> str:
            response = api.http.post("/v1/images/generations", json={"prompt": "x", "response_format": "url",
                                                                     "num_inference_steps": 1},
                                     headers={"authorization": f"Bearer {key}"})
            return response.json()["data"][0]["url"]

        mine = url_image("sk-a")
        flood = [url_image("sk-b") for _ in range(6)]
        assert httpx.get(mine).status_code == 200  # still there
        assert [httpx.get(url).status_code for url in flood] == [404] * 4 + [200] * 2  # b keeps its newest two


def test_a_crashed_engine_answers_503_engine_failed():
    gate = StepGate(1)
    with running_api(pipeline=ToyPipeline(on_forward=gate)) as api:
        results = []
        call = threading.Thread(target=lambda: results.append(
            api.http.post("/v1/images/generations", json={"prompt": "running", "num_inference_steps": 20})))
        call.start()
        gate.wait()
        crash = api.engine.submit(GenerationParams(prompt="[crash] it"), session_id="x")  # joins forward 2
        gate.release()
        call.join(30)
        crashed = "the engine stopped after an internal error (EngineCrash: injected crash of the engine thread)"
        assert crash.result(timeout=30) == Failed(message=crashed, stage="engine")
        assert api.engine.failure == crashed
        error = assert_openai_error(results[0], 503, code="engine_failed")
        assert "EngineCrash" in error["message"]
        refused = api.http.post("/v1/images/generations", json={"prompt": "after"})
        assert_openai_error(refused, 503, code="engine_failed")
        health = api.http.get("/healthz")
        assert health.status_code == 503 and "EngineCrash" in health.json()["error"]


def test_the_catch_all_route_stays_out_of_the_openapi_document():
    app = fastapi.FastAPI(openapi_url=None)
    app.include_router(build_router(Engine(ToyPipeline())))
    paths = app.openapi()["paths"]
    assert "/v1/images/generations" in paths and "/v1/{path}" not in paths

"""The OpenAI-compatible HTTP API on a real uvicorn server, driven by the official openai client."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import socket
import threading
import time
from dataclasses import dataclass

import fastapi
import httpx
import numpy as np
import openai
import pytest
import uvicorn
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from engine import Completed, Engine, GenerationParams, ServingLimits
from pipelines.toy import ToyPipeline
from studio.api.http_routes import HttpApiConfig, build_router
from studio.api.image_files import ImageFileStore
from tests.engine_helpers import StepGate


# ---------------------------------------------------------------------- helpers (also used by test_metrics)
@contextlib.contextmanager
def serving(engine: Engine, config: HttpApiConfig | None = None, **router_options):
    """Serve the API of `engine` on 127.0.0.1 (a free port) from a thread; yields the base URL.
    `router_options` go to build_router (e.g. outputs=)."""
    app = fastapi.FastAPI()
    app.include_router(build_router(engine, config, **router_options))
    # Bound before the server starts: no race for the port. An explicit IPPROTO_TCP makes
    # asyncio set TCP_NODELAY on accepted connections (proto 0 costs ~40 ms per response).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@dataclass
class Api:
    engine: Engine
    pipeline: ToyPipeline
    url: str
    http: httpx.Client

    def openai(self, api_key: str = "x") -> openai.OpenAI:
        # No retries: a test must see the first answer, and a retried request would run twice.
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=30)


@contextlib.contextmanager
def running_api(step_delay_s: float = 0.0, config: HttpApiConfig | None = None, pipeline=None, **engine_kwargs):
    pipeline = pipeline or ToyPipeline(step_delay_s=step_delay_s)
    engine = Engine(pipeline, **engine_kwargs).start()
    try:
        with serving(engine, config) as url, httpx.Client(base_url=url, timeout=30) as http:
            yield Api(engine, pipeline, url, http)
    finally:
        engine.close()


def metric(http: httpx.Client, name: str, **labels: str) -> float:
    """One sample of GET /metrics, e.g. metric(http, "stepstudio_requests_finished_total", status="error")."""
    response = http.get("/metrics")
    response.raise_for_status()
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise KeyError(f"{name}{labels} is not in /metrics")


def raw_post(port_url: str, body: dict, headers: dict[str, str] | None = None) -> socket.socket:
    """Send a generation request on a raw socket and leave it open (the caller closes it)."""
    host, port = port_url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    head = [
        "POST /v1/images/generations HTTP/1.1",
        f"Host: {host}",
        "Content-Type: application/json",
        f"Content-Length: {len(payload)}",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    sock = socket.create_connection((host, int(port)))
    sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
    return sock


def wait_until(condition, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def decode_png(data: bytes) -> Image.Image:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def assert_openai_error(response: httpx.Response, status: int, param: str | None = None, code: str | None = None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error


# ---------------------------------------------------------------------- fixtures
@pytest.fixture
def api():
    with running_api(step_delay_s=0.005) as api:
        yield api


@pytest.fixture(scope="module")
def shared_api():
    """One server for the many bad-request cases (none of them may disturb it)."""
    with running_api() as api:
        yield api


# ---------------------------------------------------------------------- the openai client
def test_openai_client_gets_a_png_of_the_requested_size(api):
    result = api.openai().images.generate(
        model="toy", prompt="a red circle", size="48x32", response_format="b64_json", extra_body={"seed": 3}
    )
    assert len(result.data) == 1
    image = decode_png(base64.b64decode(result.data[0].b64_json))
    assert image.size == (48, 32)
    assert result.data[0].model_extra["seed"] == 3
    # The very image the engine makes for these parameters.
    direct = api.engine.submit(GenerationParams(prompt="a red circle", width=48, height=32, seed=3)).result(timeout=30)
    assert isinstance(direct, Completed)
    np.testing.assert_array_equal(np.asarray(image.convert("RGB")), np.asarray(direct.images[0]))


def test_openai_fields_the_server_cannot_honour_are_accepted_and_ignored(api):
    result = api.openai().images.generate(
        model="toy", prompt="a red circle", size="64x64", response_format="b64_json", quality="hd", style="vivid",
        user="someone", background="auto", moderation="low", output_compression=80, extra_body={"seed": 5},
    )
    plain = api.openai().images.generate(model="toy", prompt="a red circle", size="64x64",
                                         response_format="b64_json", extra_body={"seed": 5})
    assert result.data[0].b64_json == plain.data[0].b64_json


def test_n_images_and_concurrent_calls_share_forwards():
    gate = StepGate(0)  # the engine waits in its first forward until the second call has queued
    with running_api(pipeline=ToyPipeline(on_forward=gate)) as api:
        check_n_images_and_concurrent_calls_share_forwards(api, gate)


def check_n_images_and_concurrent_calls_share_forwards(api, gate):
    client = api.openai()
    results: dict[str, object] = {}

    def call(name: str, n: int, seed: int) -> None:
        results[name] = client.images.generate(
            model="toy", prompt=f"shape {name}", n=n, size="64x64",
            extra_body={"seed": seed, "num_inference_steps": 30},
        )

    threads = [threading.Thread(target=call, args=("a", 3, 10)), threading.Thread(target=call, args=("b", 1, 99))]
    threads[0].start()
    gate.wait()
    threads[1].start()
    wait_until(lambda: api.engine.requests_in_flight == 4, what="the second call to queue")
    gate.release()
    for thread in threads:
        thread.join(30)

    three = results["a"].data
    assert [item.model_extra["seed"] for item in three] == [10, 11, 12]
    pixels = [np.asarray(decode_png(base64.b64decode(item.b64_json))) for item in three]
    assert not np.array_equal(pixels[0], pixels[1]), "different seeds must give different images"
    assert results["b"].data[0].model_extra["seed"] == 99
    # The three images of one call, and the other call too, ran in shared forwards: once the
    # gate opens all four requests are queued, so the next forward carries the four of them.
    sizes = [len(rows) for rows in api.pipeline.forward_log]
    assert sizes[1] == 4 and sum(sizes) == 4 * 30
    observations = metric(api.http, "stepstudio_batch_size_count")
    single_row = metric(api.http, "stepstudio_batch_size_bucket", le="1.0")
    assert observations - single_row >= 1, "no forward had 2 or more rows"


def test_url_response_is_a_fetchable_png(api):
    result = api.openai().images.generate(model="toy", prompt="a blue square", size="64x64", response_format="url")
    url = result.data[0].url
    assert url.startswith(f"{api.url}/v1/images/files/")
    response = httpx.get(url)
    assert response.status_code == 200
    assert response.headers["content-type"] == "image/png"
    assert decode_png(response.content).size == (64, 64)

    missing = api.http.get("/v1/images/files/no-such-image.png")
    assert_openai_error(missing, 404, code="image_not_found")


def test_models_and_health(api):
    models = api.openai().models.list()
    assert [model.id for model in models.data] == ["toy"]
    health = api.http.get("/healthz")
    assert health.status_code == 200
    body = health.json()
    assert (body["engine_alive"], body["model"], body["queue_depth"], body["running"]) == (True, "toy", 0, 0)


# ---------------------------------------------------------------------- bad requests
LONG_PROMPT = "x" * 3000  # fits the body limit, not the prompt limit

BAD_REQUESTS = [
    # (raw body, status, param, code)
    (b'{"prompt": "a cat", "n": 2', 400, None, "invalid_json"),
    (b'["a cat"]', 400, None, "invalid_type"),
    (b'{"n": 1}', 400, "prompt", "missing_required_parameter"),
    (b'{"prompt": 42}', 400, "prompt", "invalid_type"),
    (b'{"prompt": "a cat", "n": "2"}', 400, "n", "invalid_type"),
    (b'{"prompt": "a cat", "n": true}', 400, "n", "invalid_type"),
    (b'{"prompt": "a cat", "n": 1000000}', 400, "n", "invalid_value"),
    (b'{"prompt": "a cat", "n": 0}', 400, "n", "invalid_value"),
    (b'{"prompt": "a cat", "guidance_scale": "high"}', 400, "guidance_scale", "invalid_type"),
    (b'{"prompt": "a cat", "guidance_scale": NaN}', 400, "guidance_scale", "invalid_value"),
    (b'{"prompt": "a cat", "seed": -1}', 400, "seed", "invalid_value"),
    (b'{"prompt": "a cat", "response_format": "jpeg"}', 400, "response_format", None),
    (b'{"prompt": "a cat", "colour": "red"}', 400, "colour", "unknown_parameter"),
    (b'{"prompt": "a cat", "quality": 3}', 400, "quality", "invalid_type"),
    (json.dumps({"prompt": LONG_PROMPT}).encode(), 400, "prompt", "invalid_value"),
    (b'{"prompt": "   "}', 400, "prompt", "invalid_value"),
    (b'{"prompt": "a cat", "size": "big"}', 400, "size", "invalid_value"),
    (b'{"prompt": "a cat", "size": "64x"}', 400, "size", "invalid_value"),
    (b'{"prompt": "a cat", "size": "4x4"}', 400, "size", "invalid_value"),  # below the minimum size
    (b'{"prompt": "a cat", "size": "63x64"}', 400, "size", "invalid_value"),  # the model's multiple of 8
    (b'{"prompt": "a cat", "size": "4096x4096"}', 400, "size", "invalid_value"),  # the server's max size
    (b'{"prompt": "a cat", "num_inference_steps": 500}', 400, "num_inference_steps", "invalid_value"),
    (b'{"prompt": "a cat", "model": "dall-e-3"}', 404, "model", "model_not_found"),
]


@pytest.mark.parametrize(("body", "status", "param", "code"), BAD_REQUESTS, ids=lambda v: str(v)[:40])
def test_bad_requests_get_an_openai_error_and_never_run(shared_api, body, status, param, code):
    encoded_before = len(shared_api.pipeline.encoded)
    response = shared_api.http.post(
        "/v1/images/generations", content=body, headers={"content-type": "application/json"}
    )
    assert_openai_error(response, status, param, code)
    assert len(shared_api.pipeline.encoded) == encoded_before


@pytest.mark.parametrize("steps", [0, 500, 5000, 10**30])
def test_every_out_of_range_step_count_names_this_servers_range(shared_api, steps):
    allowed = f"allowed is 1..{shared_api.engine.limits.max_steps}."
    response = shared_api.http.post("/v1/images/generations", json={"prompt": "a cat", "num_inference_steps": steps})
    assert_openai_error(response, 400, "num_inference_steps", "invalid_value")
    assert response.json()["error"]["message"].endswith(allowed), response.json()


def test_a_10_mb_prompt_is_refused_unread_and_the_server_keeps_serving(shared_api):
    huge = json.dumps({"prompt": "x" * 10_000_000}).encode()
    response = shared_api.http.post("/v1/images/generations", content=huge, headers={"content-type": "application/json"})
    assert_openai_error(response, 413, code="request_too_large")

    ok = shared_api.http.post("/v1/images/generations", json={"prompt": "still here", "size": "32x32"})
    assert ok.status_code == 200
    assert decode_png(base64.b64decode(ok.json()["data"][0]["b64_json"])).size == (32, 32)


def test_a_chunked_body_is_cut_off_at_the_limit(shared_api):
    chunks = iter([b'{"prompt": "', b"x" * 100_000, b'"}'])  # no Content-Length: only counting can stop it
    response = shared_api.http.post("/v1/images/generations", content=chunks, headers={"content-type": "application/json"})
    assert_openai_error(response, 413, code="request_too_large")


def test_the_openai_client_sees_typed_errors(shared_api):
    client = shared_api.openai()
    with pytest.raises(openai.BadRequestError) as bad:
        client.images.generate(model="toy", prompt="a cat", size="abc")
    assert bad.value.body["param"] == "size"
    with pytest.raises(openai.NotFoundError):
        client.images.generate(model="dall-e-3", prompt="a cat")


# ---------------------------------------------------------------------- admission, shutdown, failures
def test_a_full_queue_gives_429_and_frees_up_afterwards():
    with running_api(step_delay_s=0.01, limits=ServingLimits(max_queue=1)) as api:
        hog = api.engine.submit(GenerationParams(prompt="hog", num_inference_steps=100), session_id="other")
        response = api.http.post("/v1/images/generations", json={"prompt": "a cat"})
        error = assert_openai_error(response, 429, code="queue_full")
        assert error["type"] == "rate_limit_error"
        assert response.headers["retry-after"] == "1"

        hog.cancel()
        # The slot is free once the engine published it (the Aborted event may come a moment earlier).
        wait_until(lambda: not api.engine.snapshot().requests, what="the slot to be freed")
        assert api.http.post("/v1/images/generations", json={"prompt": "a cat"}).status_code == 200


def test_n_is_capped_by_the_session_limit():
    with running_api(limits=ServingLimits(max_per_session=2)) as api:
        response = api.http.post("/v1/images/generations", json={"prompt": "a cat", "n": 3})
        error = assert_openai_error(response, 400, param="n")
        assert "1..2" in error["message"]


def test_images_beyond_the_callers_in_flight_limit_give_429_and_none_of_them_run():
    keys = HttpApiConfig(api_keys={"k1": "sk-1", "k2": "sk-2"})
    with running_api(step_delay_s=0.01, config=keys, limits=ServingLimits(max_per_session=3)) as api:
        key = {"authorization": "Bearer sk-1"}
        busy = raw_post(api.url, {"prompt": "already running", "num_inference_steps": 100}, key)
        wait_until(lambda: api.engine.snapshot().running, what="the first call to start")

        response = api.http.post("/v1/images/generations", json={"prompt": "a cat", "n": 3}, headers=key)
        assert_openai_error(response, 429, code="session_limit")
        # The two that fitted were withdrawn at once: nothing of this call runs.
        wait_until(lambda: api.engine.snapshot().stats.finished == {"aborted": 2}, what="the two to be withdrawn")
        assert [view.prompt for view in api.engine.snapshot().requests] == ["already running"]

        other = api.http.post("/v1/images/generations", json={"prompt": "a cat", "n": 3}, headers={"authorization": "Bearer sk-2"})
        assert other.status_code == 200 and len(other.json()["data"]) == 3  # another key, its own limit
        busy.close()
        wait_until(lambda: not api.engine.snapshot().requests, what="the engine to be idle")
        assert len(api.pipeline.decoded) == 3  # only the other key's images were ever decoded


def test_a_closed_engine_gives_503():
    with running_api() as api:
        api.engine.close()
        response = api.http.post("/v1/images/generations", json={"prompt": "a cat"})
        error = assert_openai_error(response, 503, code="shutting_down")
        assert error["type"] == "server_error"
        assert api.http.get("/healthz").status_code == 503
        assert api.http.get("/v1/models").status_code == 200  # the server itself still answers


def test_a_shutdown_mid_request_gives_503_shutting_down():
    with running_api(step_delay_s=0.01) as api:
        responses = []
        call = threading.Thread(
            target=lambda: responses.append(
                api.http.post("/v1/images/generations", json={"prompt": "a cat", "num_inference_steps": 100})
            )
        )
        call.start()
        wait_until(lambda: api.engine.snapshot().running, what="the request to start")
        api.engine.close()
        call.join(10)
        error = assert_openai_error(responses[0], 503, code="shutting_down")
        assert error["message"] == "the server is shutting down (the engine was shut down); try again once it is back."


def test_a_failing_request_gives_500_with_the_engine_message(api):
    response = api.http.post("/v1/images/generations", json={"prompt": "boom [fail:denoise_step]"})
    error = assert_openai_error(response, 500, code="generation_failed")
    assert "denoise_step" in error["message"]
    assert api.http.post("/v1/images/generations", json={"prompt": "fine"}).status_code == 200


# ---------------------------------------------------------------------- client disconnects
def test_closing_the_connection_aborts_the_request_before_any_decode():
    config = HttpApiConfig(api_keys={"alice": "sk-secret"})
    with running_api(step_delay_s=0.01, config=config) as api:
        sock = raw_post(api.url, {"prompt": "a slow one", "num_inference_steps": 100}, {"Authorization": "Bearer sk-secret"})
        wait_until(lambda: api.engine.snapshot().running, what="the request to start")
        view = api.engine.snapshot().running[0]
        # The session is the name of the caller's API key: keys never show in the studio's queue view.
        assert view.session_id == "http:key:alice"
        wait_until(lambda: len(api.pipeline.forward_log) >= 3, what="a few steps")

        sock.close()
        wait_until(lambda: not api.engine.snapshot().requests, what="the abort")
        forwards = len(api.pipeline.forward_log)
        assert api.engine.snapshot().stats.finished == {"aborted": 1}
        assert view.request_id not in api.pipeline.decoded
        assert forwards < 100
        assert api.engine.states_in_memory == 0
        # The next request runs alone: the aborted one is in none of the forwards after the abort.
        after = api.http.post("/v1/images/generations", json={"prompt": "next", "num_inference_steps": 2},
                              headers={"Authorization": "Bearer sk-secret"})
        assert after.status_code == 200
        assert all(view.request_id not in rows for rows in api.pipeline.forward_log[forwards:])
        assert len(api.pipeline.forward_log) == forwards + 2


# ---------------------------------------------------------------------- API keys
def test_configured_api_keys_are_required_on_v1_routes_metrics_and_openapi():
    with running_api(config=HttpApiConfig(api_keys=frozenset({"sk-right"}), failed_key_delay_s=0)) as api:
        with pytest.raises(openai.AuthenticationError):
            api.openai(api_key="sk-wrong").images.generate(model="toy", prompt="a cat")
        assert_openai_error(api.http.get("/v1/models"), 401, code="invalid_api_key")
        result = api.openai(api_key="sk-right").images.generate(model="toy", prompt="a cat", response_format="url")
        assert httpx.get(result.data[0].url).status_code == 200  # the unguessable URL is the key
        # Probes need no key, and learn no more than that the engine is alive.
        health = api.http.get("/healthz")
        assert (health.status_code, health.json()) == (200, {"status": "ok", "engine_alive": True})
        key = {"authorization": "Bearer sk-right"}
        assert api.http.get("/healthz", headers=key).json()["model"] == "toy"
        assert_openai_error(api.http.get("/metrics"), 401, code="invalid_api_key")
        assert api.http.get("/metrics", headers=key).status_code == 200
        assert_openai_error(api.http.get("/v1/openapi.json"), 401, code="invalid_api_key")
        wait_until(lambda: api.engine.snapshot().stats.finished == {"completed": 1}, what="one completed request")


def test_the_request_schema_is_in_the_openapi_document():
    app = fastapi.FastAPI()
    app.include_router(build_router(Engine(ToyPipeline())))  # never started: nothing runs
    body = app.openapi()["paths"]["/v1/images/generations"]["post"]["requestBody"]
    schema = body["content"]["application/json"]["schema"]
    assert schema["required"] == ["prompt"] and "seed" in schema["properties"]


# ---------------------------------------------------------------------- served image files
class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_image_files_expire_after_their_ttl():
    clock = FakeClock()
    store = ImageFileStore(ttl_s=10, clock=clock)
    name = store.put(b"png-1")
    clock.now = 9.9
    assert store.get(name) == b"png-1"
    clock.now = 10.0
    assert store.get(name) is None and len(store) == 0 and store.total_bytes == 0


def test_image_files_are_bounded_by_count_and_bytes_oldest_first():
    store = ImageFileStore(max_files=2, max_bytes=10, clock=FakeClock(), max_files_per_owner=2)
    first, second = store.put(b"aaaa"), store.put(b"bbbb")
    third = store.put(b"cccc")  # a third file: the oldest goes
    assert (store.get(first), store.get(second), store.get(third)) == (None, b"bbbb", b"cccc")
    big = store.put(b"dddddddd")  # 8 bytes: both others must go to stay within 10
    assert (store.get(second), store.get(third), store.get(big)) == (None, None, b"dddddddd")
    assert store.total_bytes == 8
    with pytest.raises(ValueError, match="does not fit"):
        store.put(b"x" * 11)


def test_image_file_names_are_unguessable():
    store = ImageFileStore()
    names = {store.put(b"same bytes") for _ in range(50)}
    assert len(names) == 50 and all(len(name) >= 32 + len(".png") for name in names)

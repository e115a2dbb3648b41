"""Gradio's door of the studio under hostile or careless callers: bodies nested too deep, bad
session hashes, a second stream on someone's session, and gradio_client's `job.cancel()`
with two jobs of one endpoint running (studio.server.guards in front of Gradio's routes)."""

from __future__ import annotations

import contextlib
import json

import httpx
import pytest
from gradio_client import Client
from gradio_client.utils import Status
from PIL import Image

from pipelines.loader import load_pipeline
from pipelines.toy import ToyPipeline
from studio.server.guards import MAX_JSON_DEPTH
from tests.engine_helpers import StepGate
from tests.studio_helpers import connect, live_studio, statuses, wait_for
from tests.test_http_api import wait_until
from tests.test_http_videos import WAN_CONFIG, Instrumented
from tests.test_reliability_studio import studio
from tests.test_workflow_client import xy_workflow
from tests.tiny_checkpoints import build_tiny_wan

GENERATE = ["a red circle", "", 64, 64, 2, 1.0, 1, ""]  # the values /generate takes


def nested(depth: int) -> str:
    """JSON text of `depth` lists, one inside the other."""
    return "[" * depth + "]" * depth


def post_json(server, path: str, text: str) -> httpx.Response:
    return httpx.post(server.url + path, content=text, headers={"content-type": "application/json"}, timeout=30)


def fn_index(app, api_name: str) -> int:
    return next(index for index, fn in app.state.demo.fns.items() if fn.api_name == api_name)


def generate_job(client: Client, seed: int):
    return client.submit(prompt="a red circle", negative_prompt="", width=64, height=64, steps=4,
                         guidance_scale=1.0, seed=seed, api_name="/generate")


# ---------------------------------------------------------------------------- finding 2: depth
DEEP_BODIES = {
    "gradio_api/queue/join": '{"data": %s, "fn_index": 0, "session_hash": "abcdefghijk"}',
    "gradio_api/run/generate": '{"data": %s}',
    "gradio_api/api/queue": '{"data": %s}',
    "gradio_api/call/generate": '{"data": %s}',
    "gradio_api/call/v2/run_workflow": '{"data": %s}',
    "gradio_api/cancel": '{"session_hash": "abcdefghijk", "fn_index": 0, "event_id": "e", "x": %s}',
}


def test_json_nested_too_deep_gets_a_gradio_400_naming_the_limit_and_no_traceback(capfd):
    wanted = (f"the request body nests lists and objects more than {MAX_JSON_DEPTH} levels deep; "
              f"at most {MAX_JSON_DEPTH} are accepted.")
    with studio() as (server, engine, _):
        for path, body in DEEP_BODIES.items():
            for depth in (5000, MAX_JSON_DEPTH):  # the body itself is one level more than its data
                refused = post_json(server, path, body % nested(depth))
                assert refused.status_code == 400, (path, depth, refused.text)
                assert (refused.status_code, refused.json()) == (
                    400, {"error": wanted, "duration": 10, "visible": True, "title": "Bad request"}), path
        # Brackets inside strings are text, not nesting; a body at the limit reaches Gradio.
        text = json.dumps({"data": ["[" * 5000, "", 64, 64, 2, 1.0, 1, ""]})
        passed = post_json(server, "gradio_api/run/generate", text)
        assert (passed.status_code, passed.json()["error"]) == (
            400, "prompt is 5000 characters long; at most 2000 are allowed.")
        at_limit = post_json(server, "gradio_api/run/queue", '{"data": [], "x": ' + nested(MAX_JSON_DEPTH - 1) + "}")
        assert at_limit.status_code == 200 and at_limit.json()["data"][0]["requests"] == []
        assert engine.snapshot().stats.finished == {}
    assert "Traceback" not in capfd.readouterr().err


# ---------------------------------------------------------------------------- finding 3: session hashes
BAD_SESSION_HASHES = [
    ("", "''"), (None, "none"), (12345, "int"), (["a"], "list"), ("a" * 129, "129 characters"),
    ("a<gradio-sep>b", "'a<gradio-sep>b'"), ("tab one", "'tab one'"), ("tab\none", "'tab\\none'"),
]


def test_bad_session_hashes_are_a_clear_400(capfd):
    rule = "session_hash must be text of 1 to 128 letters, digits, '-', '_', '.' or ':' (a random id per tab or client)"
    with studio() as (server, engine, app):
        for session_hash, shown in BAD_SESSION_HASHES:
            body = {"data": GENERATE, "fn_index": fn_index(app, "generate")}
            if session_hash is not None:
                body["session_hash"] = session_hash
            joined = httpx.post(server.url + "gradio_api/queue/join", json=body, timeout=30)
            assert joined.status_code == 400, (session_hash, joined.text)
            assert (joined.status_code, joined.json()["error"]) == (400, f"{rule}, got {shown}."), session_hash
            if session_hash is not None:  # optional for a direct call, but valid when sent
                called = httpx.post(server.url + "gradio_api/run/generate", timeout=30,
                                    json={"data": GENERATE, "session_hash": session_hash})
                assert (called.status_code, called.json()["error"]) == (400, f"{rule}, got {shown}."), session_hash
            if isinstance(session_hash, str):
                streamed = httpx.get(server.url + "gradio_api/queue/data", params={"session_hash": session_hash},
                                     timeout=30)
                assert (streamed.status_code, streamed.json()["error"]) == (400, f"{rule}, got {shown}.")
        assert engine.snapshot().stats.finished == {}
    assert "Traceback" not in capfd.readouterr().err


def test_the_session_hashes_real_callers_send_are_accepted():
    with studio() as (server, _, app):
        client = connect(server.url)  # a uuid4
        status, _, image = generate_job(client, seed=1).result(timeout=60)
        assert status["state"] == "completed" and Image.open(image).size == (64, 64)
        # The browser's: Math.random().toString(36).substring(2)
        joined = httpx.post(server.url + "gradio_api/queue/join", timeout=30, json={
            "data": GENERATE, "fn_index": fn_index(app, "generate"), "session_hash": "k3j9x0q2mz1"})
        assert joined.status_code == 200
        with httpx.stream("GET", server.url + "gradio_api/queue/data", params={"session_hash": "k3j9x0q2mz1"},
                          timeout=30) as stream:
            messages = [json.loads(line[5:]) for line in stream.iter_lines() if line.startswith("data:")]
        assert [m["msg"] for m in messages if m["msg"] in ("process_completed", "close_stream")] == [
            "process_completed", "close_stream"]
        assert messages[-2]["success"] is True


# ---------------------------------------------------------------------------- finding 7: one stream a session
STREAM_TAKEN = ("session {!r} is already being streamed to another connection: one stream a session "
                "(the first caller's answers stay with it); open it again once that stream has ended.")


@contextlib.contextmanager
def a_client_streaming_a_held_job():
    """A studio whose engine holds a gradio_client job in its second step, with the client's
    stream open: yields (server, engine, client, job, gate)."""
    gate = StepGate(1)
    with studio(ToyPipeline(on_forward=gate), preview_every=1) as (server, engine, _):
        client = connect(server.url)
        job = generate_job(client, seed=1)
        gate.wait()
        wait_for(lambda: statuses(job), what="the first update on the client's stream")
        yield server, engine, client, job, gate


def open_then_drop(url: str, **params) -> tuple[int, dict | None]:
    """Open an event stream and hang up at once: (status, the JSON body of a refusal)."""
    with httpx.stream("GET", url, params=params, timeout=30) as stream:
        return stream.status_code, json.loads(stream.read()) if stream.status_code != 200 else None


def test_a_second_stream_on_a_session_is_refused_and_the_first_caller_still_gets_its_result():
    with a_client_streaming_a_held_job() as (server, engine, client, job, gate):
        answer = open_then_drop(server.url + "gradio_api/queue/data", session_hash=client.session_hash)
        gate.release()
        status, _, image = job.result(timeout=60)
        assert status["state"] == "completed" and Image.open(image).size == (64, 64)
        assert answer == (409, {"error": STREAM_TAKEN.format(client.session_hash), "duration": 10, "visible": True,
                                "title": "Conflict"})
        # Once the client's stream has ended, its next job opens one again.
        status, _, _ = generate_job(client, seed=2).result(timeout=60)
        assert status["state"] == "completed"
        assert engine.snapshot().stats.finished == {"completed": 2}


def test_a_call_stream_cannot_read_another_callers_session():
    with a_client_streaming_a_held_job() as (server, engine, client, job, gate):
        # The /call door streams the session of the event it is given: a call made with the client's
        # session hash (held, as the engine is) would stream the client's messages.
        posted = httpx.post(server.url + "gradio_api/call/generate", timeout=30,
                            json={"data": GENERATE, "session_hash": client.session_hash})
        answer = open_then_drop(server.url + f"gradio_api/call/generate/{posted.json()['event_id']}")
        gate.release()
        status, _, _ = job.result(timeout=60)
        assert status["state"] == "completed"
        wait_until(lambda: engine.requests_in_flight == 0, timeout=30, what="the call's request to end")
        assert engine.snapshot().stats.finished == {"completed": 2}
        assert answer == (409, {"error": STREAM_TAKEN.format(client.session_hash), "duration": 10, "visible": True,
                                "title": "Conflict"})


# ---------------------------------------------------------------------------- finding 8: job.cancel()
def submit(client: Client, endpoint: str, seed: int):
    if endpoint == "/generate":
        return generate_job(client, seed)
    workflow = xy_workflow(steps="4", guidance="1")
    workflow["nodes"].append({"id": "seed", "type": "seed", "values": {"seed": seed}})
    workflow["links"].append({"from": {"node": "seed", "port": "seed"}, "to": {"node": "s", "port": "seed"}})
    return client.submit(workflow=workflow, api_name="/run_workflow")


@pytest.mark.parametrize("endpoint", ["/generate", "/run_workflow"])
def test_job_cancel_ends_that_job_only(endpoint):
    gate = StepGate(0)
    with studio(ToyPipeline(on_forward=gate), preview_every=1) as (server, engine, _):
        client = connect(server.url)
        first, second = submit(client, endpoint, seed=1), submit(client, endpoint, seed=2)
        gate.wait()  # the engine holds the first job's request in its first step
        # Both handlers are running (each has submitted its request): both are Gradio tasks of this session.
        wait_for(lambda: statuses(first) and statuses(second), what="both jobs' first updates")
        assert first.cancel()
        gate.release()
        if endpoint == "/generate":
            status, _, image = second.result(timeout=60)
            assert Image.open(image).size == (64, 64)
        else:
            status, images, grids = second.result(timeout=60)
            assert (len(images), len(grids)) == (1, 1)
        assert status["state"] == "completed"
        assert first.status().code == Status.CANCELLED
        wait_until(lambda: engine.requests_in_flight == 0, timeout=30, what="both requests to end")
        assert engine.snapshot().stats.finished == {"aborted": 1, "completed": 1}


def test_job_cancel_ends_that_video_job_only(tmp_path):
    gate = StepGate(0)
    wan = Instrumented(load_pipeline(str(build_tiny_wan(tmp_path / "wan", WAN_CONFIG))), on_forward=gate)
    with live_studio({"wan": wan}, preview_every=1) as (server, engine):
        client = connect(server.url)
        first, second = (client.submit(prompt="a red circle moving left", negative_prompt="", width=32, height=32,
                                       steps=3, guidance_scale=1.0, seed=seed, model="wan", num_frames=9,
                                       api_name="/generate_video") for seed in (1, 2))
        gate.wait()
        wait_for(lambda: statuses(first) and statuses(second), what="both jobs' first updates")
        assert first.cancel()
        gate.release()
        status, _, media = second.result(timeout=60)
        assert status["state"] == "completed" and media is not None
        assert first.status().code == Status.CANCELLED
        wait_until(lambda: engine.requests_in_flight == 0, timeout=30, what="both requests to end")
        assert engine.snapshot().stats.finished == {"aborted": 1, "completed": 1}
        assert wan.decoded == [status["request_id"]]  # the cancelled video was never decoded

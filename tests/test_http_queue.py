"""The HTTP API's queue routes on a real server: each caller pauses, reorders and clears its own
queue (httpx and the openai client, as real callers), and the operator pauses the engine."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from engine.queue_control import CLEAR_REASON
from studio.api.http_routes import HttpApiConfig
from tests.test_http_api import assert_openai_error, running_api, wait_until
from tests.test_readme_claims import ToyVideo, api_server, create_video, statuses

KEYS = {"alice": "key-alice", "bob": "key-bob"}


@pytest.fixture
def api():
    config = HttpApiConfig(api_keys=KEYS, admin_key="key-operator", failed_key_delay_s=0)
    with running_api(config=config, max_batch_requests=4) as api:
        yield api


def auth(name: str) -> dict:
    return {"Authorization": f"Bearer {KEYS.get(name, name)}"}


def own_queue(api, name: str) -> dict:
    response = api.http.get("/v1/queue", headers=auth(name))
    assert response.status_code == 200, response.text
    return response.json()


def generate(api, name: str, n: int, seed: int):
    return api.openai(KEYS[name]).images.generate(
        model="toy", prompt=f"{name}'s picture", n=n, size="64x64", response_format="b64_json",
        extra_body={"seed": seed, "num_inference_steps": 3})


def test_a_caller_pauses_reorders_and_resumes_its_own_queue(api):
    paused = api.http.post("/v1/queue/pause", headers=auth("alice"), json={})
    assert paused.status_code == 200 and paused.json()["paused"] is True
    with ThreadPoolExecutor(2) as pool:
        alices = pool.submit(generate, api, "alice", 2, 10)
        wait_until(lambda: own_queue(api, "alice")["waiting"] == 2, what="alice's two requests queued")
        queue = own_queue(api, "alice")
        assert (queue["paused"], queue["engine_paused"], queue["running"]) == (True, False, 0)
        assert [(r["position"], r["paused"]) for r in queue["requests"]] == [(1, "session"), (2, "session")]
        first, second = (r["request_id"] for r in queue["requests"])
        # bob's queue is not paused: his picture is made while alice's wait.
        assert own_queue(api, "bob")["paused"] is False
        assert [item.model_extra["seed"] for item in generate(api, "bob", 1, 20).data] == [20]
        assert first not in api.pipeline.encoded and second not in api.pipeline.encoded
        # bob can't move (or even see) alice's request; alice moves her second one first.
        assert_openai_error(api.http.post(f"/v1/queue/{second}/move", headers=auth("bob"), json={}),
                            404, param="request_id", code="request_not_found")
        moved = api.http.post(f"/v1/queue/{second}/move", headers=auth("alice"), json={"before": None})
        assert moved.status_code == 200 and moved.json()["moved"] is True
        wait_until(lambda: [r["request_id"] for r in own_queue(api, "alice")["requests"]] == [second, first],
                   what="the moved request first")
        assert api.http.post("/v1/queue/resume", headers=auth("alice"), json={}).json()["paused"] is False
        result = alices.result(timeout=60)
    assert sorted(item.model_extra["seed"] for item in result.data) == [10, 11]
    assert api.pipeline.encoded.index(second) < api.pipeline.encoded.index(first)


def test_clearing_a_paused_queue_aborts_its_requests_and_the_call_says_so(api):
    api.http.post("/v1/queue/pause", headers=auth("alice"), json={"abort_running": False}).raise_for_status()
    with ThreadPoolExecutor(1) as pool:
        alices = pool.submit(generate, api, "alice", 2, 1)
        wait_until(lambda: own_queue(api, "alice")["waiting"] == 2, what="alice's two requests queued")
        cleared = api.http.post("/v1/queue/clear", headers=auth("alice"), json={"include_running": True})
        assert cleared.status_code == 200 and cleared.json()["cleared"] == 2
        with pytest.raises(openai.APIStatusError) as caught:
            alices.result(timeout=60)
    assert caught.value.status_code == 503 and CLEAR_REASON in caught.value.message
    assert api.pipeline.forward_log == []
    assert own_queue(api, "alice")["requests"] == []


def test_queue_bodies_must_be_json_and_well_typed(api):
    text = api.http.post("/v1/queue/pause", headers={**auth("alice"), "Content-Type": "text/plain"}, content=b"{}")
    assert_openai_error(text, 415, code="unsupported_media_type")
    assert_openai_error(api.http.post("/v1/queue/pause", headers=auth("alice"), json={"abort_running": "yes"}),
                        400, param="abort_running")
    assert_openai_error(api.http.post("/v1/queue/clear", headers=auth("alice"), json={"everything": True}),
                        400, code="unknown_parameter")
    assert_openai_error(api.http.post("/v1/queue/pause", json={}), 401, code="invalid_api_key")
    assert own_queue(api, "alice")["paused"] is False  # none of those paused anything


def test_the_operator_pauses_and_resumes_the_whole_engine(api):
    assert_openai_error(api.http.post("/v1/admin/pause", headers=auth("key-alice")), 401, code="invalid_admin_key")
    assert_openai_error(api.http.post("/v1/admin/pause"), 401, code="invalid_admin_key")
    operator = auth("key-operator")
    paused = api.http.post("/v1/admin/pause", headers=operator)
    assert paused.status_code == 200 and paused.json()["engine_paused"] is True
    with ThreadPoolExecutor(1) as pool:
        bobs = pool.submit(generate, api, "bob", 1, 5)
        wait_until(lambda: own_queue(api, "bob")["waiting"] == 1, what="bob's request queued")
        queue = own_queue(api, "bob")
        assert (queue["engine_paused"], queue["paused"], queue["requests"][0]["paused"]) == (True, False, "engine")
        assert "paused by its operator" in queue["message"]
        # bob's own resume can't lift the operator's pause.
        api.http.post("/v1/queue/resume", headers=auth("bob"), json={}).raise_for_status()
        assert api.http.get("/v1/admin/queue", headers=operator).json() == {
            "engine_paused": True, "paused_sessions": 0, "waiting": 1, "running": 0,
            "message": "paused: nothing new starts; running requests finish"}
        assert api.pipeline.forward_log == []
        resumed = api.http.post("/v1/admin/resume", headers=operator)
        assert resumed.status_code == 200 and resumed.json()["engine_paused"] is False
        assert [item.model_extra["seed"] for item in bobs.result(timeout=60).data] == [5]


def test_without_an_admin_key_the_admin_routes_say_how_to_turn_them_on():
    with running_api() as api:
        error = assert_openai_error(api.http.post("/v1/admin/pause"), 404, code="admin_disabled")
        assert "--admin-key" in error["message"]
        assert not api.engine.pause_state.engine
        # Without API keys a caller is its host; its own queue routes work as with keys.
        assert api.http.post("/v1/queue/pause", json={}).json()["paused"] is True
        assert api.engine.pause_state.sessions == frozenset({"http:host:127.0.0.1"})


def test_a_video_job_is_named_by_its_video_id_in_the_queue_and_moved_by_it():
    pipeline = ToyVideo()
    with api_server(pipeline) as (_, http):
        assert http.post("/v1/queue/pause", json={}).json()["paused"] is True
        first, second = (create_video(http, seed=seed).json()["id"] for seed in (1, 2))
        wait_until(lambda: http.get("/v1/queue").json()["waiting"] == 2, what="both video jobs queued")
        queued = http.get("/v1/queue").json()["requests"]
        assert [request["video_id"] for request in queued] == [first, second]
        requests = {request["video_id"]: request["request_id"] for request in queued}
        assert_openai_error(http.post("/v1/queue/video_nope/move", json={}), 404, param="request_id",
                            code="request_not_found")
        moved = http.post(f"/v1/queue/{second}/move", json={"before": first})
        assert moved.status_code == 200 and (moved.json()["moved"], moved.json()["request_id"]) == (True, second)
        wait_until(lambda: [r["video_id"] for r in http.get("/v1/queue").json()["requests"]] == [second, first],
                   what="the moved job first")
        http.post("/v1/queue/resume", json={}).raise_for_status()
        wait_until(lambda: set(statuses(http).values()) == {"completed"}, what="both jobs completed")
    assert pipeline.encoded.index(requests[second]) < pipeline.encoded.index(requests[first])

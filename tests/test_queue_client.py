"""Pausing, reordering and clearing one's own queue with gradio_client, against a live studio."""

from __future__ import annotations

import pytest
from gradio_client.exceptions import AppError

from engine.queue_control import CLEAR_REASON, PAUSE_ABORT_REASON
from pipelines.toy import ToyPipeline
from tests.engine_helpers import StepGate
from tests.studio_helpers import connect, live_studio, statuses, wait_for


@pytest.fixture(scope="module")
def studio():
    pipeline = ToyPipeline()
    with live_studio(pipeline, preview_every=0, max_batch=4) as (server, engine):
        yield server, engine, pipeline


def submit(client, prompt: str, steps: int = 3, seed: int = 1):
    return client.submit(prompt=prompt, negative_prompt="", width=64, height=64, steps=steps,
                         guidance_scale=1.0, seed=seed, api_name="/generate")


def request_id_of(job) -> str:
    return wait_for(lambda: next((s["request_id"] for s in statuses(job)), None), what="a request id")


def mine_in_queue(client) -> list[tuple[str, int, str]]:
    return [(r["request_id"], r["position"], r["paused"]) for r in client.predict(api_name="/queue")["requests"]
            if r["mine"]]


def test_a_paused_queue_holds_its_requests_reorders_them_and_runs_them_on_resume(studio):
    _, engine, pipeline = studio
    owner, other = connect(studio[0].url), connect(studio[0].url)
    paused = owner.predict(False, api_name="/pause_queue")
    assert (paused["paused"], paused["engine_paused"], paused["abort_running"]) == (True, False, False)
    first, second = submit(owner, "first", seed=1), submit(owner, "second", seed=2)
    first_id, second_id = request_id_of(first), request_id_of(second)
    for job in (first, second):
        wait_for(lambda: any(s["paused"] == "session" for s in statuses(job)), what="a paused status")
    # Another session's request runs past them; theirs never start.
    assert other.predict(api_name="/queue_state")["paused"] is False
    passer = submit(other, "passer", seed=3).result(timeout=60)[0]
    assert passer["state"] == "completed"
    assert first_id not in pipeline.encoded and second_id not in pipeline.encoded
    state = owner.predict(api_name="/queue_state")
    assert (state["paused"], state["waiting"], state["running"]) == (True, 2, 0)
    assert "your queue is paused" in state["message"]
    # Only the owner may move its request; then it is first of its queue.
    with pytest.raises(AppError, match="another session"):
        other.predict(second_id, "", api_name="/move_request")
    moved = owner.predict(second_id[:8], "", api_name="/move_request")  # a short id, as the page shows
    assert (moved["request_id"], moved["moved"], moved["before"]) == (second_id, True, None)
    wait_for(lambda: mine_in_queue(owner) == [(second_id, 1, "session"), (first_id, 2, "session")],
             what="the moved request first")
    resumed = owner.predict(api_name="/resume_queue")
    assert resumed["paused"] is False
    assert [job.result(timeout=60)[0]["state"] for job in (first, second)] == ["completed", "completed"]
    assert pipeline.encoded.index(second_id) < pipeline.encoded.index(first_id)
    assert owner.predict(api_name="/queue_state")["waiting"] == 0


def test_clearing_aborts_the_queued_requests_and_pausing_can_abort_the_running_one(studio):
    _, engine, pipeline = studio
    owner = connect(studio[0].url)
    # Everything is asked while the engine is held inside the running request's first forward; the
    # engine applies it all at the boundary after that forward.
    gate = StepGate(min_requests=1)
    pipeline.on_forward = gate
    try:
        running = submit(owner, "running", steps=30)
        gate.wait()
        running_id = request_id_of(running)
        owner.predict(False, api_name="/pause_queue")
        queued = [submit(owner, f"queued {i}", seed=i) for i in range(2)]
        wait_for(lambda: engine.requests_in_flight == 3, what="both queued requests at the engine")
        cleared = owner.predict(False, api_name="/clear_queue")
        assert (cleared["cleared"], cleared["include_running"]) == (2, False)
        aborted = owner.predict(True, api_name="/pause_queue")  # abort_running: the running one goes too
        assert aborted["abort_running"] is True
    finally:
        pipeline.on_forward = None
        gate.release()
    for job in queued:
        final = job.result(timeout=60)[0]
        assert (final["state"], final["step"], final["message"]) == ("aborted", 0, CLEAR_REASON)
        assert [s["paused"] for s in statuses(job) if s["state"] == "queued"][-1] == "session"
    final = running.result(timeout=60)[0]
    assert (final["state"], final["message"]) == ("aborted", PAUSE_ABORT_REASON)
    # Asked while its first forward ran: that forward was its last.
    assert final["step"] == 1 and len([ids for ids in pipeline.forward_log if running_id in ids]) == 1
    owner.predict(api_name="/resume_queue")
    assert owner.predict(api_name="/queue_state")["waiting"] == 0


def test_the_endpoints_are_listed_and_an_operator_pause_shows_in_the_callers_status(studio):
    _, engine, _ = studio
    client = connect(studio[0].url)
    endpoints = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert {"/pause_queue", "/resume_queue", "/clear_queue", "/move_request", "/queue_state"} <= set(endpoints)
    engine.pause_engine()
    try:
        job = submit(client, "waits for the operator")
        wait_for(lambda: any(s["paused"] == "engine" for s in statuses(job)), what="an engine-paused status")
        state = client.predict(api_name="/queue_state")
        assert (state["engine_paused"], state["paused"]) == (True, False)
        assert client.predict(api_name="/queue")["paused"] == {"mine": False, "engine": True, "mine_until": None}
    finally:
        engine.resume_engine()
    assert job.result(timeout=60)[0]["state"] == "completed"

"""The studio's named Gradio API, driven by real gradio_client clients against a live server.

One server per module: the toy pipeline (with a small per-forward delay so requests overlap)
behind one shared engine, exactly as `python app.py --model toy` wires it.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError
from PIL import Image

from engine import Engine
from pipelines.toy import ToyPipeline
from studio.config import StudioOptions
from studio.app import build_app
from studio.server.serving import StudioServer
from tests.engine_helpers import StepGate, spy_on_submits
from tests.studio_helpers import connect, live_studio, statuses, streamed, wait_for

STEP_DELAY_S = 0.03


@pytest.fixture(scope="module")
def studio():
    pipeline = ToyPipeline(step_delay_s=STEP_DELAY_S)
    with live_studio(pipeline, preview_every=2, max_size=256, max_steps=60, max_per_session=4) as (server, engine):
        yield server, engine, pipeline


@pytest.fixture
def clients(studio):
    server = studio[0]

    def make() -> Client:
        return connect(server.url)

    yield make
    # Client.close() waits ~1 s per client for its heartbeat stream; the server's shutdown ends them.


def submit(client: Client, prompt: str, steps: int, seed: int = -1):
    return client.submit(prompt=prompt, negative_prompt="", width=64, height=64, steps=steps,
                         guidance_scale=1.0, seed=seed, api_name="/generate")




def running_status(job, min_step: int = 1) -> dict | None:
    seen = [s for s in statuses(job) if s["state"] == "running" and s["step"] >= min_step]
    return seen[-1] if seen else None


def test_api_page_lists_the_named_endpoints(studio, clients):
    endpoints = clients().view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert {"/generate", "/cancel", "/queue"} <= set(endpoints)
    names = [p["parameter_name"] for p in endpoints["/generate"]["parameters"]]
    assert names == ["prompt", "negative_prompt", "width", "height", "steps", "guidance_scale", "seed", "model", "loras",
                     "step_cache"]
    assert not {name for name in endpoints if name.startswith("/ui_")}  # the page's own events stay private


def test_gradio_queue_does_not_cap_concurrent_sessions():
    engine = Engine(ToyPipeline())
    demo = build_app(engine, StudioOptions(model="toy", outputs=None)).state.demo
    assert demo._queue.max_thread_count == 256  # Gradio's default (40) would cap concurrent sessions
    generate = next(fn for fn in demo.fns.values() if fn.api_name == "generate")
    assert generate.concurrency_limit is None


def test_three_clients_share_forwards_and_stream_every_step(studio, clients):
    _, engine, _ = studio
    steps = 10
    pipeline = studio[2]
    group = [clients() for _ in range(3)]  # connect first, then submit together
    before = dict(engine.snapshot().stats.forwards_by_batch_size)
    # Hold the engine in the first job's first forward until all three are in: on a loaded machine
    # one job could otherwise finish its ten steps before the next one arrives.
    gate = StepGate(len(pipeline.forward_log))
    pipeline.on_forward = gate
    try:
        jobs = [submit(client, f"a red circle number {i}", steps, seed=100 + i) for i, client in enumerate(group)]
        gate.wait()
        wait_for(lambda: engine.requests_in_flight >= 3, what="three requests in flight")
    finally:
        pipeline.on_forward = None
        gate.release()
    results = [job.result(timeout=30) for job in jobs]

    after = engine.snapshot().stats.forwards_by_batch_size
    shared = sum(count - before.get(size, 0) for size, count in after.items() if size >= 2)
    assert shared >= 1, f"no co-batched forward: {after}"
    for index, (job, (final, _, image_path)) in enumerate(zip(jobs, results)):
        assert final["state"] == "completed" and final["seed"] == 100 + index
        running_steps = [s["step"] for s in statuses(job) if s["state"] == "running" and s["step"] > 0]
        assert running_steps == list(range(1, steps + 1))
        assert len({s["request_id"] for s in statuses(job)}) == 1
        with Image.open(image_path) as image:
            assert image.size == (64, 64)
    batch_sizes = {s["batch_size"] for job in jobs for s in statuses(job) if s["state"] == "running"}
    assert max(batch_sizes) >= 2


def test_previews_stream_every_few_steps(studio, clients):
    job = submit(clients(), "a blue square", 6)
    job.result(timeout=30)
    previews = [output[1] for output in streamed(job) if isinstance(output[1], str)]
    assert len(previews) == 2  # steps 2 and 4 (step 6 is the final image, no preview)
    with Image.open(previews[0]) as preview:
        assert preview.format == "JPEG" and max(preview.size) <= 256


def test_cancel_one_of_several_jobs_of_one_client(studio, clients):
    _, engine, pipeline = studio
    owner, other = clients(), clients()
    steps = 40
    # Hold the engine inside the first forward of all three while the cancels arrive: no race with
    # the run, however late the streamed statuses come on a loaded machine.
    gate = StepGate(min_requests=3)
    pipeline.on_forward = gate
    victim = submit(owner, "victim", steps)
    sibling = submit(owner, "sibling", steps)
    neighbour = submit(other, "neighbour", steps)
    gate.wait()
    try:
        victim_id = wait_for(lambda: next((s["request_id"] for s in statuses(victim)), None), what="the victim's id")
        with pytest.raises(AppError, match="another session"):
            other.predict(victim_id, api_name="/cancel")
        answer = owner.predict(victim_id, api_name="/cancel")
        forwards_at_cancel = len(pipeline.forward_log)  # the engine has the cancel by now
    finally:
        pipeline.on_forward = None
        gate.release()
    assert answer == {"request_id": victim_id, "cancelled": True,
                      "message": "cancelling at the next step boundary"}

    final_victim = victim.result(timeout=30)[0]
    assert final_victim["state"] == "aborted"
    later = [ids for ids in pipeline.forward_log[forwards_at_cancel:] if victim_id in ids]
    assert len(later) <= 1, "the cancelled request ran more than the one step already under way"
    for job in (sibling, neighbour):
        final = job.result(timeout=30)[0]
        assert final["state"] == "completed" and final["step"] == steps
    assert victim_id not in {v.request_id for v in engine.snapshot().requests}
    assert engine.states_in_memory == 0


def test_queue_endpoint_marks_own_requests_and_hides_other_prompts(studio, clients):
    pipeline = studio[2]
    mine, theirs = clients(), clients()
    # Hold the engine inside the request's second forward while both clients look at the queue.
    gate = StepGate(len(pipeline.forward_log) + 1)
    pipeline.on_forward = gate
    job = submit(theirs, "their secret prompt", 30)
    gate.wait()
    try:
        snapshot = mine.predict(api_name="/queue")
        own_view = theirs.predict(api_name="/queue")["requests"]
        request_id = wait_for(lambda: next((s["request_id"] for s in statuses(job)), None), what="a status")
        theirs.predict(request_id, api_name="/cancel")  # still held: the request cannot finish first
    finally:
        pipeline.on_forward = None
        gate.release()
    assert snapshot["engine"]["mode"] == "step"
    views = snapshot["requests"]
    assert views and all(not v["mine"] and v["prompt"] == "(hidden)" for v in views)
    assert any(v["mine"] and v["prompt"] == "their secret prompt" for v in own_view)
    assert job.result(timeout=30)[0]["state"] == "aborted"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("prompt", "   ", "prompt is empty"),
        ("steps", 0, "num_inference_steps=0 is out of range"),
        ("width", 4096, "above this server's limit of 256 pixels"),
        ("guidance_scale", "NaN", "guidance_scale=nan is not allowed"),  # JSON has no NaN literal
        ("width", 60, "must be a multiple of 8"),
        ("steps", 2.5, "steps must be a whole number"),
    ],
)
def test_bad_inputs_come_back_as_clear_errors(studio, clients, field, value, message):
    client = clients()
    arguments = dict(prompt="a red circle", negative_prompt="", width=64, height=64, steps=4,
                     guidance_scale=1.0, seed=-1)
    arguments[field] = value
    with pytest.raises(AppError, match=message):
        client.predict(**arguments, api_name="/generate")
    final = client.predict(**dict(arguments, **{field: {"prompt": "ok", "width": 64, "steps": 4,
                                                        "guidance_scale": 1.0}[field]}), api_name="/generate")
    assert final[0]["state"] == "completed"


def test_many_sessions_at_once_are_not_serialised(studio, clients):
    _, engine, pipeline = studio
    sessions = 6
    group = [clients() for _ in range(sessions)]
    everyone_in = threading.Event()

    def hold_until_all_submitted(index, batch) -> None:
        # The engine waits in its first forward until every session's request has reached it,
        # so a forward of all of them follows (unless Gradio held some back: then it never comes).
        if not everyone_in.is_set():
            deadline = time.monotonic() + 60
            while engine.requests_in_flight < sessions and time.monotonic() < deadline:
                time.sleep(0.01)
            everyone_in.set()

    first_forward = len(pipeline.forward_log)
    pipeline.on_forward = hold_until_all_submitted
    try:
        with ThreadPoolExecutor(len(group)) as pool:
            results = list(pool.map(lambda c: c.predict(prompt="parallel", negative_prompt="", width=64, height=64,
                                                        steps=10, guidance_scale=1.0, seed=1, api_name="/generate"),
                                    group))
    finally:
        pipeline.on_forward = None
    assert all(final[0]["state"] == "completed" for final in results)
    ours = {final[0]["request_id"] for final in results}
    assert len(ours) == sessions
    # All six ran side by side in one forward: this test's forwards only, not the module's.
    assert any(set(ids) == ours for ids in pipeline.forward_log[first_forward:]), pipeline.forward_log[first_forward:]


def test_nan_in_a_raw_json_body_is_refused_with_the_engine_message(studio):
    server = studio[0]
    body = '{"data": ["a red circle", "", 64, 64, 4, NaN, -1, ""]}'  # Python's json accepts NaN
    posted = httpx.post(server.url + "gradio_api/call/generate", content=body,
                        headers={"content-type": "application/json"}, timeout=10)
    assert posted.status_code == 200, posted.text
    events = httpx.get(server.url + f"gradio_api/call/generate/{posted.json()['event_id']}", timeout=10).text
    assert "event: error" in events and "guidance_scale=nan is not allowed" in events


def test_a_failing_request_and_a_full_session_are_reported_and_the_app_keeps_serving(studio, clients):
    client = clients()
    with pytest.raises(AppError, match="denoise_step failed"):
        client.predict(prompt="boom [fail:denoise_step]", negative_prompt="", width=64, height=64, steps=4,
                       guidance_scale=1.0, seed=1, api_name="/generate")
    pipeline = studio[2]
    gate = StepGate(min_requests=4)  # hold the engine while all four long jobs are in flight
    pipeline.on_forward = gate
    try:
        long_jobs = [submit(client, f"long {i}", 60) for i in range(4)]  # max_per_session=4
        gate.wait()
        ids = [wait_for(lambda job=job: next((s["request_id"] for s in statuses(job)), None), what="a status")
               for job in long_jobs]
        with pytest.raises(AppError, match="already has 4 requests in flight"):
            client.predict(prompt="one too many", negative_prompt="", width=64, height=64, steps=4,
                           guidance_scale=1.0, seed=1, api_name="/generate")
        for request_id in ids:
            client.predict(request_id, api_name="/cancel")
    finally:
        pipeline.on_forward = None
        gate.release()
    assert [job.result(timeout=30)[0]["state"] for job in long_jobs] == ["aborted"] * 4
    final = client.predict(prompt="still serving", negative_prompt="", width=64, height=64, steps=4,
                           guidance_scale=1.0, seed=1, api_name="/generate")
    assert final[0]["state"] == "completed"


def test_cancel_while_waiting_in_the_queue():
    pipeline = ToyPipeline(step_delay_s=STEP_DELAY_S)
    config = StudioOptions(model="toy", port=0, max_batch=1, preview_every=0, outputs=None)
    engine = Engine(pipeline, mode=config.mode, max_batch_requests=config.max_batch, limits=config.limits).start()
    # The first request may not finish (and the second start) before the cancel arrives: the
    # engine waits in the first request's second forward until the second one is submitted, and
    # then in the first forward after it was queued behind the first, until the cancel is in.
    running_gate = StepGate(1)
    queued_gate = StepGate(when=lambda: len(engine.snapshot().requests) == 2)
    pipeline.on_forward = lambda index, batch: (running_gate(index, batch), queued_gate(index, batch))
    submitted = spy_on_submits(engine)
    server = StudioServer(build_app(engine, config), "127.0.0.1", 0).start()
    try:
        first, second = connect(server.url), connect(server.url)
        running = submit(first, "runs first", 40)
        running_gate.wait()
        waiting = submit(second, "waits", 5)
        wait_for(lambda: len(submitted) == 2, what="the second request to reach the engine")
        running_gate.release()
        queued_gate.wait()
        queued = wait_for(lambda: [s for s in statuses(waiting) if s["position"] == 1], what="a queue position")
        second.predict(queued[-1]["request_id"], api_name="/cancel")
        queued_gate.release()
        final = waiting.result(timeout=30)[0]
        assert final["state"] == "aborted" and final["step"] == 0
        assert not [ids for ids in pipeline.forward_log if queued[-1]["request_id"] in ids]
        assert running.result(timeout=30)[0]["state"] == "completed"
    finally:
        running_gate.release()
        queued_gate.release()
        server.stop()
        engine.close()


def test_auth_guards_the_page_and_the_http_api():
    engine = Engine(ToyPipeline(), limits=StudioOptions().limits).start()
    config = StudioOptions(model="toy", port=0, auth=("me", "secret"), outputs=None)
    server = StudioServer(build_app(engine, config), "127.0.0.1", 0).start()
    try:
        base = server.url.rstrip("/")
        body = {"prompt": "a red circle", "num_inference_steps": 2}
        assert httpx.post(f"{base}/v1/images/generations", json=body, timeout=30).status_code == 401
        ok = httpx.post(f"{base}/v1/images/generations", json=body, timeout=30,
                        headers={"Authorization": "Bearer secret"})
        assert ok.status_code == 200 and ok.json()["data"][0]["b64_json"]
        # The Gradio page and its API want the login too.
        assert httpx.get(f"{base}/config", timeout=30).status_code == 401
    finally:
        server.stop()
        engine.close()


@pytest.mark.parametrize(("steps", "width"), [(500, 64), (5000, 64), (0, 64)])
def test_out_of_range_values_name_this_servers_range_however_far_out(studio, clients, steps, width):
    with pytest.raises(AppError, match=r"allowed is 1\.\.60\."):
        clients().predict(prompt="a red circle", negative_prompt="", width=width, height=64, steps=steps,
                          guidance_scale=1.0, seed=-1, api_name="/generate")


def test_a_size_far_above_the_limit_names_this_servers_limit(studio, clients):
    for width in (512, 100_000):
        with pytest.raises(AppError, match="width=.* is above this server's limit of 256 pixels"):
            clients().predict(prompt="a red circle", negative_prompt="", width=width, height=64, steps=4,
                              guidance_scale=1.0, seed=-1, api_name="/generate")


def test_integer_parameters_are_typed_as_integers_on_the_api_page(clients):
    parameters = clients().view_api(print_info=False, return_format="dict")["named_endpoints"]["/generate"]["parameters"]
    types = {p["parameter_name"]: p["type"]["type"] for p in parameters}
    assert (types["width"], types["height"], types["steps"], types["seed"]) == ("integer",) * 4
    assert types["guidance_scale"] == "number"

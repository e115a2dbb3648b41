"""The documented Serve config (serve/stepstudio.yaml) run as a user would: `serve run`, two CPU
replicas of the built-in image and video models behind the studio ingress, driven from outside through
gradio_client and the HTTP API. Checked: a request streams every step; /metrics labels both
replicas; a Cancel, a client's job.cancel() (what a closed tab does) and a dropped HTTP
connection abort on the replica; killing one replica
runs the request waiting on it again on the other and both finish, new requests succeed and Serve
replaces the replica; stopping leaves no Ray process behind.
Slow (a Ray cluster, the model loaded twice); needs the `serve` extra."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install -e '.[serve]')")
yaml = pytest.importorskip("yaml")

from gradio_client import Client  # noqa: E402

from studio.server.sockets import free_port  # noqa: E402
from tests.studio_helpers import connect, statuses, wait_for, wait_until_serving  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
# Steps of a request still running when the test acts on it: the built-in image model makes a
# 64x64 step in a few milliseconds, and gradio_client's view of a stream runs seconds behind.
LONG = 1000  # the most steps a request may ask for
LONG_VIDEO = 300  # a video step takes several image steps' time


def _ray_processes() -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if re.search(r"raylet|gcs_server|ray::", line)]


def _replica_pids() -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines() if "ServeReplica:stepstudio:EngineReplica" in line]


def _metric(base: str, name: str, labels: str) -> float:
    text = httpx.get(base + "metrics", timeout=10).text
    start = f"{name}{{{labels}" if labels else f"{name} "  # an unlabelled sample has no braces
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(start)]
    assert len(values) == 1, (name, labels, values)
    return values[0]


def _aborted_total(base: str) -> float:
    return sum(_metric(base, "stepstudio_requests_finished_total", f'replica="replica {i}",status="aborted"')
               for i in (0, 1))


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    assert _ray_processes() == [], "a Ray cluster is already running here"
    folder = tmp_path_factory.mktemp("serve-config")
    config = yaml.safe_load((ROOT / "serve" / "stepstudio.yaml").read_text())
    port = free_port()
    config["http_options"] = {"host": "127.0.0.1", "port": port}
    args = config["applications"][0]["args"]
    # Long requests (seconds, not a blink), which one session's cost budget would refuse.
    args.update(outputs=str(folder / "outputs"), max_steps=LONG, max_session_cost=None)
    path = folder / "stepstudio.yaml"
    path.write_text(yaml.safe_dump(config))
    log = open(folder / "serve.log", "w")
    process = subprocess.Popen([sys.executable, "-m", "ray.serve.scripts", "run", str(path)], cwd=ROOT,
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}/"

    try:
        wait_until_serving(process, base, (folder / "serve.log").read_text)
        yield base
    finally:
        process.send_signal(signal.SIGINT)  # `serve run` then shuts the application, Serve and Ray down
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()
    deadline = time.monotonic() + 60
    while _ray_processes() and time.monotonic() < deadline:
        time.sleep(0.5)  # pacing only: Ray's workers exit on their own once the raylet is gone
    assert _ray_processes() == []


def _generate(client: Client, size: int, steps: int, seed: int = 1):
    return client.submit(prompt="a large red circle on a blue background, left", negative_prompt="", width=size,
                         height=size, steps=steps, guidance_scale=3.0, seed=seed, api_name="/generate")


def _generate_video(client: Client, steps: int, seed: int = 1):
    return client.submit(prompt="a red circle moving left on a blue background", negative_prompt="", width=64,
                         height=64, steps=steps, guidance_scale=4.0, seed=seed, model="shapes-wan", num_frames=9,
                         api_name="/generate_video")


def _running(job, min_step: int = 1):
    seen = [s for s in statuses(job) if s["state"] == "running" and s["step"] >= min_step]
    return seen[-1] if seen else None


def test_a_request_streams_every_step_through_the_studio(studio):
    client = connect(studio)
    job = _generate(client, 64, steps=12)
    status, _, image_path = job.result(timeout=120)
    assert status["state"] == "completed" and status["step"] == 12 and status["seed"] == 1
    steps = [s["step"] for s in statuses(job) if s["state"] == "running" and s["step"] > 0]
    assert steps == list(range(1, 13))
    assert Path(image_path).is_file()


def test_the_http_api_and_metrics_cover_both_replicas(studio):
    body = {"prompt": "a small blue square on a black background, top", "n": 2, "seed": 3, "size": "64x64"}
    response = httpx.post(studio + "v1/images/generations", json=body, timeout=120)
    assert response.status_code == 200, response.text
    assert [item["seed"] for item in response.json()["data"]] == [3, 4]
    health = httpx.get(studio + "healthz", timeout=10).json()
    assert (health["status"], health["model"], health["engine_alive"]) == ("ok", "shapes-flux", True)
    text = httpx.get(studio + "metrics", timeout=10).text
    assert set(re.findall(r'stepstudio_running_requests\{replica="([^"]+)"\}', text)) == {"replica 0", "replica 1"}
    assert "stepstudio_replicas_live 2.0" in text.splitlines()


def test_a_cancel_through_the_studio_aborts_on_the_replica(studio):
    client = connect(studio)
    before = _aborted_total(studio)
    job = _generate(client, 64, steps=LONG)
    status = wait_for(lambda: _running(job, min_step=2), timeout_s=120, what="a running request")
    answer = client.predict(status["request_id"], api_name="/cancel")
    assert answer["cancelled"] is True
    final, _, _ = job.result(timeout=60)
    assert (final["state"], final["message"]) == ("aborted", "cancelled by the user")
    wait_for(lambda: _aborted_total(studio) == before + 1, timeout_s=30, what="the replica's abort")


def test_a_job_cancelled_by_its_client_aborts_on_the_replica(studio):
    """gradio_client's job.cancel() stops the handler as a closed tab does: its `finally` cancels."""
    client = connect(studio)
    before = _aborted_total(studio)
    job = _generate(client, 64, steps=LONG)
    wait_for(lambda: _running(job, min_step=2), timeout_s=120, what="a running request")
    job.cancel()
    wait_for(lambda: _aborted_total(studio) == before + 1, timeout_s=30, what="the replica's abort")


def test_a_dropped_http_connection_aborts_on_the_replica(studio):
    before = _aborted_total(studio)
    body = {"prompt": "a small green square on a black background, right", "num_inference_steps": LONG}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(studio + "v1/images/generations", json=body, timeout=httpx.Timeout(10, read=1.0))
    wait_for(lambda: _aborted_total(studio) == before + 1, timeout_s=30, what="the replica's abort")


def test_killing_a_replica_its_waiting_request_runs_on_the_other_and_the_studio_keeps_serving(studio):
    """The requests a killed replica held run again on a live one. A built-in request takes a
    second or two on the engine (and its client's stream runs seconds behind), too short to kill
    a replica at a known moment mid-run, so each caller pauses its own queue first: the requests
    wait on the replicas, one on each, when one is killed (mid-run kills: test_serve_replicas.py
    and test_serve_faults.py, on a slow stand-in model)."""
    pids = _replica_pids()
    assert len(pids) == 2
    clients = [connect(studio), connect(studio)]  # two sessions: each pauses and resumes its own queue
    for client in clients:
        assert client.predict(False, api_name="/pause_queue")["paused"] is True
    reruns = _metric(studio, "stepstudio_replica_rerun_requests_total", "")
    # An image and a video: two batch keys, so the router places them on the two replicas.
    jobs = [_generate(clients[0], 64, steps=LONG), _generate_video(clients[1], steps=LONG_VIDEO)]
    wait_for(lambda: [_metric(studio, "stepstudio_queue_depth", f'replica="replica {i}"') for i in (0, 1)]
             == [1.0, 1.0], timeout_s=120, what="one request waiting on each replica")
    os.kill(pids[0], signal.SIGKILL)
    wait_for(lambda: _metric(studio, "stepstudio_replica_rerun_requests_total", "") == reruns + 1, timeout_s=120,
             what="the killed replica's request sent again")
    for client in clients:
        client.predict(api_name="/resume_queue")
    # Both callers get exactly their one result.
    finals = [job.result(timeout=240)[0] for job in jobs]
    assert [(f["state"], f["step"]) for f in finals] == [("completed", LONG), ("completed", LONG_VIDEO)]
    assert _metric(studio, "stepstudio_replica_rerun_requests_total", "") == reruns + 1
    after = _generate(connect(studio), 64, steps=8)
    assert after.result(timeout=120)[0]["state"] == "completed"
    # Serve replaces the dead replica; /metrics shows two replicas again.
    wait_for(lambda: len(_replica_pids()) == 2 and "stepstudio_replicas_live 2.0"
             in httpx.get(studio + "metrics", timeout=10).text.splitlines(), timeout_s=300, what="a replacement")
    assert pids[0] not in _replica_pids()

"""`python app.py --replicas 2`: a local Ray cluster behind the same studio, started and stopped
as a user would (SIGTERM), leaving no Ray process behind. Slow; needs the `serve` extra."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install -e '.[serve]')")

from studio.server.sockets import free_port  # noqa: E402
from tests.studio_helpers import wait_for, wait_until_serving  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def _ray_processes() -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if re.search(r"raylet|gcs_server|ray::", line)]


def test_app_replicas_serves_the_studio_and_stops_cleanly_on_sigterm(tmp_path):
    assert _ray_processes() == [], "a Ray cluster is already running here"
    port = free_port()
    log = open(tmp_path / "app.log", "w")
    process = subprocess.Popen(
        [sys.executable, "app.py", "--replicas", "2", "--model", "toy", "--port", str(port), "--no-save"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/"

    try:
        wait_until_serving(process, base, (tmp_path / "app.log").read_text,
                           healthy=lambda response: response.json().get("status") == "ok")
        response = httpx.post(base + "v1/images/generations", json={"prompt": "a red circle", "n": 2, "seed": 9},
                              timeout=120)
        assert response.status_code == 200, response.text
        assert [item["seed"] for item in response.json()["data"]] == [9, 10]
        metrics = httpx.get(base + "metrics", timeout=10).text
        assert "stepstudio_replicas_live 2.0" in metrics.splitlines()
        assert httpx.get(base, timeout=30).status_code == 200  # the page
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0  # the cap only stops a hung stop
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
    wait_for(lambda: _ray_processes() == [], timeout_s=60, what="every Ray process gone")

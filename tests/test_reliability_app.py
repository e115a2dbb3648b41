"""`python app.py` as a process: SIGTERM answers everyone and exits 0, an engine crash exits 1,
a busy port is refused before the model loads, a share link that can't be made is only a
warning, and each studio keeps Gradio's temp files in a folder of its own. The model is the toy
one, slowed down so requests are in flight when it matters."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from gradio_client.exceptions import AppError

from tests.studio_helpers import START_TIMEOUT_S, connect, wait_until_serving
from tests.test_http_api import assert_openai_error, wait_until

ROOT = Path(__file__).resolve().parent.parent

TEARDOWN_RAN = "PYTHON'S FINAL TEARDOWN RAN\n"
GRADIO_IMPORTED = "GRADIO IS BEING IMPORTED\n"
# `python app.py` (app.main_then_exit) with the toy model (slowed down), "toy-video" (the toy
# model as a video model: every frame is its image) and, on request, a tunnel that can't be opened.
_LAUNCH = """
import os
import sys
from dataclasses import replace

class TeardownWitness:  # speaks if Python's final teardown frees it: app.main_then_exit skips that teardown
    def __del__(self, write=os.write):
        write(1, TEARDOWN_RAN.encode())

teardown_witness = TeardownWitness()

class GradioImportWitness:  # speaks when Gradio is first imported (a busy port is refused before that)
    def find_spec(self, name, path=None, target=None):
        if name == "gradio":
            sys.meta_path.remove(self)
            print(GRADIO_IMPORTED, end="", flush=True)

sys.meta_path.insert(0, GradioImportWitness())

import app
from pipelines.interface import ModelDefaults
from pipelines.toy import ToyPipeline

step_delay_s = float(sys.argv[1])

class ToyVideo(ToyPipeline):
    def __init__(self):
        super().__init__(step_delay_s, defaults=ModelDefaults(64, 64, 8, 1.0, num_frames=3, fps=8))
        self.info = replace(self.info, name="toy-video", output_kind="video")

    def validate(self, params):
        super().validate(replace(params, num_frames=1))

    def post_decode(self, state):
        return super().post_decode(state) * state.params.num_frames

    def preview(self, state):
        return [super().preview(state)] * state.params.num_frames

def load_model(config, model=None):
    print("LOADING THE MODEL", flush=True)
    return ToyVideo() if model == "toy-video" else ToyPipeline(step_delay_s=step_delay_s)

def no_tunnel(host, port):
    raise OSError("no route to the share server (no internet here)")

app.load_model = load_model
app.open_share_link = no_tunnel
app.main_then_exit(sys.argv[2:])
""".replace("TEARDOWN_RAN", repr(TEARDOWN_RAN)).replace("GRADIO_IMPORTED", repr(GRADIO_IMPORTED))


class AppProcess:
    def __init__(self, *args: str, step_delay_s: float = 0.05, env: dict[str, str] | None = None) -> None:
        if "--outputs" not in args:  # one studio per outputs folder: studios of other tests save nothing
            args = (*args, "--no-save")
        self.process = subprocess.Popen(
            [sys.executable, "-c", _LAUNCH, str(step_delay_s), "--model", "toy", "--preview-every", "0", *args],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})},
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def url(self, timeout_s: float = START_TIMEOUT_S) -> str:
        """Where the studio serves, once its port answers; its output if it dies first."""
        wait_until(lambda: "serving on" in self.output or self.process.poll() is not None, timeout=timeout_s,
                   what="the studio to start")
        match = re.search(r"serving on (http://\S+/)", self.output)
        assert match, self.output
        url = match.group(1)
        # The line is logged as the server starts; it answers a moment later.
        wait_until_serving(self.process, url, lambda: self.output, timeout_s)
        return url

    def wait(self, timeout_s: float = 30) -> int:
        code = self.process.wait(timeout_s)
        self._reader.join(5)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@contextlib.contextmanager
def app_process(*args: str, **kwargs):
    process = AppProcess(*args, **kwargs)
    try:
        yield process
    finally:
        process.kill()


def in_flight(url: str) -> int:
    health = httpx.get(url + "healthz").json()
    return health["running"] + health["queue_depth"]


def workflow_with_steps(steps: int) -> dict:
    workflow = json.loads((ROOT / "assets" / "workflows" / "text-to-image.json").read_text())
    for node in workflow["nodes"]:
        if node["type"] == "steps":
            node["values"]["steps"] = steps
    return workflow


def test_sigterm_answers_every_caller_and_exits_0_without_pythons_teardown():
    """8 calls of every kind in flight (400 steps of 50 ms each, previews on): each gets the
    documented error and the process exits 0 as soon as its exit handlers are done, skipping
    Python's final teardown of torch's and Gradio's objects (which took 3-10 s after "stopped"). The
    teardown is seen by a witness object that speaks if it is freed, not by a clock: the time taken
    depends on the machine's load (docs/reliability.md gives the figures measured here)."""
    steps = 400
    with app_process("--port", "0", "--model", "toy-video", "--max-steps", str(steps), "--preview-every", "2",
                     "--max-per-session", "64", "--max-session-cost", "100000") as studio:
        url = studio.url()
        http_answers = []
        http_calls = [threading.Thread(target=lambda i=i: http_answers.append(httpx.post(
            url + "v1/images/generations", json={"prompt": f"http caller {i}", "num_inference_steps": steps},
            timeout=60))) for i in range(8)]
        for call in http_calls:
            call.start()
        videos = [httpx.post(url + "v1/videos", json={"prompt": f"video job {i}", "num_inference_steps": steps})
                  for i in range(8)]
        # Accepted; a job that reaches the forward before the last HTTP caller does is already running.
        assert all(v.status_code == 200 and v.json()["status"] in ("queued", "in_progress") for v in videos), \
            [(v.status_code, v.text[:200]) for v in videos]
        form = dict(negative_prompt="", width=64, height=64, steps=steps, guidance_scale=1.0)
        pages, video_callers, workflow_callers = (connect(url) for _ in range(3))
        jobs = ([pages.submit(prompt=f"page {i}", seed=i, model="", api_name="/generate", **form) for i in range(8)]
                + [video_callers.submit(prompt=f"video {i}", seed=i, model="toy-video", num_frames=3,
                                        api_name="/generate_video", **form) for i in range(8)]
                + [workflow_callers.submit(workflow=workflow_with_steps(steps), api_name="/run_workflow")
                   for _ in range(8)])
        wait_until(lambda: in_flight(url) == 40, timeout=60, what="all 40 requests in flight")

        studio.process.send_signal(signal.SIGTERM)
        code = studio.wait()
        for call in http_calls:
            call.join(30)
        assert code == 0, studio.output
        assert TEARDOWN_RAN not in studio.output, "Python's final teardown ran after the studio stopped"
        assert len(http_answers) == 8
        for answer in http_answers:
            assert_openai_error(answer, 503, code="shutting_down")
        for job in jobs:
            with pytest.raises(AppError, match="The server is shutting down: the engine was shut down"):
                job.result(timeout=30)
        assert "Traceback" not in studio.output, studio.output
        assert "stopping: SIGTERM" in studio.output


def test_gradio_temp_files_go_only_once_the_server_has_closed_every_connection():
    """Deleting them earlier (while uvicorn still served) made a preview that a client was
    downloading vanish under its response: a FileNotFoundError traceback at exit."""
    from engine import Engine
    from pipelines.toy import ToyPipeline
    from studio.config import StudioOptions
    from studio.app import build_app
    from studio.server.serving import StudioServer

    engine = Engine(ToyPipeline()).start()
    server = StudioServer(build_app(engine, StudioOptions(model="toy", port=0, outputs=None)), "127.0.0.1", 0).start()
    try:
        connect(server.url).predict(prompt="a red circle", negative_prompt="", width=64, height=64,
                                                  steps=2, guidance_scale=1.0, seed=7, api_name="/generate")
        cached = [path for files in server._demo.temp_file_sets for path in files]
        assert cached and all(os.path.isfile(path) for path in cached)
        sweeper, serving_at_sweep = server._sweeper, []

        class Recorder:
            def stop(self) -> int:
                serving_at_sweep.append(server._thread.is_alive())
                return sweeper.stop()

        server._sweeper = Recorder()
        server.stop()
    finally:
        engine.close()
    assert serving_at_sweep == [False]
    assert not any(os.path.exists(path) for path in cached)


def test_a_busy_port_is_refused_before_the_model_loads():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with app_process("--port", str(port)) as studio:
            assert studio.wait() == 2
    assert f"can't listen on 127.0.0.1:{port}" in studio.output
    assert "LOADING THE MODEL" not in studio.output and "serving on" not in studio.output
    assert GRADIO_IMPORTED not in studio.output  # refused before Gradio's imports (seconds of them)


def test_share_without_internet_warns_and_serves_and_an_engine_crash_exits_1():
    with app_process("--port", "0", "--share", step_delay_s=0.0) as studio:
        url = studio.url()
        wait_until(lambda: "no public link" in studio.output, timeout=60, what="the warning")
        assert "no route to the share server" in studio.output
        assert httpx.get(url + "healthz").status_code == 200  # still serving
        crashed = httpx.post(url + "v1/images/generations", json={"prompt": "[crash] now"}, timeout=30)
        assert_openai_error(crashed, 503, code="engine_failed")
        assert studio.wait() == 1, studio.output
        assert "exiting with status 1: the engine stopped after an internal error (EngineCrash" in studio.output


def test_a_whole_prompt_is_never_logged_in_one_line():
    code = "import app, logging\napp.configure_logging()\nlogging.getLogger('tokenizer').warning('truncated: ' + 'x' * 88_000)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    (line,) = done.stderr.splitlines()
    assert len(line) < 2100 and line.endswith("... [86011 more characters]")


def test_each_studio_keeps_its_gradio_files_in_its_own_folder_and_removes_it_at_exit(tmp_path):
    """Two studios on one machine send the same image (same content, so the same hash-named
    file in Gradio's cache): stopping one leaves the other's copy in place."""
    shared = tmp_path / "gradio"
    env = {"GRADIO_TEMP_DIR": str(shared)}
    with app_process("--port", "0", env=env) as first, app_process("--port", "0", env=env) as second:
        for studio in (first, second):
            connect(studio.url()).predict(
                prompt="a red circle", negative_prompt="", width=64, height=64, steps=2, guidance_scale=1.0,
                seed=7, api_name="/generate")
        folders = {studio: shared / next(p.name for p in shared.iterdir() if f"-{studio.process.pid}-" in p.name)
                   for studio in (first, second)}
        assert sorted(p.name for p in shared.iterdir()) == sorted(f.name for f in folders.values())
        results = {studio: sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file())
                   for studio, folder in folders.items()}
        assert results[first] and results[first] == results[second]  # the same hash-named files in each

        first.process.send_signal(signal.SIGTERM)
        assert first.wait() == 0, first.output
        assert not folders[first].exists()
        assert all((folders[second] / name).is_file() for name in results[second])
        second.process.send_signal(signal.SIGTERM)
        assert second.wait() == 0, second.output
    assert list(shared.iterdir()) == []

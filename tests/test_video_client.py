"""`/generate_video` and `/cancel` through gradio_client, on a live studio whose one engine serves
a tiny FLUX checkpoint (the default model) and a tiny Wan checkpoint."""

from __future__ import annotations

import imageio_ffmpeg
import pytest
from gradio_client import Client
from PIL import Image

from pipelines.loader import load_pipeline
from tests.engine_helpers import StepGate
from tests.studio_helpers import connect, live_studio, statuses, streamed, wait_for
from tests.test_http_videos import FLUX_CONFIG, FPS, WAN_CONFIG, Instrumented
from tests.tiny_checkpoints import build_tiny_flux, build_tiny_wan


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    wan = Instrumented(load_pipeline(str(build_tiny_wan(folder / "wan", WAN_CONFIG))))
    flux = load_pipeline(str(build_tiny_flux(folder / "flux", FLUX_CONFIG)))
    outputs = tmp_path_factory.mktemp("outputs")
    with live_studio({"flux": flux, "wan": wan}, outputs, preview_every=1) as (server, engine):
        yield server, engine, wan, outputs


def mp4_facts(path) -> tuple:
    """(frames, size, fps, codec) of an MP4, read back with imageio-ffmpeg."""
    frames = imageio_ffmpeg.read_frames(str(path))
    meta = next(frames)
    return sum(1 for _ in frames), meta["size"], meta["fps"], meta["codec"]


# The model's 9 frames at its own 8 fps (1.125 s): the default model, flux, has no fps of its own,
# and the studio's default of 16 fps would play them in 0.5625 s.
AT_WAN_FPS = (9, (32, 32), FPS, "h264")


def generate_video(client: Client, steps: int, seed: int = 5, frames: int = 9):
    return client.submit(prompt="a red circle moving left", negative_prompt="", width=32, height=32, steps=steps,
                         guidance_scale=1.0, seed=seed, model="wan", num_frames=frames, api_name="/generate_video")


def video_path(media) -> str:
    return media["video"] if isinstance(media, dict) else media


def test_generate_video_streams_previews_and_returns_an_mp4(studio):
    server, _, wan, outputs = studio
    before = set(outputs.rglob("*.mp4"))
    client = connect(server.url)
    endpoint = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/generate_video"]
    assert [p["parameter_name"] for p in endpoint["parameters"]][-4:] == ["model", "num_frames", "loras", "step_cache"]

    job = generate_video(client, steps=6)
    status, _, media = job.result(timeout=60)
    assert (status["state"], status["step"], status["total"], status["seed"]) == ("completed", 6, 6, 5)
    with_preview = [output for output in streamed(job) if output[1]]
    # preview_every=1: a preview after every step but the last (the video itself comes then),
    # each one every latent frame as a looping GIF.
    assert [output[0]["step"] for output in with_preview] == [1, 2, 3, 4, 5]
    previews = [output[1] for output in with_preview]
    with Image.open(previews[-1]) as gif:
        assert gif.format == "GIF" and gif.n_frames == 3  # 9 frames -> 3 latent frames
    assert mp4_facts(video_path(media)) == AT_WAN_FPS  # the MP4 returned ...
    (saved,) = set(outputs.rglob("*.mp4")) - before
    assert mp4_facts(saved) == AT_WAN_FPS  # ... and the one saved in outputs/
    assert status["request_id"] in wan.decoded


def test_a_workflows_video_is_made_and_saved_at_its_models_fps(studio):
    server, _, _, outputs = studio
    before = set(outputs.rglob("*.mp4"))
    link = lambda a, b, port: {"from": {"node": a, "port": port}, "to": {"node": b, "port": port}}  # noqa: E731
    workflow = {"version": 1, "nodes": [
        {"id": "p", "type": "prompt", "values": {"text": "a red circle moving left"}},
        {"id": "m", "type": "model", "values": {"name": "wan"}},
        {"id": "t", "type": "steps", "values": {"steps": 2}},
        {"id": "s", "type": "sampler"}],
        "links": [link("p", "s", "prompt"), link("m", "s", "model"), link("t", "s", "steps")]}
    status, images, _ = connect(server.url).predict(workflow=workflow, api_name="/run_workflow")
    assert status["state"] == "completed" and len(images) == 1
    assert mp4_facts(images[0]["video"]) == AT_WAN_FPS
    (saved,) = set(outputs.rglob("*.mp4")) - before
    assert mp4_facts(saved) == AT_WAN_FPS


def test_cancel_stops_a_video_at_the_next_step_boundary_without_decoding_it(studio):
    server, _, wan, _ = studio
    client = connect(server.url)
    gate = StepGate(wan.forwards + 2)
    wan.on_forward = gate
    try:
        job = generate_video(client, steps=20)
        gate.wait()  # inside the request's third forward
        running = wait_for(lambda: [s for s in statuses(job) if s["state"] == "running"], what="a running status")
        request_id = running[-1]["request_id"]
        answer = client.predict(request_id, api_name="/cancel")
        assert answer["cancelled"] is True, answer
        gate.release()
        status, _, media = job.result(timeout=60)
    finally:
        wan.on_forward = None
        gate.release()
    assert status["state"] == "aborted" and media is None
    assert status["step"] <= 3 and request_id not in wan.decoded
    # Another video after it runs to the end.
    assert generate_video(client, steps=2, seed=6).result(timeout=60)[0]["state"] == "completed"

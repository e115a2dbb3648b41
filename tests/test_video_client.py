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
    with live_studio({"flux": flux, "wan": wan}, preview_every=1) as (server, engine):
        yield server, engine, wan


def generate_video(client: Client, steps: int, seed: int = 5, frames: int = 9):
    return client.submit(prompt="a red circle moving left", negative_prompt="", width=32, height=32, steps=steps,
                         guidance_scale=1.0, seed=seed, model="wan", num_frames=frames, api_name="/generate_video")


def video_path(media) -> str:
    return media["video"] if isinstance(media, dict) else media


def test_generate_video_streams_previews_and_returns_an_mp4(studio):
    server, _, wan = studio
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
    frames = imageio_ffmpeg.read_frames(video_path(media))
    meta = next(frames)
    assert (sum(1 for _ in frames), meta["size"], meta["fps"], meta["codec"]) == (9, (32, 32), FPS, "h264")
    assert status["request_id"] in wan.decoded


def test_cancel_stops_a_video_at_the_next_step_boundary_without_decoding_it(studio):
    server, _, wan = studio
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

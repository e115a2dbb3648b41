"""OpenAI's Videos API (`/v1/videos`) on a real uvicorn server, driven by the official openai
client, over one engine serving a tiny Wan checkpoint and a tiny FLUX one."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import httpx
import imageio_ffmpeg
import numpy as np
import openai
import pytest
from PIL import Image

from engine import (
    Completed,
    Engine,
    GenerationParams,
    Progress,
    RequestHandle,
    ServingLimits,
    Started,
)
from pipelines.loader import load_pipeline
from studio.api.http_routes import HttpApiConfig
from studio.api.video_files import VideoFiles
from studio.api.video_jobs import VideoError, VideoJob, VideoJobStore, VideoStoreFull
from studio.media import write_mp4
from studio.outputs import OutputStore
from tests.engine_helpers import StepGate
from tests.test_http_api import FakeClock, assert_openai_error, serving, wait_until
from tests.tiny_checkpoints import build_tiny_flux, build_tiny_wan

FPS = 8
WAN_CONFIG = {"width": 32, "height": 32, "num_frames": 9, "num_inference_steps": 4, "fps": FPS,
              "guidance_scale": 1.0, "max_sequence_length": 16}
FLUX_CONFIG = {"width": 32, "height": 32, "num_inference_steps": 4, "max_sequence_length": 16}
PROMPT = "a red circle moving left"


class Instrumented:
    """A pipeline as it is, plus a hook in every forward and a log of what it encoded and decoded."""

    def __init__(self, inner, on_forward=None) -> None:
        self._inner = inner
        self.info = inner.info
        self.on_forward = on_forward
        self.forwards = 0
        self.encoded: list[str] = []
        self.decoded: list[str] = []

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def prepare_encode(self, state) -> None:
        self.encoded.append(state.request_id)
        self._inner.prepare_encode(state)

    def denoise_step(self, batch):
        index, self.forwards = self.forwards, self.forwards + 1
        if self.on_forward is not None:
            self.on_forward(index, batch)
        return self._inner.denoise_step(batch)

    def post_decode(self, state):
        self.decoded.append(state.request_id)
        return self._inner.post_decode(state)

    def post_decode_many(self, states):  # requests that finish in the same step decode together
        self.decoded.extend(state.request_id for state in states)
        return self._inner.post_decode_many(states)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    wan = load_pipeline(str(build_tiny_wan(folder / "wan", WAN_CONFIG)))
    flux = load_pipeline(str(build_tiny_flux(folder / "flux", FLUX_CONFIG)))
    return wan, flux


@contextlib.contextmanager
def videos_api(checkpoints, on_forward=None, config: HttpApiConfig | None = None, outputs: OutputStore | None = None,
               **engine_kwargs):
    """Yields (engine, instrumented wan, base url) for one engine serving flux (the default) and wan."""
    wan, flux = checkpoints
    video = Instrumented(wan, on_forward)
    engine = Engine({"flux": flux, "wan": video}, **engine_kwargs).start()
    try:
        with serving(engine, config, outputs=outputs) as url:
            yield engine, video, url
    finally:
        engine.close()


def client(url: str, key: str = "x") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=30)


def read_mp4(data: bytes, folder: Path) -> tuple[dict, int]:
    meta, frames = decode_mp4(data, folder)
    return meta, len(frames)


def decode_mp4(data: bytes, folder: Path) -> tuple[dict, np.ndarray]:
    """The MP4's metadata and its frames as RGB, shape (frames, height, width, 3)."""
    path = folder / "video.mp4"
    path.write_bytes(data)
    frames = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24")
    meta = next(frames)
    width, height = meta["size"]
    return meta, np.stack([np.frombuffer(frame, np.uint8).reshape(height, width, 3) for frame in frames])


# What H.264 (libx264 at write_mp4's quality) in yuv420p keeps of the tiny Wan's frames, which
# are close to noise at 32x32: measured over 5 seeds, the luma (BT.601) of the decoded frames is
# at most 2.0 off per frame on average and 11.7 at any pixel, and the colour of each 2x2 block
# (all that 4:2:0 keeps of it) at most 2.9 off on average. Twice that passes; another seed's
# video, or these frames in another order, is 19 or more off on average.
LUMA_MEAN_BOUND, LUMA_PIXEL_BOUND, BLOCK_COLOUR_MEAN_BOUND = 4.0, 24.0, 6.0


def assert_same_video(decoded: np.ndarray, frames: list[Image.Image]) -> None:
    """`decoded` (an MP4's frames) is `frames` within what H.264 in yuv420p allows."""
    expected = np.stack([np.asarray(frame.convert("RGB")) for frame in frames]).astype(float)
    decoded = decoded.astype(float)
    assert decoded.shape == expected.shape, (decoded.shape, expected.shape)
    luma = np.array([0.299, 0.587, 0.114])
    luma_diff = np.abs(decoded @ luma - expected @ luma)
    count, height, width, _ = expected.shape
    blocks = (count, height // 2, 2, width // 2, 2, 3)
    colour_diff = np.abs(decoded.reshape(blocks).mean(axis=(2, 4)) - expected.reshape(blocks).mean(axis=(2, 4)))
    assert luma_diff.mean(axis=(1, 2)).max() <= LUMA_MEAN_BOUND, luma_diff.mean(axis=(1, 2))
    assert luma_diff.max() <= LUMA_PIXEL_BOUND, luma_diff.max()
    assert colour_diff.mean() <= BLOCK_COLOUR_MEAN_BOUND, colour_diff.mean()


# ---------------------------------------------------------------------- the openai client
def test_create_and_poll_then_download_the_mp4_thumbnail_and_spritesheet(checkpoints, tmp_path):
    outputs = OutputStore(tmp_path / "outputs", model="flux", fps=FPS, write_video=write_mp4)
    with videos_api(checkpoints, outputs=outputs) as (engine, _, url):
        api = client(url)
        video = api.videos.create_and_poll(model="wan", prompt=PROMPT, size="32x32", poll_interval_ms=20,
                                           extra_body={"seed": 7, "num_frames": 9, "num_inference_steps": 4})
        assert (video.status, video.progress, video.model, video.size) == ("completed", 100, "wan", "32x32")
        assert video.error is None and video.completed_at >= video.created_at
        assert video.expires_at == video.completed_at + 3600
        extra = video.model_extra
        assert (video.seconds, extra["num_frames"], extra["fps"], extra["seed"]) == ("1.125", 9, FPS, 7)

        meta, decoded = decode_mp4(api.videos.download_content(video.id).read(), tmp_path)
        assert (len(decoded), meta["size"], meta["fps"], meta["codec"]) == (9, (32, 32), FPS, "h264")
        assert meta["pix_fmt"].startswith("yuv420p")
        thumbnail = Image.open(io.BytesIO(api.videos.download_content(video.id, variant="thumbnail").read()))
        assert (thumbnail.format, thumbnail.size) == ("WEBP", (32, 32))
        sheet = Image.open(io.BytesIO(api.videos.download_content(video.id, variant="spritesheet").read()))
        assert (sheet.format, sheet.size) == ("JPEG", (96, 96))  # 9 frames, 3 x 3

        # The same frames as the engine makes for these parameters, alone.
        direct = engine.submit(GenerationParams(prompt=PROMPT, model="wan", seed=7)).result(timeout=30)
        assert isinstance(direct, Completed) and len(direct.images) == 9
        assert_same_video(decoded, direct.images)

        # Saved like the page's results, under the caller's session, before it showed as completed.
        store = OutputStore(tmp_path / "outputs", model="wan")
        (saved,) = store.index.history(store.owners.of_caller("http:host:127.0.0.1"), 10)
        assert saved["kind"] == "video" and Path(saved["path"]).suffix == ".mp4" and saved["settings"]["seed"] == 7


def test_seconds_become_the_nearest_frame_count_the_model_takes(checkpoints):
    with videos_api(checkpoints) as (_, _, url):
        api = client(url)
        made = {}
        # At 8 fps: 1 s = 8 frames -> 9; 2 s = 16 -> 17; 0.875 s = 7, between 5 and 9 -> the longer;
        # no seconds -> the model's default (9); num_frames wins over seconds.
        for seconds, extra in (("1", {}), ("2", {}), ("0.875", {}), (None, {}), ("2", {"num_frames": 5})):
            kwargs = {"seconds": seconds} if seconds else {}
            video = api.videos.create_and_poll(model="wan", prompt=PROMPT, poll_interval_ms=20,
                                               extra_body={"num_inference_steps": 1, **extra}, **kwargs)
            made[(seconds, tuple(extra.items()))] = (video.model_extra["num_frames"], video.seconds)
        assert list(made.values()) == [(9, "1.125"), (17, "2.125"), (9, "1.125"), (9, "1.125"), (5, "0.625")]
        # The default model of /v1/videos is the first video model, even though flux is the engine's default.
        assert api.videos.create_and_poll(prompt=PROMPT, poll_interval_ms=20).model == "wan"


def test_retrieve_tells_the_step_the_engine_is_at_and_list_shows_the_callers_videos(checkpoints):
    first, second = StepGate(1), StepGate(3)  # hold the engine after 1, then after 3, of 4 steps

    def hold(index, batch):
        first(index, batch)
        second(index, batch)

    with videos_api(checkpoints, on_forward=hold) as (_, _, url):
        api = client(url)
        video = api.videos.create(model="wan", prompt=PROMPT, extra_body={"num_inference_steps": 4})
        # The engine runs step 1 (and holds) while the answer is on its way: a loaded machine may
        # answer after step 1's Progress reached the job.
        assert video.status in ("queued", "in_progress") and video.progress in (0, 25)
        first.wait()
        # The engine is held after step 1; its Progress event reaches the job a moment later.
        wait_until(lambda: api.videos.retrieve(video.id).progress > 0, what="step 1 in the job")
        now = api.videos.retrieve(video.id)  # still held: nothing moves past step 1
        assert (now.status, now.progress, now.completed_at) == ("in_progress", 25, None)
        with pytest.raises(openai.ConflictError, match="in_progress"):
            api.videos.download_content(video.id)
        first.release()
        second.wait()
        wait_until(lambda: api.videos.retrieve(video.id).progress > 25, what="step 3 in the job")
        assert api.videos.retrieve(video.id).progress == 75
        second.release()
        done = api.videos.poll(video.id, poll_interval_ms=20)
        assert (done.status, done.progress) == ("completed", 100)

        later = api.videos.create_and_poll(model="wan", prompt="a blue square moving up", poll_interval_ms=20)
        assert [v.id for v in api.videos.list()] == [later.id, video.id]  # newest first
        assert [v.id for v in api.videos.list(order="asc")] == [video.id, later.id]
        page = api.videos.list(limit=1)
        assert [v.id for v in page.data] == [later.id] and page.has_more
        assert [v.id for v in page.get_next_page().data] == [video.id]


def test_delete_mid_run_cancels_at_the_next_step_boundary_and_decodes_nothing(checkpoints):
    gate = StepGate(2)
    with videos_api(checkpoints, on_forward=gate) as (engine, wan, url):
        api = client(url)
        video = api.videos.create(model="wan", prompt=PROMPT, extra_body={"num_inference_steps": 20})
        gate.wait()  # the engine is inside the request's third forward
        deleted = api.videos.delete(video.id)
        assert (deleted.id, deleted.deleted, deleted.object) == (video.id, True, "video.deleted")
        gate.release()
        wait_until(lambda: engine.requests_in_flight == 0, what="the request to be aborted")
        request_id = video.id.removeprefix("video_")
        assert request_id in wan.encoded and request_id not in wan.decoded
        assert wan.forwards == 3  # the forward it was in when deleted, then no more
        assert engine.snapshot().stats.finished == {"aborted": 1} and engine.states_in_memory == 0
        with pytest.raises(openai.NotFoundError):
            api.videos.retrieve(video.id)
        assert api.videos.list().data == []
        # The engine keeps serving.
        assert api.videos.create_and_poll(model="wan", prompt=PROMPT, poll_interval_ms=20).status == "completed"


def test_another_caller_can_neither_see_nor_delete_your_video(checkpoints, tmp_path):
    keys = HttpApiConfig(api_keys={"alice": "sk-alice", "bob": "sk-bob"}, failed_key_delay_s=0)
    with videos_api(checkpoints, config=keys) as (_, _, url):
        alice, bob = client(url, "sk-alice"), client(url, "sk-bob")
        video = alice.videos.create_and_poll(model="wan", prompt=PROMPT, poll_interval_ms=20)
        for attempt in (lambda: bob.videos.retrieve(video.id), lambda: bob.videos.delete(video.id),
                        lambda: bob.videos.download_content(video.id)):
            with pytest.raises(openai.NotFoundError, match="does not exist"):
                attempt()
        assert bob.videos.list().data == []
        with pytest.raises(openai.AuthenticationError):
            client(url, "sk-mallory").videos.list()
        assert alice.videos.retrieve(video.id).status == "completed"
        _, count = read_mp4(alice.videos.download_content(video.id).read(), tmp_path)
        assert count == 9


# ---------------------------------------------------------------------- bad input
def form(**fields: str) -> dict:
    """A multipart body as the openai client sends it: every field as text."""
    return {"files": {name: (None, value) for name, value in fields.items()}}


BAD_VIDEO_REQUESTS = [
    # (request kwargs, status, param, code, words the message must have)
    (form(prompt=PROMPT, num_frames="10"), 400, "num_frames", "invalid_value", ["4k+1", "9 or 13", "1, 5, 9"]),
    (form(prompt=PROMPT, num_frames="131"), 400, "num_frames", "invalid_value", ["limit", "up to 129"]),
    (form(prompt=PROMPT, seconds="100"), 400, "seconds", "invalid_value", ["800 frames", "up to 16.125"]),
    (form(prompt=PROMPT, seconds="soon"), 400, "seconds", "invalid_value", ["number of seconds"]),
    (form(prompt=PROMPT, seconds="-1"), 400, "seconds", "invalid_value", ["above 0"]),
    (form(prompt=PROMPT, size="24x32"), 400, "size", "invalid_value", ["multiple of 16", "16 or 32"]),
    (form(prompt=PROMPT, size="big"), 400, "size", "invalid_value", ["WIDTHxHEIGHT"]),
    (form(prompt=PROMPT, size="4096x4096"), 400, "size", "invalid_value", ["limit of 32"]),
    (form(prompt=PROMPT, model="flux"), 400, "model", "unsupported_model", ["makes images", "wan"]),
    (form(prompt=PROMPT, model="sora-2"), 404, "model", "model_not_found", ["'flux', 'wan'"]),
    (form(prompt=PROMPT, num_inference_steps="5000"), 400, "num_inference_steps", "invalid_value", ["1..100"]),
    (form(prompt=PROMPT, num_inference_steps="0"), 400, "num_inference_steps", "invalid_value", ["1..100"]),
    (form(prompt=PROMPT, seed="-1"), 400, "seed", "invalid_value", []),
    (form(prompt=PROMPT, guidance_scale="nan"), 400, "guidance_scale", "invalid_value", []),
    (form(prompt=PROMPT, colour="red"), 400, "colour", "unknown_parameter", []),
    (form(seconds="4"), 400, "prompt", "missing_required_parameter", []),
    (form(prompt=PROMPT, input_reference="a picture"), 400, "input_reference", "unsupported_parameter", ["text only"]),
    ({"files": {"prompt": (None, PROMPT), "input_reference": ("ref.png", b"\x89PNG", "image/png")}}, 400,
     "input_reference", "unsupported_parameter", ["takes no files"]),
    ({"json": {"prompt": PROMPT, "num_frames": "9"}}, 400, "num_frames", "invalid_type", []),  # JSON is typed
    ({"content": b"prompt=x", "headers": {"content-type": "text/plain"}}, 415, None, "unsupported_media_type",
     ["multipart/form-data"]),
    ({**form(prompt=PROMPT), "headers": {"origin": "http://evil.example"}}, 403, None, "cross_site_request", []),
]


@pytest.fixture(scope="module")
def shared_api(checkpoints):
    with videos_api(checkpoints) as served:
        yield served


@pytest.mark.parametrize(("request_kwargs", "status", "param", "code", "words"), BAD_VIDEO_REQUESTS,
                         ids=lambda v: str(v)[:50])
def test_bad_video_requests_get_an_openai_error_naming_what_is_allowed(shared_api, request_kwargs, status, param,
                                                                       code, words):
    _, wan, url = shared_api
    encoded_before = len(wan.encoded)
    response = httpx.post(f"{url}/v1/videos", **request_kwargs)
    error = assert_openai_error(response, status, param, code)
    for word in words:
        assert word in error["message"], error["message"]
    assert len(wan.encoded) == encoded_before  # nothing ran


def test_a_video_model_is_refused_on_the_images_route_and_the_engine_keeps_serving(shared_api):
    url = shared_api[2]
    api = client(url)
    with pytest.raises(openai.BadRequestError, match="model 'wan' makes videos; .* image models: use one of: flux"):
        api.images.generate(model="wan", prompt=PROMPT)
    assert [m.id for m in api.models.list().data] == ["flux", "wan"]
    assert api.models.retrieve("wan").model_extra["output_kind"] == "video"
    # Reads of unknown videos, bad variants and bad list arguments are refused too.
    http = httpx.Client(base_url=url)
    assert_openai_error(http.get("/v1/videos/video_nope"), 404, "video_id", "video_not_found")
    assert_openai_error(http.get("/v1/videos", params={"limit": "0"}), 400, "limit")
    assert_openai_error(http.get("/v1/videos", params={"order": "sideways"}), 400, "order")
    assert_openai_error(http.get("/v1/videos", params={"after": "video_nope"}), 400, "after")
    assert_openai_error(http.patch("/v1/videos/video_nope"), 405)
    video = api.videos.create_and_poll(prompt=PROMPT, poll_interval_ms=20)
    error = assert_openai_error(http.get(f"/v1/videos/{video.id}/content", params={"variant": "gif"}), 400, "variant")
    assert "video, thumbnail, spritesheet" in error["message"]
    assert api.images.generate(prompt="a red circle", response_format="b64_json").data[0].b64_json
    assert video.status == "completed"


def test_the_callers_engine_limits_apply_to_video_jobs(checkpoints):
    gate = StepGate(0)
    with videos_api(checkpoints, on_forward=gate, limits=ServingLimits(max_per_session=1)) as (_, _, url):
        api = client(url)
        first = api.videos.create(model="wan", prompt=PROMPT)
        gate.wait()
        with pytest.raises(openai.RateLimitError, match="limit 1"):
            api.videos.create(model="wan", prompt=PROMPT)
        gate.release()
        assert api.videos.poll(first.id, poll_interval_ms=20).status == "completed"
        assert [v.id for v in api.videos.list()] == [first.id]  # the refused one left no job behind


# ---------------------------------------------------------------------- the job store alone
def job(job_id: str, owner: str, created_at: float = 0.0) -> VideoJob:
    params = GenerationParams(prompt=PROMPT, model="wan", width=32, height=32, num_frames=9, num_inference_steps=4,
                              guidance_scale=1.0, seed=1)
    handle = RequestHandle(request_id=job_id, session_id=owner, params=params, _cancel=lambda *_: None)
    return VideoJob(id=job_id, owner=owner, handle=handle, fps=FPS, created_at=created_at)


FILES = VideoFiles({}, size_bytes=10)  # no files on disk: the store alone counts their bytes


def test_job_status_and_progress_follow_the_engine_events():
    video = job("a", "alice")
    assert (video.status, video.progress) == ("queued", 0)
    video.handle.emit(Started(batch_size=1))
    assert (video.status, video.progress) == ("in_progress", 0)
    video.handle.emit(Progress(step=3, total=4, batch_size=1))
    assert (video.status, video.progress) == ("in_progress", 75)
    video.handle.emit(Progress(step=4, total=4, batch_size=1))
    assert (video.status, video.progress) == ("in_progress", 99)  # 100 only once it can be downloaded
    store = VideoJobStore()
    store.add(video)
    assert store.finish(video, files=FILES)
    assert (video.status, video.progress) == ("completed", 100)


def test_a_caller_at_its_quota_pushes_out_its_oldest_finished_job_and_is_refused_while_all_run():
    clock = FakeClock()
    store = VideoJobStore(max_jobs=10, max_jobs_per_owner=2, clock=clock)
    first, second = job("a1", "alice"), job("a2", "alice")
    store.add(first)
    store.add(second)
    with pytest.raises(VideoStoreFull, match="2 videos in progress"):
        store.make_room("alice")
    store.make_room("bob")  # another caller has its own quota
    store.finish(second, files=FILES)
    store.add(job("a3", "alice"))
    assert [j.id for j in store.jobs_of("alice")] == ["a1", "a3"]  # the finished one gave way, not the older
    assert store.get("a1", "bob") is None and store.remove("a1", "bob") is None  # owners only


def test_a_full_store_takes_from_the_caller_holding_the_most_finished_jobs():
    store = VideoJobStore(max_jobs=3, max_jobs_per_owner=3, clock=FakeClock())
    jobs = [job("a1", "alice"), job("a2", "alice"), job("b1", "bob")]
    for one in jobs:
        store.add(one)
        store.finish(one, files=FILES)
    store.add(job("b2", "bob"))
    assert sorted(j.id for j in [*store.jobs_of("alice"), *store.jobs_of("bob")]) == ["a2", "b1", "b2"]


def test_finished_jobs_expire_and_bytes_are_bounded():
    clock = FakeClock()
    store = VideoJobStore(max_bytes=25, ttl_s=60, clock=clock)
    old, new = job("a1", "alice"), job("b1", "bob")
    store.add(old)
    store.finish(old, files=FILES)
    clock.now = 30
    store.add(new)
    store.finish(new, files=FILES)
    assert store.expires_at(old) == 60 and store.total_bytes == 20
    clock.now = 40
    third = job("a2", "alice")
    store.add(third)
    store.finish(third, files=FILES)  # 30 bytes: the caller with the most finished jobs gives its oldest
    assert store.get("a1", "alice") is None and store.total_bytes == 20
    clock.now = 90
    assert store.get("b1", "bob") is None and len(store) == 1  # 60 s after it finished
    huge = job("a3", "alice")
    store.add(huge)
    store.finish(huge, files=VideoFiles({}, size_bytes=30))
    assert huge.status == "failed" and huge.failure == VideoError("video_too_large", huge.error.message)
    assert "30 bytes" in huge.error.message

"""Claims of the README's pages (docs/http-api.md, docs/replicas.md) that no other test proved,
each at the documented default values; every test's docstring names the page and quotes the
sentence it proves, and a test checks that the page still says it.

- `/v1/videos` (over a real uvicorn server, with the toy model served as a video model): the
  per-caller job limit (429 `video_limit`), the `openai-poll-after-ms` header, 409
  `video_failed`, the refusal of forms a browser marks as from another site, and the built-in video
  model's 2k+1 frame message.
- The HTTP API's default guards: a second per wrong key and a lockout after ten, 32 of the 256
  `url` images per caller, 10 s to send a body.
- The Ray Serve facade (`serve/replicated_engine.py`, over a stand-in for Serve's deployment
  handle, no cluster): no replica up -> 429 "try again shortly" at once; a replica that never
  answers is given up after 10 s. Skipped without Ray.

Tests that wait on a default time limit (1 s, 10 s) take that long; they bound it from below only.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from engine import Engine, GenerationParams, ServingLimits
from pipelines.interface import ModelDefaults
from pipelines.loader import BUILTIN_VIDEO_MODEL_DIR, load_pipeline
from pipelines.toy import ToyPipeline
from studio.api.http_routes import HttpApiConfig
from studio.config import StudioOptions
from tests.engine_helpers import StepGate
from tests.studio_helpers import live_studio
from tests.test_http_api import assert_openai_error, serving, wait_until
from tests.test_reliability_http import read_response

PROMPT = "a red circle moving left"


class ToyVideo(ToyPipeline):
    """The toy model as a video model: every frame is its image (any frame count, 8 fps)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(defaults=ModelDefaults(16, 16, 1, 1.0, num_frames=1, fps=8), **kwargs)
        self.info = replace(self.info, name="toy-video", output_kind="video")

    def validate(self, params: GenerationParams) -> None:
        super().validate(replace(params, num_frames=1))

    def post_decode(self, state):
        return super().post_decode(state) * state.params.num_frames

    def preview(self, state):
        return [super().preview(state)] * state.params.num_frames


@contextlib.contextmanager
def api_server(pipeline, limits: ServingLimits | None = None, config: HttpApiConfig | None = None):
    """Yields (engine, http client) for the HTTP API over one engine serving `pipeline`."""
    engine = Engine(pipeline, limits=limits).start()
    try:
        with serving(engine, config) as url, httpx.Client(base_url=url, timeout=30) as http:
            yield engine, http
    finally:
        engine.close()


def create_video(http: httpx.Client, prompt: str = PROMPT, **fields) -> httpx.Response:
    return http.post("/v1/videos", json={"prompt": prompt, "num_inference_steps": 1, **fields})


def statuses(http: httpx.Client) -> dict[str, str]:
    """The caller's videos (oldest first): id -> status."""
    listed = http.get("/v1/videos", params={"order": "asc", "limit": "100"})
    assert listed.status_code == 200, listed.text
    return {video["id"]: video["status"] for video in listed.json()["data"]}


# ---------------------------------------------------------------------- /v1/videos
def test_a_caller_with_16_videos_in_progress_gets_429_video_limit():
    """docs/http-api.md: "a caller holds at most 16 jobs, a new one pushing out its own oldest
    finished one (429 `video_limit` while all 16 are still running ...)"."""
    gate = StepGate(0)  # the engine holds its first forward: every job stays queued or running
    # The engine's default limits (16 requests per session) leave room for 16 running jobs.
    with api_server(ToyVideo(on_forward=gate)) as (engine, http):
        ids = []
        for index in range(16):
            created = create_video(http, f"{PROMPT} {index}")
            assert created.status_code == 200, created.text
            ids.append(created.json()["id"])
            if index == 0:
                gate.wait()
        refused = create_video(http, "one too many")
        error = assert_openai_error(refused, 429, code="video_limit")
        assert error["message"] == ("this caller already has 16 videos in progress (limit 16); wait for one to "
                                    "finish or delete one.")
        assert refused.headers["retry-after"] == "1"
        assert engine.requests_in_flight == 16  # the refused one never reached the engine

        gate.release()
        wait_until(lambda: set(statuses(http).values()) == {"completed"}, timeout=120, what="16 completed videos")
        # Now a new one pushes out the caller's oldest finished one.
        newest = create_video(http, "the 17th")
        assert newest.status_code == 200, newest.text
        assert list(statuses(http)) == [*ids[1:], newest.json()["id"]]
        assert_openai_error(http.get(f"/v1/videos/{ids[0]}"), 404, "video_id", "video_not_found")


def test_at_the_studios_default_session_limit_the_ninth_running_video_gets_429_session_limit():
    """docs/http-api.md: "(429 `video_limit` while all 16 are still running; at the studio's
    default `--max-per-session` of 8 the engine's limit refuses a ninth running one first, 429
    `session_limit`)"."""
    gate = StepGate(0)
    limits = StudioOptions().limits
    assert (limits.max_per_session, limits.max_session_cost) == (8, 32.0)
    with api_server(ToyVideo(on_forward=gate), limits=limits) as (_, http):
        for index in range(8):
            assert create_video(http, f"{PROMPT} {index}").status_code == 200
            if index == 0:
                gate.wait()
        refused = create_video(http, "the ninth")
        error = assert_openai_error(refused, 429, code="session_limit")
        assert "already has 8 requests in flight (limit 8)" in error["message"]
        assert len(statuses(http)) == 8  # the refused one left no job behind
        gate.release()


def test_video_answers_carry_the_openai_poll_after_ms_header_of_250():
    """docs/http-api.md: "The `openai-poll-after-ms` header (250) paces `create_and_poll`"."""
    with api_server(ToyVideo()) as (_, http):
        created = create_video(http)
        assert created.status_code == 200 and created.headers["openai-poll-after-ms"] == "250"
        retrieved = http.get(f"/v1/videos/{created.json()['id']}")
        assert retrieved.status_code == 200 and retrieved.headers["openai-poll-after-ms"] == "250"


def test_the_content_of_a_failed_video_is_409_video_failed():
    """docs/http-api.md: "`GET /v1/videos/{id}/content` ... 409 (`video_not_ready`,
    `video_failed`) before it completed" and "`failed` with `error: {code, message}`"."""
    with api_server(ToyVideo()) as (_, http):
        video_id = create_video(http, "a circle [fail:denoise_step]").json()["id"]
        wait_until(lambda: statuses(http)[video_id] == "failed", timeout=60, what="the video to fail")
        failed = http.get(f"/v1/videos/{video_id}").json()
        message = "injected failure in denoise_step for this prompt"
        assert (failed["status"], failed["error"]["code"]) == ("failed", "generation_failed")
        assert message in failed["error"]["message"]
        content = http.get(f"/v1/videos/{video_id}/content")
        error = assert_openai_error(content, 409, "video_id", "video_failed")
        assert error["message"].startswith(f"video '{video_id}' failed (generation_failed): ")
        assert message in error["message"] and error["message"].endswith("; it has no content.")


@pytest.mark.parametrize(("sec_fetch_site", "status"), [
    ("cross-site", 403), ("same-site", 403), ("same-origin", 200), ("none", 200),
])
def test_a_form_a_browser_marks_as_from_another_site_is_refused(sec_fetch_site, status):
    """docs/http-api.md: "A multipart body that a browser marks as coming from another site or
    origin (an `Origin` not this server's, `Sec-Fetch-Site: cross-site` or `same-site`) is refused
    (403 `cross_site_request`)"."""
    pipeline = ToyVideo()
    with api_server(pipeline) as (_, http):
        form = {"prompt": (None, PROMPT), "num_inference_steps": (None, "1")}
        answer = http.post("/v1/videos", files=form, headers={"sec-fetch-site": sec_fetch_site})
        if status == 403:
            error = assert_openai_error(answer, 403, code="cross_site_request")
            assert "a form posted from another web site is refused" in error["message"]
            assert statuses(http) == {} and pipeline.encoded == []
        else:
            assert answer.status_code == 200, answer.text
            assert list(statuses(http)) == [answer.json()["id"]]


@pytest.mark.skipif(not (BUILTIN_VIDEO_MODEL_DIR / "model_index.json").is_file(), reason="assets/shapes-wan missing")
def test_the_built_in_video_model_names_its_2k_plus_1_frame_counts():
    """docs/http-api.md: "Bad video input names what is allowed, e.g. `num_frames=10 is not a
    frame count shapes-wan takes (e.g. 9 or 11): allowed are 2k+1 up to 129: 1, 3, 5, ..., 127,
    129`"."""
    with api_server(load_pipeline("builtin-video")) as (engine, http):
        answer = create_video(http, num_frames=10)
        error = assert_openai_error(answer, 400, "num_frames", "invalid_value")
        assert error["message"] == ("num_frames=10 is not a frame count shapes-wan takes (e.g. 9 or 11): allowed "
                                    "are 2k+1 up to 129: 1, 3, 5, ..., 127, 129.")
        assert engine.snapshot().stats.finished == {} and engine.requests_in_flight == 0


# ---------------------------------------------------------------------- the HTTP API's default guards
def test_a_wrong_key_costs_a_second_and_ten_in_a_minute_lock_the_host_out():
    """docs/http-api.md: "A wrong key costs its host a second before the 401, one guess at a time
    per host; ten wrong keys ... within a minute lock the host out for a minute (429
    `too_many_failed_attempts`, `Retry-After`)"."""
    with api_server(ToyPipeline(), config=HttpApiConfig(api_keys={"alice": "sk-alice"})) as (_, http):
        for guess in range(10):
            sent = time.monotonic()
            answer = http.get("/v1/models", headers={"authorization": f"Bearer guess-{guess}"})
            assert_openai_error(answer, 401, code="invalid_api_key")
            assert time.monotonic() - sent >= 1.0, f"wrong key {guess + 1} was answered in under a second"
        # The tenth locked the host out: even the right key is refused now, unchecked.
        locked = http.get("/v1/models", headers={"authorization": "Bearer sk-alice"})
        since_tenth = time.monotonic() - sent
        error = assert_openai_error(locked, 429, code="too_many_failed_attempts")
        assert error["message"].startswith("too many failed attempts from this address; try again in ")
        # A minute from the tenth failure, which the server counted after `sent`.
        assert 60 - since_tenth <= int(locked.headers["retry-after"]) <= 60


def test_one_caller_holds_at_most_32_of_the_256_url_images():
    """docs/http-api.md: "one caller holds at most 32 of the store's 256, and when the store is
    full the caller holding the most gives up its oldest, so no caller can push others' images
    out"."""
    callers = [f"c{index}" for index in range(9)]
    config = HttpApiConfig(api_keys={name: f"sk-{name}" for name in callers})
    with api_server(ToyPipeline(), config=config) as (_, http):
        def url_images(caller: str, count: int) -> list[str]:
            urls = []
            while len(urls) < count:
                answer = http.post("/v1/images/generations", headers={"authorization": f"Bearer sk-{caller}"},
                                   json={"prompt": "x", "n": min(8, count - len(urls)), "size": "8x8",
                                         "num_inference_steps": 1, "response_format": "url"})
                assert answer.status_code == 200, answer.text
                urls += [item["url"] for item in answer.json()["data"]]
            return urls

        def kept(urls: list[str]) -> list[bool]:
            return [http.get(url).status_code == 200 for url in urls]

        first = url_images("c0", 33)
        assert kept(first) == [False] + [True] * 32  # its own oldest went to make room
        others = [url_images(caller, 32) for caller in callers[1:8]]  # 8 x 32: the store is full
        assert all(kept(urls) == [True] * 32 for urls in [first[1:], *others])
        newcomer = url_images("c8", 1)
        # Still 256 in all: one of the callers holding the most (32) gave up its oldest.
        held = [kept(urls) for urls in [first[1:], *others]]
        gave_up = [urls for urls in held if not all(urls)]
        assert gave_up == [[False] + [True] * 31] and kept(newcomer) == [True]


def test_a_body_not_in_within_10_s_is_answered_408_and_a_caller_gone_mid_body_logs_nothing(capfd):
    """docs/http-api.md: "408 body not in within 10 s (`request_timeout`)", through the studio as
    `python app.py` builds it (its connection deadline, `request_timeout_s`, is 30 s: the API's
    own 10 s answers first); and "No traceback is logged for a rejected input"."""
    pipeline = ToyPipeline()
    head = (b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n")
    with live_studio(pipeline) as (server, _):
        address = (server.host, server.port)
        with socket.create_connection(address, timeout=60) as sock:
            started = time.monotonic()
            sock.sendall(head + b'{"prompt": "a')
            answer = read_response(sock)
            took = time.monotonic() - started
        assert answer.startswith("HTTP/1.1 408")
        assert '"code":"request_timeout"' in answer and "did not arrive within 10 s" in answer
        assert took >= 10.0 and pipeline.encoded == []
        with socket.create_connection(address, timeout=60) as sock:  # this caller hangs up mid-body
            sock.sendall(head + b'{"prompt": "a')
        ok = httpx.post(server.url + "v1/images/generations", json={"prompt": "still served", "num_inference_steps": 2},
                        timeout=60)
        assert ok.status_code == 200
    log = capfd.readouterr()
    assert "Traceback" not in log.out + log.err and "ClientDisconnect" not in log.out + log.err


# ---------------------------------------------------------------------- the Ray Serve facade
class _Method:
    """`handle.<method>` of a Serve deployment handle: `.remote(...)` gives an awaitable."""

    def __init__(self, function) -> None:
        self.remote = function


class _Broadcast:
    def __init__(self, answers: list) -> None:
        self._answers = answers

    async def results_async(self, timeout_s: float, return_exceptions: bool) -> list:
        return self._answers


class StandInReplicas:
    """Stands in for Serve's handle of the EngineReplica deployment: `describe` answers as a
    replica of the toy model would; `report` says whether a replica is up; `prepare` never
    answers (a replica that hangs). Counts the `prepare` calls made."""

    def __init__(self, replica_up: bool) -> None:
        from serve.wire import ReplicaDescription, ReplicaReport

        engine = Engine(ToyPipeline())  # never started: only its description and snapshot are used
        self.description = ReplicaDescription(
            infos=dict(engine.infos), limits={"toy": engine.limits_for("toy")}, mode=engine.mode,
            max_batch_requests=engine.max_batch_requests, unit_cost=engine.unit_cost, with_unknown_words=frozenset())
        self.reports = [ReplicaReport(
            replica_id="r0", replica="replica 0", pid=1, device="cpu", clock=time.perf_counter(),
            snapshot=engine.snapshot(), metrics=b"", alive=True, failure=None)] if replica_up else []
        self.prepare_calls = 0
        self.describe = _Method(self._describe)
        self.prepare = _Method(self._prepare)

    async def _describe(self):
        return self.description

    async def _prepare(self, params):
        self.prepare_calls += 1
        await asyncio.Event().wait()  # never set: this replica never answers

    def broadcast(self, method: str) -> _Broadcast:
        assert method == "report"
        return _Broadcast(self.reports)


@contextlib.contextmanager
def replicated_api(replicas: StandInReplicas):
    """Yields (facade, http client): the HTTP API over a ReplicatedEngine at its defaults."""
    pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install -e '.[serve]')")
    from serve.replicated_engine import ReplicatedEngine

    facade = ReplicatedEngine(replicas).start()
    try:
        with serving(facade) as url, httpx.Client(base_url=url, timeout=60) as http:
            yield facade, http
    finally:
        facade.close()


def test_with_no_replica_up_a_call_is_refused_at_once_with_429_try_again_shortly():
    """docs/replicas.md: "while no replica is up at all `submit` fails at once with a "try again
    shortly" (429 `queue_full` over HTTP) instead of waiting for Serve's replacement"."""
    replicas = StandInReplicas(replica_up=False)
    with replicated_api(replicas) as (facade, http):
        answer = http.post("/v1/images/generations", json={"prompt": "a red circle"})
        error = assert_openai_error(answer, 429, code="queue_full")
        assert error["message"] == "no engine replica is up right now (Serve is starting new ones); try again shortly."
        assert answer.headers["retry-after"] == "1"
        assert replicas.prepare_calls == 0  # refused without waiting on any replica
        assert not facade.is_alive and facade.requests_in_flight == 0


def test_a_replica_call_that_never_answers_is_given_up_after_10_s():
    """docs/replicas.md: "No call waits forever: every replica call has a deadline (10 s; 10
    minutes for the first, while the replicas load their model at start)"."""
    replicas = StandInReplicas(replica_up=True)
    with replicated_api(replicas) as (facade, http):
        assert (facade.call_timeout_s, facade.start_timeout_s) == (10.0, 600.0)
        started = time.monotonic()
        answer = http.post("/v1/images/generations", json={"prompt": "a red circle"})
        took = time.monotonic() - started
        error = assert_openai_error(answer, 429, code="queue_full")
        assert error["message"] == "no engine replica answered within 10 s (TimeoutError); try again shortly."
        assert took >= 10.0 and replicas.prepare_calls == 1
        assert facade.requests_in_flight == 0


# ---------------------------------------------------------------------- the claims' sources
def quoted_claims() -> list[tuple[str, str, str]]:
    """(test, page, the quote's first words) for every test here whose docstring quotes a page."""
    claims = []
    for name, test in sorted(globals().items()):
        doc = " ".join((test.__doc__ or "").split()) if name.startswith("test_") else ""
        quoted = re.match(r'((?:docs/[\w-]+|README)\.md): "(.+?)(?: \.\.\.|")', doc)
        if quoted:
            claims.append((name, quoted[1], quoted[2]))
    return claims


def test_every_quoted_claim_is_still_on_its_page():
    root = Path(__file__).resolve().parent.parent
    claims = quoted_claims()
    assert len(claims) == 11  # every claim test above names its page
    missing = [(name, page, words) for name, page, words in claims
               if words not in " ".join((root / page).read_text().split())]
    assert missing == []

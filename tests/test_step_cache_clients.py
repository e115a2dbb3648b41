"""Step caching from the clients, on a live studio over the built-in image model: a per-request
`step_cache` over gradio_client (keyword; old positional calls still work) and over the openai
client's extra_body reaches the engine; how many steps a request skipped shows in its status, in
/queue (gradio_client and HTTP) and in the images' data; /metrics counts rows skipped; a bad
threshold is refused naming the field."""

from __future__ import annotations

import io
import threading

import httpx
import openai
import pytest
from PIL import Image

from pipelines.loader import load_pipeline
from tests.engine_helpers import spy_on_submits
from tests.studio_helpers import connect, live_studio

PROMPT = "a large red circle on a blue background, left"
THRESHOLD = 0.3  # the built-in model skips most of its 20 steps at this threshold
DEFAULT = 0.1  # assets/shapes-flux/stepstudio.json's step_cache


@pytest.fixture(scope="module")
def studio():
    pipeline = load_pipeline("builtin")
    with live_studio(pipeline, max_size=64) as (server, engine):
        yield server, engine, pipeline


@pytest.fixture
def submitted(studio, monkeypatch):
    return spy_on_submits(studio[1], monkeypatch)


@pytest.fixture(scope="module")
def client(studio):
    return connect(studio[0].url)


@pytest.fixture(scope="module")
def api(studio):
    return openai.OpenAI(base_url=f"{studio[0].url.rstrip('/')}/v1", api_key="x", max_retries=0, timeout=120)


def test_gradio_client_sends_a_threshold_and_hears_the_skipped_steps(client, submitted):
    status, _, _ = client.predict(PROMPT, "", 64, 64, 20, 3.0, 5, "", None, THRESHOLD, api_name="/generate")
    assert submitted[-1].step_cache == THRESHOLD
    assert status["state"] == "completed" and 5 <= status["skipped"] < 20, status
    by_keyword, _, _ = client.predict(prompt=PROMPT, seed=5, step_cache=THRESHOLD, api_name="/generate")
    assert by_keyword["skipped"] == status["skipped"]  # the same request: the same skips


def test_an_old_positional_call_runs_at_the_models_default_threshold(client, submitted):
    status, _, _ = client.predict(PROMPT, "", 64, 64, 20, 3.0, 5, "", api_name="/generate")
    assert submitted[-1].step_cache is None  # the model's default: its stepstudio.json's
    default = client.predict(PROMPT, "", 64, 64, 20, 3.0, 5, "", None, DEFAULT, api_name="/generate")[0]
    off = client.predict(PROMPT, "", 64, 64, 20, 3.0, 5, "", None, 0, api_name="/generate")[0]
    assert status["state"] == "completed" and status["skipped"] == default["skipped"] > 0, (status, default)
    assert off["skipped"] == 0


def test_the_openai_client_sends_a_threshold_and_each_image_says_its_skips(api, submitted):
    result = api.images.generate(model="shapes-flux", prompt=PROMPT, n=2, size="64x64", response_format="b64_json",
                                 extra_body={"seed": 9, "step_cache": THRESHOLD})
    assert [p.step_cache for p in submitted] == [THRESHOLD, THRESHOLD]
    assert all(item.model_extra["skipped_steps"] >= 5 for item in result.data)
    plain = api.images.generate(model="shapes-flux", prompt=PROMPT, size="64x64", response_format="b64_json",
                                extra_body={"seed": 9, "step_cache": 0})
    assert plain.data[0].model_extra["skipped_steps"] == 0


def test_a_redraw_of_a_picture_runs_every_step_unless_it_asks_for_caching(api, submitted):
    # docs/benchmarks.md#step-caching: caching lowered how often a light redraw takes its prompt's colour.
    picture = io.BytesIO()
    Image.new("RGB", (64, 64), (40, 80, 200)).save(picture, format="PNG")
    edit = dict(model="shapes-flux", prompt=PROMPT, size="64x64", response_format="b64_json")
    plain = api.images.edit(image=("blue.png", picture.getvalue(), "image/png"), **edit, extra_body={"seed": 4})
    asked = api.images.edit(image=("blue.png", picture.getvalue(), "image/png"), **edit,
                            extra_body={"seed": 4, "step_cache": THRESHOLD})
    assert [params.step_cache for params in submitted] == [None, THRESHOLD]  # the first: the model's default
    assert plain.data[0].model_extra["skipped_steps"] == 0 and asked.data[0].model_extra["skipped_steps"] > 0


@pytest.mark.parametrize("value", [-1, 2, "a lot"])
def test_a_bad_threshold_over_http_is_refused_naming_the_field(api, value):
    with pytest.raises(openai.BadRequestError) as error:
        api.images.generate(model="shapes-flux", prompt=PROMPT, size="64x64", extra_body={"step_cache": value})
    assert error.value.body["param"] == "step_cache"


def test_queue_and_metrics_say_how_many_steps_a_running_request_skipped(studio, client):
    server, engine, pipeline = studio
    held, release = threading.Event(), threading.Event()
    denoise_step = pipeline.denoise_step

    def holding(batch):  # hold the engine after the 12th step, while the request is still running
        output = denoise_step(batch)
        if batch.states[0].step_index == 11 and not held.is_set():
            held.set()
            assert release.wait(120), "the test never released the engine"
        return output

    pipeline.denoise_step = holding
    try:
        job = client.submit(prompt=PROMPT, seed=21, step_cache=THRESHOLD, api_name="/generate")
        assert held.wait(120), "the request never reached its 12th step"
        engine_view = engine.snapshot()
        queue = client.predict(api_name="/queue")
        release.set()
        final_status = job.result()[0]
    finally:
        release.set()
        del pipeline.denoise_step
    [mine] = [r for r in queue["requests"] if r["mine"]]
    skipped = engine_view.running[0].skipped
    assert 1 <= skipped <= 11 and mine["skipped"] == skipped and mine["state"] == "running", (mine, skipped)
    assert queue["engine"]["rows_skipped"] >= 2 * skipped  # a CFG request: both rows skip together
    assert final_status["skipped"] >= skipped
    metrics = httpx.get(f"{server.url.rstrip('/')}/metrics", timeout=60).text
    skipped_rows = next(float(line.split()[-1]) for line in metrics.splitlines()
                        if line.startswith("stepstudio_rows_skipped_total "))
    assert skipped_rows == engine.snapshot().stats.rows_skipped > 0

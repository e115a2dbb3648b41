"""LoRA adapters from the official clients, on a live studio over the tiny FLUX with two tiny
adapters: gradio_client's `loras` argument and `<lora:NAME:SCALE>` tags, the openai client's
`extra_body={"loras": [...]}` on images.generate and images.edit, GET /v1/models listing them,
clear refusals naming the adapter, and the saved PNG's parameters writing them as A1111 tags."""

from __future__ import annotations

import base64
import io

import numpy as np
import openai
import pytest
from diffusers import FluxPipeline
from diffusers.utils import logging as diffusers_logging
from PIL import Image

from pipelines.loader import load_pipeline
from studio.outputs import png_texts
from tests.studio_helpers import connect, live_studio
from tests.test_flux_pipeline import STUDIO_CONFIG
from tests.tiny_checkpoints import build_tiny_flux
from tests.tiny_loras import build_tiny_lora

diffusers_logging.set_verbosity_error()
PROMPT = "a red circle"


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-clients")
    folder = build_tiny_flux(root / "flux", studio_config=STUDIO_CONFIG)
    stock = FluxPipeline.from_pretrained(folder, use_safetensors=True)
    pipeline = load_pipeline(str(folder))
    pipeline.load_lora("ink", build_tiny_lora(stock, root / "ink", seed=1))
    pipeline.load_lora("glow", build_tiny_lora(stock, root / "glow", seed=2, rank=2))
    with live_studio(pipeline, outputs=root / "outputs", max_size=64) as (server, engine):
        yield server, engine, root / "outputs"


@pytest.fixture(scope="module")
def client(studio):
    return connect(studio[0].url)


@pytest.fixture(scope="module")
def api(studio):
    return openai.OpenAI(base_url=f"{studio[0].url.rstrip('/')}/v1", api_key="x", max_retries=0, timeout=60)


def pixels(image) -> np.ndarray:
    picture = image if isinstance(image, Image.Image) else Image.open(image)
    return np.asarray(picture.convert("RGB")).astype(int)


def generate(client, prompt: str = PROMPT, loras=None, seed: int = 3):
    status, _, image = client.predict(prompt, "", 32, 32, 4, 1.0, seed, "", loras, api_name="/generate")
    assert status["state"] == "completed", status
    return pixels(image)


def test_gradio_client_runs_adapters_by_argument_and_by_prompt_tag(client):
    base = generate(client)
    inked = generate(client, loras=[{"name": "ink", "scale": 1.0}])
    tagged = generate(client, prompt=f"{PROMPT} <lora:ink:1>")
    assert np.abs(inked - base).max() > 10  # the adapter changes the picture
    assert np.abs(inked - tagged).max() <= 1  # the tag is the argument (one level of float noise at most)
    both = generate(client, loras=[{"name": "ink", "scale": 1.0}, {"name": "glow", "scale": -0.5}])
    assert np.abs(both - inked).max() > 5


def test_gradio_client_refusals_name_the_adapter(client):
    with pytest.raises(Exception, match="LoRA 'nope' is not loaded for flux; the loaded ones are: ink, glow"):
        generate(client, loras=[{"name": "nope"}])
    with pytest.raises(Exception, match=r"LoRA 'ink' has scale 9: allowed is -4..4"):
        generate(client, loras=[{"name": "ink", "scale": 9}])


def test_the_models_list_names_each_models_adapters(api):
    [card] = api.models.list().data
    assert (card.id, card.loras) == ("flux", ["ink", "glow"])


def test_openai_images_generate_takes_loras_in_extra_body(api, client):
    result = api.images.generate(prompt=PROMPT, size="32x32", extra_body={
        "seed": 3, "num_inference_steps": 4, "guidance_scale": 1.0, "loras": [{"name": "ink", "scale": 1.0}]})
    image = pixels(io.BytesIO(base64.b64decode(result.data[0].b64_json)))
    assert np.abs(image - generate(client, loras=[{"name": "ink", "scale": 1.0}])).max() <= 1
    with pytest.raises(openai.BadRequestError) as refused:
        api.images.generate(prompt=PROMPT, size="32x32", extra_body={"loras": [{"name": "gone"}]})
    assert refused.value.body["param"] == "loras" and "LoRA 'gone' is not loaded" in refused.value.body["message"]


def test_openai_images_edit_takes_loras_as_the_client_sends_them(api):
    picture = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 40, 40)).save(picture, format="PNG")
    ask = dict(image=("init.png", picture.getvalue(), "image/png"), prompt=PROMPT, size="32x32")
    plain, inked = (api.images.edit(**ask, extra_body={"seed": 2, "strength": 0.8, **extra})
                    for extra in ({}, {"loras": [{"name": "ink", "scale": 1.0}, {"name": "glow", "scale": 0.5}]}))
    difference = pixels(io.BytesIO(base64.b64decode(plain.data[0].b64_json))) - pixels(
        io.BytesIO(base64.b64decode(inked.data[0].b64_json)))
    assert np.abs(difference).max() > 5
    with pytest.raises(openai.BadRequestError, match="LoRA 'x' is not loaded"):
        api.images.edit(**ask, extra_body={"loras": [{"name": "x", "scale": 1.0}]})


def test_saved_results_carry_the_adapters_as_a1111_tags(client, studio):
    generate(client, prompt="a blue square <lora:glow:0.5>", loras=[{"name": "ink", "scale": 1.0}], seed=11)
    outputs = studio[2]
    newest = max(outputs.rglob("*.png"), key=lambda path: path.stat().st_mtime)
    assert png_texts(newest)["parameters"].split("\n")[0] == "a blue square <lora:ink:1> <lora:glow:0.5>"

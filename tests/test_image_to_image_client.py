"""The studio's `/image_to_image` endpoint driven by a real gradio_client (pictures sent with
`handle_file`) against a live studio over the toy pipeline."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from gradio_client import handle_file
from gradio_client.exceptions import AppError
from PIL import Image

from engine import Completed, GenerationParams
from pipelines.toy import ToyPipeline
from tests.studio_helpers import connect, live_studio, statuses

PROMPT = "a green field"


@pytest.fixture(scope="module")
def studio():
    pipeline = ToyPipeline(step_delay_s=0.005)
    with live_studio(pipeline, preview_every=2, max_size=128, max_steps=60) as (server, engine):
        yield server, engine, pipeline


@pytest.fixture(scope="module")
def client(studio):
    return connect(studio[0].url)


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    """The picture to start from (red on top, blue below), a mask whose right half is white
    (repaint), a mask of another size, and a file that is no picture."""
    folder = tmp_path_factory.mktemp("pictures")
    init = Image.new("RGB", (64, 64), (220, 40, 40))
    init.paste((30, 60, 210), (0, 32, 64, 64))
    init.save(folder / "init.png")
    mask = Image.new("L", (64, 64), 0)
    mask.paste(255, (32, 0, 64, 64))
    mask.save(folder / "mask.png")
    Image.new("L", (32, 32), 255).save(folder / "small-mask.png")
    (folder / "notes.png").write_bytes(b"these are notes, not a picture")
    paths = {name: str(folder / f"{name}.png") for name in ("init", "mask", "small-mask", "notes")}
    return {"init_image": init, "mask_image": mask, **paths}


def pixels(path: str) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB")).astype(int)


def direct(engine, **fields) -> np.ndarray:
    result = engine.submit(GenerationParams(prompt=PROMPT, **fields)).result(timeout=30)
    assert isinstance(result, Completed), result
    return np.asarray(result.images[0]).astype(int)


def test_the_endpoint_is_listed_with_the_mask_and_settings_optional(client):
    endpoint = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/image_to_image"]
    parameters = {p["parameter_name"]: p for p in endpoint["parameters"]}
    assert list(parameters) == ["image", "prompt", "strength", "mask", "negative_prompt", "steps", "guidance_scale",
                                "seed", "model", "loras", "step_cache"]
    assert [name for name, p in parameters.items() if not p["parameter_has_default"]] == ["image", "prompt"]
    assert parameters["strength"]["parameter_default"] == 0.6  # the model's default strength


def test_a_picture_sent_with_handle_file_is_redrawn_in_the_steps_its_strength_runs(studio, client, pictures):
    _, engine, _ = studio
    job = client.submit(image=handle_file(pictures["init"]), prompt=PROMPT, strength=0.5, steps=10, seed=3,
                        api_name="/image_to_image")
    status, _, image = job.result(timeout=60)
    assert (status["state"], status["step"], status["total"], status["seed"]) == ("completed", 5, 5, 3)
    # Every step's status counts the 5 steps that run (10 x 0.5), not the 10 of the whole schedule.
    stepped = [s for s in statuses(job) if s["step"] > 0]
    assert [s["step"] for s in stepped if s["state"] == "running"] == [1, 2, 3, 4, 5]
    assert {s["total"] for s in stepped} == {5}
    redrawn = pixels(image)
    np.testing.assert_array_equal(redrawn, direct(engine, init_image=pictures["init_image"], strength=0.5, seed=3,
                                                  num_inference_steps=10))
    distance = np.abs(redrawn - np.asarray(pictures["init_image"])).mean()
    from_text = np.abs(direct(engine, seed=3, num_inference_steps=10) - np.asarray(pictures["init_image"])).mean()
    assert 0 < distance < from_text / 1.5


def test_a_mask_repaints_its_white_part_only(studio, client, pictures):
    _, engine, _ = studio
    status, _, image = client.predict(image=handle_file(pictures["init"]), prompt=PROMPT, strength=0.9,
                                      mask=handle_file(pictures["mask"]), seed=4, api_name="/image_to_image")
    assert status["state"] == "completed"
    difference = np.abs(pixels(image) - np.asarray(pictures["init_image"]))
    assert difference[:, :32].max() <= 3, "the black half of the mask must be kept"
    assert difference[:, 32:].mean() > 30, "the white half must be repainted"
    np.testing.assert_array_equal(pixels(image), direct(engine, init_image=pictures["init_image"],
                                                        mask_image=pictures["mask_image"], strength=0.9, seed=4))


@pytest.mark.parametrize(("arguments", "message"), [
    ({"strength": 1.5}, "strength=1.5 is not allowed"),
    ({"strength": "strong"}, "strength must be a number"),
    ({"image": "notes"}, "image is not a picture this server reads"),
    ({"mask": "small-mask"}, "mask is 32x32 but image is 64x64"),
    ({"image": None}, "image is required"),
    ({"steps": 500}, "allowed is 1..60"),
])
def test_bad_inputs_get_a_message_naming_the_field_and_never_run(studio, client, pictures, arguments, message):
    pipeline = studio[2]
    values = {"image": "init", "prompt": PROMPT, "strength": 0.5, "mask": None, **arguments}
    for name in ("image", "mask"):
        if values[name] is not None:
            values[name] = handle_file(pictures[values[name]])
    encoded = len(pipeline.encoded)
    with pytest.raises(AppError, match=message):
        client.predict(**values, api_name="/image_to_image")
    assert len(pipeline.encoded) == encoded


def test_a_path_outside_the_upload_folder_is_never_read(studio, pictures):
    """A caller names a file on the server instead of uploading one: Gradio refuses it before
    the handler runs, so nothing of it reaches the engine."""
    server, _, pipeline = studio
    encoded = len(pipeline.encoded)
    elsewhere = {"path": pictures["init"], "meta": {"_type": "gradio.FileData"}}
    with httpx.Client(base_url=server.url, timeout=30) as http:
        posted = http.post("/gradio_api/call/image_to_image",
                           json={"data": [elsewhere, PROMPT, 0.5, None, "", 4, 1.0, 1, ""]})
        assert posted.status_code == 200, posted.text
        events = http.get(f"/gradio_api/call/image_to_image/{posted.json()['event_id']}").text
    assert "event: error" in events and "event: complete" not in events, events
    assert len(pipeline.encoded) == encoded

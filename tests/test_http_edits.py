"""OpenAI's Images edit API (`POST /v1/images/edits`) on a real uvicorn server over the toy
pipeline, driven by the official openai client as it encodes uploads (multipart), and the
mask conversion on its own."""

from __future__ import annotations

import base64
import io
import socket
import struct
import threading
import zlib
from dataclasses import replace

import numpy as np
import openai
import pytest
from PIL import Image

from engine import Completed, Engine, GenerationParams, ServingLimits
from pipelines.errors import ParamError
from pipelines.toy import ToyPipeline
from studio.api.http_routes import HttpApiConfig
from studio.pictures import mask_from_transparency, mask_from_white, open_upload
from tests.engine_helpers import StepGate
from tests.test_http_api import assert_openai_error, decode_png, running_api, serving, wait_until
from tests.test_reliability_http import read_response

PROMPT = "a green field"


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def two_colour_picture(width: int = 64, height: int = 64) -> Image.Image:
    """Red on top, blue below."""
    image = Image.new("RGB", (width, height), (220, 40, 40))
    image.paste((30, 60, 210), (0, height // 2, width, height))
    return image


def openai_mask(width: int = 64, height: int = 64) -> Image.Image:
    """OpenAI's convention: the right half fully transparent (edit it), the left half opaque (keep)."""
    mask = Image.new("RGBA", (width, height), (0, 0, 0, 255))
    mask.paste((0, 0, 0, 0), (width // 2, 0, width, height))
    return mask


def pixels(b64: str) -> np.ndarray:
    return np.asarray(decode_png(base64.b64decode(b64)).convert("RGB")).astype(int)


def direct(engine: Engine, **fields) -> np.ndarray:
    """The engine's own image for these parameters, submitted straight to it."""
    result = engine.submit(GenerationParams(prompt=PROMPT, **fields)).result(timeout=30)
    assert isinstance(result, Completed), result
    return np.asarray(result.images[0]).astype(int)


@pytest.fixture
def api():
    with running_api() as api:
        yield api


@pytest.fixture(scope="module")
def shared_api():
    """One server (sizes up to 128) for the many bad-request cases; none of them may run."""
    with running_api(limits=ServingLimits(max_size=128)) as api:
        yield api


# ---------------------------------------------------------------------- the openai client
def test_an_edit_without_a_mask_is_the_engines_image_to_image_request(api):
    init = two_colour_picture()
    result = api.openai().images.edit(
        image=("init.png", png(init), "image/png"), prompt=PROMPT, size="64x64", response_format="b64_json",
        extra_body={"seed": 3, "strength": 0.5, "num_inference_steps": 10},
    )
    assert len(result.data) == 1 and result.data[0].model_extra["seed"] == 3
    edited = pixels(result.data[0].b64_json)
    # The very image the engine makes from this picture, and 5 of the 10 steps ran (strength 0.5).
    np.testing.assert_array_equal(edited, direct(api.engine, init_image=init, strength=0.5, seed=3,
                                                 num_inference_steps=10))
    assert len(api.pipeline.forward_log) == 5 + 5
    # It starts from the picture: closer to it than text to image from the same seed, and not equal.
    from_text = direct(api.engine, seed=3, num_inference_steps=10)
    distance = np.abs(edited - np.asarray(init)).mean()
    assert 0 < distance < np.abs(from_text - np.asarray(init)).mean() / 1.5


def test_strength_decides_how_far_the_edit_goes(api):
    init = two_colour_picture()
    distances = []
    for strength in (0.2, 0.5, 1.0):
        result = api.openai().images.edit(image=("init.png", png(init), "image/png"), prompt=PROMPT,
                                          extra_body={"seed": 7, "strength": strength})
        distances.append(np.abs(pixels(result.data[0].b64_json) - np.asarray(init)).mean())
    assert distances[0] < 20 < distances[1] < distances[2], distances


def test_an_edit_with_a_mask_repaints_only_the_transparent_part(api):
    init = two_colour_picture()
    result = api.openai().images.edit(
        image=("init.png", png(init), "image/png"), mask=("mask.png", png(openai_mask()), "image/png"),
        prompt=PROMPT, response_format="b64_json", extra_body={"seed": 4, "strength": 0.9},
    )
    edited = pixels(result.data[0].b64_json)
    difference = np.abs(edited - np.asarray(init))
    assert difference[:, :32].max() <= 3, "the opaque half of the mask must be kept"
    assert difference[:, 32:].mean() > 30, "the transparent half must be repainted"
    white_right = Image.new("L", (64, 64), 0)
    white_right.paste(255, (32, 0, 64, 64))
    np.testing.assert_array_equal(edited, direct(api.engine, init_image=init, mask_image=white_right, strength=0.9,
                                                 seed=4))


def test_n_edits_take_seeds_seed_plus_i_and_the_size_of_the_picture(api):
    init = two_colour_picture(48, 32)
    result = api.openai().images.edit(image=("init.png", png(init), "image/png"), prompt=PROMPT, n=2,
                                      extra_body={"seed": 10, "strength": 0.6})
    assert [item.model_extra["seed"] for item in result.data] == [10, 11]
    images = [pixels(item.b64_json) for item in result.data]
    assert images[0].shape == images[1].shape == (32, 48, 3)  # size absent: the picture's own
    assert not np.array_equal(images[0], images[1])
    for seed, image in zip((10, 11), images):
        np.testing.assert_array_equal(image, direct(api.engine, init_image=init, strength=0.6, seed=seed))


def test_a_list_of_one_picture_and_a_url_answer_work(api):
    init = two_colour_picture()
    result = api.openai().images.edit(image=[("init.png", png(init), "image/png")], prompt=PROMPT,
                                      response_format="url", extra_body={"seed": 2})
    fetched = api.http.get(result.data[0].url)
    assert fetched.status_code == 200 and decode_png(fetched.content).size == (64, 64)


def test_an_edit_and_a_generation_of_one_size_share_forwards():
    gate = StepGate(0)  # the first forward waits until the second call has queued
    with running_api(pipeline=ToyPipeline(on_forward=gate)) as api:
        client = api.openai()
        results = {}
        edit = threading.Thread(target=lambda: results.update(edit=client.images.edit(
            image=("init.png", png(two_colour_picture()), "image/png"), prompt=PROMPT,
            extra_body={"seed": 1, "strength": 1.0, "num_inference_steps": 12})))
        generate = threading.Thread(target=lambda: results.update(generate=client.images.generate(
            prompt="a red circle", size="64x64", extra_body={"seed": 2, "num_inference_steps": 12})))
        edit.start()
        gate.wait()
        generate.start()
        wait_until(lambda: api.engine.requests_in_flight == 2, what="the generation to queue")
        gate.release()
        edit.join(30)
        generate.join(30)
        assert set(results) == {"edit", "generate"}
        sizes = [len(rows) for rows in api.pipeline.forward_log]
        assert sizes[1] == 2 and sum(sizes) == 24, sizes


# ---------------------------------------------------------------------- bad requests
def form(image: bytes | None = None, mask: bytes | None = None, **fields: str) -> dict:
    """httpx's multipart arguments as the openai client sends them (files, every field as text)."""
    files = {name: (None, value) for name, value in {"prompt": PROMPT, **fields}.items()}
    if image is not None:
        files["image"] = ("image.png", image, "image/png")
    if mask is not None:
        files["mask"] = ("mask.png", mask, "image/png")
    return {"files": files}


PICTURE = png(two_colour_picture())
MASK = png(openai_mask())

BAD_EDITS = [
    # (httpx request kwargs, status, param, code, words the message must have)
    (form(b"GIF89a not really"), 400, "image", "invalid_value", ["PNG, JPEG or WEBP"]),
    (form(b""), 400, "image", "invalid_value", ["empty"]),
    (form(PICTURE[:100]), 400, "image", "invalid_value", ["damaged"]),
    (form(png(two_colour_picture(136, 64))), 400, "image", "invalid_value", ["136x64", "128 pixels a side"]),
    (form(png(two_colour_picture(60, 64))), 400, "image", "invalid_value", ["multiple of 8"]),
    (form(png(two_colour_picture(80, 64)), size="64x64"), 400, "image", "invalid_value",
     ["80x64", "this request is 64x64"]),
    (form(PICTURE, size="4096x4096"), 400, "size", "invalid_value", ["limit of 128"]),
    (form(PICTURE, png(openai_mask(32, 32))), 400, "mask", "invalid_value", ["32x32", "64x64"]),
    (form(PICTURE, png(Image.new("RGB", (64, 64)))), 400, "mask", "invalid_value", ["transparent"]),
    (form(PICTURE, b"not a mask"), 400, "mask", "invalid_value", ["PNG, JPEG or WEBP"]),
    (form(), 400, "image", "missing_required_parameter", []),
    ({"files": [("prompt", (None, PROMPT)), ("image[]", ("a.png", PICTURE, "image/png")),
                ("image[]", ("b.png", PICTURE, "image/png"))]}, 400, "image", "invalid_value", ["2 images", "one"]),
    ({"files": {"prompt": (None, PROMPT), "image": (None, "a picture")}}, 400, "image", "invalid_type",
     ["file upload"]),
    (form(PICTURE, strength="1.5"), 400, "strength", "invalid_value", []),
    (form(PICTURE, strength="strong"), 400, "strength", "invalid_value", []),
    (form(PICTURE, strength="0.01", num_inference_steps="10"), 200, None, None, []),  # one step runs
    (form(PICTURE, strength="0", num_inference_steps="10"), 400, "strength", "invalid_value", ["no denoise step"]),
    (form(PICTURE, n="100"), 400, "n", "invalid_value", ["1..8"]),
    (form(PICTURE, seed="-1"), 400, "seed", "invalid_value", []),
    (form(PICTURE, num_inference_steps="500"), 400, "num_inference_steps", "invalid_value", ["1..100"]),
    (form(PICTURE, stream="true"), 400, "stream", "unsupported_parameter", []),
    (form(PICTURE, colour="red"), 400, "colour", "unknown_parameter", []),
    (form(PICTURE, model="dall-e-2"), 404, "model", "model_not_found", []),
    ({"files": {"prompt": (None, PROMPT), "image": ("i.png", PICTURE, "image/png"),
                "markup": ("m.png", PICTURE, "image/png")}}, 400, "markup", "unsupported_parameter", []),
    ({"json": {"prompt": PROMPT, "image": "data:image/png;base64,AAAA"}}, 415, None, "unsupported_media_type",
     ["multipart/form-data"]),
    ({**form(PICTURE), "headers": {"origin": "http://evil.example"}}, 403, None, "cross_site_request", []),
    ({**form(PICTURE), "headers": {"sec-fetch-site": "cross-site"}}, 403, None, "cross_site_request", []),
]


@pytest.mark.parametrize(("request_kwargs", "status", "param", "code", "words"), BAD_EDITS, ids=lambda v: str(v)[:50])
def test_bad_edits_get_an_openai_error_naming_the_field_and_never_run(shared_api, request_kwargs, status, param, code,
                                                                      words):
    encoded_before = len(shared_api.pipeline.encoded)
    response = shared_api.http.post("/v1/images/edits", **request_kwargs)
    if status == 200:
        assert response.status_code == 200, response.text
        return
    error = assert_openai_error(response, status, param, code)
    for word in words:
        assert word in error["message"], error
    assert len(shared_api.pipeline.encoded) == encoded_before


def test_a_picture_over_the_byte_limit_is_named_and_a_body_over_two_of_them_is_refused_unread():
    config = HttpApiConfig(max_upload_bytes=20_000)  # the body may then carry 2 x 20000 + 64 KiB
    with running_api(config=config) as api:
        error = assert_openai_error(api.http.post("/v1/images/edits", **form(PICTURE, b"x" * 30_000)), 400, "mask")
        assert "30000 bytes" in error["message"] and "at most 20000" in error["message"]
        huge = api.http.post("/v1/images/edits", **form(b"x" * 200_000))
        error = assert_openai_error(huge, 413, code="request_too_large")
        assert "20000 bytes each" in error["message"]
        assert api.engine.snapshot().stats.finished == {}
        assert api.http.post("/v1/images/edits", **form(PICTURE)).status_code == 200


def test_keys_sessions_and_the_body_deadline_are_the_generations_routes():
    keys = HttpApiConfig(api_keys={"alice": "sk-alice"}, failed_key_delay_s=0, body_timeout_s=0.3)
    with running_api(config=keys, step_delay_s=0.01) as api:
        assert_openai_error(api.http.post("/v1/images/edits", **form(PICTURE)), 401, code="invalid_api_key")
        calls = []
        call = threading.Thread(target=lambda: calls.append(api.openai("sk-alice").images.edit(
            image=("i.png", PICTURE, "image/png"), prompt=PROMPT, extra_body={"num_inference_steps": 40})))
        call.start()
        wait_until(lambda: api.engine.snapshot().running, what="the edit to start")
        assert api.engine.snapshot().running[0].session_id == "http:key:alice"
        call.join(30)
        assert len(calls[0].data) == 1
        # A body that stops halfway is answered 408 once the deadline passed; nothing runs.
        host, port = api.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /v1/images/edits HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-alice\r\n"
                         b"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 5000\r\n\r\n--b\r\n")
            answer = read_response(sock)
        assert answer.startswith("HTTP/1.1 408") and "did not arrive within 0.3 s" in answer
        assert api.engine.snapshot().stats.finished == {"completed": 1}


def test_a_model_that_makes_videos_is_refused():
    video = ToyPipeline()
    video.info = replace(video.info, name="toy-video", output_kind="video")
    engine = Engine({"toy": ToyPipeline(), "toy-video": video}).start()
    try:
        with serving(engine) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=30)
            with pytest.raises(openai.BadRequestError) as refused:
                client.images.edit(image=("i.png", PICTURE, "image/png"), prompt=PROMPT, model="toy-video")
            assert refused.value.body["param"] == "model" and "makes videos" in refused.value.body["message"]
    finally:
        engine.close()


def test_the_openai_client_sees_the_field_in_its_typed_error(shared_api):
    with pytest.raises(openai.BadRequestError) as bad:
        shared_api.openai().images.edit(image=("i.png", PICTURE, "image/png"), mask=("m.png", MASK[:50], "image/png"),
                                        prompt=PROMPT)
    assert bad.value.body["param"] == "mask"


def test_the_form_is_in_the_openapi_document(shared_api):
    body = shared_api.http.get("/v1/openapi.json").json()["paths"]["/v1/images/edits"]["post"]["requestBody"]
    schema = body["content"]["multipart/form-data"]["schema"]
    assert schema["required"] == ["image", "prompt"]
    assert {"mask", "strength", "seed", "num_inference_steps"} <= set(schema["properties"])


# ---------------------------------------------------------------------- masks, as a unit
def test_openai_masks_become_white_where_fully_transparent():
    alpha = np.array([[0, 1, 128, 255]], dtype=np.uint8)
    rgba = Image.fromarray(np.dstack([np.full((1, 4, 3), 90, np.uint8), alpha[..., None]]), "RGBA")
    converted = mask_from_transparency(rgba)
    assert converted.mode == "L"
    assert np.asarray(converted).tolist() == [[255, 0, 0, 0]]
    # Grey with alpha, and a palette picture with a transparent colour, read the same way.
    la = Image.fromarray(np.dstack([np.full((1, 4), 200, np.uint8), alpha]), "LA")
    assert np.asarray(mask_from_transparency(la)).tolist() == [[255, 0, 0, 0]]
    palette = Image.fromarray(np.array([[0, 1, 1, 0]], dtype=np.uint8), "P")
    palette.info["transparency"] = 0
    assert np.asarray(mask_from_transparency(palette)).tolist() == [[255, 0, 0, 255]]


def test_a_mask_without_transparency_is_refused_naming_the_mask():
    with pytest.raises(ParamError) as refused:
        mask_from_transparency(Image.new("RGB", (8, 8), (255, 255, 255)))
    assert refused.value.field == "mask_image" and "alpha" in str(refused.value)


def test_a_white_mask_is_taken_as_it_is():
    rgb = Image.fromarray(np.array([[[0, 0, 0], [255, 255, 255], [128, 128, 128]]], dtype=np.uint8))
    assert np.asarray(mask_from_white(rgb)).tolist() == [[0, 255, 128]]


def png_claiming(width: int, height: int) -> bytes:
    """A 1x1 PNG whose header claims width x height (its IHDR rewritten, checksum included)."""
    small = png(Image.new("L", (1, 1)))
    ihdr = b"IHDR" + struct.pack(">II", width, height) + small[24:29]
    return small[:12] + ihdr + struct.pack(">I", zlib.crc32(ihdr)) + small[33:]


@pytest.mark.parametrize("side", [6000, 20000])
def test_a_picture_claiming_huge_dimensions_is_refused_before_it_is_decoded(side):
    # A tiny file whose header claims side x side: refused on the header, no pixels made (at
    # 20000 a side Pillow's own decompression-bomb check fires first: refused all the same).
    claim = png_claiming(side, side)
    assert len(claim) < 100 and struct.unpack(">II", claim[16:24]) == (side, side)
    with pytest.raises(ParamError) as refused:
        open_upload(claim, "init_image", max_side=128, max_bytes=10**7)
    assert refused.value.field == "init_image" and "128 pixels a side" in str(refused.value)

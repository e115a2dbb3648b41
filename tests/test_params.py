"""GenerationParams rejects bad values at the boundary, naming the field and what is allowed."""

import dataclasses
import math

import pytest

from engine import Engine, GenerationParams, ServingLimits
from pipelines.errors import ParamError
from pipelines.toy import ToyPipeline


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"prompt": ""}, "prompt is empty"),
        ({"prompt": "   \n\t"}, "prompt is empty"),
        ({"prompt": 42}, "prompt must be a string"),
        ({"prompt": "x" * 2001}, "at most 2000"),
        ({"negative_prompt": "y" * 5000}, "negative_prompt is 5000 characters"),
        ({"num_inference_steps": 0}, "num_inference_steps=0 is out of range"),
        ({"num_inference_steps": -3}, "num_inference_steps=-3 is out of range"),
        ({"num_inference_steps": 2.5}, "num_inference_steps must be an integer"),
        ({"num_inference_steps": True}, "num_inference_steps must be an integer"),
        ({"width": 4}, "width=4 is out of range"),
        ({"height": 100000}, "height=100000 is out of range"),
        ({"guidance_scale": math.nan}, "guidance_scale=nan"),
        ({"guidance_scale": math.inf}, "guidance_scale=inf"),
        ({"guidance_scale": -1.0}, "guidance_scale=-1.0"),
        ({"guidance_scale": "7"}, "guidance_scale must be a number"),
        ({"seed": -1}, "seed=-1 is out of range"),
        ({"preview_every": -2}, "preview_every=-2"),
        ({"num_frames": 0}, "num_frames=0"),
    ],
)
def test_bad_values_raise_clear_errors(fields, message):
    values = {"prompt": "a red circle", **fields}
    with pytest.raises(ParamError, match=message.replace("(", r"\(").replace(".", r"\.")) as caught:
        GenerationParams(**values)
    assert caught.value.field == next(iter(fields))  # the field it is about, for front ends to point at
    assert isinstance(caught.value, ValueError) and caught.value.message == str(caught.value)


def test_good_values_are_kept_and_unset_ones_stay_none():
    p = GenerationParams(prompt="a red circle", width=64, guidance_scale=3)
    assert (p.prompt, p.width, p.height, p.guidance_scale, p.seed) == ("a red circle", 64, None, 3, None)
    assert not p.is_complete


def test_engine_fills_defaults_and_records_a_random_seed():
    engine = Engine(ToyPipeline())
    resolved = engine.prepare_params(GenerationParams(prompt="a red circle"))
    defaults = engine.info.defaults
    assert (resolved.width, resolved.height) == (defaults.width, defaults.height)
    assert resolved.num_inference_steps == defaults.num_inference_steps
    assert resolved.is_complete and 0 <= resolved.seed < 2**32
    assert engine.prepare_params(GenerationParams(prompt="a", seed=7)).seed == 7


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_inference_steps": 51}, "num_inference_steps=51 is above this server's limit: allowed is 1..50"),
        ({"width": 264}, "width=264 is above this server's limit of 256 pixels"),
        ({"width": 60}, "width=60 must be a multiple of 8"),
    ],
)
def test_server_and_model_limits_apply_before_queueing(fields, message):
    engine = Engine(ToyPipeline(), limits=ServingLimits(max_steps=50, max_size=256))
    with pytest.raises(ParamError, match=message) as caught:
        engine.submit(GenerationParams(prompt="a red circle", **fields))
    assert caught.value.field == next(iter(fields))
    assert engine.snapshot().requests == ()


# ---------------------------------------------------------------------------- requests that start from an image
def _picture(size=(64, 64), colour=(200, 40, 40), mode="RGB"):
    from PIL import Image

    return Image.new(mode, size, colour if mode == "RGB" else 255)


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"strength": 1.5}, "strength", "strength=1.5 is not allowed: use a number in 0..1"),
        ({"strength": math.nan}, "strength", "strength=nan"),
        ({"strength": "0.5"}, "strength", "strength must be a number"),
        ({"init_image": "picture.png"}, "init_image", "init_image must be a PIL image"),
        ({"init_image": "RGBA"}, "init_image", "init_image is a 'RGBA' image; it must be 'RGB'"),
        ({"mask": True}, "mask_image", "mask_image needs an init_image"),
        ({"init_image": "RGB", "width": 64, "height": 48}, "init_image",
         "init_image is 80x64; this request is 64x48: resize it or ask for 80x64"),
        ({"init_image": "RGB", "mask": (64, 64)}, "mask_image", "mask_image is 64x64; init_image is 80x64"),
    ],
)
def test_bad_image_fields_raise_errors_naming_the_field(fields, field, message):
    values = {"prompt": "a red circle"}
    for name, value in fields.items():
        if name == "init_image" and value in ("RGB", "RGBA"):
            value = _picture((80, 64), mode=value)
        if name == "mask":
            name, value = "mask_image", _picture(value if isinstance(value, tuple) else (80, 64), mode="L")
        values[name] = value
    with pytest.raises(ParamError) as caught:
        GenerationParams(**values)
    assert caught.value.field == field and message in caught.value.message


def test_params_with_images_compare_hash_and_print_by_content():
    import pickle

    a = GenerationParams(prompt="a", init_image=_picture(), strength=0.5)
    same_pixels = GenerationParams(prompt="a", init_image=_picture(), strength=0.5)
    other_pixels = GenerationParams(prompt="a", init_image=_picture(colour=(0, 0, 255)), strength=0.5)
    assert a == same_pixels and hash(a) == hash(same_pixels) and a != other_pixels
    assert a == pickle.loads(pickle.dumps(a)) == dataclasses.replace(a) == GenerationParams(**a.__dict__)
    assert dataclasses.replace(a, init_image=None) != a
    text = repr(a)
    assert "init_image=<64x64:" in text and len(text) < 400  # a digest, never the pixels
    assert a.init_image_digest.startswith("64x64:") and a.mask_image_digest is None


def test_an_init_image_sets_the_size_strength_and_steps_that_run():
    engine = Engine(ToyPipeline())
    resolved = engine.prepare_params(GenerationParams(prompt="a", init_image=_picture((64, 48)), num_inference_steps=10))
    assert (resolved.width, resolved.height, resolved.strength, resolved.denoise_steps) == (64, 48, 0.6, 6)
    # diffusers' get_timesteps rounds steps x strength up: 10 x 0.25 runs 3 steps, 10 x 0.01 one.
    for strength, steps in ((0.25, 3), (0.01, 1), (1.0, 10), (0.5, 5)):
        assert dataclasses.replace(resolved, strength=strength).denoise_steps == steps
    with pytest.raises(ParamError, match="runs no denoise step") as caught:
        engine.prepare_params(GenerationParams(prompt="a", init_image=_picture(), strength=0.0))
    assert caught.value.field == "strength"


def test_a_model_that_takes_no_images_refuses_them_by_field():
    from pipelines.interface import PipelineInfo

    toy = ToyPipeline()
    toy.info = PipelineInfo(**{**toy.info.__dict__, "image_inputs": ("init_image",)})
    engine = Engine(toy)
    picture = _picture()
    engine.prepare_params(GenerationParams(prompt="a", init_image=picture))
    with pytest.raises(ParamError, match="does not take mask_image: it takes init_image") as caught:
        engine.prepare_params(GenerationParams(prompt="a", init_image=picture, mask_image=_picture(mode="L")))
    assert caught.value.field == "mask_image"


def test_the_toy_model_starts_from_the_image_and_keeps_what_the_mask_keeps():
    import numpy as np

    from engine import Completed, Progress

    engine = Engine(ToyPipeline(), mode="step").start()
    picture = _picture()
    mask = _picture(mode="L").point(lambda v: 0)
    mask.paste(255, (32, 0, 64, 64))  # repaint the right half

    def run(**fields):
        events = list(engine.submit(GenerationParams(prompt="a blue square", seed=3, num_inference_steps=10,
                                                     **fields)).events(timeout=30))
        assert isinstance(events[-1], Completed)
        totals = {e.total for e in events if isinstance(e, Progress)}
        return np.asarray(events[-1].images[0]).astype(int), totals

    try:
        near, near_total = run(init_image=picture, strength=0.2)
        far, far_total = run(init_image=picture, strength=1.0)
        text, _ = run()
        painted, painted_total = run(init_image=picture, mask_image=mask, strength=0.8)
    finally:
        engine.close()
    original = np.asarray(picture).astype(int)
    assert (near_total, far_total, painted_total) == ({2}, {10}, {8})
    assert np.abs(near - original).mean() < 0.5 * np.abs(far - original).mean()
    assert np.array_equal(far, text)  # strength 1: pure noise at the first sigma, as text-to-image
    assert np.array_equal(painted[:, :32], original[:, :32])  # kept exactly
    assert np.abs(painted[:, 32:] - original[:, 32:]).mean() > 10  # repainted

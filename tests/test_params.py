"""GenerationParams rejects bad values at the boundary, naming the field and what is allowed."""

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

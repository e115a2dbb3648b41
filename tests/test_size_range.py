"""A model's card may name the range of sizes it makes (stepstudio.json's `size_range`): every
multiple of its size step from the smallest to the largest side. The engine takes any of them, the
server's default size limit becomes the top of the range, and a side outside it is refused naming
the range."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from engine import Completed, Engine, GenerationParams
from pipelines.errors import ParamError
from pipelines.studio_config import read_studio_config
from pipelines.toy import ToyPipeline
from studio.workflows.limits import ModelLimits


def ranged_toy() -> ToyPipeline:
    pipeline = ToyPipeline(packs=True)
    pipeline.info = replace(pipeline.info, size_range=(48, 128))
    return pipeline


def test_the_engine_serves_every_size_in_the_range_and_refuses_the_rest():
    engine = Engine(ranged_toy()).start()
    try:
        assert engine.limits.max_size == 128  # the range's top, not the default 64
        for width, height in ((48, 48), (128, 72), (72, 128), (120, 80)):
            final = engine.submit(GenerationParams(prompt="a", width=width, height=height, num_inference_steps=2, seed=1),
                                  session_id=f"{width}x{height}").result(timeout=30)
            assert isinstance(final, Completed) and final.images[0].size == (width, height)
        with pytest.raises(ParamError, match="width=40 is not a size toy makes: each side from 48 to 128") as low:
            engine.submit(GenerationParams(prompt="a", width=40, height=64))
        assert low.value.field == "width"
        with pytest.raises(ParamError, match="height=136 is not a size toy makes") as high:
            engine.submit(GenerationParams(prompt="a", width=64, height=136))
        assert high.value.field == "height"
    finally:
        engine.close()


def test_a_workflow_size_outside_the_range_is_refused_at_its_node():
    limits = ModelLimits(name="shapes-flux", max_size=128, size_multiple=8, size_range=(48, 128))
    limits.check({"width": 96, "height": 48})
    with pytest.raises(ParamError, match="height=32 is not a size shapes-flux makes"):
        limits.check({"width": 96, "height": 32})


@pytest.mark.parametrize("value", [[48], [128, 48], [0, 64], ["48", 128], [True, 64]])
def test_a_bad_size_range_in_stepstudio_json_is_refused(tmp_path, value):
    (tmp_path / "stepstudio.json").write_text(json.dumps({"size_range": value}))
    with pytest.raises(ValueError, match="size_range must be"):
        read_studio_config(tmp_path)


def test_size_range_is_read_from_stepstudio_json(tmp_path):
    (tmp_path / "stepstudio.json").write_text(json.dumps({"size_range": [48, 128]}))
    assert read_studio_config(tmp_path).size_range == (48, 128)


def test_the_server_size_limit_takes_the_largest_of_the_card_s_sizes():
    from engine.limits import ServingLimits

    pipeline = ToyPipeline()
    info = replace(pipeline.info, supported_sizes=((64, 64), (96, 64)))
    assert (info.defaults.width, info.defaults.height) == (64, 64)
    assert ServingLimits().resolved_for(info).max_size == 96  # not the default size's 64
    assert ServingLimits().resolved_for(pipeline.info).max_size == 64

"""One engine, several models: the model is part of the batch key, each model's defaults and
limits apply to its requests, and groups of different models take turns."""

from __future__ import annotations

import pytest

from engine import Completed, Engine, GenerationParams, ServingLimits
from engine.models import ModelBatchKey
from pipelines.interface import ModelDefaults
from pipelines.toy import ToyPipeline
from tests.engine_helpers import engine_started_after

IMAGE_DEFAULTS = ModelDefaults(width=64, height=64, num_inference_steps=4, guidance_scale=1.0)
WIDE_DEFAULTS = ModelDefaults(width=128, height=64, num_inference_steps=6, guidance_scale=1.0)


def two_models() -> tuple[ToyPipeline, ToyPipeline]:
    return ToyPipeline(defaults=IMAGE_DEFAULTS), ToyPipeline(defaults=WIDE_DEFAULTS)


def test_models_are_named_and_the_first_is_the_default():
    first, second = two_models()
    engine = Engine([first, second])
    assert engine.models.names == ("toy", "toy-2") and engine.pipeline is first
    assert engine.info is first.info and engine.infos == {"toy": first.info, "toy-2": second.info}
    named = Engine({"small": first, "wide": second})
    assert named.models.names == ("small", "wide")
    assert named.prepare_params(GenerationParams(prompt="x")).model == "small"


def test_each_model_fills_in_its_own_defaults_and_limits():
    first, second = two_models()
    engine = Engine({"small": first, "wide": second}, limits=ServingLimits())
    small = engine.prepare_params(GenerationParams(prompt="x", seed=1))
    wide = engine.prepare_params(GenerationParams(prompt="x", seed=1, model="wide"))
    assert (small.width, small.num_inference_steps) == (64, 4)
    assert (wide.width, wide.num_inference_steps) == (128, 6)
    # An unset max size is each model's own size.
    assert (engine.limits_for("small").max_size, engine.limits_for("wide").max_size) == (64, 128)
    with pytest.raises(ValueError, match="width=128 is above this server's limit of 64 pixels"):
        engine.prepare_params(GenerationParams(prompt="x", width=128, height=64))
    with pytest.raises(ValueError, match=r"model='video' is not loaded here; the loaded models are: small, wide\."):
        engine.prepare_params(GenerationParams(prompt="x", model="video"))
    assert engine.prepare(small).batch_key == ModelBatchKey("small", first.batch_key(small))


def test_models_never_share_a_forward_and_take_turns():
    order: list[str] = []
    first = ToyPipeline(defaults=IMAGE_DEFAULTS, on_forward=lambda i, batch: order.append("small"))
    second = ToyPipeline(defaults=WIDE_DEFAULTS, on_forward=lambda i, batch: order.append("wide"))
    submissions = [(GenerationParams(prompt=f"small {i}", seed=i, model="small"), "a") for i in range(2)]
    submissions += [(GenerationParams(prompt=f"wide {i}", seed=i, model="wide", width=64), "b") for i in range(2)]
    with engine_started_after(submissions, pipeline={"small": first, "wide": second}) as (engine, handles):
        finals = [handle.result(timeout=30) for handle in handles]
    assert all(isinstance(final, Completed) for final in finals)
    small_ids = {h.request_id for h in handles[:2]}
    wide_ids = {h.request_id for h in handles[2:]}
    # Each pipeline ran only its own requests, both of them in every one of its forwards.
    assert [set(rows) for rows in first.forward_log] == [small_ids] * 4
    assert [set(rows) for rows in second.forward_log] == [wide_ids] * 6
    # The two groups took turns: the engine's forwards alternated while both had work.
    assert order == ["small", "wide"] * 4 + ["wide"] * 2
    assert [f.params.model for f in finals] == ["small", "small", "wide", "wide"]
    assert [f.params.num_inference_steps for f in finals] == [4, 4, 6, 6]


def test_a_model_card_that_names_its_sizes_is_served_at_those_only(tmp_path):
    from pipelines.loader import load_pipeline
    from pipelines.studio_config import read_studio_config

    builtin = load_pipeline("builtin")
    assert builtin.info.supported_sizes == ((64, 64),)
    engine = Engine(builtin, limits=ServingLimits(max_size=256))
    assert engine.prepare_params(GenerationParams(prompt="a red circle")).width == 64
    with pytest.raises(ValueError, match=r"width=32, height=32 is not a size shapes-flux makes: allowed is 64x64\."):
        engine.prepare_params(GenerationParams(prompt="a red circle", width=32, height=32))
    (tmp_path / "stepstudio.json").write_text('{"sizes": ["64x64", "big"]}')
    with pytest.raises(ValueError, match=r"sizes must be a list of \"WIDTHxHEIGHT\" texts like \"64x64\", got 'big'"):
        read_studio_config(tmp_path)

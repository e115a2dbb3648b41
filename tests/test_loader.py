"""Loading: device/dtype choice, clear errors, optional compile + warm-up."""

import json

import pytest
import torch

from engine import Engine, GenerationParams
from engine.warmup import warm_up
from pipelines.loader import (
    LoadOptions,
    compile_denoiser,
    load_pipeline,
    resolve_device_dtype,
)
from pipelines.toy import ToyPipeline


def test_cpu_defaults_to_float32_and_dtype_names_are_checked():
    if not torch.cuda.is_available():
        assert resolve_device_dtype(LoadOptions()) == (torch.device("cpu"), torch.float32)
    assert resolve_device_dtype(LoadOptions(device="cpu", dtype="bf16"))[1] == torch.bfloat16
    with pytest.raises(ValueError, match="dtype='float8' is not supported"):
        resolve_device_dtype(LoadOptions(dtype="float8"))


def test_missing_and_unsupported_folders_give_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="has no model_index.json"):
        load_pipeline(str(tmp_path))
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "KandinskyPipeline"}))
    with pytest.raises(ValueError, match="'KandinskyPipeline' is not supported by stepstudio; supported classes are: Flux"):
        load_pipeline(str(tmp_path))
    (tmp_path / "model_index.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_pipeline(str(tmp_path))


def test_an_unknown_hub_id_offline_says_so(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="could not download 'nobody/no-such-model'.*pass its local folder"):
        load_pipeline("nobody/no-such-model")


def test_compile_needs_a_denoiser_and_warm_up_runs_each_size():
    with pytest.raises(ValueError, match="ToyPipeline has no transformer or unet"):
        compile_denoiser(ToyPipeline())
    pipeline = ToyPipeline()
    engine = Engine(pipeline).start()
    try:
        times = warm_up(engine, [(64, 64), (32, 48)])
    finally:
        engine.close()
    assert len(times) == 2 and all(t > 0 for t in times)
    assert [len(f) for f in pipeline.forward_log] == [1, 1, 1, 1]


def test_attention_is_sdpa_on_cpu_and_flash_is_never_required():
    from diffusers import FluxTransformer2DModel

    from pipelines.attention import select_attention_backend

    tiny = FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
                                  attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                  pooled_projection_dim=32, axes_dims_rope=(4, 6, 6))
    assert select_attention_backend(tiny, torch.device("cpu"), torch.float32) == "native"
    # Even asking for half precision on CPU never picks flash-attn.
    assert select_attention_backend(tiny, torch.device("cpu"), torch.bfloat16) == "native"
    assert select_attention_backend(tiny, torch.device("cpu"), torch.float32, requested="native") == "native"


@pytest.mark.slow
def test_a_compiled_denoiser_gives_the_same_image(tmp_path):
    import numpy as np

    from engine import GenerationParams
    from tests.tiny_checkpoints import build_tiny_flux

    folder = build_tiny_flux(tmp_path / "flux", studio_config={"height": 32, "width": 32, "max_sequence_length": 16})
    images = []
    for compiled in (False, True):
        engine = Engine(load_pipeline(str(folder), LoadOptions(compile_denoiser=compiled))).start()
        try:
            warm_up(engine, [(32, 32)])
            final = engine.submit(GenerationParams(prompt="a red circle", num_inference_steps=3, seed=1)).result(600)
        finally:
            engine.close()
        images.append(np.asarray(final.images[0], np.int16))
    assert np.abs(images[0] - images[1]).max() <= 1


def test_the_prompt_cache_size_is_a_load_option():
    assert load_pipeline("toy").prompt_cache.capacity == LoadOptions().prompt_cache_size == 32
    pipeline = load_pipeline("toy", LoadOptions(prompt_cache_size=0))
    engine = Engine(pipeline).start()
    try:
        for seed in (1, 2):
            engine.submit(GenerationParams(prompt="a red circle", num_inference_steps=2, seed=seed)).result(30)
    finally:
        engine.close()
    assert pipeline.text_encoder_calls == [("a red circle",), ("a red circle",)]  # nothing kept
    with pytest.raises(ValueError, match="prompt_cache_size=-1 must be 0"):
        load_pipeline("toy", LoadOptions(prompt_cache_size=-1))


def test_every_family_is_built_the_same_way():
    import inspect

    from pipelines.loader import FAMILIES, family_class
    from pipelines.wan import WanStepPipeline

    assert family_class("WanPipeline") is WanStepPipeline
    for class_name in FAMILIES:
        parameters = list(inspect.signature(family_class(class_name).__init__).parameters)
        assert parameters == ["self", "pipe", "device", "name", "studio", "scheduler"], class_name

"""The Qwen-Image step pipeline reproduces diffusers' QwenImagePipeline.

A tiny random-weight checkpoint (tests/tiny_qwen_image_model.py) is loaded through
`pipelines.loader.load_pipeline` into our engine and as the plain diffusers pipeline. Our
true CFG runs the positive and negative prompts (of different token counts, padded and
masked) in ONE forward with every other request; `__call__` runs two unpadded forwards.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import QwenImagePipeline

from engine import Engine, GenerationParams, Progress
from pipelines.loader import load_pipeline
from pipelines.qwen_image import QwenImageStepPipeline
from tests.pipeline_parity import Run, assert_same, finished, run_joining_together
from tests.tiny_qwen_image_model import build_tiny_qwen_image


def qwen_params(**overrides) -> GenerationParams:
    values = dict(prompt="a red circle", width=32, height=32, num_inference_steps=4, guidance_scale=1.0, seed=1)
    values.update(overrides)
    return GenerationParams(**values)


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory):
    return build_tiny_qwen_image(tmp_path_factory.mktemp("tiny-qwen-image") / "model")


@pytest.fixture(scope="module")
def qwen_pipeline(qwen_folder):
    return load_pipeline(str(qwen_folder))


@pytest.fixture(scope="module")
def qwen_reference(qwen_folder):
    pipe = QwenImagePipeline.from_pretrained(qwen_folder, use_safetensors=True)
    pipe.set_progress_bar_config(disable=True)

    def run(params: GenerationParams) -> tuple[torch.Tensor, np.ndarray]:
        final = {}

        def keep_latents(pipe, step, timestep, tensors):
            final["latents"] = tensors["latents"].clone()
            return {}

        image = pipe(
            prompt=params.prompt,
            negative_prompt=params.negative_prompt,
            true_cfg_scale=params.guidance_scale,
            width=params.width,
            height=params.height,
            num_inference_steps=params.num_inference_steps,
            generator=torch.Generator("cpu").manual_seed(params.seed),
            callback_on_step_end=keep_latents,
        ).images[0]
        return final["latents"], np.asarray(image)

    return run


def test_loader_picks_qwen_image_with_true_cfg_defaults(qwen_pipeline):
    assert isinstance(qwen_pipeline, QwenImageStepPipeline)
    info = qwen_pipeline.info
    assert info.schedulers == ("flow-match-euler",)
    assert info.size_multiple == 8  # tiny VAE factor 4 x 2x2 latent patches
    assert info.defaults.negative_prompt == " " and info.defaults.guidance_scale == 4.0  # CFG on by default


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"scheduler": "euler"}, r"scheduler='euler' is not a noise scheduler.*allowed are: flow-match-euler"),
        ({"width": 36}, r"width=36 is not allowed: .* needs a multiple of 8"),
        ({"num_frames": 3}, r"num_frames=3 is not allowed: .* use 1"),
    ],
)
def test_model_limits_are_checked_at_submission(qwen_pipeline, overrides, message):
    with pytest.raises(ValueError, match=message):
        Engine(qwen_pipeline).submit(qwen_params(**overrides))


def test_cfg_needs_a_negative_prompt_and_a_scale_above_one(qwen_pipeline):
    key = qwen_pipeline.batch_key
    with_cfg = key(qwen_params(guidance_scale=4.0, negative_prompt=" "))
    assert with_cfg == key(qwen_params(guidance_scale=7.0, negative_prompt="blurry", prompt="x", seed=9))
    assert with_cfg != key(qwen_params(guidance_scale=4.0, negative_prompt=None))
    assert with_cfg != key(qwen_params(guidance_scale=1.0, negative_prompt=" "))


@pytest.mark.parametrize(
    "guidance_scale, negative_prompt",
    [(1.0, None), (4.0, " "), (4.0, "blurry, dark and of low quality")],
)
def test_one_request_matches_diffusers(qwen_pipeline, qwen_reference, guidance_scale, negative_prompt):
    params = qwen_params(guidance_scale=guidance_scale, negative_prompt=negative_prompt, seed=3, preview_every=2)
    with Run(qwen_pipeline) as run:
        handle = run.submit(params)
        ours = finished(run, handle)
    assert_same(ours, qwen_reference(params))
    assert set(run.forward_sizes) == {1}  # CFG rows are in the same forward, not a second one
    previews = [e.preview for e in handle.events(timeout=5) if isinstance(e, Progress) and e.preview is not None]
    assert [p.size for p in previews] == [(8, 8)]  # after step 2 of 4; one pixel per latent cell


def test_co_batched_requests_match_each_run_alone(qwen_pipeline, qwen_reference):
    first = qwen_params(prompt="a red circle", seed=11, num_inference_steps=6, guidance_scale=4.0, negative_prompt=" ")
    second = qwen_params(prompt="two small green birds on a branch", seed=22, num_inference_steps=3,
                         guidance_scale=6.5, negative_prompt="blurry")
    third = qwen_params(prompt="a blue square", seed=33, num_inference_steps=4, guidance_scale=2.0,
                        negative_prompt="dark, grainy, washed out colours")
    # `second` joins after two steps of `first`, `third` after the next one.
    with Run(qwen_pipeline, arrivals={2: second, 3: third}) as run:
        finished(run, run.submit(first))  # the longest: the others arrived meanwhile
        results = [finished(run, handle) for handle in run.handles]
    assert run.forward_sizes[:4] == [1, 1, 2, 3], run.forward_sizes
    for params, ours in zip((first, second, third), results):
        assert_same(ours, qwen_reference(params), co_batched=True)


def test_requests_joining_one_step_share_one_text_encoding(qwen_pipeline, qwen_reference, monkeypatch):
    # Texts of different token counts: the batched encoding pads them; each keeps its own length.
    requests = [
        qwen_params(prompt="a red circle", seed=4, guidance_scale=4.0, negative_prompt=" "),
        qwen_params(prompt="two small green birds on a branch", seed=5, guidance_scale=3.0, negative_prompt=" "),
    ]
    results, calls = run_joining_together(qwen_pipeline, requests, monkeypatch)
    assert calls == [["a red circle", " ", "two small green birds on a branch"]]
    lengths = [qwen_pipeline.prompt_cache.encode(text).shape[1] for text in calls[0]]
    assert len(set(lengths)) == 3  # three different token counts came out of one padded call
    for params, ours in zip(requests, results):
        assert_same(ours, qwen_reference(params), co_batched=True)

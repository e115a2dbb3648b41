"""Stable Diffusion 1.x and SDXL step pipelines reproduce diffusers' own pipelines.

Tiny random-weight checkpoints (tests/tiny_unet_models.py) are loaded twice from the same
folder: through `pipelines.loader.load_pipeline` into our engine, and as the plain diffusers
pipeline as the reference. Same seed and settings must give the same final latents (to float
noise) and the same uint8 image; co-batched with other requests, the float noise may move a
pixel by one uint8 level.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from diffusers import (
    DDIMScheduler,
    DPMSolverMultistepScheduler,
    EulerAncestralDiscreteScheduler,
    EulerDiscreteScheduler,
    PNDMScheduler,
    StableDiffusionPipeline,
    StableDiffusionXLPipeline,
    UniPCMultistepScheduler,
)

from engine import Engine, GenerationParams, Progress
from pipelines.loader import LoadOptions, load_pipeline
from pipelines.sdxl import StableDiffusionXLStepPipeline
from pipelines.stable_diffusion import StableDiffusionStepPipeline
from tests.pipeline_parity import Run, assert_same, finished, run_joining_together
from tests.tiny_unet_models import build_tiny_sd, build_tiny_sdxl

# The diffusers class each scheduler name must stand for (None: the checkpoint's own).
REFERENCE_SCHEDULERS = {
    None: None,
    "euler": EulerDiscreteScheduler,
    "euler-a": EulerAncestralDiscreteScheduler,
    "dpm++2m": DPMSolverMultistepScheduler,
    "unipc": UniPCMultistepScheduler,
    "ddim": DDIMScheduler,
    "pndm": PNDMScheduler,
}


class Reference:
    """A plain diffusers pipeline that reports its final latents next to its image."""

    def __init__(self, pipe) -> None:
        self.pipe = pipe
        self.pipe.set_progress_bar_config(disable=True)
        self.checkpoint_scheduler = copy.deepcopy(pipe.scheduler)

    def __call__(self, params: GenerationParams) -> tuple[torch.Tensor, np.ndarray]:
        scheduler_class = REFERENCE_SCHEDULERS[params.scheduler]
        if scheduler_class is None:
            self.pipe.scheduler = copy.deepcopy(self.checkpoint_scheduler)
        else:
            self.pipe.scheduler = scheduler_class.from_config(self.checkpoint_scheduler.config)
        final = {}

        def keep_latents(pipe, step, timestep, tensors):
            final["latents"] = tensors["latents"].clone()
            return {}

        image = self.pipe(
            prompt=params.prompt,
            negative_prompt=params.negative_prompt,
            width=params.width,
            height=params.height,
            num_inference_steps=params.num_inference_steps,
            guidance_scale=params.guidance_scale,
            generator=torch.Generator("cpu").manual_seed(params.seed),
            callback_on_step_end=keep_latents,
        ).images[0]
        return final["latents"], np.asarray(image)


def sd_params(**overrides) -> GenerationParams:
    values = dict(prompt="a red circle", width=32, height=32, num_inference_steps=4, guidance_scale=1.0, seed=1)
    values.update(overrides)
    return GenerationParams(**values)


# ------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def sd_folder(tmp_path_factory):
    return build_tiny_sd(tmp_path_factory.mktemp("tiny-sd") / "model")


@pytest.fixture(scope="module")
def sdxl_folder(tmp_path_factory):
    return build_tiny_sdxl(tmp_path_factory.mktemp("tiny-sdxl") / "model")


@pytest.fixture(scope="module")
def sd_pipeline(sd_folder):
    return load_pipeline(str(sd_folder))


@pytest.fixture(scope="module")
def sd_reference(sd_folder):
    return Reference(StableDiffusionPipeline.from_pretrained(sd_folder, use_safetensors=True, safety_checker=None))


@pytest.fixture(scope="module")
def sdxl_pipeline(sdxl_folder):
    return load_pipeline(str(sdxl_folder))


@pytest.fixture(scope="module")
def sdxl_reference(sdxl_folder):
    return Reference(StableDiffusionXLPipeline.from_pretrained(sdxl_folder, use_safetensors=True))


# ------------------------------------------------------------------ loading and validation
def test_loader_picks_the_family_and_describes_it(sd_pipeline, sdxl_pipeline):
    assert isinstance(sd_pipeline, StableDiffusionStepPipeline)
    assert type(sdxl_pipeline) is StableDiffusionXLStepPipeline
    for pipeline in (sd_pipeline, sdxl_pipeline):
        assert set(REFERENCE_SCHEDULERS) - {None} <= set(pipeline.info.schedulers)
        assert pipeline.info.size_multiple == 2  # the tiny VAE downsamples twice
        assert pipeline.info.uses_negative_prompt
    assert sd_pipeline.info.defaults.guidance_scale == 7.5
    assert sdxl_pipeline.info.defaults.guidance_scale == 5.0
    assert sd_pipeline.info.extras["default_scheduler"] == "pndm"  # the checkpoint's own
    assert sdxl_pipeline.info.extras["default_scheduler"] == "euler"


def test_unknown_scheduler_is_a_clear_error(sd_pipeline, sd_folder):
    engine = Engine(sd_pipeline)
    with pytest.raises(ValueError, match=r"scheduler='warp-drive'.*allowed are: euler, euler-a, dpm\+\+2m"):
        engine.submit(sd_params(scheduler="warp-drive"))
    with pytest.raises(ValueError, match=r"scheduler='warp-drive'.*allowed are"):
        load_pipeline(str(sd_folder), LoadOptions(scheduler="warp-drive"))


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"width": 33}, r"width=33 is not allowed: .* needs a multiple of 2"),
        ({"height": 31}, r"height=31 is not allowed: .* needs a multiple of 2"),
        ({"num_frames": 2}, r"num_frames=2 is not allowed: .* use 1"),
    ],
)
def test_model_limits_are_checked_at_submission(sd_pipeline, overrides, message):
    with pytest.raises(ValueError, match=message):
        Engine(sd_pipeline).submit(sd_params(**overrides))


def test_batch_key_ignores_per_request_settings(sd_pipeline):
    key = sd_pipeline.batch_key
    base = sd_params(num_frames=1, guidance_scale=3.0)
    assert key(base) == key(sd_params(num_frames=1, guidance_scale=9.0, seed=7, num_inference_steps=9,
                                      scheduler="euler-a", prompt="a blue square"))
    assert key(base) != key(sd_params(num_frames=1, guidance_scale=1.0))  # CFG on vs off
    assert key(base) != key(sd_params(num_frames=1, guidance_scale=3.0, width=40))


# ------------------------------------------------------------------ parity, one request
@pytest.mark.parametrize(
    "scheduler, guidance_scale, negative_prompt",
    [
        (None, 1.0, None),  # the checkpoint's PNDM (one step more than asked)
        ("euler", 1.0, None),
        ("euler-a", 6.0, "blurry, dark"),  # stochastic: noise from the request's generator
        ("dpm++2m", 6.0, "blurry, dark"),  # multistep: history in the request's scheduler
        ("unipc", 1.0, None),
        ("ddim", 6.0, None),  # CFG with the empty negative prompt
    ],
)
def test_one_request_matches_diffusers(sd_pipeline, sd_reference, scheduler, guidance_scale, negative_prompt):
    params = sd_params(scheduler=scheduler, guidance_scale=guidance_scale, negative_prompt=negative_prompt, seed=3)
    with Run(sd_pipeline) as run:
        ours = finished(run, run.submit(params))
    assert_same(ours, sd_reference(params))
    assert run.forward_sizes and set(run.forward_sizes) == {1}


def test_negative_prompt_changes_the_image(sd_pipeline):
    with Run(sd_pipeline) as run:
        plain = finished(run, run.submit(sd_params(guidance_scale=6.0, scheduler="euler")))
        negative = finished(run, run.submit(sd_params(guidance_scale=6.0, scheduler="euler", negative_prompt="dark")))
    assert (plain[0] - negative[0]).abs().max().item() > 1e-3


def test_progress_counts_every_scheduler_step_and_previews_are_small(sd_pipeline):
    # PNDM's PLMS runs num_inference_steps + 1 steps; DPM++ has no pred_original_sample.
    for scheduler, steps_taken in ((None, 5), ("dpm++2m", 4), ("euler", 4)):
        with Run(sd_pipeline) as run:
            handle = run.submit(sd_params(scheduler=scheduler, preview_every=1))
            events = [e for e in handle.events(timeout=60) if isinstance(e, Progress)]
        assert [(e.step, e.total) for e in events] == [(i, steps_taken) for i in range(1, steps_taken + 1)]
        previews = [e.preview for e in events if e.preview is not None]
        assert len(previews) == steps_taken - 1  # the last step sends the image instead
        assert all(p.size == (16, 16) and p.mode == "RGB" for p in previews)  # one pixel per latent cell


# ------------------------------------------------------------------ parity, co-batched
def test_co_batched_requests_match_each_run_alone(sd_pipeline, sd_reference):
    first = sd_params(prompt="a red circle", seed=11, num_inference_steps=6, guidance_scale=5.0,
                      negative_prompt="blurry", scheduler="dpm++2m")
    second = sd_params(prompt="a green square", seed=22, num_inference_steps=4, guidance_scale=8.0,
                       scheduler="euler-a")
    third = sd_params(prompt="two blue stars", seed=33, num_inference_steps=5, guidance_scale=3.0,
                      negative_prompt="grey", scheduler="unipc")
    # `second` joins after two steps of `first`, `third` after the next one.
    with Run(sd_pipeline, arrivals={2: second, 3: third}) as run:
        finished(run, run.submit(first))  # the longest: the others arrived meanwhile
        results = [finished(run, handle) for handle in run.handles]
    assert run.forward_sizes[:4] == [1, 1, 2, 3], run.forward_sizes
    for params, ours in zip((first, second, third), results):
        assert_same(ours, sd_reference(params), co_batched=True)


def test_requests_joining_one_step_share_one_text_encoding(sd_pipeline, sd_reference, monkeypatch):
    requests = [
        sd_params(prompt="a red circle", seed=4, guidance_scale=6.0, negative_prompt="blurry", scheduler="euler"),
        sd_params(prompt="a green square", seed=5, guidance_scale=6.0, scheduler="euler"),  # "" as __call__
        sd_params(prompt="a red circle", seed=6, guidance_scale=6.0, negative_prompt="blurry", scheduler="euler"),
    ]
    results, calls = run_joining_together(sd_pipeline, requests, monkeypatch)
    assert calls == [["a red circle", "blurry", "a green square", ""]]
    for params, ours in zip(requests, results):
        assert_same(ours, sd_reference(params), co_batched=True)


# ------------------------------------------------------------------ SDXL
@pytest.mark.parametrize(
    "scheduler, guidance_scale, negative_prompt",
    [(None, 5.0, None), ("euler-a", 1.0, None), ("unipc", 6.0, "blurry")],
)
def test_sdxl_one_request_matches_diffusers(sdxl_pipeline, sdxl_reference, scheduler, guidance_scale, negative_prompt):
    params = sd_params(scheduler=scheduler, guidance_scale=guidance_scale, negative_prompt=negative_prompt, seed=5)
    with Run(sdxl_pipeline) as run:
        ours = finished(run, run.submit(params))
    assert_same(ours, sdxl_reference(params))


def test_sdxl_co_batched_requests_match_each_run_alone(sdxl_pipeline, sdxl_reference):
    first = sd_params(prompt="a red circle", seed=1, num_inference_steps=5, guidance_scale=5.0, scheduler="euler")
    second = sd_params(prompt="a blue square", seed=2, num_inference_steps=3, guidance_scale=7.0,
                       negative_prompt="dark", scheduler="ddim")
    with Run(sdxl_pipeline, arrivals={1: second}) as run:
        finished(run, run.submit(first))  # the longest: the other arrived meanwhile
        results = [finished(run, handle) for handle in run.handles]
    assert run.forward_sizes[:2] == [1, 2], run.forward_sizes
    for params, ours in zip((first, second), results):
        assert_same(ours, sdxl_reference(params), co_batched=True)


def test_sdxl_requests_joining_one_step_share_one_text_encoding(sdxl_pipeline, sdxl_reference, monkeypatch):
    assert sdxl_pipeline.pipe.config.force_zeros_for_empty_prompt
    requests = [
        sd_params(prompt="a red circle", seed=7, guidance_scale=5.0, negative_prompt="dark", scheduler="euler"),
        # No negative prompt: __call__ zeroes the unconditional embeddings, nothing is encoded.
        sd_params(prompt="a blue square", seed=8, guidance_scale=5.0, scheduler="euler"),
        sd_params(prompt="two stars", seed=9, guidance_scale=5.0, negative_prompt="", scheduler="euler"),
    ]
    results, calls = run_joining_together(sdxl_pipeline, requests, monkeypatch)
    assert calls == [["a red circle", "dark", "a blue square", "two stars", ""]]
    for params, ours in zip(requests, results):
        assert_same(ours, sdxl_reference(params), co_batched=True)

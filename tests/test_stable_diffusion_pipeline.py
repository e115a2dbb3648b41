"""Stable Diffusion 1.x and SDXL step pipelines reproduce diffusers' own pipelines.

Tiny random-weight checkpoints (tests/tiny_checkpoints.py) are loaded twice from the same
folder: through `pipelines.loader.load_pipeline` into our engine, and as the plain diffusers
pipeline as the reference. Same seed and settings must give the same final latents (to the
float tolerance of tests/pipeline_parity.py) and the same uint8 image (one level apart at most
where the latents are not bitwise equal).
"""

from __future__ import annotations

import pytest
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
from tests.pipeline_parity import (
    Reference,
    Run,
    TinyFamily,
    assert_same,
    finished,
    request,
    run_joining_together,
)
from tests.tiny_checkpoints import build_tiny_sd, build_tiny_sdxl

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


class UNetReference(Reference):
    """The stock pipeline with the noise scheduler a request names."""

    def __init__(self, pipe) -> None:
        super().__init__(pipe, lambda p: {"negative_prompt": p.negative_prompt, "guidance_scale": p.guidance_scale})

    def __call__(self, params: GenerationParams, output_type: str = "pil", scheduler=None):
        scheduler_class = REFERENCE_SCHEDULERS[params.scheduler]
        if scheduler_class is not None:
            scheduler = scheduler_class.from_config(self.checkpoint_scheduler.config)
        return super().__call__(params, output_type, scheduler)


# ------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def sd(tmp_path_factory):
    folder = build_tiny_sd(tmp_path_factory.mktemp("tiny-sd") / "model")
    stock = StableDiffusionPipeline.from_pretrained(folder, use_safetensors=True, safety_checker=None)
    return TinyFamily(folder, load_pipeline(str(folder)), UNetReference(stock))


@pytest.fixture(scope="module")
def sdxl(tmp_path_factory):
    folder = build_tiny_sdxl(tmp_path_factory.mktemp("tiny-sdxl") / "model")
    stock = StableDiffusionXLPipeline.from_pretrained(folder, use_safetensors=True)
    return TinyFamily(folder, load_pipeline(str(folder)), UNetReference(stock))


# ------------------------------------------------------------------ loading and validation
def test_loader_picks_the_family_and_describes_it(sd, sdxl):
    assert isinstance(sd.pipeline, StableDiffusionStepPipeline)
    assert type(sdxl.pipeline) is StableDiffusionXLStepPipeline
    for pipeline in (sd.pipeline, sdxl.pipeline):
        assert set(REFERENCE_SCHEDULERS) - {None} <= set(pipeline.info.schedulers)
        assert pipeline.info.size_multiple == 2  # the tiny VAE downsamples twice
        assert pipeline.info.uses_negative_prompt
    assert sd.pipeline.info.defaults.guidance_scale == 7.5
    assert sdxl.pipeline.info.defaults.guidance_scale == 5.0
    assert sd.pipeline.info.extras["default_scheduler"] == "pndm"  # the checkpoint's own
    assert sdxl.pipeline.info.extras["default_scheduler"] == "euler"


def test_unknown_scheduler_is_a_clear_error(sd):
    engine = Engine(sd.pipeline)
    with pytest.raises(ValueError, match=r"scheduler='warp-drive'.*allowed are: euler, euler-a, dpm\+\+2m"):
        engine.submit(request(scheduler="warp-drive"))
    with pytest.raises(ValueError, match=r"scheduler='warp-drive'.*allowed are"):
        load_pipeline(str(sd.folder), LoadOptions(scheduler="warp-drive"))


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"width": 33}, r"width=33 is not allowed: .* needs a multiple of 2"),
        ({"height": 31}, r"height=31 is not allowed: .* needs a multiple of 2"),
        ({"num_frames": 2}, r"num_frames=2 is not allowed: .* use 1"),
    ],
)
def test_model_limits_are_checked_at_submission(sd, overrides, message):
    with pytest.raises(ValueError, match=message):
        Engine(sd.pipeline).submit(request(**overrides))


def test_batch_key_ignores_per_request_settings(sd):
    key = sd.pipeline.batch_key
    base = request(num_frames=1, guidance_scale=3.0)
    assert key(base) == key(request(num_frames=1, guidance_scale=9.0, seed=7, num_inference_steps=9,
                                      scheduler="euler-a", prompt="a blue square"))
    assert key(base) == key(request(num_frames=1, guidance_scale=1.0))  # CFG is per row (pipelines/cfg.py)
    assert key(base) != key(request(num_frames=1, guidance_scale=3.0, width=40))


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
def test_one_request_matches_diffusers(sd, scheduler, guidance_scale, negative_prompt):
    params = request(scheduler=scheduler, guidance_scale=guidance_scale, negative_prompt=negative_prompt, seed=3)
    with Run(sd.pipeline) as run:
        ours = finished(run, run.submit(params))
    assert_same(ours, sd.reference(params))
    # One forward per step; with CFG [negative, positive] in it, as __call__.
    assert set(run.forwards.rows) == {2 if guidance_scale > 1 else 1}


def test_negative_prompt_changes_the_image(sd):
    with Run(sd.pipeline) as run:
        plain = finished(run, run.submit(request(guidance_scale=6.0, scheduler="euler")))
        negative = finished(run, run.submit(request(guidance_scale=6.0, scheduler="euler", negative_prompt="dark")))
    assert (plain[0] - negative[0]).abs().max().item() > 1e-3


def test_progress_counts_every_scheduler_step_and_previews_are_small(sd):
    # PNDM's PLMS runs num_inference_steps + 1 steps; DPM++ has no pred_original_sample.
    for scheduler, steps_taken in ((None, 5), ("dpm++2m", 4), ("euler", 4)):
        with Run(sd.pipeline) as run:
            handle = run.submit(request(scheduler=scheduler, preview_every=1))
            events = [e for e in handle.events(timeout=60) if isinstance(e, Progress)]
        assert [(e.step, e.total) for e in events] == [(i, steps_taken) for i in range(1, steps_taken + 1)]
        previews = [e.preview for e in events if e.preview is not None]
        assert len(previews) == steps_taken - 1  # the last step sends the image instead
        assert all(p.size == (16, 16) and p.mode == "RGB" for p in previews)  # one pixel per latent cell


# ------------------------------------------------------------------ parity, co-batched
def test_co_batched_requests_match_each_run_alone(sd):
    first = request(prompt="a red circle", seed=11, num_inference_steps=6, guidance_scale=5.0,
                      negative_prompt="blurry", scheduler="dpm++2m")
    second = request(prompt="a green square", seed=22, num_inference_steps=4, guidance_scale=1.0,
                       scheduler="euler-a")  # no CFG: one row among the others' two
    third = request(prompt="two blue stars", seed=33, num_inference_steps=5, guidance_scale=3.0,
                      negative_prompt="grey", scheduler="unipc")
    # `second` joins after two steps of `first`, `third` after the next one.
    with Run(sd.pipeline, arrivals={2: second, 3: third}) as run:
        finished(run, run.submit(first))  # the longest: the others arrived meanwhile
        results = [finished(run, handle) for handle in run.handles]
    assert run.forward_sizes[:4] == [1, 1, 2, 3], run.forward_sizes
    assert run.forwards.rows == [2, 2, 3, 5, 5, 5, 2, 2], run.forwards.steps
    for params, ours in zip((first, second, third), results):
        assert_same(ours, sd.reference(params))


def test_requests_joining_one_step_share_one_text_encoding(sd, monkeypatch):
    requests = [
        request(prompt="a red circle", seed=4, guidance_scale=6.0, negative_prompt="blurry", scheduler="euler"),
        request(prompt="a green square", seed=5, guidance_scale=6.0, scheduler="euler"),  # "" as __call__
        request(prompt="a red circle", seed=6, guidance_scale=6.0, negative_prompt="blurry", scheduler="euler"),
    ]
    results, calls, run = run_joining_together(sd.pipeline, requests, monkeypatch)
    assert calls == [["a red circle", "blurry", "a green square", ""]]
    assert run.forwards.rows == [6] * 4
    for params, ours in zip(requests, results):
        assert_same(ours, sd.reference(params))


# ------------------------------------------------------------------ SDXL
@pytest.mark.parametrize(
    "scheduler, guidance_scale, negative_prompt",
    [(None, 5.0, None), ("euler-a", 1.0, None), ("unipc", 6.0, "blurry")],
)
def test_sdxl_one_request_matches_diffusers(sdxl, scheduler, guidance_scale, negative_prompt):
    params = request(scheduler=scheduler, guidance_scale=guidance_scale, negative_prompt=negative_prompt, seed=5)
    with Run(sdxl.pipeline) as run:
        ours = finished(run, run.submit(params))
    assert_same(ours, sdxl.reference(params))


def test_sdxl_co_batched_requests_match_each_run_alone(sdxl):
    first = request(prompt="a red circle", seed=1, num_inference_steps=5, guidance_scale=5.0, scheduler="euler")
    second = request(prompt="a blue square", seed=2, num_inference_steps=3, guidance_scale=7.0,
                       negative_prompt="dark", scheduler="ddim")
    with Run(sdxl.pipeline, arrivals={1: second}) as run:
        finished(run, run.submit(first))  # the longest: the other arrived meanwhile
        results = [finished(run, handle) for handle in run.handles]
    assert run.forward_sizes[:2] == [1, 2], run.forward_sizes
    assert run.forwards.rows == [2, 4, 4, 4, 2], run.forwards.steps
    for params, ours in zip((first, second), results):
        assert_same(ours, sdxl.reference(params))


def test_sdxl_requests_joining_one_step_share_one_text_encoding(sdxl, monkeypatch):
    assert sdxl.pipeline.pipe.config.force_zeros_for_empty_prompt
    requests = [
        request(prompt="a red circle", seed=7, guidance_scale=5.0, negative_prompt="dark", scheduler="euler"),
        # No negative prompt: __call__ zeroes the unconditional embeddings, nothing is encoded.
        request(prompt="a blue square", seed=8, guidance_scale=5.0, scheduler="euler"),
        request(prompt="two stars", seed=9, guidance_scale=5.0, negative_prompt="", scheduler="euler"),
    ]
    results, calls, run = run_joining_together(sdxl.pipeline, requests, monkeypatch)
    assert calls == [["a red circle", "dark", "a blue square", "two stars", ""]]
    assert run.forwards.rows == [6] * 4
    for params, ours in zip(requests, results):
        assert_same(ours, sdxl.reference(params))

"""Stable Diffusion 1.x and SDXL requests that start from an image reproduce diffusers'
`StableDiffusionImg2ImgPipeline`, `StableDiffusionInpaintPipeline` (a 4-channel UNet: the
mask is blended into the latents after every step), `StableDiffusionXLImg2ImgPipeline` and
`StableDiffusionXLInpaintPipeline`, alone and co-batched with text-to-image requests.

Same tiny checkpoints, seeds and tolerance as tests/test_stable_diffusion_pipeline.py. The
request's one generator feeds, in __call__'s order, the VAE's latent sample of the image, the
start noise, (inpaint) the sample of the masked image, and a stochastic scheduler's steps, so
euler-a rows check that order too.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from diffusers import (
    StableDiffusionImg2ImgPipeline,
    StableDiffusionInpaintPipeline,
    StableDiffusionPipeline,
    StableDiffusionXLImg2ImgPipeline,
    StableDiffusionXLInpaintPipeline,
    StableDiffusionXLPipeline,
)
from diffusers.utils import logging as diffusers_logging

from engine import Engine, GenerationParams
from pipelines.errors import ParamError
from pipelines.loader import load_pipeline
from tests.image_requests import ImageReference, box_mask, init_picture, run_alone
from tests.pipeline_parity import (
    Run,
    TinyFamily,
    assert_same,
    finished,
    request,
    run_joining_together,
)
from tests.test_stable_diffusion_pipeline import REFERENCE_SCHEDULERS, UNetReference
from tests.tiny_checkpoints import build_tiny_sd, build_tiny_sdxl

diffusers_logging.set_verbosity_error()

PICTURE = init_picture()
MASK = box_mask()


def unet_arguments(params) -> dict:
    return {"negative_prompt": params.negative_prompt, "guidance_scale": params.guidance_scale}


def scheduler_for(checkpoint_config):
    """The stock scheduler class a request's scheduler name stands for, on the checkpoint's config."""

    def make(params):
        scheduler_class = REFERENCE_SCHEDULERS[params.scheduler]
        return None if scheduler_class is None else scheduler_class.from_config(checkpoint_config)

    return make


def families(folder, build, stock_class, img2img_class, inpaint_class, **load):
    folder = build(folder)
    stock = stock_class.from_pretrained(folder, use_safetensors=True, **load)
    images = ImageReference(stock, img2img_class, inpaint_class, unet_arguments, scheduler_for(stock.scheduler.config))
    family = TinyFamily(folder, load_pipeline(str(folder)), UNetReference(stock))
    return family, images


@pytest.fixture(scope="module")
def sd(tmp_path_factory):
    return families(tmp_path_factory.mktemp("tiny-sd") / "model", build_tiny_sd, StableDiffusionPipeline,
                    StableDiffusionImg2ImgPipeline, StableDiffusionInpaintPipeline, safety_checker=None)


@pytest.fixture(scope="module")
def sdxl(tmp_path_factory):
    return families(tmp_path_factory.mktemp("tiny-sdxl") / "model", build_tiny_sdxl, StableDiffusionXLPipeline,
                    StableDiffusionXLImg2ImgPipeline, StableDiffusionXLInpaintPipeline)


# ------------------------------------------------------------------ what the families take
def test_families_take_an_image_and_a_mask_with_diffusers_default_strengths(sd, sdxl):
    assert sd[0].pipeline.info.image_inputs == ("init_image", "mask_image")
    assert sdxl[0].pipeline.info.image_inputs == ("init_image", "mask_image")
    assert sd[0].pipeline.info.defaults.strength == 0.8  # StableDiffusionImg2ImgPipeline's
    assert sdxl[0].pipeline.info.defaults.strength == 0.3  # StableDiffusionXLImg2ImgPipeline's


def test_a_strength_that_runs_no_step_is_refused(sd):
    # SD runs int(steps x strength) steps: int(4 x 0.2) = 0 (FLUX's rounding would run 1).
    with pytest.raises(ParamError, match=r"strength=0.2 with num_inference_steps=4 runs no denoise step") as error:
        Engine(sd[0].pipeline).submit(request(init_image=PICTURE, strength=0.2))
    assert error.value.field == "strength"


def test_a_request_naming_only_the_picture_takes_its_size_and_the_default_strength(sd):
    family, images = sd
    params = GenerationParams(prompt="a red circle", init_image=PICTURE, num_inference_steps=5, guidance_scale=1.0,
                              seed=8, scheduler="euler")
    ours, rows, totals = run_alone(family.pipeline, params)
    assert_same(ours, images(replace(params, width=32, height=32, strength=0.8)))
    assert images.steps_run == 4 and rows == [1] * 4 and totals == {4}  # int(5 x 0.8)


# ------------------------------------------------------------------ SD 1.x, image to image
@pytest.mark.parametrize(
    "scheduler, strength, guidance_scale, negative_prompt, steps_run",
    [
        (None, 0.5, 1.0, None, 3),  # the checkpoint's PNDM: PLMS runs one timestep more, as __call__
        ("euler", 0.75, 1.0, None, 3),
        ("euler-a", 0.6, 6.0, "blurry", 2),  # int(4 * 0.6) = 2; stochastic steps
        ("dpm++2m", 0.8, 6.0, None, 3),  # multistep history from a later start; CFG with ""
        ("ddim", 0.3, 1.0, None, 1),  # int(4 * 0.3) = 1: the last step only (timestep 1)
        ("unipc", 1.0, 1.0, None, 4),  # strength 1: the whole schedule, from the noised image
    ],
)
def test_sd_img2img_matches_diffusers(sd, scheduler, strength, guidance_scale, negative_prompt, steps_run):
    family, images = sd
    params = request(init_image=PICTURE, strength=strength, scheduler=scheduler, guidance_scale=guidance_scale,
                     negative_prompt=negative_prompt, seed=3)
    ours, rows, totals = run_alone(family.pipeline, params)
    assert_same(ours, images(params))
    assert images.steps_run == steps_run
    assert rows == [2 if guidance_scale > 1 else 1] * steps_run  # one forward per step that really runs
    assert totals == {steps_run}  # Progress counts the steps that run, not num_inference_steps


def test_sd_img2img_starts_from_the_picture(sd):
    """A low strength keeps the picture's latents; strength 1 keeps far less of them."""
    family, _ = sd
    picture_latents = family.pipeline.pipe.vae.encode(
        family.pipeline.pipe.image_processor.preprocess(PICTURE)).latent_dist.mean
    picture_latents = picture_latents * family.pipeline.vae.config.scaling_factor
    distances = {}
    for strength in (0.25, 1.0):
        params = request(init_image=PICTURE, strength=strength, scheduler="euler", seed=5, num_inference_steps=8)
        latents = run_alone(family.pipeline, params)[0].latents
        distances[strength] = (latents - picture_latents).abs().mean().item()
    assert distances[0.25] < 0.5 * distances[1.0], distances


# ------------------------------------------------------------------ SD 1.x, inpainting
@pytest.mark.parametrize(
    "scheduler, strength, guidance_scale, negative_prompt, steps_run",
    [
        ("euler", 0.75, 1.0, None, 3),
        ("ddim", 1.0, 6.0, None, 4),  # strength 1: __call__ starts from pure noise x init_noise_sigma
        ("euler-a", 0.5, 5.0, "dark", 2),  # the masked image's VAE sample also draws from the generator
        (None, 0.5, 1.0, None, 3),  # PNDM
    ],
)
def test_sd_inpaint_matches_diffusers(sd, scheduler, strength, guidance_scale, negative_prompt, steps_run):
    family, images = sd
    params = request(init_image=PICTURE, mask_image=MASK, strength=strength, scheduler=scheduler,
                     guidance_scale=guidance_scale, negative_prompt=negative_prompt, seed=4)
    ours, rows, totals = run_alone(family.pipeline, params)
    assert_same(ours, images(params))
    assert images.steps_run == steps_run
    assert rows == [2 if guidance_scale > 1 else 1] * steps_run
    assert totals == {steps_run}


def test_sd_inpaint_repaints_only_the_masked_latents(sd):
    """Two prompts, same seed: the latents outside the mask are the picture's, equal in both."""
    family, _ = sd
    results = []
    for prompt in ("a red circle", "a green square"):
        params = request(prompt=prompt, init_image=PICTURE, mask_image=MASK, strength=0.8, scheduler="euler", seed=6)
        latents = run_alone(family.pipeline, params)[0].latents
        results.append(latents)
    # The mask on the latent grid (16x16 cells of 2x2 pixels): columns 8.., rows 4..11.
    inside = results[0].new_zeros(results[0].shape, dtype=bool)
    inside[..., 4:12, 8:] = True
    difference = (results[0] - results[1]).abs()
    assert difference[~inside].max().item() == 0.0
    assert difference[inside].mean().item() > 1e-3


# ------------------------------------------------------------------ SD 1.x, co-batched
def test_sd_image_requests_share_forwards_with_text_to_image(sd):
    family, images = sd
    text_to_image = request(prompt="a red circle", seed=11, num_inference_steps=6, scheduler="euler")
    img2img = request(prompt="a blue square", seed=22, num_inference_steps=8, strength=0.5, init_image=PICTURE,
                      guidance_scale=5.0, negative_prompt="blurry", scheduler="dpm++2m")  # 4 steps, 2 rows
    inpaint = request(prompt="a green circle", seed=33, num_inference_steps=4, strength=0.75, init_image=PICTURE,
                      mask_image=MASK, scheduler="euler-a")  # 3 steps
    with Run(family.pipeline, arrivals={1: img2img, 2: inpaint}) as run:
        first = finished(run, run.submit(text_to_image))  # the longest: the others arrived meanwhile
        results = [first] + [finished(run, handle) for handle in run.handles[1:]]
    assert run.forward_sizes == [1, 2, 3, 3, 3, 1], run.forward_sizes
    assert run.forwards.rows == [1, 3, 4, 4, 4, 1], run.forwards.steps  # one forward per step
    assert_same(results[0], family.reference(text_to_image))
    assert_same(results[1], images(img2img))
    assert_same(results[2], images(inpaint))


def test_sd_pictures_of_requests_joining_together_share_one_vae_encoding(sd, monkeypatch):
    family, images = sd
    vae = family.pipeline.vae
    batches = []
    encode = vae.encode
    monkeypatch.setattr(vae, "encode", lambda pixels, *a, **k: batches.append(len(pixels)) or encode(pixels, *a, **k))
    family.pipeline.image_cache.clear()
    requests = [
        request(prompt="a red circle", seed=1, init_image=PICTURE, strength=0.5, scheduler="euler"),
        request(prompt="a blue square", seed=2, init_image=init_picture(colour=(30, 60, 200)), mask_image=MASK,
                strength=0.75, scheduler="euler-a"),
        request(prompt="a red circle", seed=3, init_image=PICTURE, strength=1.0, scheduler="ddim"),  # the same picture
        request(prompt="a green square", seed=4, scheduler="euler"),  # from noise
    ]
    results, _, run = run_joining_together(family.pipeline, requests, monkeypatch)
    assert batches == [2]  # two different pictures, one encoder call; nothing encoded in prepare_encode
    assert run.forwards.rows[0] == 4
    for params, ours in zip(requests[:3], results):
        assert_same(ours, images(params))
    assert_same(results[3], family.reference(requests[3]))


# ------------------------------------------------------------------ SDXL
@pytest.mark.parametrize(
    "scheduler, strength, guidance_scale, negative_prompt, steps_run",
    [
        (None, 0.5, 5.0, None, 2),  # the checkpoint's Euler; CFG with zeroed negative embeddings
        ("unipc", 0.7, 6.0, "blurry", 2),  # int(4 * 0.7) = 2
        ("euler-a", 1.0, 1.0, None, 4),
    ],
)
def test_sdxl_img2img_matches_diffusers(sdxl, scheduler, strength, guidance_scale, negative_prompt, steps_run):
    family, images = sdxl
    params = request(init_image=PICTURE, strength=strength, scheduler=scheduler, guidance_scale=guidance_scale,
                     negative_prompt=negative_prompt, seed=5)
    ours, rows, totals = run_alone(family.pipeline, params)
    assert_same(ours, images(params))
    assert images.steps_run == steps_run
    assert rows == [2 if guidance_scale > 1 else 1] * steps_run
    assert totals == {steps_run}


@pytest.mark.parametrize(
    "scheduler, strength, guidance_scale, negative_prompt, steps_run",
    [
        ("euler", 0.75, 1.0, None, 3),
        ("ddim", 1.0, 5.0, "dark", 4),  # pure noise start at strength 1
        ("euler-a", 0.5, 1.0, None, 2),
    ],
)
def test_sdxl_inpaint_matches_diffusers(sdxl, scheduler, strength, guidance_scale, negative_prompt, steps_run):
    family, images = sdxl
    params = request(init_image=PICTURE, mask_image=MASK, strength=strength, scheduler=scheduler,
                     guidance_scale=guidance_scale, negative_prompt=negative_prompt, seed=6)
    ours, rows, totals = run_alone(family.pipeline, params)
    assert_same(ours, images(params))
    assert images.steps_run == steps_run
    assert rows == [2 if guidance_scale > 1 else 1] * steps_run
    assert totals == {steps_run}


def test_sdxl_image_requests_share_forwards_with_text_to_image(sdxl):
    family, images = sdxl
    text_to_image = request(prompt="a red circle", seed=1, num_inference_steps=5, guidance_scale=5.0,
                            scheduler="euler")  # 2 rows
    img2img = request(prompt="a blue square", seed=2, num_inference_steps=4, strength=0.75, init_image=PICTURE,
                      scheduler="ddim")  # 3 steps, 1 row
    inpaint = request(prompt="two stars", seed=3, num_inference_steps=6, strength=0.5, init_image=PICTURE,
                      mask_image=MASK, guidance_scale=6.0, negative_prompt="dark", scheduler="euler")  # 3 steps
    with Run(family.pipeline, arrivals={1: img2img, 2: inpaint}) as run:
        first = finished(run, run.submit(text_to_image))
        results = [first] + [finished(run, handle) for handle in run.handles[1:]]
    assert run.forward_sizes == [1, 2, 3, 3, 2], run.forward_sizes
    assert run.forwards.rows == [2, 3, 5, 5, 4], run.forwards.steps
    assert_same(results[0], family.reference(text_to_image))
    assert_same(results[1], images(img2img))
    assert_same(results[2], images(inpaint))

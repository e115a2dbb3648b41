"""Qwen-Image requests that start from an image reproduce diffusers' `QwenImageImg2ImgPipeline`
and `QwenImageInpaintPipeline`, alone and co-batched with text-to-image requests.

Qwen-Image's VAE is a video VAE: the picture is encoded as one frame (5-D latents),
normalised with the VAE's latents_mean / latents_std, packed in 2x2 patches, and noised by
flow matching (`scale_noise`) at the first timestep that runs. Its `get_timesteps` is SD3's:
`t_start = int(steps - steps * strength)`, so 4 steps at strength 0.6 run 3 (SD's rounding
would run 2). The inpaint mask is packed like the latents and blended after every step.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from diffusers import (
    QwenImageImg2ImgPipeline,
    QwenImageInpaintPipeline,
    QwenImagePipeline,
)
from diffusers.utils import logging as diffusers_logging

from engine import GenerationParams
from tests.image_requests import ImageReference, box_mask, init_picture, run_alone
from tests.pipeline_parity import (
    Run,
    assert_same,
    finished,
    request,
    run_joining_together,
    tiny_family,
)
from tests.tiny_checkpoints import build_tiny_qwen_image

diffusers_logging.set_verbosity_error()

PICTURE = init_picture()
MASK = box_mask()


def qwen_arguments(params) -> dict:
    return {"negative_prompt": params.negative_prompt, "true_cfg_scale": params.guidance_scale}


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    family = tiny_family(tmp_path_factory.mktemp("tiny-qwen-image") / "model", build_tiny_qwen_image,
                         QwenImagePipeline, qwen_arguments)
    images = ImageReference(family.reference.pipe, QwenImageImg2ImgPipeline, QwenImageInpaintPipeline,
                            qwen_arguments, sized_img2img=True)
    return family, images


def test_qwen_takes_an_image_and_a_mask_with_the_img2img_default_strength(qwen):
    family, images = qwen
    assert family.pipeline.info.image_inputs == ("init_image", "mask_image")
    assert family.pipeline.info.defaults.strength == 0.6  # QwenImageImg2ImgPipeline's
    params = GenerationParams(prompt="a red circle", init_image=PICTURE, num_inference_steps=4, guidance_scale=1.0,
                              seed=8)  # the picture's size, the default strength
    ours, rows, totals = run_alone(family.pipeline, params)
    assert_same(ours, images(replace(params, width=32, height=32, strength=0.6)))
    assert rows == [1, 1, 1] and totals == {3}


@pytest.mark.parametrize(
    "strength, guidance_scale, negative_prompt, steps_run",
    [
        (0.6, 1.0, None, 3),  # t_start = int(4 - 2.4) = 1
        (1.0, 4.0, " ", 4),  # true CFG: its negative row in the same forward
        (0.3, 3.0, "blurry, dark and of low quality", 2),  # t_start = int(4 - 1.2) = 2
    ],
)
def test_qwen_img2img_matches_diffusers(qwen, strength, guidance_scale, negative_prompt, steps_run):
    family, images = qwen
    params = request(init_image=PICTURE, strength=strength, guidance_scale=guidance_scale,
                     negative_prompt=negative_prompt, seed=3)
    ours, rows, totals = run_alone(family.pipeline, params)
    assert_same(ours, images(params))
    assert images.steps_run == steps_run
    cfg = guidance_scale > 1 and negative_prompt is not None
    assert rows == [2 if cfg else 1] * steps_run
    assert totals == {steps_run}


@pytest.mark.parametrize(
    "strength, guidance_scale, negative_prompt, steps_run",
    [(0.6, 1.0, None, 3), (1.0, 4.0, " ", 4), (0.5, 2.0, "blurry", 2)],
)
def test_qwen_inpaint_matches_diffusers(qwen, strength, guidance_scale, negative_prompt, steps_run):
    family, images = qwen
    params = request(init_image=PICTURE, mask_image=MASK, strength=strength, guidance_scale=guidance_scale,
                     negative_prompt=negative_prompt, seed=4)
    ours, rows, totals = run_alone(family.pipeline, params)
    assert_same(ours, images(params))
    assert images.steps_run == steps_run
    assert rows == [2 if guidance_scale > 1 and negative_prompt is not None else 1] * steps_run
    assert totals == {steps_run}


def test_qwen_inpaint_repaints_only_the_masked_latents(qwen):
    """Two prompts, same seed: outside the mask the final latents are the picture's own."""
    family, _ = qwen
    results = []
    for prompt in ("a red circle", "two small green birds on a branch"):
        params = request(prompt=prompt, init_image=PICTURE, mask_image=MASK, strength=0.8, seed=6)
        latents = run_alone(family.pipeline, params)[0].latents
        results.append(latents)
    # Packed latents: [1, 4x4 patches, 4 channels x 2x2]; a patch is 8x8 pixels. The mask covers
    # pixel columns 16.. and rows 8..23: patch columns 2..3, patch rows 1..2.
    inside = results[0].new_zeros(results[0].shape, dtype=bool).view(1, 4, 4, -1)
    inside[:, 1:3, 2:4] = True
    inside = inside.view(results[0].shape)
    difference = (results[0] - results[1]).abs()
    assert difference[~inside].max().item() == 0.0
    assert difference[inside].mean().item() > 1e-3


def test_qwen_image_requests_share_forwards_with_text_to_image(qwen):
    family, images = qwen
    text_to_image = request(prompt="a red circle", seed=11, num_inference_steps=5, guidance_scale=1.0)
    img2img = request(prompt="a blue square", seed=22, num_inference_steps=4, strength=0.6, init_image=PICTURE,
                      guidance_scale=4.0, negative_prompt=" ")  # 3 steps, 2 rows
    inpaint = request(prompt="two small green birds on a branch", seed=33, num_inference_steps=6, strength=0.5,
                      init_image=PICTURE, mask_image=MASK)  # 3 steps, 1 row
    with Run(family.pipeline, arrivals={1: img2img, 2: inpaint}) as run:
        first = finished(run, run.submit(text_to_image))
        results = [first] + [finished(run, handle) for handle in run.handles[1:]]
    assert run.forward_sizes == [1, 2, 3, 3, 2], run.forward_sizes
    assert run.forwards.rows == [1, 3, 4, 4, 2], run.forwards.steps
    assert_same(results[0], family.reference(text_to_image))
    assert_same(results[1], images(img2img))
    assert_same(results[2], images(inpaint))


def test_qwen_pictures_of_requests_joining_together_share_one_vae_encoding(qwen, monkeypatch):
    family, images = qwen
    vae = family.pipeline.vae
    batches = []
    encode = vae.encode
    monkeypatch.setattr(vae, "encode", lambda pixels, *a, **k: batches.append(tuple(pixels.shape)) or encode(pixels, *a, **k))
    family.pipeline.image_cache.clear()
    requests = [
        request(prompt="a red circle", seed=1, init_image=PICTURE, strength=0.6),
        request(prompt="a blue square", seed=2, init_image=init_picture(colour=(30, 60, 200)), mask_image=MASK,
                strength=0.8, guidance_scale=4.0, negative_prompt=" "),
    ]
    results, _, _ = run_joining_together(family.pipeline, requests, monkeypatch)
    assert batches == [(2, 3, 1, 32, 32)]  # both pictures, one frame each, in one encoder call
    for params, ours in zip(requests, results):
        assert_same(ours, images(params))

"""FLUX requests that start from an image against diffusers' FluxImg2ImgPipeline and
FluxInpaintPipeline, on the tiny random-weight checkpoint: alone, and co-batched with a
text-to-image request of the same shape (one forward per step)."""

from __future__ import annotations

import pytest
import torch
from diffusers import FluxImg2ImgPipeline, FluxInpaintPipeline, FluxPipeline
from diffusers.utils import logging as diffusers_logging

from engine import Engine, GenerationParams
from pipelines.errors import ParamError
from tests.img2img_parity import (
    assert_alone_matches,
    assert_cobatched_with_text_to_image,
    image_reference,
    init_picture,
    right_half_mask,
)
from tests.pipeline_parity import SIZE, Run, finished, request, tiny_family
from tests.protocol_driver import drive
from tests.test_flux_pipeline import STUDIO_CONFIG, flux_arguments
from tests.tiny_checkpoints import build_tiny_flux

diffusers_logging.set_verbosity_error()
diffusers_logging.disable_progress_bar()


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    return tiny_family(tmp_path_factory.mktemp("tiny-flux-img2img") / "model", build_tiny_flux, FluxPipeline,
                       flux_arguments, STUDIO_CONFIG)


@pytest.fixture(scope="module")
def references(family):
    return {
        "text": family.reference,
        "img2img": image_reference(family, FluxImg2ImgPipeline, flux_arguments),
        "inpaint": image_reference(family, FluxInpaintPipeline, flux_arguments),
    }


def test_img2img_runs_the_last_steps_and_matches_flux_img2img_pipeline(family, references):
    # 6 steps at 0.5: diffusers starts at step 3, so 3 run.
    p = request(seed=4, num_inference_steps=6, init_image=init_picture(1), strength=0.5)
    assert_alone_matches(family, references["img2img"], p, steps_run=3)


def test_rounding_of_steps_times_strength_is_diffusers(family, references):
    # 10 x 0.25 = 2.5: diffusers starts at int(7.5) = 7, so 3 steps run, not 2.
    p = request(seed=2, num_inference_steps=10, init_image=init_picture(2), strength=0.25)
    assert p.denoise_steps == 3
    assert_alone_matches(family, references["img2img"], p, steps_run=3)


def test_inpaint_matches_flux_inpaint_pipeline_and_keeps_the_unmasked_latents(family, references):
    p = request(seed=5, num_inference_steps=5, init_image=init_picture(3), mask_image=right_half_mask(), strength=0.8)
    assert_alone_matches(family, references["inpaint"], p, steps_run=4)
    [state] = drive(family.pipeline, [(0, p)])
    keep = state.extra.mask == 0
    assert 0 < keep.float().mean() < 1
    assert torch.equal(state.latents[keep], state.extra.image_latents[keep])  # the last blend: the clean image
    assert (state.latents[~keep] - state.extra.image_latents[~keep]).abs().max() > 0.1


def test_true_cfg_img2img_matches_flux_img2img_pipeline(family, references):
    p = request(seed=6, num_inference_steps=4, guidance_scale=3.0, negative_prompt="blurry",
                init_image=init_picture(4), strength=0.75)
    assert_alone_matches(family, references["img2img"], p, steps_run=3)


def test_img2img_and_inpaint_share_every_forward_with_text_to_image(family, references):
    picture = init_picture(5)
    requests = [
        (request("a red circle", seed=1, num_inference_steps=4), "text"),
        (request("a blue square", seed=2, num_inference_steps=4, init_image=picture, strength=1.0), "img2img"),
        (request("a green circle", seed=3, num_inference_steps=8, init_image=init_picture(6), strength=0.5,
                 guidance_scale=2.0, negative_prompt="blurry"), "img2img"),
        (request("a red square", seed=4, num_inference_steps=4, init_image=picture, mask_image=right_half_mask(),
                 strength=0.5), "inpaint"),
    ]
    run = assert_cobatched_with_text_to_image(family, references, requests)
    # 4, 4, 4 and 2 steps; the CFG request's negative row rides along.
    assert run.forwards.rows == [5, 5, 4, 4]


def test_joining_init_images_share_one_vae_encoder_call(family, monkeypatch):
    pipeline = family.pipeline
    pipeline.image_cache.clear()
    calls = []
    encode = pipeline.vae.encode

    def recording(pixels, *args, **kwargs):
        calls.append(pixels.shape[0])
        return encode(pixels, *args, **kwargs)

    monkeypatch.setattr(pipeline.vae, "encode", recording)
    pictures = [init_picture(7), init_picture(8), init_picture(7)]  # the third repeats the first
    run = Run(pipeline)
    handles = [run.submit(request(seed=i, num_inference_steps=2, init_image=pic, strength=1.0))
               for i, pic in enumerate(pictures)]
    with run:  # started after the submits: all three join the first step
        results = [finished(run, handle) for handle in handles]
    assert calls == [2]  # two distinct pictures, one encoder call
    assert run.forward_sizes == [3, 3]
    # The repeated picture, another seed: another sample and noise, so another image.
    assert (results[0][0] - results[2][0]).abs().max().item() > 1e-3


def test_an_init_image_takes_its_size_and_the_default_strength(family):
    engine = Engine(family.pipeline)
    picture = init_picture(9)
    resolved = engine.prepare_params(GenerationParams(prompt="a red circle", init_image=picture, num_inference_steps=10))
    assert (resolved.width, resolved.height, resolved.strength) == (SIZE, SIZE, 0.6)
    assert resolved.denoise_steps == 6
    assert engine.prepare(resolved).cost.steps == 6
    with pytest.raises(ParamError, match="runs no denoise step") as caught:
        engine.prepare_params(GenerationParams(prompt="a", init_image=picture, strength=0.0))
    assert caught.value.field == "strength"
    bigger = init_picture(9, size=SIZE * 2)
    with pytest.raises(ParamError, match=f"init_image is {SIZE * 2}x{SIZE * 2}; this request is {SIZE}x{SIZE}"):
        engine.prepare_params(GenerationParams(prompt="a", init_image=bigger, width=SIZE, height=SIZE))
    text_only = engine.prepare_params(GenerationParams(prompt="a red circle"))
    assert text_only.strength is None and text_only.init_image_digest is None

"""Stable Diffusion 3 requests that start from an image against diffusers'
StableDiffusion3Img2ImgPipeline and StableDiffusion3InpaintPipeline, on the tiny random-weight
checkpoint: alone, and co-batched with a text-to-image request (CFG rows included)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import StableDiffusion3Img2ImgPipeline, StableDiffusion3InpaintPipeline, StableDiffusion3Pipeline
from diffusers.utils import logging as diffusers_logging

from tests.img2img_parity import (
    assert_alone_matches,
    assert_cobatched_with_text_to_image,
    image_reference,
    init_picture,
    right_half_mask,
)
from tests.pipeline_parity import SIZE, request, tiny_family
from tests.protocol_driver import drive
from tests.tiny_checkpoints import T5_LENGTH, build_tiny_sd3_16_channels

diffusers_logging.set_verbosity_error()
diffusers_logging.disable_progress_bar()

STUDIO_CONFIG = {"height": SIZE, "width": SIZE, "max_sequence_length": T5_LENGTH, "num_inference_steps": 4,
                 "guidance_scale": 1.0}


def sd3_arguments(p) -> dict:
    return {"negative_prompt": p.negative_prompt, "guidance_scale": p.guidance_scale, "max_sequence_length": T5_LENGTH}


class ShiftedDecode:
    """StableDiffusion3InpaintPipeline (diffusers 0.42) decodes `latents / scaling_factor` without
    adding the VAE's shift_factor, unlike StableDiffusion3Pipeline and its img2img pipeline (and
    us). Its final latents stay the reference; its image is decoded as those two decode."""

    def __init__(self, reference) -> None:
        self.reference = reference

    def __call__(self, params, output_type: str = "pil"):
        latents, _ = self.reference(params, output_type)
        pipe, config = self.reference.pipe, self.reference.pipe.vae.config
        with torch.no_grad():
            image = pipe.vae.decode(latents / config.scaling_factor + config.shift_factor, return_dict=False)[0]
        return latents, np.asarray(pipe.image_processor.postprocess(image, output_type=output_type)[0])


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """A tiny SD3 with 16 latent channels: StableDiffusion3InpaintPipeline takes no other."""
    return tiny_family(tmp_path_factory.mktemp("tiny-sd3-img2img") / "model", build_tiny_sd3_16_channels,
                       StableDiffusion3Pipeline, sd3_arguments, STUDIO_CONFIG)


@pytest.fixture(scope="module")
def references(family):
    return {
        "text": family.reference,
        "img2img": image_reference(family, StableDiffusion3Img2ImgPipeline, sd3_arguments),
        "inpaint": ShiftedDecode(image_reference(family, StableDiffusion3InpaintPipeline, sd3_arguments)),
    }


def test_img2img_matches_sd3_img2img_pipeline(family, references):
    p = request(seed=3, num_inference_steps=6, init_image=init_picture(1), strength=0.5)
    assert_alone_matches(family, references["img2img"], p, steps_run=3)


def test_cfg_img2img_matches_sd3_img2img_pipeline(family, references):
    p = request(seed=4, num_inference_steps=5, guidance_scale=4.0, init_image=init_picture(2), strength=0.6)
    assert_alone_matches(family, references["img2img"], p, steps_run=3)


def test_inpaint_matches_sd3_inpaint_pipeline(family, references):
    p = request(seed=5, num_inference_steps=4, init_image=init_picture(3), mask_image=right_half_mask(), strength=0.75)
    assert_alone_matches(family, references["inpaint"], p, steps_run=3)
    [state] = drive(family.pipeline, [(0, p)])
    keep = (state.extra.mask == 0).expand_as(state.latents)
    assert torch.equal(state.latents[keep], state.extra.image_latents[keep])


def test_inpaint_at_full_strength_matches_sd3_inpaint_pipeline(family, references):
    # strength 1: diffusers starts from the bare noise; the first sigma is 1, so scale_noise agrees.
    p = request(seed=6, num_inference_steps=3, init_image=init_picture(4), mask_image=right_half_mask(), strength=1.0)
    assert_alone_matches(family, references["inpaint"], p, steps_run=3)


def test_img2img_and_inpaint_share_every_forward_with_text_to_image(family, references):
    requests = [
        (request("a red circle", seed=1, num_inference_steps=3, guidance_scale=2.0), "text"),
        (request("a blue square", seed=2, num_inference_steps=6, init_image=init_picture(5), strength=0.5), "img2img"),
        (request("a green circle", seed=3, num_inference_steps=3, guidance_scale=3.0, init_image=init_picture(6),
                 mask_image=right_half_mask(), strength=0.9), "inpaint"),
    ]
    run = assert_cobatched_with_text_to_image(family, references, requests)
    assert run.forwards.rows == [5, 5, 5]  # two CFG requests: their negative rows ride along

"""What the image-to-image and inpainting parity tests of every family share: init pictures and
masks, the stock img2img/inpaint pipelines on a family's own components, and the checks that an
image-started request matches them alone and co-batched with a text-to-image request."""

from __future__ import annotations

import numpy as np
from PIL import Image

from engine import GenerationParams, Progress
from tests.pipeline_parity import SIZE, Reference, Run, TinyFamily, assert_same, assert_step_outputs_match, finished
from tests.protocol_driver import drive


def init_picture(seed: int = 0, size: int = SIZE) -> Image.Image:
    """A smooth coloured picture with a bright square in it (RGB, size x size)."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 1, size)
    base = rng.uniform(0.2, 0.8, 3)[None, None, :] * (0.5 + 0.5 * ramp[None, :, None] * ramp[:, None, None])
    pixels = (base * 255).astype(np.uint8)
    pixels[size // 4 : size // 2, size // 4 : size // 2] = rng.integers(150, 256, 3)
    return Image.fromarray(pixels, mode="RGB")


def right_half_mask(size: int = SIZE) -> Image.Image:
    """White (repaint) on the right half, black (keep) on the left: "L"."""
    mask = np.zeros((size, size), dtype=np.uint8)
    mask[:, size // 2 :] = 255
    return Image.fromarray(mask, mode="L")


def image_reference(family: TinyFamily, stock_class: type, arguments) -> Reference:
    """`stock_class` (e.g. FluxImg2ImgPipeline) on the family's stock components; each call
    also gets the request's image, strength and mask."""

    def with_images(params: GenerationParams) -> dict:
        images = {"image": params.init_image, "strength": params.strength}
        if params.mask_image is not None:
            images["mask_image"] = params.mask_image
        return {**arguments(params), **images}

    return Reference(stock_class(**family.reference.pipe.components), with_images)


def with_reference(family: TinyFamily, reference: Reference) -> TinyFamily:
    return TinyFamily(family.folder, family.pipeline, reference)


def assert_alone_matches(family: TinyFamily, reference: Reference, params: GenerationParams, steps_run: int) -> None:
    """The step protocol alone: exactly `steps_run` steps, float outputs as the stock pipeline's."""
    [state] = drive(family.pipeline, [(0, params)])
    assert state.total_steps == state.step_index == steps_run
    assert_step_outputs_match(with_reference(family, reference), state, params)


def assert_cobatched_with_text_to_image(family: TinyFamily, references: dict, requests: list) -> Run:
    """`requests`: (params, reference kind) submitted together, so they join one step; each one
    matches its own stock pipeline (decoded pixels), every step is ONE forward, and each one's
    Progress says the steps it really runs and the requests it shared each forward with."""
    pipeline = family.pipeline
    run = Run(pipeline)
    handles = [run.submit(params) for params, _ in requests]  # before the engine starts: one first step
    with run:
        results = [finished(run, handle) for handle in handles]
        progress = [[e for e in h.events(timeout=1) if isinstance(e, Progress)] for h in handles]
    for (params, kind), ours in zip(requests, results):
        assert_same(ours, references[kind](params))
    for (params, _), events in zip(requests, progress):
        steps = params.denoise_steps  # the tests give image-started requests their strength
        assert [e.step for e in events] == list(range(1, steps + 1))
        assert {e.total for e in events} == {steps}
    # Every step, one forward with every live request: the first has them all.
    assert run.forward_sizes[0] == len(requests) and all(e.batch_size == len(requests) for e in (p[0] for p in progress))
    run.forwards.rows  # noqa: B018 - fails if any step ran more than one forward
    return run

"""What the image-to-image and inpainting parity tests share: the pictures a request starts
from, and the stock diffusers img2img / inpaint pipeline as the reference.

The reference is built with `from_pipe` on the text-to-image pipeline the family tests already
load (the same modules, no second copy of the weights), and is called with the request's own
image, mask, strength and seed. Like `tests.pipeline_parity.Reference` it returns the final
latents (after the last step's mask blend, as `callback_on_step_end` sees them) and the image.
"""

from __future__ import annotations

import copy
from typing import Callable

import numpy as np
import torch
from PIL import Image, ImageDraw

from engine import GenerationParams, Progress
from tests.pipeline_parity import SIZE, Run, finished


def run_alone(pipeline, params):
    """(final latents, uint8 image), the rows of every forward, and the Progress totals."""
    with Run(pipeline) as run:
        handle = run.submit(params)
        ours = finished(run, handle)
    totals = {event.total for event in handle.events(timeout=5) if isinstance(event, Progress)}
    return ours, run.forwards.rows, totals


def init_picture(size: int = SIZE, colour: tuple[int, int, int] = (220, 40, 30)) -> Image.Image:
    """A picture with structure at every scale: a diagonal gradient and a coloured disc."""
    y, x = np.mgrid[0:size, 0:size]
    pixels = np.stack([x * 255 // (size - 1), y * 255 // (size - 1), (x + y) * 255 // (2 * size - 2)], axis=-1)
    picture = Image.fromarray(pixels.astype(np.uint8), "RGB")
    ImageDraw.Draw(picture).ellipse((size // 4, size // 4, size * 3 // 4 - 1, size * 3 // 4 - 1), fill=colour)
    return picture


def box_mask(size: int = SIZE, box: tuple[int, int, int, int] | None = None) -> Image.Image:
    """White (repaint) inside `box` (x0, y0, x1, y1; default: the right half's middle), black elsewhere."""
    mask = Image.new("L", (size, size), 0)
    ImageDraw.Draw(mask).rectangle(box or (size // 2, size // 4, size - 1, size * 3 // 4 - 1), fill=255)
    return mask


class ImageReference:
    """A stock diffusers img2img pipeline and its inpaint sibling over the same modules.

    `arguments(params)` gives the family's guidance keyword arguments; `scheduler(params)` the
    noise scheduler the request names (None: the checkpoint's own)."""

    def __init__(
        self,
        text_to_image,
        img2img_class: type,
        inpaint_class: type,
        arguments: Callable[[GenerationParams], dict],
        scheduler: Callable[[GenerationParams], object] | None = None,
        sized_img2img: bool = False,
    ) -> None:
        self.img2img = img2img_class.from_pipe(text_to_image)
        self.inpaint = inpaint_class.from_pipe(text_to_image)
        for pipe in (self.img2img, self.inpaint):
            pipe.set_progress_bar_config(disable=True)
        self.arguments = arguments
        self.scheduler = scheduler or (lambda params: None)
        self.checkpoint_scheduler = copy.deepcopy(text_to_image.scheduler)
        # SD and SDXL img2img take their size from the image; Qwen-Image's takes height/width.
        self.sized_img2img = sized_img2img

    def __call__(self, params: GenerationParams, output_type: str = "pil"):
        """(final latents, the output as an array: uint8 pixels for "pil", floats for "np")."""
        assert params.init_image is not None and params.strength is not None
        inpainting = params.mask_image is not None
        pipe = self.inpaint if inpainting else self.img2img
        pipe.scheduler = self.scheduler(params) or copy.deepcopy(self.checkpoint_scheduler)
        final = {}

        def keep_latents(pipe, step, timestep, tensors):
            final["latents"] = tensors["latents"].clone()
            final["steps"] = step + 1
            return {}

        sizes = {"width": params.width, "height": params.height} if inpainting or self.sized_img2img else {}
        masks = {"mask_image": params.mask_image} if inpainting else {}
        output = pipe(
            prompt=params.prompt,
            image=params.init_image,
            strength=params.strength,
            num_inference_steps=params.num_inference_steps,
            generator=torch.Generator("cpu").manual_seed(params.seed),
            callback_on_step_end=keep_latents,
            output_type=output_type,
            **sizes,
            **masks,
            **self.arguments(params),
        )
        self.steps_run = final["steps"]
        image = output.images[0]
        return final["latents"], np.asarray(image) if output_type == "pil" else image

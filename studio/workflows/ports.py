"""What flows along a workflow's links: the port types, which outputs an input takes, and the
GenerationParams fields a value of each type sets.

Both the node type declarations (`studio.workflows.nodes`) and the value readers
(`studio.workflows.readers`) name these, so they live apart from either. Pure: imports neither
gradio nor torch.
"""

from __future__ import annotations


class PortType:
    """What flows along a link. Only equal types may be linked."""

    PROMPT = "prompt"
    NEGATIVE_PROMPT = "negative_prompt"
    SEED = "seed"
    SIZE = "size"
    STEPS = "steps"
    GUIDANCE = "guidance"
    SCHEDULER = "scheduler"
    FRAMES = "frames"  # a video's frame count
    MODEL = "model"  # which loaded model makes the branch
    STRENGTH = "strength"  # how much of a picture a sampler redraws (0..1)
    STEP_CACHE = "step_cache"  # a sampler's step-caching threshold (0 = off)
    IMAGES = "images"  # a sampler's branches: their previews, images and settings
    IMAGE = "image"  # a picture to start from: a Load image's, an Upscale's, or a sampler's results
    MASK = "mask"  # which part of the picture to repaint
    LORA = "lora"  # the LoRA adapters a sampler runs with (LoRA nodes, chained)
    LORA_SCALE = "lora_scale"  # a LoRA node's scale, swept


def accepts(input_type: str, output_type: str | None) -> bool:
    """Whether an input of `input_type` takes a link from an output of `output_type`: the same
    type, or a sampler's images into a picture input (one stage feeding the next)."""
    return output_type == input_type or (input_type == PortType.IMAGE and output_type == PortType.IMAGES)


# The GenerationParams fields a value of each port type sets.
PARAMS_OF_PORT = {
    PortType.PROMPT: ("prompt",), PortType.NEGATIVE_PROMPT: ("negative_prompt",), PortType.SEED: ("seed",),
    PortType.SIZE: ("width", "height"), PortType.STEPS: ("num_inference_steps",),
    PortType.GUIDANCE: ("guidance_scale",), PortType.SCHEDULER: ("scheduler",), PortType.FRAMES: ("num_frames",),
    PortType.MODEL: ("model",), PortType.STRENGTH: ("strength",), PortType.LORA: ("loras",),
    PortType.LORA_SCALE: ("loras",), PortType.STEP_CACHE: ("step_cache",),
}
# What a Sweep node may vary: its `param` value decides its output type.
SWEEPABLE = (PortType.GUIDANCE, PortType.STEPS, PortType.SCHEDULER, PortType.SIZE, PortType.SEED, PortType.FRAMES,
             PortType.MODEL, PortType.STRENGTH, PortType.LORA_SCALE, PortType.STEP_CACHE)

"""The Simple tab's form as a small workflow (run like the editor's), and the compiler's problems
in the form's words.

    workflow = form_workflow(values, uses_negative_prompt=True, seed_start=seed_start(values))
"""

from __future__ import annotations

import random
from typing import Any

from PIL import Image, ImageChops

from studio.pictures import picture_data_url
from studio.workflows.format import WorkflowError, link_json
from studio.workflows.nodes import NODE_TYPES

_SEED_RANGE = 2**32

# Node ids double as the form's field names in error messages ("steps: 500 is out of range ...").
FORM_NODES = ("prompt", "negative prompt", "seed", "size", "steps", "guidance", "scheduler", "frames", "model",
              "picture", "mask", "strength")


def form_workflow(values: dict[str, Any], uses_negative_prompt: bool, seed_start: int) -> dict:
    """The form as a workflow: its fields as value nodes, `batch count` as a seed batch, each linked to
    the sampler's input of its port type. Node ids are the form's field names (FORM_NODES)."""
    fields = [
        ("prompt", "prompt", {"text": values["prompt"] if isinstance(values["prompt"], str) else ""}),
        ("seed", "seed_batch", {"start": seed_start, "count": values["batch_count"]}),
        ("size", "size", {"width": values["width"], "height": values["height"]}),
        ("steps", "steps", {"steps": values["steps"]}),
        ("guidance", "guidance", {"scale": values["guidance_scale"]}),
        ("model", "model", {"name": values.get("model") or ""}),
    ]
    if values.get("frames"):
        fields.append(("frames", "frames", {"frames": values["frames"]}))
    negative = values.get("negative_prompt")
    if uses_negative_prompt and isinstance(negative, str):
        fields.append(("negative prompt", "negative_prompt", {"text": negative}))
    if values.get("scheduler"):
        fields.append(("scheduler", "scheduler", {"name": values["scheduler"]}))
    picture, mask = start_picture(values.get("picture"))
    if picture is not None:  # image to image: redraw the picture (with a mask, only its painted part)
        fields.append(("picture", "load_image", {"image": picture_data_url(picture)}))
        fields.append(("strength", "strength", {"strength": values.get("strength")}))
        if mask is not None:
            fields.append(("mask", "mask", {"source": "painted", "painted": picture_data_url(mask)}))
    nodes = [NODE_TYPES[node_type].node(node_id, **node_values) for node_id, node_type, node_values in fields]
    links = [link_json(node_id, NODE_TYPES[node_type].outputs[0].name, "sampler") for node_id, node_type, _ in fields]
    return {"version": 1, "nodes": [*nodes, NODE_TYPES["sampler"].node("sampler")], "links": links}


def start_picture(editor_value: object) -> tuple[Image.Image | None, Image.Image | None]:
    """The picture to start from and the mask painted on it ("L", white = repaint; None when
    nothing was painted), from gr.ImageMask's value (background, layers, composite)."""
    if not isinstance(editor_value, dict) or not isinstance(editor_value.get("background"), Image.Image):
        return None, None
    picture = editor_value["background"]
    painted = None
    for layer in editor_value.get("layers") or ():
        if isinstance(layer, Image.Image) and layer.mode == "RGBA":
            alpha = layer.getchannel("A")
            painted = alpha if painted is None else ImageChops.lighter(painted, alpha)
    if painted is None or painted.getbbox() is None:
        return picture.convert("RGB"), None
    mask = painted.point(lambda value: 255 if value > 0 else 0)
    return picture.convert("RGB"), mask if mask.size == picture.size else mask.resize(picture.size, Image.NEAREST)


def form_problems(error: WorkflowError) -> str:
    """The compiler's problems in the form's words: 'steps: 500 is out of range ...'."""
    parts = []
    for problem in error.problems:
        if problem.node_id in FORM_NODES and problem.node_id != "sampler":
            field = "batch count" if (problem.node_id, problem.port) == ("seed", "count") else problem.node_id
            parts.append(f"{field}: {problem.message}")
        else:
            parts.append(problem.message)
    return "; ".join(parts)


def seed_start(values: dict[str, Any]) -> object:
    """The first seed of the batch: random when asked (or none given), else the form's (the
    compiler checks it)."""
    seed = values["seed"]
    if values["random_seed"] or seed is None or (isinstance(seed, (int, float)) and seed < 0):
        return random.SystemRandom().randrange(_SEED_RANGE)
    return seed

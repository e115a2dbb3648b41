"""Workflows whose stages feed each other: a Sampler's images into another Sampler's picture input
(directly or through Upscale), Load image and Mask nodes, strength sweeps; compiled, then run on a
real engine with the toy pipeline (its images depend only on each request's own parameters, init
image included, and it logs the request ids of every forward)."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image

from engine import Engine, ServingLimits
from pipelines.toy import ToyPipeline
from studio.page.form_workflow import form_workflow, start_picture
from studio.pictures import MAX_DATA_URL_CHARS, MaskSpec, picture_data_url, sized, start_size
from studio.workflows.compiler import compile_workflow
from studio.workflows.format import (
    MAX_SAVED_WORKFLOW_CHARS,
    MAX_WORKFLOW_BYTES,
    WorkflowError,
    for_saving,
    link_json,
    parse_workflow,
)
from studio.workflows.limits import ModelLimits, WorkflowLimits
from studio.workflows.run import WorkflowRun
from tests.engine_helpers import solo_pixels

TOY = ModelLimits(name="toy", max_size=256, image_inputs=("init_image", "mask_image"))
LIMITS = WorkflowLimits((TOY,))
PROMPT = "a red circle"


def node(node_id: str, node_type: str, **values) -> dict:
    return {"id": node_id, "type": node_type, "values": values}


def picture(size=(64, 64), colour=(200, 40, 30), mode="RGB") -> Image.Image:
    image = Image.new(mode, size, colour if mode == "RGB" else colour + (255,))
    return image


def two_stages(seeds: int = 2, strengths: str = "0.5, 1.0", steps: str = "4", factor: float | None = None) -> dict:
    """Prompt + Seed batch -> Sampler s1 -> [Upscale] -> Sampler s2 (strength sweep) -> Grid."""
    nodes = [node("p", "prompt", text=PROMPT), node("b", "seed_batch", start=3, count=seeds),
             node("t", "sweep", param="steps", values=steps) if "," in steps else node("t", "steps", steps=int(steps)),
             node("s1", "sampler"),
             node("st", "sweep", param="strength", values=strengths), node("s2", "sampler"),
             node("g", "grid", x="strength", y="auto")]
    links = [link_json("p", "prompt", "s1"), link_json("b", "seed", "s1"), link_json("t", "values" if "," in steps else "steps", "s1", "steps"),
             link_json("p", "prompt", "s2"), link_json("st", "values", "s2", "strength"),
             link_json("s2", "images", "g")]
    if factor is None:
        links.append(link_json("s1", "images", "s2", "image"))
    else:
        nodes.append(node("u", "upscale", factor=factor))
        links += [link_json("s1", "images", "u", "image"), link_json("u", "image", "s2", "image")]
    return {"version": 1, "nodes": nodes, "links": links}


def compiled(source: dict, limits: WorkflowLimits = LIMITS, **kwargs):
    return compile_workflow(parse_workflow(source), limits, **kwargs)


def problems(source: dict, limits: WorkflowLimits = LIMITS, **kwargs) -> list[tuple]:
    with pytest.raises(WorkflowError) as caught:
        compiled(source, limits, **kwargs)
    return [(p["node"], p["port"], p["message"]) for p in caught.value.as_dicts()]


def load_and_mask(image: Image.Image, mask: dict | None = None, strength: float = 0.75, steps: int = 4) -> dict:
    """Load image (+ Mask) -> Sampler."""
    nodes = [node("p", "prompt", text=PROMPT), node("li", "load_image", image=picture_data_url(image)),
             node("k", "strength", strength=strength), node("n", "steps", steps=steps), node("s", "sampler")]
    links = [link_json("p", "prompt", "s"), link_json("li", "image", "s"), link_json("k", "strength", "s"),
             link_json("n", "steps", "s")]
    if mask is not None:
        nodes.append(node("m", "mask", **mask))
        links.append(link_json("m", "mask", "s"))
        if mask.get("source") == "alpha":
            links.append(link_json("li", "image", "m", "image"))
    return {"version": 1, "nodes": nodes, "links": links}


# ---------------------------------------------------------------------------- compiling
def test_a_second_stage_makes_one_branch_per_earlier_image_times_its_own_sweep():
    result = compiled(two_stages(seeds=2, strengths="0.5, 1.0", factor=2))
    first = [b for b in result.branches if b.sampler == "s1"]
    second = [b for b in result.branches if b.sampler == "s2"]
    assert [b.index for b in first] == [0, 1] and [b.parent for b in first] == [None, None]
    assert [(b.parent, b.params.strength) for b in second] == [(0, 0.5), (0, 1.0), (1, 0.5), (1, 1.0)]
    # Its own sweep first, then the earlier stage's: the grid lays stage 2 out by stage 1's seeds.
    assert [b.label for b in second] == ["strength 0.5, seed 3", "strength 1, seed 3",
                                         "strength 0.5, seed 4", "strength 1, seed 4"]
    assert all(b.start.scale == 2.0 and b.start.multiple == 8 for b in second)
    assert second[0].params.width is None  # the earlier image's size x 2, known when it is prepared
    (grid,) = result.grids
    assert (grid.x_axis, grid.y_axis, grid.columns, grid.rows) == ("strength", "seed", ("0.5", "1"), ("3", "4"))
    assert grid.cells == ((2, 3), (4, 5))
    assert result.node_branches["u"] == (2, 3, 4, 5) and result.node_branches["s1"] == (0, 1)
    assert result.node_branches["p"] == (0, 1, 2, 3, 4, 5)
    assert result.descendants(0) == [2, 3] and result.descendants(1) == [4, 5] and result.descendants(2) == []
    # An error about the size is shown at the Upscale's factor.
    assert second[0].source_of("width") == ("u", "factor")


def test_stages_count_towards_the_branch_limit_together():
    limits = WorkflowLimits((TOY,), max_branches=5)
    found = problems(two_stages(seeds=2, strengths="0.5, 1.0"), limits)
    assert found == [
        ("s1", None, "makes 2 branches; with the other samplers the run would make 6, more than the limit of 5 "
                     "(--max-branches)."),
        ("s2", None, "makes 4 branches; with the other samplers the run would make 6, more than the limit of 5 "
                     "(--max-branches).")]


def test_a_load_image_sets_the_size_and_a_mask_is_drawn_at_it():
    result = compiled(load_and_mask(picture((40, 24)), {"source": "rectangle", "x": 8, "y": 0, "width": 16,
                                                        "height": 100, "invert": "no"}))
    (branch,) = result.branches
    assert (branch.params.width, branch.params.height, branch.params.strength) == (40, 24, 0.75)
    assert branch.start.picture.size == (40, 24) and branch.start.parent is None
    mask = np.asarray(branch.start.mask.render((40, 24)))
    assert mask.shape == (24, 40) and mask[:, 8:24].min() == 255 and mask[:, :8].max() == 0 and mask[:, 24:].max() == 0
    assert result.node_branches["li"] == (0,) and result.node_branches["m"] == (0,)


def test_a_mask_from_alpha_repaints_the_transparent_part():
    rgba = Image.new("RGBA", (32, 32), (10, 200, 10, 255))
    rgba.paste((0, 0, 0, 0), (0, 0, 16, 32))
    (branch,) = compiled(load_and_mask(rgba, {"source": "alpha", "invert": "yes"})).branches
    mask = np.asarray(branch.start.mask.render((32, 32)))
    assert mask[:, :16].max() == 0 and mask[:, 16:].min() == 255  # inverted: the opaque half is repainted
    assert branch.start.picture.mode == "RGBA"  # the sampler's picture is made RGB when it is sized
    assert sized(branch.start.picture, (32, 32)).mode == "RGB"


def test_what_a_picture_input_needs_is_shown_at_its_node_and_port():
    opaque = picture((32, 32))
    assert problems(load_and_mask(opaque, {"source": "alpha", "invert": "no"})) == [
        ("m", "image", "a mask from alpha needs a Load image whose picture has transparent pixels (a PNG with an "
                       "alpha channel).")]
    no_picture = load_and_mask(opaque)
    no_picture["nodes"][1]["values"]["image"] = ""
    assert problems(no_picture) == [
        ("li", "image", "has no picture: upload one, drop one on the node or pick a saved result.")]
    broken = load_and_mask(opaque)
    broken["nodes"][1]["values"]["image"] = "data:image/png;base64,iVBORw0KGgo="
    [(node_id, port, message)] = problems(broken)
    assert (node_id, port) == ("li", "image") and message.startswith("image is not a picture this server reads")
    named = load_and_mask(opaque)
    named["nodes"][1]["values"]["image"] = "2026-12-01/00001-3.png"
    [(node_id, port, message)] = problems(named)
    assert (node_id, port) == ("li", "image") and "reads no saved results by name" in message

    def saved(name: str) -> bytes:
        raise ValueError(f"{name!r} is not one of your saved results.")

    assert problems(named, picture_files=saved) == [("li", "image", "'2026-12-01/00001-3.png' is not one of your "
                                                                    "saved results.")]
    # Strength and mask without a picture; a model that takes no pictures.
    plain = {"version": 1, "nodes": [node("p", "prompt", text=PROMPT), node("k", "strength", strength=0.5),
                                     node("m", "mask"), node("s", "sampler")],
             "links": [link_json("p", "prompt", "s"), link_json("k", "strength", "s"), link_json("m", "mask", "s")]}
    assert problems(plain) == [("s", "mask", "a mask needs a picture to redraw: link an image input too."),
                               ("s", "strength", "a strength needs a picture to redraw: link an image input too.")]
    text_only = WorkflowLimits((ModelLimits(name="toy", max_size=256),))
    assert problems(load_and_mask(opaque), text_only) == [
        ("s", "image", "this model takes no pictures to start from: remove the link.")]


def test_a_picture_a_model_can_not_take_is_refused_at_the_node_that_sized_it():
    card = WorkflowLimits((replace(TOY, sizes=((64, 64),)),))
    assert problems(load_and_mask(picture((40, 24))), card) == [
        ("li", "image", "the picture makes a 40x24 request: width=40, height=24 is not a size toy makes: allowed "
                        "is 64x64.")]
    upscaled = two_stages(factor=0.25)
    upscaled["nodes"][-1]["values"]["factor"] = 5
    assert problems(upscaled) == [("u", "factor", "5 is out of range: allowed is 0.25..4.")]


def test_start_sizes_round_to_the_models_multiple():
    assert start_size((64, 64), 1.5, 8) == (96, 96)
    assert start_size((100, 75), 1.0, 16) == (96, 80)
    assert start_size((8, 8), 0.25, 8) == (8, 8)  # never below one multiple


def test_pictures_are_limited_apart_from_the_rest_of_the_workflow():
    big = Image.effect_noise((256, 256), 64).convert("RGB")  # noise: a PNG that does not compress
    workflow = load_and_mask(big)
    url = workflow["nodes"][1]["values"]["image"]
    assert len(url) > MAX_WORKFLOW_BYTES // 4  # far past a prompt's 2,000 characters, and still a value
    assert len(compiled(workflow).branches) == 1
    assert len(compiled(json.dumps(workflow)).branches) == 1  # as text too
    too_long = load_and_mask(picture((8, 8)))
    too_long["nodes"][1]["values"]["image"] = "data:image/png;base64," + "A" * MAX_DATA_URL_CHARS
    [(node_id, port, message)] = problems(too_long)
    assert (node_id, port) == ("li", "image") and f"at most {MAX_DATA_URL_CHARS} are allowed" in message
    # The rest of the graph is still held to 256 KiB, pictures or not.
    padded = load_and_mask(big)
    padded["notes"] = "x" * MAX_WORKFLOW_BYTES
    [(_, _, message)] = problems(padded)
    assert message.startswith("the workflow is ") and message.endswith(
        f"bytes as compact JSON without its pictures; at most {MAX_WORKFLOW_BYTES} are allowed.")


def test_a_saved_workflow_keeps_its_pictures_up_to_a_size():
    small = load_and_mask(picture((16, 16)))
    assert for_saving(small) is small
    big = load_and_mask(Image.effect_noise((700, 700), 64).convert("RGB"))
    assert len(json.dumps(big)) > MAX_SAVED_WORKFLOW_CHARS
    saved = for_saving(big)
    assert saved["pictures_left_out"] == 1 and saved["nodes"][1]["values"]["image"] == ""
    assert big["nodes"][1]["values"]["image"].startswith("data:image/png")  # the run's own copy is untouched
    assert problems(saved)[0][:2] == ("li", "image")  # opened again, it asks for the picture


def test_mask_specs_draw_boxes_clipped_and_pictures_resized():
    box = np.asarray(MaskSpec(box=(48, 48, 64, 64)).render((64, 64)))
    assert box[48:, 48:].min() == 255 and box[:48].max() == 0 and box[:, :48].max() == 0
    painted = Image.new("L", (16, 16), 0)
    painted.paste(255, (0, 0, 8, 16))
    drawn = np.asarray(MaskSpec(picture=painted).render((32, 32)))
    assert drawn[:, :16].min() == 255 and drawn[:, 16:].max() == 0


# ---------------------------------------------------------------------------- running
@pytest.fixture
def toy():
    pipeline = ToyPipeline()
    engine = Engine(pipeline, max_batch_requests=8, limits=ServingLimits(max_per_session=16, max_size=256))
    yield pipeline, engine
    engine.close()


def drive(run: WorkflowRun, engine: Engine, on_view=None):
    async def go():
        views = []
        async for view in run.updates():
            views.append(view)
            if len(views) == 1:
                engine.start()
            if on_view is not None:
                on_view(view)
        return views

    return asyncio.run(go())


def test_a_later_stage_starts_as_soon_as_its_own_branch_ends_and_shares_forwards_with_the_rest(toy):
    pipeline, engine = toy
    # Stage 1: a 2-step and a 12-step branch; stage 2 redraws each at strength 1 (every step runs).
    source = two_stages(seeds=1, strengths="1.0", steps="2, 12")
    run = WorkflowRun(engine, compiled(source), session_id="tab", preview_every=0)
    fast_child_submitted = threading.Event()

    def hold_the_slow_branch(index, batch):  # in its third step, until the fast branch's stage 2 is in
        if index == 2:
            assert fast_child_submitted.wait(30), "the fast branch's second stage was never submitted"

    def on_view(view):
        if view.branches[2].request_id is not None:
            fast_child_submitted.set()

    pipeline.on_forward = hold_the_slow_branch
    views = drive(run, engine, on_view)
    final = views[-1]
    assert final.state == "completed" and [b.state for b in final.branches] == ["completed"] * 4
    ids = [b.request_id for b in final.branches]
    fast, slow, after_fast, after_slow = ids  # s1: steps 2, steps 12; s2: from each
    # No barrier: the fast branch's second stage shared forwards with the slow branch's first.
    shared = [forward for forward in pipeline.forward_log if after_fast in forward and slow in forward]
    assert len(shared) >= 2
    assert all(after_slow not in forward for forward in pipeline.forward_log if slow in forward)
    # Each second-stage image is what the same request makes alone from its first stage's image.
    for child, parent in ((final.branches[2], final.branches[0]), (final.branches[3], final.branches[1])):
        init = parent.result.images[0]
        assert child.params.init_image_digest == replace(child.params, init_image=init).init_image_digest
        alone = solo_pixels(replace(child.params, init_image=init, preview_every=0))
        assert np.array_equal(np.asarray(child.result.images[0]), alone)
    # Stage 2's total is its own steps: the toy model's default 8, all of them at strength 1.
    assert [b.total for b in final.branches] == [2, 12, 8, 8]


def test_an_upscaled_stage_starts_from_the_lanczos_enlarged_image(toy):
    pipeline, engine = toy
    run = WorkflowRun(engine, compiled(two_stages(seeds=1, strengths="0.5", factor=1.5)), session_id="tab")
    final = drive(run, engine)[-1]
    first, second = final.branches
    assert (second.params.width, second.params.height) == (96, 96)
    expected = first.result.images[0].resize((96, 96), Image.LANCZOS)
    assert np.array_equal(np.asarray(second.params.init_image), np.asarray(expected))
    assert second.result.images[0].size == (96, 96)


def test_an_inpainted_stage_keeps_the_picture_outside_its_mask(toy):
    pipeline, engine = toy
    start = Image.effect_noise((32, 32), 80).convert("RGB")
    source = load_and_mask(start, {"source": "rectangle", "x": 0, "y": 0, "width": 16, "height": 32, "invert": "no"},
                           strength=1.0)
    final = drive(WorkflowRun(engine, compiled(source), session_id="tab"), engine)[-1]
    (branch,) = final.branches
    made, before = np.asarray(branch.result.images[0]).astype(int), np.asarray(start).astype(int)
    assert np.array_equal(made[:, 16:], before[:, 16:])  # kept exactly
    assert np.abs(made[:, :16] - before[:, :16]).mean() > 20  # repainted


def test_cancelling_a_branch_cancels_the_stages_that_start_from_it(toy):
    pipeline, engine = toy
    compiled_run = compiled(two_stages(seeds=2, strengths="0.5", steps="6"))
    run = WorkflowRun(engine, compiled_run, session_id="tab")
    cancelled, cancel_made = [], threading.Event()

    def hold_until_cancelled(index, batch):  # in the second forward: the views see branch 0 running, however busy
        if index == 1:
            assert cancel_made.wait(30), "branch 0 was never seen running"

    def on_view(view):
        if not cancelled and view.branches[0].state == "running":
            cancelled.append(run.cancel_branch(0))
            cancel_made.set()

    pipeline.on_forward = hold_until_cancelled
    final = drive(run, engine, on_view)[-1]
    assert cancelled == [True]
    states = [b.state for b in final.branches]
    assert states == ["aborted", "completed", "aborted", "completed"]
    assert final.branches[2].request_id is None  # never reached the engine
    assert final.state == "partial"


def test_a_stage_whose_source_failed_does_not_run(toy):
    pipeline, engine = toy
    source = two_stages(seeds=1, strengths="0.5")
    # Stage 1 fans out over two prompts, one of which fails; stage 2 has a prompt of its own.
    source["nodes"] += [node("pl", "prompt_list", prompts=f"{PROMPT} [fail:denoise_step]\n{PROMPT}")]
    source["links"][0] = link_json("pl", "prompt", "s1")
    final = drive(WorkflowRun(engine, compiled(source), session_id="tab"), engine)[-1]
    assert [(b.branch.sampler, b.branch.parent, b.state) for b in final.branches] == [
        ("s1", None, "failed"), ("s1", None, "completed"), ("s2", 0, "aborted"), ("s2", 1, "completed")]
    assert final.branches[2].message == "not run: branch 0, whose image it starts from, failed"
    assert final.branches[2].request_id is None
    assert final.state == "partial"  # one result made, the rest failed or not run


# ---------------------------------------------------------------------------- the Simple tab's form
def test_the_simple_tabs_picture_and_painted_strokes_become_load_image_and_mask_nodes():
    background = Image.new("RGB", (48, 40), (30, 60, 200))
    strokes = Image.new("RGBA", (48, 40), (0, 0, 0, 0))
    strokes.paste((255, 255, 255, 255), (0, 0, 12, 40))  # the left quarter painted
    values = {"prompt": "a red circle", "batch_count": 2, "width": 64, "height": 64, "steps": 6,
              "guidance_scale": 1.0, "model": "", "picture": {"background": background, "layers": [strokes],
                                                             "composite": background}, "strength": 0.5}
    workflow = form_workflow(values, uses_negative_prompt=False, seed_start=5)
    result = compiled(workflow)
    assert [(b.params.seed, b.params.strength, b.params.width) for b in result.branches] == [(5, 0.5, 64), (6, 0.5, 64)]
    start = result.branches[0].start
    assert np.array_equal(np.asarray(start.picture.convert("RGB")), np.asarray(background))
    mask = np.asarray(start.mask.render((64, 64)))  # drawn at the form's size, as the picture is resized to it
    assert mask[:, :15].min() == 255 and mask[:, 17:].max() == 0
    # Nothing painted: no mask; no picture: a plain text-to-image form.
    assert start_picture({"background": background, "layers": [Image.new("RGBA", (48, 40))]})[1] is None
    assert start_picture(None) == (None, None)
    plain = compiled(form_workflow({**values, "picture": None}, uses_negative_prompt=False, seed_start=5))
    assert plain.branches[0].start is None and plain.branches[0].params.strength is None

"""Bypassed nodes (`"bypass": true`), compiled: each passes through what its outputs' inputs take (a
picture, a LoRA chain, an earlier stage's images), or leaves them unlinked; the branches, grids and
problems that follow, and the flag kept in the workflow as sent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.lora_request import LoraUse
from studio.workflows.bypass import without_bypassed
from studio.workflows.compiler import compile_workflow
from studio.workflows.format import link_json, parse_workflow
from studio.workflows.limits import ModelLimits, WorkflowLimits
from tests.test_workflow_compiler import LIMITS, link, node, problems, workflow
from tests.test_workflow_stages import LIMITS as PICTURE_LIMITS
from tests.test_workflow_stages import compiled as compiled_stages
from tests.test_workflow_stages import two_stages

XY = json.loads((Path(__file__).resolve().parent.parent / "assets" / "workflows" / "guidance-steps-xy.json").read_text())
LORA_LIMITS = WorkflowLimits((ModelLimits(name="shapes", max_steps=100, max_size=256, loras=("outline", "thick")),))


def bypassed(source: dict, *node_ids: str) -> dict:
    """`source` with these nodes bypassed."""
    return {**source, "nodes": [{**n, "bypass": True} if n["id"] in node_ids else n for n in source["nodes"]]}


def test_the_xy_example_with_its_steps_sweep_bypassed_makes_the_guidance_row_alone():
    whole = compile_workflow(parse_workflow(XY), LIMITS)
    assert len(whole.branches) == 9
    result = compile_workflow(parse_workflow(bypassed(XY, "4")), LIMITS)
    assert [(b.params.guidance_scale, b.params.num_inference_steps, b.params.seed) for b in result.branches] == [
        (1.0, None, 7), (3.0, None, 7), (5.0, None, 7)]  # steps: the model's default
    (grid,) = result.grids  # its Y axis ("steps") was the bypassed Sweep's: taken as auto, not refused
    assert (grid.x_axis, grid.y_axis, grid.columns, grid.rows, grid.cells) == (
        "guidance", None, ("1", "3", "5"), ("",), ((0, 1, 2),))
    # The compiled run keeps the workflow as sent (saved with each result, shown in the editor);
    # the bypassed node takes part in no branch.
    assert result.workflow.nodes["4"].bypass and result.workflow.to_json()["nodes"][3]["bypass"] is True
    assert result.node_branches["4"] == () and result.node_branches["5"] == (0, 1, 2)
    # Both Sweeps bypassed: one branch, a one-cell grid.
    single = compile_workflow(parse_workflow(bypassed(XY, "3", "4")), LIMITS)
    assert [(b.params.guidance_scale, b.params.num_inference_steps) for b in single.branches] == [(None, None)]
    assert single.grids[0].cells == ((0,),)


def test_a_bypassed_upscale_hands_on_the_picture_it_gets():
    upscaled = compiled_stages(two_stages(factor=2.0))
    plain = compiled_stages(bypassed(two_stages(factor=2.0), "u"))
    for result, scale in ((upscaled, 2.0), (plain, 1.0)):
        stage_two = [b for b in result.branches if b.sampler == "s2"]
        assert [(b.parent, b.start.scale, b.params.strength) for b in stage_two] == [
            (0, scale, 0.5), (0, scale, 1.0), (1, scale, 0.5), (1, scale, 1.0)]
        assert len(result.branches) == 6
    assert plain.node_branches["u"] == () and upscaled.node_branches["u"] == (2, 3, 4, 5)


def test_a_bypassed_lora_hands_on_the_chain_before_it():
    nodes = [node("p", "prompt", text="a red circle"), node("s", "sampler"),
             node("a", "lora", name="outline", scale=1), node("b", "lora", name="thick", scale=0.5)]
    links = [link("p", "prompt", "s", "prompt"), link("a", "lora", "b", "lora"), link("b", "lora", "s", "lora")]

    def loras(*off: str) -> tuple:
        (branch,) = compile_workflow(parse_workflow(bypassed(workflow(nodes, links), *off)), LORA_LIMITS).branches
        return branch.params.loras

    assert loras() == (LoraUse("outline", 1.0), LoraUse("thick", 0.5))
    assert loras("b") == (LoraUse("outline", 1.0),)  # the chain before it passes through
    assert loras("a") == (LoraUse("thick", 0.5),)  # nothing feeds it: the chain starts at b
    assert loras("a", "b") == ()  # a chain of bypassed nodes: nothing left


def stage_two_bypassed_workflow() -> dict:
    """Prompt + Seed batch (2) -> s1 -> s2 (strength sweep, bypassed) -> Grid (X: strength) and Image output."""
    source = bypassed(two_stages(seeds=2), "s2")
    source["nodes"].append({"id": "o", "type": "image_output", "values": {}})
    source["links"].append(link_json("s2", "images", "o"))
    return source


def test_a_bypassed_second_stage_hands_the_first_stages_images_to_its_outputs():
    result = compiled_stages(stage_two_bypassed_workflow())
    assert [(b.sampler, b.params.seed, b.parent) for b in result.branches] == [("s1", 3, None), ("s1", 4, None)]
    assert result.node_branches["g"] == result.node_branches["o"] == (0, 1)
    assert result.node_branches["s2"] == result.node_branches["st"] == ()
    (grid,) = result.grids  # its X axis, the bypassed stage's strength, is taken as auto: stage 1's seeds
    assert (grid.sampler, grid.x_axis, grid.columns, grid.cells) == ("s1", "seed", ("3", "4"), ((0, 1),))


def test_a_chain_of_bypassed_nodes_resolves_through_and_a_picture_is_no_stages_images():
    """Grid <- s2 <- Upscale <- s1: the Upscale hands on a picture, which no Grid takes; bypassed
    too, it hands on s1's images, and so does s2."""
    source = stage_two_bypassed_workflow()
    source["nodes"].append({"id": "u", "type": "upscale", "values": {"factor": 2}})
    source["links"] = [lk for lk in source["links"] if lk["to"] != {"node": "s2", "port": "image"}] + [
        link_json("s1", "images", "u", "image"), link_json("u", "image", "s2", "image")]
    message = ("this input is required, and Sampler (node s2), which feeds it, is bypassed and passes no images "
               "through: stop bypassing it, or link another images output here.")
    assert problems(None, None, source=source) == [("g", "images", message), ("o", "images", message)]
    runnable = without_bypassed(parse_workflow(bypassed(source, "u")))
    assert sorted((lk.source.node, lk.source.port, lk.target.node, lk.target.port) for lk in runnable.links) == [
        ("b", "seed", "s1", "seed"), ("p", "prompt", "s1", "prompt"), ("s1", "images", "g", "images"),
        ("s1", "images", "o", "images"), ("t", "steps", "s1", "steps")]
    assert set(runnable.nodes) == {"p", "b", "t", "st", "s1", "g", "o"}  # the strength Sweep feeds nothing now
    assert compiled_stages(bypassed(source, "u")).node_branches["g"] == (0, 1)


def test_a_bypassed_prompt_leaves_the_required_prompt_unlinked_and_says_so():
    nodes = [node("1", "prompt", text="a red circle"), node("2", "sampler")]
    source = bypassed(workflow(nodes, [link("1", "prompt", "2", "prompt")]), "1")
    assert problems(None, None, source=source) == [
        ("2", "prompt", "this input is required, and Prompt (node 1), which feeds it, is bypassed and passes no "
                        "prompt through: stop bypassing it, or link another prompt output here.")]
    # The only Sampler bypassed: nothing to make.
    assert problems(None, None, source=bypassed(workflow(nodes, [link("1", "prompt", "2", "prompt")]), "2")) == [
        (None, None, "every Sampler is bypassed (Sampler (node 2)), so the workflow makes nothing: stop bypassing one.")]


@pytest.mark.parametrize("value", ["yes", 1, None, [True]])
def test_bypass_is_true_or_false(value):
    source = workflow([{**node("1", "prompt", text="a"), "bypass": value}, node("2", "sampler")],
                      [link("1", "prompt", "2", "prompt")])
    assert problems(None, None, source=source) == [
        ("1", None, f"bypass must be true or false (or left out), got {value!r}.")]


def test_bypass_round_trips_through_the_workflow_json():
    source = bypassed(two_stages(factor=2.0), "u")
    parsed = parse_workflow(source)
    written = parsed.to_json()
    assert [n["id"] for n in written["nodes"] if "bypass" in n] == ["u"]
    assert {n["id"]: n.get("bypass") for n in written["nodes"]}["u"] is True
    assert parse_workflow(written) == parsed
    off = {**source, "nodes": [{**n, "bypass": False} for n in source["nodes"]]}
    assert all("bypass" not in n for n in parse_workflow(off).to_json()["nodes"])  # written only when true
    assert compiled_stages(source, PICTURE_LIMITS).workflow == parsed

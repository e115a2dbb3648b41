"""The workflow format and compiler on their own: fan-out products, every error kind, limits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from studio.workflows.branches import with_run_settings
from studio.workflows.compiler import compile_workflow
from studio.workflows.format import (
    MAX_NODES,
    MAX_VALUE_CHARS,
    MAX_WORKFLOW_BYTES,
    MAX_WORKFLOW_DEPTH,
    WorkflowError,
    json_bytes,
    parse_workflow,
)
from studio.workflows.limits import ModelLimits, WorkflowLimits
from studio.workflows.nodes import NODE_TYPES, node_type_specs
from studio.workflows.run_views import result_caption

LIMITS = WorkflowLimits((ModelLimits(max_steps=100, max_size=256, size_multiple=16, schedulers=("euler", "ddim"),
                                     uses_negative_prompt=True),), max_branches=64)


def node(node_id, node_type, **values):
    return {"id": node_id, "type": node_type, "values": values, "position": [0, 0]}


def link(source, source_port, target, target_port):
    return {"from": {"node": source, "port": source_port}, "to": {"node": target, "port": target_port}}


def workflow(nodes, links):
    return {"version": 1, "nodes": nodes, "links": links}


def compiled(nodes, links, limits=LIMITS):
    return compile_workflow(parse_workflow(workflow(nodes, links)), limits)


def problems(nodes, links, limits=LIMITS, source=None):
    with pytest.raises(WorkflowError) as caught:
        compile_workflow(parse_workflow(source if source is not None else workflow(nodes, links)), limits)
    return [(p.node_id, p.port, p.message) for p in caught.value.problems]


PROMPT = node("p", "prompt", text="a red circle")
SAMPLER = node("s", "sampler")
TO_SAMPLER = link("p", "prompt", "s", "prompt")


# ---------------------------------------------------------------------------- products
def test_a_single_prompt_makes_one_branch_with_model_defaults():
    result = compiled([PROMPT, SAMPLER], [TO_SAMPLER])
    assert len(result.branches) == 1
    params = result.branches[0].params
    assert params.prompt == "a red circle"
    assert (params.width, params.height, params.num_inference_steps, params.guidance_scale, params.seed) == (
        None, None, None, None, None)
    assert result.branches[0].axes == ()


def test_fan_outs_multiply_in_input_order():
    nodes = [
        node("pl", "prompt_list", prompts="a red circle\n\n  a blue square  \n"),
        node("sb", "seed_batch", start=10, count=3),
        node("g", "sweep", param="guidance", values="1, 2.5"),
        SAMPLER,
    ]
    links = [link("pl", "prompt", "s", "prompt"), link("sb", "seed", "s", "seed"), link("g", "values", "s", "guidance")]
    result = compiled(nodes, links)
    combos = [(b.params.prompt, b.params.seed, b.params.guidance_scale) for b in result.branches]
    assert combos == [
        (prompt, seed, guidance)
        for prompt in ("a red circle", "a blue square")
        for seed in (10, 11, 12)
        for guidance in (1.0, 2.5)
    ]
    assert [a.input for a in result.branches[0].axes] == ["prompt", "seed", "guidance"]
    assert result.branches[5].label == "prompt a red circle, seed 12, guidance 2.5"
    assert result.node_branches["sb"] == tuple(range(12))


def test_every_sweepable_setting_parses_its_values():
    nodes = [PROMPT, SAMPLER,
             node("a", "sweep", param="steps", values="4,8"),
             node("b", "sweep", param="size", values="64x32, 128X128"),
             node("c", "sweep", param="scheduler", values="euler, default"),
             node("d", "sweep", param="seed", values="5, -1")]
    links = [TO_SAMPLER, link("a", "values", "s", "steps"), link("b", "values", "s", "size"),
             link("c", "values", "s", "scheduler"), link("d", "values", "s", "seed")]
    result = compiled(nodes, links)
    assert len(result.branches) == 16
    first, last = result.branches[0].params, result.branches[-1].params
    assert (first.width, first.height, first.num_inference_steps, first.scheduler, first.seed) == (64, 32, 4, "euler", 5)
    assert (last.width, last.height, last.num_inference_steps, last.scheduler, last.seed) == (128, 128, 8, None, None)


def test_a_step_cache_node_and_a_sweep_of_thresholds_set_each_branchs_step_cache():
    one = compiled([PROMPT, SAMPLER, node("c", "step_cache", threshold=0.25)],
                   [TO_SAMPLER, link("c", "step_cache", "s", "step_cache")])
    assert one.branches[0].params.step_cache == 0.25
    swept = compiled([PROMPT, SAMPLER, node("w", "sweep", param="step_cache", values="0, 0.1, 0.3")],
                     [TO_SAMPLER, link("w", "values", "s", "step_cache")])
    assert [b.params.step_cache for b in swept.branches] == [0.0, 0.1, 0.3]
    assert compiled([PROMPT, SAMPLER], [TO_SAMPLER]).branches[0].params.step_cache is None  # the model's default
    found = problems([PROMPT, SAMPLER, node("c", "step_cache", threshold=2)],
                     [TO_SAMPLER, link("c", "step_cache", "s", "step_cache")])
    assert found == [("c", "threshold", "step_cache=2.0 is not allowed: use a threshold in 0..1 (0 = off; higher "
                                        "skips more steps, e.g. 0.05).")]


def test_random_seed_is_shared_by_a_samplers_branches_and_explicit_seeds_stay():
    nodes = [PROMPT, SAMPLER, node("g", "sweep", param="guidance", values="1, 3")]
    result = compiled(nodes, [TO_SAMPLER, link("g", "values", "s", "guidance")])
    seeds = {with_run_settings(b, seed=77, preview_every=2).seed for b in result.branches}
    assert seeds == {77}
    assert with_run_settings(result.branches[0], seed=77, preview_every=2).preview_every == 2
    fixed = compiled([PROMPT, SAMPLER, node("d", "seed", seed="12")], [TO_SAMPLER, link("d", "seed", "s", "seed")])
    assert with_run_settings(fixed.branches[0], seed=77, preview_every=0).seed == 12


def test_two_samplers_share_a_prompt_and_each_output_sees_its_own_branches():
    nodes = [PROMPT, SAMPLER, node("s2", "sampler"), node("b", "seed_batch", start=0, count=2),
             node("out1", "image_output"), node("out2", "live_preview")]
    links = [TO_SAMPLER, link("p", "prompt", "s2", "prompt"), link("b", "seed", "s2", "seed"),
             link("s", "images", "out1", "images"), link("s2", "images", "out2", "images")]
    result = compiled(nodes, links)
    assert [b.sampler for b in result.branches] == ["s", "s2", "s2"]
    assert result.node_branches["p"] == (0, 1, 2)
    assert result.node_branches["out1"] == (0,)
    assert result.node_branches["out2"] == (1, 2)


def test_grid_layout_labels_axes_with_the_swept_values():
    nodes = [PROMPT, SAMPLER, node("g", "sweep", param="guidance", values="1, 3, 5"),
             node("t", "sweep", param="steps", values="10, 20"), node("grid", "grid", x="guidance", y="steps")]
    links = [TO_SAMPLER, link("g", "values", "s", "guidance"), link("t", "values", "s", "steps"),
             link("s", "images", "grid", "images")]
    result = compiled(nodes, links)
    (grid,) = result.grids
    assert (grid.x_axis, grid.y_axis) == ("guidance", "steps")
    assert grid.columns == ("1", "3", "5") and grid.rows == ("10", "20")
    for row, steps in enumerate((10, 20)):
        for col, guidance in enumerate((1.0, 3.0, 5.0)):
            params = result.branches[grid.cells[row][col]].params
            assert (params.num_inference_steps, params.guidance_scale) == (steps, guidance)


def test_a_results_caption_names_every_swept_value_and_the_seed():
    example = Path(__file__).resolve().parents[1] / "assets" / "workflows" / "guidance-steps-xy.json"
    xy = compile_workflow(parse_workflow(example.read_text()), LIMITS)
    assert [result_caption(b, b.params.seed) for b in xy.branches] == [
        f"steps {steps}, guidance {guidance} · seed 7" for steps in (5, 10, 20) for guidance in (1, 3, 5)]
    # A swept seed is named once, with the other swept values; a branch without fan-outs names its seed.
    batch = compiled([PROMPT, SAMPLER, node("b", "seed_batch", start=3, count=2),
                      node("g", "sweep", param="guidance", values="1, 2.5")],
                     [TO_SAMPLER, link("b", "seed", "s", "seed"), link("g", "values", "s", "guidance")])
    assert [result_caption(b, b.params.seed) for b in batch.branches] == [
        "seed 3, guidance 1", "seed 3, guidance 2.5", "seed 4, guidance 1", "seed 4, guidance 2.5"]
    (single,) = compiled([PROMPT, SAMPLER], [TO_SAMPLER]).branches
    assert result_caption(single, 1234) == "seed 1234"


def test_grid_auto_axes_and_a_third_fan_out_joins_the_rows():
    nodes = [node("pl", "prompt_list", prompts="a\nb"), SAMPLER, node("b", "seed_batch", start=1, count=2),
             node("g", "sweep", param="guidance", values="1, 2"), node("grid", "grid")]
    links = [link("pl", "prompt", "s", "prompt"), link("b", "seed", "s", "seed"), link("g", "values", "s", "guidance"),
             link("s", "images", "grid", "images")]
    (grid,) = compiled(nodes, links).grids
    assert grid.x_axis == "prompt" and grid.y_axis == "seed · guidance"
    assert grid.columns == ("a", "b") and grid.rows == ("1 · 1", "1 · 2", "2 · 1", "2 · 2")
    assert sorted(i for row in grid.cells for i in row) == list(range(8))


# ---------------------------------------------------------------------------- errors name node and port
def test_malformed_json_too_large_and_wrong_version():
    assert "not valid JSON" in problems(None, None, source="{nodes: [")[0][2]
    assert f"at most {MAX_WORKFLOW_BYTES}" in problems(None, None, source="x" * (2 * 1024 * 1024))[0][2]
    assert "version=2 is not supported" in problems(None, None, source={"version": 2, "nodes": [], "links": []})[0][2]
    assert "JSON object" in problems(None, None, source="[1, 2]")[0][2]


def test_ten_thousand_nodes_are_refused_before_any_is_read():
    many = workflow([node(str(i), "prompt", text="x") for i in range(10_000)], [])
    text = json.dumps(many)
    assert len(text) > MAX_WORKFLOW_BYTES  # refused by size, as text...
    assert problems(None, None, source=text) == [(None, None, f"the workflow is {len(text)} bytes; at most 262144 are allowed.")]
    compact = len(json.dumps(many, separators=(",", ":")))  # ...and as an object, by its compact JSON
    assert compact == 688_924
    assert problems(None, None, source=many) == [
        (None, None, "the workflow is 688924 bytes as compact JSON; at most 262144 are allowed.")]
    (only,) = problems(None, None, source=workflow([{"id": i, "type": "prompt"} for i in range(MAX_NODES + 1)], []))
    assert f"at most {MAX_NODES} nodes" in only[2]  # a small object with too many nodes: by count


# ---------------------------------------------------------------------------- size, depth and values, however sent
def test_a_workflow_object_with_a_5_mb_field_is_refused_by_its_compact_json_size():
    big = {**workflow([PROMPT, SAMPLER], [TO_SAMPLER]), "notes": "x" * 5_000_000}
    assert len(json.dumps(big, separators=(",", ":"))) == 5_000_250
    assert problems(None, None, source=big) == [
        (None, None, "the workflow is 5000250 bytes as compact JSON; at most 262144 are allowed.")]


def test_a_2_mb_node_value_in_an_object_is_refused_by_the_byte_limit():
    source = workflow([node("p", "prompt", text="x" * (2 * 1024 * 1024)), SAMPLER], [TO_SAMPLER])
    assert problems(None, None, source=source) == [
        (None, None, "the workflow is 2097379 bytes as compact JSON; at most 262144 are allowed.")]


def test_a_node_value_may_be_as_long_as_a_prompt_and_no_longer():
    assert MAX_VALUE_CHARS == 2000  # GenerationParams' own prompt limit (pipelines/params.py)
    longest = compiled([node("p", "prompt", text="x" * 2000), SAMPLER], [TO_SAMPLER])
    assert longest.branches[0].params.prompt == "x" * 2000
    found = problems([node("p", "prompt", text="é" * 2001), node("s", "sampler", notes=list(range(600)))],
                     [TO_SAMPLER])
    assert found == [("p", "text", "is 2001 characters long; at most 2000 are allowed."),
                     ("s", "notes", "is 2291 characters long as JSON; at most 2000 are allowed.")]


def test_text_and_objects_are_measured_as_the_same_utf8_json():
    source = workflow([node("p", "prompt", text='é "quoted" \\ \n ☃ 😀'), SAMPLER], [TO_SAMPLER])
    compact = json.dumps(source, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    assert json_bytes(source) == len(compact) == 255
    # A workflow of exactly the limit passes as text and as an object; one byte more (a 2-byte 'é'
    # for an 'e') is refused either way, with its size.
    def with_notes(notes: str) -> dict:
        return workflow([{**node("p", "prompt", text="a"), "notes": notes}, SAMPLER], [TO_SAMPLER])

    filler = MAX_WORKFLOW_BYTES - len(json.dumps(with_notes(""), separators=(",", ":")))
    at_limit = with_notes("e" * filler)
    assert json_bytes(at_limit) == MAX_WORKFLOW_BYTES
    for source in (at_limit, json.dumps(at_limit, separators=(",", ":"))):
        assert len(compile_workflow(parse_workflow(source), LIMITS).branches) == 1
    over = with_notes("é" + "e" * (filler - 1))
    assert problems(None, None, source=over) == [
        (None, None, "the workflow is 262145 bytes as compact JSON; at most 262144 are allowed.")]
    text = json.dumps(over, separators=(",", ":"), ensure_ascii=False)
    assert problems(None, None, source=text) == [
        (None, None, "the workflow is 262145 bytes; at most 262144 are allowed.")]


def nested(levels: int) -> list:
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


def test_nesting_deeper_than_the_limit_is_refused_as_object_or_text_without_recursing():
    # The workflow object, its node list, a node and its values are 4 levels; a value adds its own.
    deepest = workflow([node("p", "prompt", text="a", notes=nested(MAX_WORKFLOW_DEPTH - 4)), SAMPLER], [TO_SAMPLER])
    assert len(compiled(deepest["nodes"], deepest["links"]).branches) == 1
    too_deep = workflow([node("p", "prompt", text="a", notes=nested(MAX_WORKFLOW_DEPTH - 3)), SAMPLER], [TO_SAMPLER])
    message = "the workflow nests lists and objects more than 16 levels deep; at most 16 are allowed."
    assert problems(None, None, source=too_deep) == [(None, None, message)]
    assert problems(None, None, source=json.dumps(too_deep)) == [(None, None, message)]
    # Far deeper than Python's recursion limit: refused, not a RecursionError.
    assert problems(None, None, source="[" * 100_000) == [(None, None, message)]
    assert problems(None, None, source=nested(100_000)) == [(None, None, message)]


def test_values_json_cant_hold_and_unhashable_node_types_are_problems_not_crashes():
    assert problems(None, None, source={"version": 1, "nodes": [], "links": [], "tags": {1, 2}}) == [
        (None, None, "the workflow is not JSON data (Object of type set is not JSON serializable).")]
    found = problems([node("x", ["prompt"])], [])
    assert found[0][:2] == ("x", None) and found[0][2].startswith("unknown node type ['prompt']; known types are: ")


def test_unknown_node_type_and_links_to_missing_nodes_or_ports():
    found = problems([PROMPT, SAMPLER, node("x", "upscaler")],
                     [link("p", "prompt", "s", "prompt"), link("ghost", "prompt", "s", "seed"),
                      link("p", "text", "s", "steps"), link("p", "prompt", "s", "colour")])
    assert ("x", None) == found[0][:2] and "unknown node type 'upscaler'" in found[0][2]
    assert "node 'ghost', which does not exist" in found[1][2]
    assert found[2][:2] == ("p", "text") and "has no output 'text'" in found[2][2]
    assert found[3][:2] == ("s", "colour") and "has no input 'colour'" in found[3][2]


def test_wrong_type_on_a_link_names_both_ends():
    found = problems([PROMPT, SAMPLER, node("t", "steps", steps=10)],
                     [TO_SAMPLER, link("t", "steps", "s", "guidance")])
    assert found == [("s", "guidance", "gets 'steps' from Steps (node t) but takes 'guidance'.")]


def test_a_sweep_outputs_the_type_it_varies():
    found = problems([PROMPT, SAMPLER, node("w", "sweep", param="steps", values="1, 2")],
                     [TO_SAMPLER, link("w", "values", "s", "seed")])
    assert found[0][:2] == ("s", "seed") and "gets 'steps'" in found[0][2]


def test_missing_required_input_and_no_sampler():
    found = problems([SAMPLER, node("o", "image_output")], [])
    assert ("s", "prompt") in [f[:2] for f in found]
    assert ("o", "images") in [f[:2] for f in found]
    assert "no Sampler node" in problems([PROMPT], [])[0][2]


def test_an_input_takes_one_link():
    found = problems([PROMPT, node("p2", "prompt", text="b"), SAMPLER],
                     [TO_SAMPLER, link("p2", "prompt", "s", "prompt")])
    assert found == [("s", "prompt", "this input has more than one link; an input takes one.")]


def test_cycles_are_found():
    nodes = [PROMPT, SAMPLER, node("s2", "sampler")]
    # Types aside, a loop of links is reported as a cycle before anything else.
    found = problems(nodes, [TO_SAMPLER, link("s", "images", "s2", "prompt"), link("s2", "images", "s", "seed")])
    assert len(found) == 1 and "cycle" in found[0][2] and found[0][0] in ("s", "s2")


def test_a_cycle_names_its_nodes_by_title_and_the_workflows_ids():
    # A Sampler whose images feed its own prompt (as a loaded file can have it): the message names
    # the node as the user sees it, its title, and its id in the JSON.
    found = problems([node("2", "sampler")], [link("2", "images", "2", "prompt")])
    assert found == [("2", None, "the links form a cycle: Sampler (node 2) -> Sampler (node 2).")]


def test_values_outside_the_models_limits():
    nodes = [PROMPT, SAMPLER, node("t", "steps", steps=500), node("z", "size", width=100, height=512),
             node("c", "scheduler", name="dpm++"), node("g", "guidance", scale="lots")]
    links = [TO_SAMPLER, link("t", "steps", "s", "steps"), link("z", "size", "s", "size"),
             link("c", "scheduler", "s", "scheduler"), link("g", "guidance", "s", "guidance")]
    found = {(f[0], f[1]): f[2] for f in problems(nodes, links)}
    # The engine's own rules and words (pipelines.validation, engine.limits), at the node's field.
    assert found == {
        ("t", "steps"): "num_inference_steps=500 is above this server's limit: allowed is 1..100.",
        ("z", "width"): "width=100 is not allowed: default needs a multiple of 16 (e.g. 96 or 112).",
        ("z", "height"): "height=512 is above this server's limit of 256 pixels.",
        ("c", "name"): "scheduler='dpm++' is not a noise scheduler this model offers; allowed are: euler, ddim "
                       "(or leave it unset for the default).",
        ("g", "scale"): "'lots' is not a number.",
    }


def test_negative_prompt_refused_for_a_model_without_one():
    limits = WorkflowLimits((ModelLimits(uses_negative_prompt=False),))
    found = problems([PROMPT, SAMPLER, node("n", "negative_prompt", text="blurry")],
                     [TO_SAMPLER, link("n", "negative_prompt", "s", "negative_prompt")], limits=limits)
    assert found == [("s", "negative_prompt", "this model takes no negative prompt: remove the link.")]


def test_branch_explosion_is_refused_without_expanding():
    nodes = [node("pl", "prompt_list", prompts="\n".join(f"p{i}" for i in range(200))), SAMPLER,
             node("b", "seed_batch", start=0, count=200), node("g", "sweep", param="guidance", values=",".join("1" * 200))]
    links = [link("pl", "prompt", "s", "prompt"), link("b", "seed", "s", "seed"), link("g", "values", "s", "guidance")]
    found = problems(nodes, links)
    assert found == [("s", None, "makes 8000000 branches; with the other samplers the run would make 8000000, "
                                 "more than the limit of 64 (--max-branches).")]
    at_limit = [PROMPT, SAMPLER, node("b", "seed_batch", start=0, count=64)]
    at_limit_links = [TO_SAMPLER, link("b", "seed", "s", "seed")]
    assert len(compiled(at_limit, at_limit_links).branches) == 64
    assert "limit of 63" in problems(at_limit, at_limit_links, limits=WorkflowLimits(max_branches=63))[0][2]


def test_every_problem_is_reported_at_once():
    nodes = [node("p", "prompt", text="   "), SAMPLER, node("t", "steps", steps=0), node("b", "seed_batch", count=0)]
    links = [TO_SAMPLER, link("t", "steps", "s", "steps"), link("b", "seed", "s", "seed")]
    found = problems(nodes, links)
    assert {(f[0], f[1]) for f in found} == {("p", "text"), ("t", "steps"), ("b", "count")}


def test_grid_axis_that_is_not_swept():
    found = problems([PROMPT, SAMPLER, node("grid", "grid", x="steps")],
                     [TO_SAMPLER, link("s", "images", "grid", "images")])
    assert found[0][:2] == ("grid", "x") and "'steps' is not swept by sampler s" in found[0][2]


# ---------------------------------------------------------------------------- several models
TWO_MODELS = WorkflowLimits((
    ModelLimits(name="shapes-flux", max_steps=50, max_size=64, size_multiple=16, uses_negative_prompt=True),
    ModelLimits(name="shapes-wan", max_steps=30, max_size=64, size_multiple=16, uses_negative_prompt=False,
                makes_video=True),
))


def test_branches_name_their_model_and_the_default_is_the_first():
    nodes = [PROMPT, SAMPLER, node("m", "sweep", param="model", values="shapes-flux, shapes-wan, default"),
             node("f", "frames", frames=9)]
    result = compiled(nodes[:2], [TO_SAMPLER], limits=TWO_MODELS)
    assert result.branches[0].params.model == "shapes-flux" and result.branches[0].params.num_frames is None
    video = compiled([PROMPT, SAMPLER, node("m", "model", name="shapes-wan"), nodes[3]],
                     [TO_SAMPLER, link("m", "model", "s", "model"), link("f", "frames", "s", "frames")],
                     limits=TWO_MODELS)
    assert (video.branches[0].params.model, video.branches[0].params.num_frames) == ("shapes-wan", 9)
    swept = compiled(nodes[:3], [TO_SAMPLER, link("m", "values", "s", "model")], limits=TWO_MODELS)
    assert [b.params.model for b in swept.branches] == ["shapes-flux", "shapes-wan", "shapes-flux"]
    assert swept.branches[1].label == "model shapes-wan"


def test_values_must_suit_every_model_of_their_sampler():
    nodes = [PROMPT, SAMPLER, node("m", "sweep", param="model", values="shapes-flux, shapes-wan"),
             node("t", "steps", steps=40), node("n", "negative_prompt", text="blurry"), node("f", "frames", frames=9)]
    links = [TO_SAMPLER, link("m", "values", "s", "model"), link("t", "steps", "s", "steps"),
             link("n", "negative_prompt", "s", "negative_prompt"), link("f", "frames", "s", "frames")]
    found = {(f[0], f[1]): f[2] for f in problems(nodes, links, limits=TWO_MODELS)}
    assert found == {
        ("t", "steps"): "shapes-wan: num_inference_steps=40 is above this server's limit: allowed is 1..30.",
        ("s", "negative_prompt"): "shapes-wan takes no negative prompt: remove the link.",
        ("f", "frames"): "num_frames=9 is not allowed: shapes-flux makes still images, use 1.",
    }


def test_an_unknown_model_is_named_with_the_loaded_ones():
    found = problems([PROMPT, SAMPLER, node("m", "model", name="sdxl")],
                     [TO_SAMPLER, link("m", "model", "s", "model")], limits=TWO_MODELS)
    assert found == [("m", "name", "model='sdxl' is not loaded here; the loaded models are: shapes-flux, shapes-wan.")]


# ---------------------------------------------------------------------------- the format
def test_round_trip_and_integer_ids():
    source = workflow([{"id": 1, "type": "prompt", "values": {"text": "a"}, "position": [5, 6]},
                       {"id": 2, "type": "sampler"}], [link(1, "prompt", 2, "prompt")])
    parsed = parse_workflow(json.dumps(source))
    again = parse_workflow(parsed.to_json())
    assert again == parsed
    assert parsed.nodes["1"].position == (5.0, 6.0)
    assert parsed.nodes["2"].values == {}


def test_node_type_specs_describe_ports_fields_and_model_defaults():
    specs = {spec["name"]: spec for spec in node_type_specs({"steps": {"steps": 28}})}
    assert [p["name"] for p in specs["sampler"]["inputs"]] == [
        "prompt", "negative_prompt", "seed", "size", "steps", "guidance", "scheduler", "frames", "model", "strength",
        "image", "mask", "lora", "step_cache"]
    assert specs["sampler"]["inputs"][0]["required"] is True
    # A picture input takes a picture, or an earlier sampler's images (a stage feeding the next).
    assert specs["sampler"]["inputs"][-4]["accepts"] == ["image", "images"]
    assert specs["sampler"]["inputs"][0]["accepts"] == ["prompt"]
    assert specs["sweep"]["outputs"] == [{"name": "values", "type": None, "typed_by": "param"}]
    assert specs["steps"]["fields"][0]["default"] == 28
    assert specs["seed"]["fields"][0]["default"] == -1


def test_the_compiler_imports_neither_gradio_nor_torch():
    code = ("import sys; import studio.workflows.compiler, studio.workflows.format; "
            "print(sorted(m for m in ('torch', 'gradio', 'diffusers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_model_that_names_its_sizes_refuses_the_others():
    limits = WorkflowLimits((ModelLimits(max_size=128, size_multiple=16, sizes=((64, 64),)),))
    found = problems([PROMPT, SAMPLER, node("z", "size", width=32, height=32)],
                     [TO_SAMPLER, link("z", "size", "s", "size")], limits=limits)
    assert found == [("z", "width", "width=32, height=32 is not a size default makes: allowed is 64x64.")]
    swept = problems([PROMPT, SAMPLER, node("w", "sweep", param="size", values="64x64, 128x64")],
                     [TO_SAMPLER, link("w", "values", "s", "size")], limits=limits)
    assert swept == [("w", "values", "width=128, height=64 is not a size default makes: allowed is 64x64.")]


def test_each_node_type_says_what_the_editor_draws_in_it_and_which_ports_a_field_types():
    specs = {spec["name"]: spec for spec in node_type_specs()}
    assert {name: spec["live_view"] for name, spec in specs.items() if spec["live_view"]} == {
        "sampler": "branch_bars", "image_output": "results", "live_preview": "previews", "grid": "grid"}
    assert specs["sweep"]["outputs"] == [{"name": "values", "type": None, "typed_by": "param"}]
    assert specs["steps"]["outputs"] == [{"name": "steps", "type": "steps", "typed_by": None}]
    sweep = NODE_TYPES["sweep"]
    assert sweep.port_type(sweep.outputs[0], {"param": "steps"}) == "steps"
    assert sweep.port_type(sweep.outputs[0], {"param": "model"}) == "model"
    assert sweep.port_type(sweep.outputs[0], {"param": "prompt"}) is None  # prompts fan out through a Prompt list
    assert sweep.port_type(sweep.outputs[0], {"param": "images"}) is None  # not a setting a sweep varies
    assert sweep.port_type(sweep.outputs[0], {"param": 3}) is None


def test_a_frame_count_above_the_servers_cap_is_shown_at_its_node_before_anything_runs():
    video_limits = WorkflowLimits((ModelLimits(name="shapes-wan", max_steps=30, max_size=64, size_multiple=16,
                                               uses_negative_prompt=False, makes_video=True, max_frames=9),))
    found = problems([PROMPT, SAMPLER, node("f", "frames", frames=17)],
                     [TO_SAMPLER, link("f", "frames", "s", "frames")], limits=video_limits)
    assert [(f[0], f[1]) for f in found] == [("f", "frames")]
    assert "num_frames=17" in found[0][2] and "9" in found[0][2]


def test_a_video_model_that_names_its_lengths_refuses_the_others_at_the_frames_node():
    video_limits = WorkflowLimits((ModelLimits(name="shapes-wan-v2", max_size=96, size_multiple=16,
                                               uses_negative_prompt=False, makes_video=True, frame_counts=(9, 13)),))
    found = problems([PROMPT, SAMPLER, node("f", "frames", frames=17)],
                     [TO_SAMPLER, link("f", "frames", "s", "frames")], limits=video_limits)
    assert found == [("f", "frames", "num_frames=17 is not a length shapes-wan-v2 makes: allowed are 9, 13.")]
    swept = problems([PROMPT, SAMPLER, node("w", "sweep", param="frames", values="9, 13, 5")],
                     [TO_SAMPLER, link("w", "values", "s", "frames")], limits=video_limits)
    assert swept == [("w", "values", "num_frames=5 is not a length shapes-wan-v2 makes: allowed are 9, 13.")]
    made = compiled([PROMPT, SAMPLER, node("f", "frames", frames=13)],
                    [TO_SAMPLER, link("f", "frames", "s", "frames")], limits=video_limits)
    assert [branch.params.num_frames for branch in made.branches] == [13]

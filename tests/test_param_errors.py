"""Every parameter check names its field (ParamError.field), and the front ends point at it without
reading the message: the workflow compiler and a run at the node and port that set the field, the
HTTP API at OpenAI's `param`."""

from __future__ import annotations

import pickle

import pytest

from engine import Engine, GenerationParams, ServingLimits
from engine.limits import check_text
from engine.models import ModelSet
from pipelines.errors import ParamError
from pipelines.toy import ToyPipeline
from pipelines.validation import (
    check_frame_count,
    check_image_params,
    check_model_name,
    check_scheduler_name,
    check_supported_size,
    check_video_params,
)
from studio.api.errors import from_engine_value_error
from studio.workflows.compiler import compile_workflow
from studio.workflows.format import WorkflowError, link_json, parse_workflow
from studio.workflows.limits import ModelLimits, WorkflowLimits
from studio.workflows.nodes import NODE_TYPES
from studio.workflows.run import WorkflowRun


def params(**fields) -> GenerationParams:
    return GenerationParams(**{"prompt": "a red circle", "width": 64, "height": 64, "num_frames": 1, **fields})


def refusal(check, *args) -> ParamError:
    with pytest.raises(ParamError) as caught:
        check(*args)
    assert isinstance(caught.value, ValueError) and str(caught.value) == caught.value.message
    return caught.value


# ---------------------------------------------------------------------------- every check names its field
@pytest.mark.parametrize(("check", "args", "field", "start"), [
    (check_image_params, (params(width=60), "FLUX", 16, ()), "width", "width=60 is not allowed: FLUX needs"),
    (check_image_params, (params(height=72), "FLUX", 16, ()), "height", "height=72 is not allowed"),
    (check_image_params, (params(num_frames=9), "FLUX", 16, ()), "num_frames", "num_frames=9 is not allowed"),
    (check_image_params, (params(scheduler="ddim"), "FLUX", 16, ("euler",)), "scheduler", "scheduler='ddim'"),
    (check_video_params, (params(num_frames=10), "Wan", 16, (), 4), "num_frames", "num_frames=10 is not allowed"),
    (check_frame_count, (6, "Wan", 4), "num_frames", "num_frames=6 is not allowed: Wan needs 4k+1"),
    (check_scheduler_name, ("scheduler", "pndm", ("euler",)), "scheduler", "scheduler='pndm'"),
    (check_supported_size, (params(width=32, height=32), "shapes-flux", ((64, 64),)), "width",
     "width=32, height=32 is not a size shapes-flux makes"),
    (check_supported_size, (params(width=40, height=64), "shapes-flux", (), (48, 128), 8), "width",
     "width=40 is not a size shapes-flux makes: each side from 48 to 128 pixels, in steps of 8"),
    (check_supported_size, (params(width=64, height=136), "shapes-flux", (), (48, 128), 8), "height",
     "height=136 is not a size shapes-flux makes"),
    (check_model_name, ("sdxl", ("shapes-flux",)), "model", "model='sdxl' is not loaded here"),
    (ServingLimits(max_steps=50).check_values, (51,), "num_inference_steps", "num_inference_steps=51 is above"),
    (ServingLimits(max_steps=50).check_values, (0,), "num_inference_steps", "num_inference_steps=0 is out of range"),
    (ServingLimits(max_size=256).check_values, (None, 64, 300), "height", "height=300 is above this server's"),
    (ServingLimits(max_frames=33).check_values, (None, None, None, 41), "num_frames", "num_frames=41 is above"),
    (check_text, (GenerationParams(prompt="a", negative_prompt="b\ud800"),), "negative_prompt",
     "negative_prompt has a lone surrogate"),
    (ToyPipeline().validate, (params(width=60),), "width", "width=60 must be a multiple of 8"),
    (ToyPipeline().validate, (params(num_frames=5),), "num_frames", "num_frames=5: the toy model"),
    (ModelSet(ToyPipeline()).resolve, ("sdxl",), "model", "model='sdxl' is not loaded here"),
])
def test_each_check_raises_a_param_error_naming_its_field(check, args, field, start):
    error = refusal(check, *args)
    assert error.field == field
    assert error.message.startswith(start), error.message


def test_a_param_error_survives_pickling_as_itself():
    # A Ray Serve replica's refusal crosses a process: it must arrive with its field.
    error = refusal(ServingLimits(max_size=256).check_values, None, 300)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is ParamError and (again.field, str(again)) == ("width", error.message)


def test_the_http_api_takes_param_from_the_field_not_the_text():
    assert from_engine_value_error(ParamError("num_inference_steps", "too many steps")).param == "num_inference_steps"
    assert from_engine_value_error(ParamError("height", "height=300 is too tall")).param == "size"
    # A message that merely starts with a field's name is not a field error.
    assert from_engine_value_error(ValueError("width=300 is too wide")).param is None


# ---------------------------------------------------------------------------- node types
def test_a_node_type_builds_its_node_with_defaults_and_refuses_unknown_fields():
    assert NODE_TYPES["seed_batch"].node("b", count=2) == {"id": "b", "type": "seed_batch",
                                                           "values": {"start": 0, "count": 2}}
    assert NODE_TYPES["sampler"].node("s") == {"id": "s", "type": "sampler", "values": {}}
    with pytest.raises(TypeError, match="a Size node has no field depth"):
        NODE_TYPES["size"].node("z", depth=3)


@pytest.mark.parametrize(("node_type", "param", "field"), [
    ("size", "width", "width"), ("size", "height", "height"), ("seed_batch", "seed", "start"),
    ("sweep", "num_frames", "values"), ("steps", "num_inference_steps", "steps"), ("prompt", "prompt", "text"),
    ("model", "model", "name"), ("steps", "width", None),
])
def test_each_node_type_says_which_field_sets_a_parameter(node_type, param, field):
    assert NODE_TYPES[node_type].field_for(param) == field


# ---------------------------------------------------------------------------- errors at node and port
def sized_workflow(size_node: dict, size_port: str) -> dict:
    return {"version": 1, "nodes": [NODE_TYPES["prompt"].node("p", text="a red circle"), size_node,
                                    NODE_TYPES["sampler"].node("s")],
            "links": [link_json("p", "prompt", "s"), link_json(size_node["id"], size_port, "s", "size")]}


TOY_LIMITS = WorkflowLimits((ModelLimits(name="toy", max_steps=50, max_size=256, size_multiple=4),))


@pytest.mark.parametrize(("size_node", "port", "where"), [
    (NODE_TYPES["size"].node("z", width=64, height=68), "size", ("z", "height")),
    (NODE_TYPES["size"].node("z", width=68, height=64), "size", ("z", "width")),
    (NODE_TYPES["sweep"].node("w", param="size", values="64x64, 64x68"), "values", ("w", "values")),
])
def test_a_run_maps_the_engines_field_error_to_the_node_and_port_that_set_it(size_node, port, where):
    # The compiler's model limits allow multiples of 4; the toy model itself wants 8: the engine refuses
    # at run time, and its ParamError's field finds the node.
    compiled = compile_workflow(parse_workflow(sized_workflow(size_node, port)), TOY_LIMITS)
    engine = Engine(ToyPipeline())
    try:
        with pytest.raises(WorkflowError) as caught:
            WorkflowRun(engine, compiled, session_id="tab")
    finally:
        engine.close()
    (problem,) = caught.value.problems
    assert (problem.node_id, problem.port) == where
    assert "=68 must be a multiple of 8 for the toy model" in problem.message


class TallOnlyToy(ToyPipeline):
    """Refuses every height but 64 in words that don't start with the field's name."""

    def validate(self, params: GenerationParams) -> None:
        super().validate(params)
        if params.height != 64:
            raise ParamError("height", f"only 64 pixels tall pictures here, not {params.height}.")


def test_a_run_finds_the_node_from_the_field_whatever_the_message_says():
    source = sized_workflow(NODE_TYPES["size"].node("z", width=64, height=128), "size")
    engine = Engine(TallOnlyToy())
    try:
        with pytest.raises(WorkflowError) as caught:
            WorkflowRun(engine, compile_workflow(parse_workflow(source), TOY_LIMITS), session_id="tab")
    finally:
        engine.close()
    (problem,) = caught.value.problems
    assert (problem.node_id, problem.port) == ("z", "height")
    assert problem.message == "branch 0 (single): only 64 pixels tall pictures here, not 128."


def test_the_compiler_maps_the_rules_field_error_to_the_node_and_port():
    # Steps above the server's cap, via a Sweep; a seed batch starting below 0; a size off the card.
    limits = WorkflowLimits((ModelLimits(name="toy", max_steps=50, max_size=256, sizes=((64, 64),)),))
    source = {"version": 1, "nodes": [
        NODE_TYPES["prompt"].node("p", text="a red circle"), NODE_TYPES["sweep"].node("t", param="steps", values="4, 60"),
        NODE_TYPES["seed_batch"].node("b", start=-3), NODE_TYPES["size"].node("z", width=32, height=32),
        NODE_TYPES["sampler"].node("s")],
        "links": [link_json("p", "prompt", "s"), link_json("t", "values", "s", "steps"), link_json("b", "seed", "s"),
                  link_json("z", "size", "s")]}
    with pytest.raises(WorkflowError) as caught:
        compile_workflow(parse_workflow(source), limits)
    assert [(p.node_id, p.port, p.message) for p in caught.value.problems] == [
        ("t", "values", "num_inference_steps=60 is above this server's limit: allowed is 1..50."),
        ("b", "start", "seed=-3 is out of range: allowed is 0..9223372036854775807."),
        ("z", "width", "width=32, height=32 is not a size toy makes: allowed is 64x64."),
    ]


def test_a_branch_names_the_node_and_field_behind_each_parameter():
    source = sized_workflow(NODE_TYPES["sweep"].node("w", param="size", values="64x64"), "values")
    (branch,) = compile_workflow(parse_workflow(source), TOY_LIMITS).branches
    assert branch.source_of("width") == branch.source_of("height") == ("w", "values")
    assert branch.source_of("prompt") == ("p", "text")
    assert branch.source_of("guidance_scale") == ("s", None)  # unlinked: the sampler

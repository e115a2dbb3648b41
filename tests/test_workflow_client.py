"""`/run_workflow` and `/cancel_workflow` driven by real gradio_client clients against a live studio.

The toy pipeline (a small per-forward delay so runs overlap) behind one engine, wired as
`python app.py --model toy` does; every shipped example workflow must run as it is.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from gradio_client.exceptions import AppError
from PIL import Image

from pipelines.params import start_step
from pipelines.toy import ToyPipeline
from studio.outputs import OutputStore, parse_infotext, png_texts
from studio.page.history_tab import history_caption
from studio.page.workflow_tab import EXAMPLES_DIR
from studio.server.history_owners import HistoryOwners
from studio.sessions import session_id_of
from tests.engine_helpers import StepGate
from tests.studio_helpers import connect, live_studio, statuses, wait_for

STEP_DELAY_S = 0.02


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    pipeline = ToyPipeline(step_delay_s=STEP_DELAY_S)
    outputs = tmp_path_factory.mktemp("outputs")
    with live_studio(pipeline, outputs, preview_every=2, max_size=256, max_steps=60, max_per_session=8) as (
            server, engine):
        yield server, engine, pipeline, outputs


@pytest.fixture
def client(studio):
    return connect(studio[0].url)


def xy_workflow(steps: str = "30, 40", guidance: str = "1, 2") -> dict:
    link = lambda a, ap, b, bp: {"from": {"node": a, "port": ap}, "to": {"node": b, "port": bp}}  # noqa: E731
    return {
        "version": 1,
        "nodes": [
            {"id": "p", "type": "prompt", "values": {"text": "a red circle"}},
            {"id": "g", "type": "sweep", "values": {"param": "guidance", "values": guidance}},
            {"id": "t", "type": "sweep", "values": {"param": "steps", "values": steps}},
            {"id": "s", "type": "sampler"},
            {"id": "grid", "type": "grid", "values": {"x": "guidance", "y": "steps"}},
        ],
        "links": [link("p", "prompt", "s", "prompt"), link("g", "values", "s", "guidance"),
                  link("t", "values", "s", "steps"), link("s", "images", "grid", "images")],
    }




def test_the_api_page_lists_the_workflow_endpoints(client):
    endpoints = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert {"/run_workflow", "/cancel_workflow"} <= set(endpoints)
    assert [p["parameter_name"] for p in endpoints["/cancel_workflow"]["parameters"]] == ["run_id", "branch"]


# The toy model takes no LoRA adapters: the LoRA examples run on the built-in model
# (tests/test_lora_builtin_example.py).
TOY_EXAMPLES = [path for path in sorted(EXAMPLES_DIR.glob("*.json")) if '"type": "lora"' not in path.read_text()]


@pytest.mark.parametrize("path", TOY_EXAMPLES, ids=lambda p: p.stem)
def test_every_shipped_example_runs(client, studio, path: Path):
    workflow = json.loads(path.read_text())
    expected = {"text-to-image": (1, 0), "seed-batch-2x2": (4, 1), "guidance-steps-xy": (9, 1),
                "image-to-image": (5, 1), "inpaint": (1, 0)}[path.stem]
    job = client.submit(workflow=workflow, api_name="/run_workflow")
    status, images, grids = job.result(timeout=60)
    assert status["state"] == "completed"
    assert (status["done"], status["total"]) == (expected[0], expected[0])
    assert [b["state"] for b in status["branches"]] == ["completed"] * expected[0]
    for branch in status["branches"]:  # from noise every step runs; from a picture, steps x strength of them
        steps, strength = branch["num_inference_steps"], branch["strength"]
        assert branch["step"] == branch["total"] == steps - (0 if strength is None else start_step(steps, strength))
    assert len(images) == expected[0] and len(grids) == expected[1]
    for item in images:
        assert Image.open(item["image"]).size == (64, 64)
    assert {n["state"] for n in status["nodes"].values()} == {"done"}
    # The stream carried each branch's progress and live previews before the end.
    streamed = statuses(job)
    assert any(s["state"] == "running" and any(b["preview"] for b in s["branches"]) for s in streamed)
    assert studio[1].snapshot().requests == ()


def test_a_workflow_may_be_sent_as_json_text(client):
    status, images, _ = client.predict(workflow=json.dumps(xy_workflow(steps="3", guidance="1")),
                                       api_name="/run_workflow")
    assert status["state"] == "completed" and len(images) == 1


def test_the_xy_grid_has_one_cell_per_branch(client):
    status, images, grids = client.predict(workflow=xy_workflow(steps="4, 6", guidance="1, 2, 3"),
                                           api_name="/run_workflow")
    assert status["total"] == 6 and len(images) == 6
    grid = Image.open(grids[0]["image"])
    # 3 columns and 2 rows of 128 px cells (64 px images enlarged 2x), with labels around them.
    assert grid.width > 3 * 128 and grid.height > 2 * 128 and grid.width < 4 * 128 + 200


def test_the_xy_examples_results_are_captioned_with_every_swept_value(client, studio):
    """The shipped X/Y example (guidance 1, 3, 5 by steps 5, 10, 20, seed 7): each result's caption
    says which cell it is, in /run_workflow's answer and in History, where its grid is saved too."""
    outputs = studio[3]
    workflow = json.loads((EXAMPLES_DIR / "guidance-steps-xy.json").read_text())
    status, images, grids = client.predict(workflow=workflow, api_name="/run_workflow")
    assert status["state"] == "completed" and len(grids) == 1
    cells = [f"steps {steps}, guidance {guidance} · seed 7" for steps in (5, 10, 20) for guidance in (1, 3, 5)]
    assert [item["caption"] for item in images] == cells
    owner = HistoryOwners.in_folder(outputs / "history").of_caller(
        session_id_of(SimpleNamespace(session_hash=client.session_hash, username=None)))
    saved = OutputStore(outputs, model="toy").history(owner)
    prompt = "a large green circle on an orange backg…"  # the first 39 characters of the example's prompt
    assert sorted(history_caption(item.settings) for item in saved) == sorted(
        [f"{cell} · {prompt}" for cell in cells] + [f"grid: guidance × steps · {prompt}"])
    (grid,) = [item for item in saved if item.kind == "grid"]
    assert Image.open(grid.path).size == Image.open(grids[0]["image"]).size  # the grid as the run drew it last
    assert png_texts(grid.path)["workflow"] and parse_infotext(grid.parameters)["seed"] == 7


@pytest.fixture
def held_run(client, studio, monkeypatch):
    """Start the 2x2 run and hold the engine in the first forward of all four branches, so the
    run is surely in flight when the test acts on it; the test releases the gate."""
    gate = StepGate(min_requests=4)
    monkeypatch.setattr(studio[2], "on_forward", gate)
    job = client.submit(workflow=xy_workflow(steps="20, 30"), api_name="/run_workflow")
    gate.wait()
    run_id = wait_for(lambda: next((s["run_id"] for s in statuses(job)), None), what="the run's first status")
    yield job, run_id, gate
    gate.release()  # whatever the test did


def test_cancel_the_whole_run(client, studio, held_run):
    job, run_id, gate = held_run
    answer = client.predict(run_id, -1, api_name="/cancel_workflow")
    assert answer["cancelled"] is True
    gate.release()
    status, images, _ = job.result(timeout=30)
    assert status["state"] == "aborted" and [b["state"] for b in status["branches"]] == ["aborted"] * 4
    assert all(b["step"] < b["total"] for b in status["branches"])
    assert images == []
    wait_for(lambda: studio[1].snapshot().requests == (), what="the engine to be empty")


def test_cancel_one_branch_and_the_others_finish(client, held_run):
    job, run_id, gate = held_run
    answer = client.predict(run_id, 3, api_name="/cancel_workflow")
    assert answer == {"run_id": run_id, "cancelled": True, "message": "cancelling branch 3 at the next step boundary"}
    gate.release()
    status, images, _ = job.result(timeout=30)
    assert [b["state"] for b in status["branches"]] == ["completed", "completed", "completed", "aborted"]
    assert status["state"] == "partial" and len(images) == 3


def test_another_session_cannot_cancel_my_run(studio, held_run):
    job, run_id, gate = held_run
    stranger = connect(studio[0].url)
    with pytest.raises(AppError, match="belongs to another session"):
        stranger.predict(run_id, -1, api_name="/cancel_workflow")
    gate.release()
    assert job.result(timeout=30)[0]["state"] == "completed"


def with_values(node_id: str, **values) -> dict:
    """A small runnable workflow with these values set on one node."""
    workflow = xy_workflow(steps="2", guidance="1")
    node = next(n for n in workflow["nodes"] if n["id"] == node_id)
    node["values"] = {**node.get("values", {}), **values}
    return workflow


BAD_WORKFLOWS = {
    "malformed JSON": ("{nodes: [", "not valid JSON"),
    "a 2 MB workflow": ("x" * (2 * 1024 * 1024), "at most 262144 are allowed"),
    "10,000 nodes": ({"version": 1, "nodes": [{"id": str(i), "type": "prompt"} for i in range(10_000)], "links": []},
                     "the workflow is 298924 bytes as compact JSON; at most 262144 are allowed"),
    "201 nodes": ({"version": 1, "nodes": [{"id": str(i), "type": "prompt"} for i in range(201)], "links": []},
                  "at most 200 nodes"),
    "a node value longer than a prompt": (with_values("s", notes="x" * 3000),
                                          "node s, port 'notes': is 3000 characters long; at most 2000 are allowed."),
    "nested 17 deep": ({"version": 1, "nodes": [], "links": [], "notes": [[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]},
                       "nests lists and objects more than 16 levels deep; at most 16 are allowed."),
    "a branch explosion": ({"version": 1, "nodes": [
        {"id": "p", "type": "prompt_list", "values": {"prompts": "\n".join(f"p{i}" for i in range(100))}},
        {"id": "b", "type": "seed_batch", "values": {"start": 0, "count": 100}}, {"id": "s", "type": "sampler"}],
        "links": [{"from": {"node": "p", "port": "prompt"}, "to": {"node": "s", "port": "prompt"}},
                  {"from": {"node": "b", "port": "seed"}, "to": {"node": "s", "port": "seed"}}]},
        "makes 10000 branches"),
    "an unknown node type": ({"version": 1, "nodes": [{"id": "1", "type": "upscaler"}], "links": []},
                             "unknown node type 'upscaler'"),
    "a link to a missing node": ({"version": 1, "nodes": [{"id": "s", "type": "sampler"}], "links": [
        {"from": {"node": "ghost", "port": "prompt"}, "to": {"node": "s", "port": "prompt"}}]}, "does not exist"),
    "a link to a missing port": ({"version": 1, "nodes": [{"id": "p", "type": "prompt", "values": {"text": "a"}},
                                                          {"id": "s", "type": "sampler"}], "links": [
        {"from": {"node": "p", "port": "prompt"}, "to": {"node": "s", "port": "colour"}}]}, "has no input 'colour'"),
    "an empty body": ("", "the workflow is empty"),
}


@pytest.mark.parametrize("name", list(BAD_WORKFLOWS))
def test_bad_workflows_get_a_clear_error_and_the_engine_keeps_serving(client, studio, name):
    engine, pipeline = studio[1], studio[2]
    workflow, message = BAD_WORKFLOWS[name]
    encoded_before = len(pipeline.encoded)
    with pytest.raises(AppError, match=message.replace("(", r"\(").replace(")", r"\)")):
        client.predict(workflow=workflow, api_name="/run_workflow")
    assert len(pipeline.encoded) == encoded_before  # nothing was submitted
    status, images, _ = client.predict(workflow=xy_workflow(steps="2", guidance="1"), api_name="/run_workflow")
    assert status["state"] == "completed" and engine.is_alive


OVERSIZED_OBJECTS = {  # the workflow as a JSON object (not text), and its compact JSON size
    "a 5 MB field": ({**xy_workflow(steps="2", guidance="1"), "notes": "x" * 5_000_000}, 5_000_625),
    "a 2 MB node value": (with_values("p", text="x" * (2 * 1024 * 1024)), 2_097_754),
}


@pytest.mark.parametrize("name", list(OVERSIZED_OBJECTS))
def test_a_workflow_object_over_the_byte_limit_is_refused_with_its_size(client, studio, name):
    workflow, size = OVERSIZED_OBJECTS[name]
    encoded_before = len(studio[2].encoded)
    with pytest.raises(AppError) as caught:
        client.predict(workflow=workflow, api_name="/run_workflow")
    assert caught.value.message == (
        f"the workflow has 1 problem: the workflow is {size} bytes as compact JSON; at most 262144 are allowed.")
    assert caught.value.title == "Workflow not run"
    assert len(studio[2].encoded) == encoded_before  # nothing was submitted


def test_the_branch_limit_comes_from_the_command_line(studio):
    from app import build_parser, config_from_args
    from studio.page.workflow_tab import workflow_limits

    config = config_from_args(build_parser().parse_args(["--model", "toy", "--max-branches", "3"]))
    limits = workflow_limits(studio[1], config)
    assert limits.max_branches == 3
    model = limits.default
    assert (model.name, model.max_steps, model.size_multiple, model.uses_negative_prompt) == ("toy", 60, 8, False)


def test_every_branch_is_saved_with_its_settings_and_the_workflow(client, studio):
    outputs = studio[3]
    before = set(outputs.rglob("*.png"))
    workflow = xy_workflow(steps="3", guidance="1, 2")
    status, images, _ = client.predict(workflow=workflow, api_name="/run_workflow")
    new = sorted(set(outputs.rglob("*.png")) - before)
    saved = [path for path in new if not path.stem.endswith("-grid")]
    assert len(saved) == 2 and len(new) == 3  # each branch, and the run's grid
    texts = [png_texts(path) for path in saved]
    by_guidance = {parse_infotext(t["parameters"])["guidance_scale"]: t for t in texts}
    assert set(by_guidance) == {1.0, 2.0}
    for branch in status["branches"]:
        settings = parse_infotext(by_guidance[branch["guidance_scale"]]["parameters"])
        assert (settings["prompt"], settings["seed"], settings["num_inference_steps"]) == (
            "a red circle", branch["seed"], 3)
        assert json.loads(by_guidance[branch["guidance_scale"]]["workflow"])["nodes"][0]["values"] == {
            "text": "a red circle"}


def test_generate_saves_its_image_too(client, studio):
    outputs = studio[3]
    before = set(outputs.rglob("*.png"))
    status, _, image = client.predict(prompt="a saved circle", negative_prompt="", width=64, height=64, steps=3,
                                      guidance_scale=1.0, seed=99, api_name="/generate")
    (saved,) = set(outputs.rglob("*.png")) - before
    assert parse_infotext(png_texts(saved)["parameters"])["seed"] == 99 and "workflow" not in png_texts(saved)
    assert Image.open(saved).tobytes() == Image.open(image).tobytes()


def _saved_name_of(outputs: Path, prompt: str) -> str:
    """The outputs folder's name of the one saved PNG made from `prompt`."""
    found = [path for path in outputs.glob("*/*.png") if png_texts(path)["parameters"].startswith(prompt + "\n")]
    assert len(found) == 1, found
    return found[0].relative_to(outputs).as_posix()


def test_a_load_image_may_name_the_callers_own_saved_result_and_no_one_elses(client, studio):
    _, _, _, outputs = studio
    prompt = "a red circle, the picture to start from"
    made, images, _ = client.predict(workflow=xy_workflow(steps="3", guidance="1") | {
        "nodes": [{"id": "p", "type": "prompt", "values": {"text": prompt}}, {"id": "s", "type": "sampler"}],
        "links": [{"from": {"node": "p", "port": "prompt"}, "to": {"node": "s", "port": "prompt"}}]},
        api_name="/run_workflow")
    name = _saved_name_of(outputs, prompt)
    redraw = {"version": 1, "nodes": [
        {"id": "p", "type": "prompt", "values": {"text": "a blue square"}},
        {"id": "i", "type": "load_image", "values": {"image": name}},
        {"id": "k", "type": "strength", "values": {"strength": 0.5}},
        {"id": "s", "type": "sampler"}],
        "links": [{"from": {"node": "p", "port": "prompt"}, "to": {"node": "s", "port": "prompt"}},
                  {"from": {"node": "i", "port": "image"}, "to": {"node": "s", "port": "image"}},
                  {"from": {"node": "k", "port": "strength"}, "to": {"node": "s", "port": "strength"}}]}
    status, images, _ = client.predict(workflow=redraw, api_name="/run_workflow")
    assert status["state"] == "completed"
    (branch,) = status["branches"]
    assert (branch["strength"], branch["total"], branch["size"]) == (0.5, 4, "64x64")  # 4 of the toy's 8 steps
    # Another caller naming the same file gets nothing: names are looked up in the caller's own results.
    stranger = connect(studio[0].url)
    with pytest.raises(AppError) as refused:
        stranger.predict(workflow=redraw, api_name="/run_workflow")
    assert f"node i, port 'image': '{name}' is not one of your saved results" in str(refused.value)

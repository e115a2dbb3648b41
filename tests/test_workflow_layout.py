"""The editor's layout data in a workflow (groups, node colours): kept through parse and to_json,
checked with errors that teach, and never changing what the compiler makes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from studio.workflows.compiler import compile_workflow
from studio.workflows.format import WorkflowError, for_saving, parse_workflow
from studio.workflows.layout import MAX_GROUPS, Group
from studio.workflows.limits import ModelLimits, WorkflowLimits

LIMITS = WorkflowLimits((ModelLimits(max_steps=100, max_size=256, size_multiple=16),), max_branches=64)
XY = json.loads((Path(__file__).resolve().parent.parent / "assets" / "workflows" / "guidance-steps-xy.json").read_text())
GROUPS = [{"title": "Axes", "position": [20, 300], "size": [320, 420], "color": "#7C3AED"},
          {"title": "", "position": [-40.5, 10], "size": [200, 100]}]


def with_layout(workflow: dict) -> dict:
    nodes = [{**node, "color": "#2563eb"} if node["type"] == "sweep" else node for node in workflow["nodes"]]
    return {**workflow, "nodes": nodes, "groups": GROUPS}


def problems(source: dict) -> list[str]:
    with pytest.raises(WorkflowError) as caught:
        parse_workflow(source)
    return [str(problem) for problem in caught.value.problems]


def test_groups_and_colours_survive_parse_and_to_json():
    parsed = parse_workflow(with_layout(XY))
    assert parsed.groups == (Group("Axes", (20.0, 300.0), (320.0, 420.0), "#7c3aed"),
                             Group("", (-40.5, 10.0), (200.0, 100.0)))
    saved = parsed.to_json()
    assert saved["groups"] == [{"title": "Axes", "position": [20.0, 300.0], "size": [320.0, 420.0], "color": "#7c3aed"},
                               {"title": "", "position": [-40.5, 10.0], "size": [200.0, 100.0]}]
    assert [n.get("color") for n in saved["nodes"]] == [None, None, "#2563eb", "#2563eb", None, None, None]
    assert parse_workflow(json.dumps(saved)).to_json() == saved  # and again, as text (a download, a PNG)
    assert for_saving(saved) == saved


def test_a_workflow_without_layout_writes_none():
    saved = parse_workflow(XY).to_json()
    assert "groups" not in saved and all("color" not in node for node in saved["nodes"])


def test_the_compiler_makes_the_same_branches_with_or_without_layout():
    plain = compile_workflow(parse_workflow(XY), LIMITS)
    laid_out = compile_workflow(parse_workflow(with_layout(XY)), LIMITS)
    assert len(plain.branches) == len(laid_out.branches) == 9
    assert [b.params for b in plain.branches] == [b.params for b in laid_out.branches]
    assert [b.label for b in plain.branches] == [b.label for b in laid_out.branches]


@pytest.mark.parametrize("groups, message", [
    ({"title": "a"}, "groups must be a JSON list, got dict."),
    ([[1, 2]], "group 0 must be a JSON object with title, position and size."),
    ([{"title": 5, "position": [0, 0], "size": [1, 1]}], "group 0: title must be text of at most 200 characters, got 5."),
    ([{"title": "a", "position": [0], "size": [1, 1]}], "group 0: position must be [x, y] in pixels, got [0]."),
    ([{"title": "a", "position": [0, 0], "size": [0, 10]}],
     "group 0: size must be [width, height], both above 0, got [0, 10]."),
    ([{"title": "a", "position": [0, 0], "size": [1, 1], "color": "red"}],
     "group 0: color must be \"#rrggbb\" (six hex digits), got 'red'."),
    ([{"title": "a", "position": [0, 0], "size": [1, 1]}] * (MAX_GROUPS + 1),
     f"the workflow has {MAX_GROUPS + 1} groups; at most {MAX_GROUPS} are allowed."),
])
def test_a_bad_group_is_refused_naming_what_is_wrong(groups, message):
    assert problems({**XY, "groups": groups}) == [message]


def test_a_bad_node_colour_is_refused_at_its_node():
    nodes = [{**XY["nodes"][0], "color": "url(x)"}] + XY["nodes"][1:]
    assert problems({**XY, "nodes": nodes}) == ["node 1: the node's color must be \"#rrggbb\" (six hex digits), got 'url(x)'."]

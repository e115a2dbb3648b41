"""LoRA nodes in a workflow: one adapter at a scale, chained adapters, a swept scale as a grid
axis, and refusals at the node and field that set them (unknown adapter, scale out of range)."""

from __future__ import annotations

from pipelines.lora_request import LoraUse
from studio.workflows.limits import ModelLimits, WorkflowLimits
from tests.test_workflow_compiler import PROMPT, SAMPLER, TO_SAMPLER, compiled, link, node, problems

LIMITS = WorkflowLimits((ModelLimits(name="shapes", max_steps=100, max_size=256, loras=("outline", "thick")),),
                        max_branches=64)


def test_a_lora_node_gives_every_branch_its_adapter_at_its_scale():
    nodes = [PROMPT, SAMPLER, node("l", "lora", name="outline", scale=0.8)]
    result = compiled(nodes, [TO_SAMPLER, link("l", "lora", "s", "lora")], LIMITS)
    assert [b.params.loras for b in result.branches] == [(LoraUse("outline", 0.8),)]


def test_chained_lora_nodes_add_up_in_order():
    nodes = [PROMPT, SAMPLER, node("a", "lora", name="outline", scale=1), node("b", "lora", name="thick", scale="-0.5")]
    links = [TO_SAMPLER, link("a", "lora", "b", "lora"), link("b", "lora", "s", "lora")]
    [branch] = compiled(nodes, links, LIMITS).branches
    assert branch.params.loras == (LoraUse("outline", 1.0), LoraUse("thick", -0.5))


def test_a_swept_scale_fans_out_and_is_a_grid_axis():
    nodes = [PROMPT, SAMPLER, node("l", "lora", name="outline", scale=1),
             node("w", "sweep", param="lora_scale", values="0, 0.5, 1"),
             node("seeds", "seed_batch", start=1, count=2), node("grid", "grid", x="lora", y="seed")]
    links = [TO_SAMPLER, link("w", "values", "l", "scale"), link("l", "lora", "s", "lora"),
             link("seeds", "seed", "s", "seed"), link("s", "images", "grid", "images")]
    result = compiled(nodes, links, LIMITS)
    assert len(result.branches) == 6
    (grid,) = result.grids
    assert (grid.x_axis, grid.y_axis) == ("lora", "seed")
    assert grid.columns == ("outline:0", "outline:0.5", "outline:1") and grid.rows == ("1", "2")
    for row, seed in enumerate((1, 2)):
        for column, scale in enumerate((0.0, 0.5, 1.0)):
            params = result.branches[grid.cells[row][column]].params
            assert (params.seed, params.loras) == (seed, (LoraUse("outline", scale),))


def test_refusals_name_the_lora_node_and_its_field():
    nodes = [PROMPT, SAMPLER, node("l", "lora", name="sketchy", scale=1)]
    links = [TO_SAMPLER, link("l", "lora", "s", "lora")]
    assert problems(nodes, links, LIMITS) == [
        ("l", "name", "LoRA 'sketchy' is not loaded for shapes; the loaded ones are: outline, thick "
                      "(python app.py --lora NAME=PATH loads one).")]
    nodes[2] = node("l", "lora", name="outline", scale=5)
    assert problems(nodes, links, LIMITS) == [
        ("l", "scale", "scale 5.0: allowed is -4..4 (1 = as trained, 0 = off).")]
    nodes[2] = node("l", "lora", name="", scale=1)
    assert problems(nodes, links, LIMITS) == [("l", "name", "names no adapter: choose one the model has loaded.")]
    sweep = node("w", "sweep", param="lora_scale", values="1, 7")
    assert problems([PROMPT, SAMPLER, node("l", "lora", name="outline", scale=1), sweep],
                    links + [link("w", "values", "l", "scale")], LIMITS) == [
        ("w", "values", "scale 7.0: allowed is -4..4 (1 = as trained, 0 = off).")]

"""A smoke run of the X/Y grid benchmark on a tiny random FLUX checkpoint: the three systems run
the same cells end to end and every figure comes from what was measured (the full run stays
out of CI; its results are in docs/benchmarks.md)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from benchmarks import workflow_grid
from tests.tiny_checkpoints import build_tiny_flux

STUDIO = {"height": 32, "width": 32, "max_sequence_length": 16, "num_inference_steps": 4,
          "guidance_scale": 2.0, "negative_prompt": ""}


# What both smoke runs ask of their studio: 64 branches (the benchmark's least), 100 steps (ditto).
STUDIO_LIMITS = {"max_branches": 64, "max_steps": 100, "threads": 2}


@pytest.fixture(scope="module")
def tiny_flux(tmp_path_factory):
    return build_tiny_flux(tmp_path_factory.mktemp("flux"), studio_config=STUDIO)


@pytest.fixture(scope="module")
def studio_url(tiny_flux):
    """The benchmark's own studio process (workflow_grid.studio_process), started once for both
    smoke runs: each would start the same one (a start costs this machine 10-20 s)."""
    with workflow_grid.studio_process(tiny_flux, **STUDIO_LIMITS) as url:
        yield url


@pytest.fixture
def shared_studio(tiny_flux, studio_url, monkeypatch):
    """A run of the benchmark gets the module's studio, once it has asked for the same one."""
    @contextlib.contextmanager
    def the_started_one(folder, **limits):
        assert (Path(folder), limits) == (tiny_flux, STUDIO_LIMITS)
        yield studio_url

    monkeypatch.setattr(workflow_grid, "studio_process", the_started_one)


def test_workflow_grid_benchmark_smoke(tiny_flux, shared_studio, tmp_path, capsys):
    out = tmp_path / "grid.json"
    result = workflow_grid.main(["--model", str(tiny_flux), "--guidance", "1", "2", "--steps", "3", "4",
                                 "--rounds", "1", "--out", str(out)])
    printed = capsys.readouterr().out
    summaries = result["summaries"]
    assert set(summaries) == {"workflow", "studio-one-by-one", "diffusers-one-by-one"}
    for name, s in summaries.items():
        chosen = s["round"]
        assert len(chosen["image_s"]) == 4 and len(chosen["first_preview_s"]) == 4
        assert s["wall_s"] == chosen["wall_s"]
        assert 0 < s["first_image_s"] <= s["last_image_s"] <= s["wall_s"]
    # The workflow's four cells shared forwards; one-by-one runs never do.
    assert summaries["workflow"]["mean_batch"] > 1.0
    assert summaries["studio-one-by-one"]["mean_batch"] == 1.0
    # Every cell of the workflow had a live preview (previews every 2 steps, 3 and 4 steps).
    assert all(t is not None for t in summaries["workflow"]["round"]["first_preview_s"])
    assert json.loads(out.read_text())["setup"]["cells"] == 4
    assert "| workflow |" in printed and "x one-by-one (studio)" in printed


def test_two_stage_benchmark_smoke(tiny_flux, shared_studio, tmp_path, capsys):
    out = tmp_path / "two_stage.json"
    # Stage 1's cells are 13 steps apart: the 3-step cell's stage 2 (3 of 4 steps at 0.6) can start
    # while the 16-step cell is still in stage 1.
    result = workflow_grid.main(["--model", str(tiny_flux), "--systems", "chained", "stages-one-after-the-other",
                                 "--stage1-steps", "3", "16", "--stage2-steps", "4", "--strength", "0.6",
                                 "--rounds", "1", "--out", str(out)])
    printed = capsys.readouterr().out
    assert result["summaries"] == {}  # no grid system was asked for
    summaries = result["two_stage"]["summaries"]
    assert set(summaries) == {"chained", "stages-one-after-the-other"}
    for name, s in summaries.items():
        chosen = s["round"]
        one, two = chosen["stage1"], chosen["stage2"]
        # Every cell made both images (the runner asserts each branch completed) and had previews.
        assert len(one["image_s"]) == len(two["image_s"]) == 2
        assert all(t is not None for t in one["first_preview_s"] + two["first_preview_s"])
        # A stage-2 image starts from its own cell's stage-1 image.
        assert all(first <= second for first, second in zip(one["image_s"], two["image_s"]))
        assert 0 < s["stage1"]["first_image_s"] <= s["stage2"]["last_image_s"] <= s["wall_s"] == chosen["wall_s"]
        assert s["mean_batch"] > 1.0  # both stage-1 cells shared forwards in either system
    chained = summaries["chained"]["round"]
    # No barrier: the fast cell's stage 2 was running before the slow cell's stage 1 had ended ...
    assert min(chained["stage2"]["running_s"]) < max(chained["stage1"]["image_s"])
    # ... where stage by stage, stage 2 only starts once all of stage 1 is done.
    apart = summaries["stages-one-after-the-other"]["round"]
    assert min(apart["stage2"]["running_s"] + apart["stage2"]["first_preview_s"]) > max(apart["stage1"]["image_s"])
    assert summaries["stages-one-after-the-other"]["x_one_after_the_other"] == 1.0
    assert summaries["chained"]["x_one_after_the_other"] > 0
    saved = json.loads(out.read_text())["two_stage"]
    assert saved["setup"]["cells"] == 2 and saved["setup"]["strength"] == 0.6
    assert "| chained |" in printed and "x one-after-the-other" in printed and "| workflow |" not in printed

"""A smoke run of the X/Y grid benchmark on a tiny random FLUX checkpoint: the three systems run
the same cells end to end and every figure comes from what was measured (the full run stays
out of CI; its results are in docs/benchmarks.md)."""

from __future__ import annotations

import json

import pytest

from benchmarks import workflow_grid
from tests.tiny_checkpoints import build_tiny_flux

STUDIO = {"height": 32, "width": 32, "max_sequence_length": 16, "num_inference_steps": 4,
          "guidance_scale": 2.0, "negative_prompt": ""}


@pytest.fixture(scope="module")
def tiny_flux(tmp_path_factory):
    return build_tiny_flux(tmp_path_factory.mktemp("flux"), studio_config=STUDIO)


def test_workflow_grid_benchmark_smoke(tiny_flux, tmp_path, capsys):
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

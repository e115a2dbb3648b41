"""The mixed-video benchmark runs end to end on the built-in video model v2 (a smoke run, not a
timing test): both systems complete every clip, packed forwards hold clips of both canvases, and
each clip's first frame matches its frame with the canvases taking turns."""

import json
from pathlib import Path

import pytest

from benchmarks import mixed_videos

MODEL_DIR = Path(__file__).resolve().parent.parent / "assets" / "shapes-wan-v2"
pytestmark = pytest.mark.skipif(not (MODEL_DIR / "model_index.json").is_file(), reason="assets/shapes-wan-v2 not exported")


def test_mixed_videos_runs_both_systems_and_matches_pixels(tmp_path):
    out = tmp_path / "videos.json"
    result = mixed_videos.main(["--requests", "8", "--users", "4", "--steps", "4", "--rounds", "1", "--out", str(out)])
    summary = result["summary"]
    assert summary["packed"]["completed"] == 8 and summary["turns"]["completed"] == 8
    # Four users, the canvases taking turns: packed forwards hold both canvases, turns' never mix them.
    assert summary["packed"]["mean_requests_per_forward"] > 1.0
    assert summary["turns"]["mean_requests_per_forward"] < summary["packed"]["mean_requests_per_forward"]
    assert result["packed_vs_turns_max_levels"] <= 1
    assert json.loads(out.read_text())["args"]["canvases"] == "64x64x9,96x64x13"
    assert "| packed |" in mixed_videos.report(result)

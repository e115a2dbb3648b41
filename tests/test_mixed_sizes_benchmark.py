"""The mixed-size benchmark runs end to end on a model that serves many sizes (a smoke run, not a
timing test): every system completes every request, packed forwards hold requests of several
sizes, and each request's pixels match its image in the other systems."""

import json
import shutil
from pathlib import Path

import pytest

from benchmarks import mixed_sizes

BUILTIN = Path(__file__).resolve().parent.parent / "assets" / "shapes-flux"


@pytest.fixture(scope="module")
def many_sizes_model(tmp_path_factory) -> Path:
    """The built-in model's folder with a size range instead of its one size (the weights don't
    matter to the engine's timing or to pixel parity)."""
    folder = tmp_path_factory.mktemp("model") / "shapes-flux"
    shutil.copytree(BUILTIN, folder)
    card = json.loads((folder / "stepstudio.json").read_text())
    card.pop("sizes", None)
    card["size_range"] = [48, 128]
    (folder / "stepstudio.json").write_text(json.dumps(card))
    return folder


def test_mixed_sizes_runs_every_system_and_matches_pixels(many_sizes_model, tmp_path):
    out = tmp_path / "mixed.json"
    result = mixed_sizes.main(["--model", str(many_sizes_model), "--requests", "4", "--users", "2", "--steps", "2",
                               "--rounds", "1", "--diffusers-requests", "2", "--sizes", "48x48,96x64,64x96",
                               "--ceiling-repeats", "1", "--out", str(out)])
    summary = result["summary"]
    assert summary["packed"]["completed"] == 4 and summary["turns"]["completed"] == 4
    assert summary["diffusers"]["completed"] == 2
    # Two users of three sizes: packed forwards hold more than one request, turns' don't mix sizes.
    assert summary["packed"]["mean_requests_per_forward"] > 1.0
    assert result["pixels"]["packed_vs_turns_max_levels"] <= 1
    assert result["pixels"]["packed_vs_diffusers_max_levels"] <= 1
    probe = result["small_beside_large"]
    assert set(probe) == {"packed", "turns"} and all(p["alone_s"] > 0 for p in probe.values())
    assert json.loads(out.read_text())["sizes"] == ["48x48", "96x64", "64x96"]
    assert "| packed |" in mixed_sizes.report(result)

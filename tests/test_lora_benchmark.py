"""A smoke run of the LoRA serving benchmark on the built-in model with tiny settings (3 users, 3
steps, one repeat): every system completes every request in exactly its steps, the shared engine
mixes adapter sets in its forwards, splitting by adapter set never does, and the diffusers baseline
patches adapters per request (the full run stays out of CI; its results are in docs/benchmarks.md)."""

from __future__ import annotations

import json

import pytest

from benchmarks import lora_serving

pytest.importorskip("peft", reason="the diffusers baseline loads adapters through PEFT (pip install -e '.[test]')")


def test_lora_serving_benchmark_smoke(tmp_path, capsys):
    out = tmp_path / "lora.json"
    # Users 0, 1, 2 run the base model, a at 1.0 and b at 0.8: three adapter sets.
    result = lora_serving.main(["--users", "3", "--steps", "3", "--repeats", "1", "--json", str(out)])
    printed = capsys.readouterr().out
    summaries = result["summaries"]
    assert set(summaries) == {"shared", "split", "diffusers", "no-adapters"}
    for name, s in summaries.items():
        records = s["run"]["records"]
        assert len(records) == s["requests"] == s["images"] == 3, name
        assert all(r["status"] == "completed" for r in records), name
        assert s["steps_exact"], (name, [(r["steps"], r["steps_done"]) for r in records])
        # Every request ran in the same number of forwards per step, and only the measured ones ran.
        assert s["requests_in_forwards"] == 3, name
        assert s["images_per_s"] == pytest.approx(3 / s["wall_s"])
        assert 0 < s["first_step_mean_s"] <= s["first_step_p95_s"] < s["latency_p95_s"] <= s["wall_s"], name
        assert s["forward_ms_mean"] > 0
    engine_systems = ("shared", "split", "no-adapters")
    for name in engine_systems:
        # One forward per step, both CFG rows of a request in it (the model's default runs true CFG).
        assert summaries[name]["forwards_per_request_step"] == [1.0], name
        assert all(f["rows"] == 2 * len(f["requests"]) for f in summaries[name]["run"]["forwards"]), name
    # The stock pipeline's true CFG: two transformer calls of one row per step.
    assert summaries["diffusers"]["forwards_per_request_step"] == [2.0]
    assert summaries["diffusers"]["rows_per_forward"] == summaries["diffusers"]["requests_per_forward"] == 1.0

    shared, split = summaries["shared"], summaries["split"]
    # Shared: rows with different adapters (and none) in one forward.
    assert shared["mixed_forwards"] >= 1 and shared["adapter_sets_per_forward_max"] >= 2
    assert shared["requests_per_forward"] > split["requests_per_forward"]
    # Split: one adapter set per forward, and each of the three sets had forwards of its own.
    assert split["mixed_forwards"] == 0 and split["adapter_sets_per_forward_max"] == 1
    split_sets = {tuple(map(tuple, f["sets"][0])) for f in split["run"]["forwards"]}
    assert split_sets == {(), (("a", 1.0),), (("b", 0.8),)}
    assert split["forwards"] == 3 * 3  # three one-request groups, three steps each
    # No adapters: every row of every forward ran the base model.
    assert all(s == [] for f in summaries["no-adapters"]["run"]["forwards"] for s in f["sets"])
    # diffusers patched both adapter users' adapters in and out, and never mixed sets.
    diffusers = summaries["diffusers"]
    assert diffusers["patches"] == 2 and diffusers["patch_s"] > 0 and diffusers["mixed_forwards"] == 0

    # The bare forward of the three requests, timed with and without their adapters.
    deltas = result["deltas"]
    assert deltas["requests"] == 3 and deltas["rows"] == 6 and deltas["with_ms"] > 0 and deltas["without_ms"] > 0
    assert len(deltas["trials_ms"]["with"]) == len(deltas["trials_ms"]["without"]) == 7

    saved = json.loads(out.read_text())
    assert saved["setup"]["requests"] == 3 and saved["setup"]["steps"] == 3
    assert saved["setup"]["user_loras"] == [[], [{"name": "a", "scale": 1.0}], [{"name": "b", "scale": 0.8}]]
    assert "| shared | 3/3 |" in printed and "x shared" in printed and "Per-row deltas" in printed
    ratio = split["images_per_s"] / shared["images_per_s"]
    assert f"| {ratio:.2f} |" in printed

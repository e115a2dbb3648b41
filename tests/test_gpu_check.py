"""The GPU check can't rot before a GPU comes: its dry run (the same code on the CPU, tiny
models, float32) runs every section here, and each one must come back with measured values."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.gpu_budget import TimeBudget
from benchmarks.gpu_plans import FP8_RELATIVE_TOLERANCE
from benchmarks.gpu_settings import DRY_RUN
from pipelines.loader import FAMILIES
from pipelines.memory_plan import PLANS

ROOT = Path(__file__).resolve().parent.parent
FLOAT32_BOUND = math.sqrt(torch.finfo(torch.float32).eps)
UNLIMITED_S = 3600  # the dry run's budget here: only a hung run gets near it


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """One dry run with every section, the compile one through the `eager` backend (Inductor
    would take minutes on this CPU). The budget is far beyond what any section needs: this
    checks that every section's code runs, and a section skipped because its time estimate did
    not fit a busy machine would say nothing about that (the budget's own logic is tested below)."""
    out = tmp_path_factory.mktemp("gpu-check")
    command = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--dry-run", "--compile-backend", "eager",
               "--time-budget", str(UNLIMITED_S), "--out-dir", str(out)]
    finished = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=UNLIMITED_S + 60)
    assert finished.returncode == 0, finished.stderr[-3000:]
    report = json.loads((out / "gpu_check_dry_run.json").read_text())
    return report, (out / "gpu_check_dry_run.md").read_text(), finished.stdout


def test_every_section_ran_and_nothing_was_skipped(dry_run):
    report, _, _ = dry_run
    for name, section in report["sections"].items():
        assert section["status"] == "ran", (name, section.get("error"))
        assert section["skipped"] == [], (name, section["skipped"])
    assert 0 < report["wall_s"] <= report["budget_s"]


def test_every_registered_family_matches_its_stock_pipeline_alone_and_co_batched(dry_run):
    parity = dry_run[0]["sections"]["parity"]
    rows = parity["rows"]
    assert {row["class"] for row in rows} == set(FAMILIES)
    for row in rows:
        assert "error" not in row, row
        assert row["passed"] and row["finite"], row
        assert row["latent_bound"] == pytest.approx(FLOAT32_BOUND * max(1.0, row["latent_magnitude"]))
        assert 0 <= row["max_abs_diff"] <= row["latent_bound"], row
        assert row["uint8_diff"] <= row["uint8_bound"] == 1, row
        assert "SDPA" in row["attention_kernels"], row
    for family in {row["family"] for row in rows}:
        runs = [row for row in rows if row["family"] == family]
        assert [row["run"] for row in runs] == ["alone", "co-batched 1/2", "co-batched 2/2"]
        assert all(row["shared_forwards"] >= 4 for row in runs[1:]), runs  # both requests' first 4 steps


def test_memory_rows_for_every_size_and_batch(dry_run):
    memory = dry_run[0]["sections"]["memory"]
    assert memory["parameters"] > 0 and memory["weights_gib"] > 0 and memory["init_s"] > 0
    measured = {(row["size"], row["batch"]) for row in memory["rows"]}
    assert measured == {(size, batch) for size in DRY_RUN.memory_sizes for batch in DRY_RUN.memory_batches}
    for row in memory["rows"]:
        assert row["forward_s"] > 0 and row["finite"], row
        assert row["peak_gib"] is None  # the CPU has no allocator statistics
    assert "SDPA" in memory["attention_kernels"]


def test_every_memory_plan_ran_and_offload_predicts_exactly_what_resident_does(dry_run):
    plans = dry_run[0]["sections"]["plans"]
    assert [plan["plan"] for plan in plans["plans"]] == list(PLANS)
    for plan in plans["plans"]:
        run = plan["uncapped"]
        assert run["cap"] == "no cap on cpu" and run["fits"] and run["finite"], plan
        assert run["step_s"] > 0 and run["encode_s"] > 0 and run["images_per_s"] > 0, plan
        # An offloaded text encoder group comes to the device once for the 8 requests' encode stage.
        assert run["text_encoder_trips"] == (0 if plan["plan"] == "resident" else 1), plan
    by_plan = {plan["plan"]: plan for plan in plans["plans"]}
    assert by_plan["offload"]["against_resident"] == {"max_abs_diff": 0.0, "relative_rms": 0.0, "exact": True}
    for name in ("fp8", "lowvram"):  # float8 weights (and text encoders): close to resident, not equal
        fp8 = by_plan[name]["against_resident"]
        assert 0 < fp8["relative_rms"] <= FP8_RELATIVE_TOLERANCE and not fp8["exact"], (name, fp8)
    assert by_plan["lowvram"]["against_fp8"]["exact"]  # block offloading changes nothing computed
    sizes = plans["sizes_gib"]
    assert 0 < sizes["denoiser_fp8"] < sizes["denoiser"] and 0 < sizes["text_encoders_fp8"] < sizes["text_encoders"]
    rows = plans["rows"]
    assert sorted((row["card_gib"], row["plan"]) for row in rows) == sorted(
        (card, plan) for card in DRY_RUN.plans_caps_gib for plan in PLANS)
    for row in rows:  # no cap on the CPU: every plan runs, and the tiny model fits every card on paper too
        assert row["cap"] == "no cap on cpu" and row["measured"] and row["fits"] and row["predicted_fits"], row
        assert row["step_s"] > 0 and row["images_per_s"] > 0 and row["predicted_peak_gib"] > 0, row
    assert all(card["auto_at_load"].startswith("resident") for card in plans["cards"])


def test_serving_rows_have_positive_throughput_and_latencies_in_step_times(dry_run):
    serving = dry_run[0]["sections"]["serving"]
    modes = serving["modes"]
    assert modes["stand_in_against_stock"]["passed"], modes["stand_in_against_stock"]
    assert [row["system"].split(" (")[0] for row in modes["rows"]] == ["one at a time", "request mode", "step mode"]
    for row in modes["rows"]:
        assert row["completed"] == DRY_RUN.serving_requests - 1 and row["aborted"] == 1 and row["failed"] == 0
        assert row["images_per_s"] == pytest.approx(row["completed"] / row["wall_s"])
        assert row["images_per_s"] > 0 and row["step_unit_s"] > 0
        assert row["admission_p50_steps"] is not None and row["cancel_client_steps"] is not None
    step = modes["rows"][2]
    # Whether an arrival finds a request still running depends on this machine's load (open loop),
    # so co-batching is not asserted here; the batching curve below queues its rows up front.
    assert step["cancel_engine_steps"] is not None and step["mean_batch"] >= 1
    ratio = modes["targets"]["step_over_request"]
    assert ratio["value"] == pytest.approx(step["images_per_s"] / modes["rows"][1]["images_per_s"])
    for curve in (serving["curve"], dry_run[0]["sections"]["compile"]):
        assert [row["batch"] for row in curve["rows"]] == list(DRY_RUN.curve_batches)
        for row in curve["rows"]:
            assert row["images_per_s"] > 0 and row["forwards_by_batch_size"] == {str(row["batch"]): DRY_RUN.curve_steps}
    compiled = dry_run[0]["sections"]["compile"]
    assert compiled["backend"] == "eager" and compiled["first_call_s"] > 0


def test_caching_rows_skip_rows_and_a_threshold_skipping_nothing_is_exactly_caching_off(dry_run):
    caching = dry_run[0]["sections"]["caching"]
    rows = caching["rows"]
    assert [row["threshold"] for row in rows] == [0.0, caching["nothing_skipped_threshold"], *DRY_RUN.caching_thresholds]
    assert caching["nothing_skipped_is_exact"] is True
    off, nothing, *cached = rows
    assert off["rows_skipped"] == nothing["rows_skipped"] == 0 and nothing["max_abs_diff_from_off"] == 0
    for row in rows:
        assert row["images_per_s"] > 0 and len(row["skipped_steps"]) == DRY_RUN.caching_requests
    # The tiny random model changes little between its last steps: threshold 1 skips some of them.
    assert all(0 < row["rows_skipped"] < 1 and row["max_abs_diff_from_off"] > 0 for row in cached), cached
    assert rows[-1]["rows_skipped"] == sum(rows[-1]["skipped_steps"]) / (DRY_RUN.caching_requests * DRY_RUN.caching_steps)


def test_packed_rows_of_three_sizes_match_their_solo_forwards_with_every_kernel(dry_run):
    packing = dry_run[0]["sections"]["packing"]
    assert packing["sizes"] == list(DRY_RUN.packing_sizes)
    systems = [row["system"] for row in packing["rows"]]
    assert systems == ["separate forwards (sizes take turns)", "packed, sdpa attention", "packed, padded attention"]
    for row in packing["rows"]:
        assert row["seconds"] > 0 and row["x_separate"] > 0
        assert row["max_rel_diff"] <= FLOAT32_BOUND, row  # float32: the packed rows are their solo forwards
    sdpa, padded = packing["rows"][1:]
    assert "SDPA" in sdpa["kernel"] and "SDPA" in padded["kernel"]


def test_the_markdown_has_every_table_and_is_printed(dry_run):
    _, markdown, printed = dry_run
    for heading in ("### Correctness", "### Memory:", "### Memory plans on emulated cards", "### Serving at", "### Batching curve", "### Step caching at",
                    "### Packed forwards", "### Skipped or failed"):
        assert heading in markdown
    assert markdown in printed


def test_budget_sections_leave_later_sections_their_planned_time():
    now = [100.0]
    budget = TimeBudget(60.0, {"a": 10.0, "b": 20.0, "c": 30.0}, clock=lambda: now[0])
    assert budget.section("a").deadline == 100.0 + 60 - 50  # b and c keep 50 s
    now[0] = 105.0  # a finished early: b may use a's leftover
    b = budget.section("b")
    assert b.deadline == 100.0 + 60 - 30 and b.left() == 25.0
    assert b.run_if_it_fits("small", 5.0, lambda: "ran") == "ran"
    assert b.run_if_it_fits("too big", 30.0, lambda: "ran") is None
    assert b.skipped == [{"what": "too big", "reason": "needs about 30 s; 25 s were left in this section"}]
    squeezed = TimeBudget(30.0, {"a": 10.0, "b": 50.0}, clock=lambda: 0.0)  # plans scaled to fit
    assert squeezed.plan == {"a": 5.0, "b": 25.0}

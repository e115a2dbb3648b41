"""A smoke run of the serving benchmark on a tiny random FLUX checkpoint: every metric is
there, and the ratios come from the measured records (the full run stays out of CI)."""

import json

import pytest

from benchmarks import serving, systems
from tests.tiny_checkpoints import build_tiny_flux, build_tiny_wan

STUDIO = {"height": 32, "width": 32, "max_sequence_length": 16, "num_inference_steps": 4,
          "guidance_scale": 2.0, "negative_prompt": ""}


@pytest.fixture(scope="module")
def tiny_flux(tmp_path_factory):
    return build_tiny_flux(tmp_path_factory.mktemp("flux"), studio_config=STUDIO)


class ChildrenInThisProcess:
    """Stands in for serving._child without a new interpreter: the child's own code (main
    --run-system, the same arguments) in this process, its result read back from its file as the
    parent reads it (a child process costs this machine 10-20 s of imports). With `first_in_a_process`
    the first child runs in its own process, as the benchmark runs every one."""

    def __init__(self, first_in_a_process: bool = False) -> None:
        self.first_in_a_process = first_in_a_process
        self.ran: list[str] = []  # the systems run, in order
        self._real_child = serving._child

    def __call__(self, system: str, args, workload_file, out_file) -> dict:
        self.ran.append(system)
        if self.first_in_a_process and len(self.ran) == 1:
            return self._real_child(system, args, workload_file, out_file)
        serving.main(serving.child_argv(system, args, workload_file, out_file))
        return json.loads(out_file.read_text())


def test_serving_benchmark_smoke(tiny_flux, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(serving, "_child", children := ChildrenInThisProcess())
    out = tmp_path / "serving.json"
    result = serving.main([
        "--model", str(tiny_flux), "--systems", "diffusers", "step4", "--requests", "6", "--users", "3",
        "--steps-mix", "3", "5", "--sizes", "32", "--cancel-fraction", "0.3", "--seed", "3", "--rounds", "2",
        "--out", str(out),
    ])
    printed = capsys.readouterr().out
    summaries = {s["system"]: s for s in result["summaries"]}
    assert set(summaries) == {"diffusers", "step4"}
    for name, s in summaries.items():
        records = next(r for r in result["results"] if r["system"] == name)["records"]
        assert len(records) == 6
        assert s["completed"] + s["aborted"] == 6 and s["failed"] == 0
        # Throughput is computed from the measured wall time and completions.
        assert s["throughput_rpm"] == pytest.approx(60 * s["completed"] / s["wall_s"])
        for key in ("latency_mean_s", "latency_p50_s", "latency_p99_s", "queue_delay_mean_s", "admission_p50_s",
                    "mean_batch", "peak_batch", "solo_step_s", "solo_latency_s", "peak_rss_mb"):
            assert s[key] is not None and s[key] > 0, (name, key)
    # Two rounds of each system; the table shows the median round (the slower one of two).
    for name, s in summaries.items():
        rounds = s["throughput_rounds_rpm"]
        assert len(rounds) == 2 and len(result["all_rounds"][name]) == 2
        assert s["throughput_rpm"] == min(rounds)
    assert "Throughput of every round, req/min" in printed
    # The same seeded workload went to both systems, with the same cancels.
    assert cancels_asked_by_both(result)
    # Only stepstudio streams previews and frees a cancelled slot without decoding.
    assert summaries["step4"]["first_preview_p50_s"] > 0 and summaries["diffusers"]["first_preview_p50_s"] is None
    assert summaries["step4"]["cancel_latency_mean_s"] > 0
    step4 = summaries["step4"]
    assert 0 < step4["first_preview_after_admission_p50_s"] < step4["first_preview_p50_s"]
    assert 1 <= step4["joined_batch_mean"] <= 4 and summaries["diffusers"]["joined_batch_mean"] is None
    assert f"requests join forwards of {step4['joined_batch_mean']:.1f} rows on average" in printed
    assert summaries["step4"]["peak_batch"] >= 2 and summaries["diffusers"]["peak_batch"] == 1
    ratio = summaries["step4"]["throughput_rpm"] / summaries["diffusers"]["throughput_rpm"]
    assert f"| {ratio:.2f} |" in printed
    ceiling = result["ceiling"]
    assert set(ceiling["per_image_step_s"]) == {1, 8} and ceiling["ceiling_rpm"] > 0
    # Timed before and after the systems; the ceiling uses their mean.
    before, after = ceiling["timings"]
    assert ceiling["per_image_step_s"][8] == pytest.approx((before["per_image_step_s"]["8"] + after["per_image_step_s"]["8"]) / 2)
    assert "The mean of two timings, before and after the systems" in printed
    assert "req   0" in printed and out.exists()
    # Two rounds of both systems, each round starting at another one, between the two timings.
    assert children.ran == ["ceiling", "diffusers", "step4", "step4", "diffusers", "ceiling"]


def cancels_asked_by_both(result: dict) -> set[int]:
    """The requests whose cancel both systems asked for (the same ones, or it fails), after
    checking that only those ended aborted. The stock pipeline, one request at a time, aborts each
    of them; step mode does unless its follower thread hears the cancel's step after the engine has
    done the last one (a loaded machine can make that happen): that request then completes."""
    asked, aborted = {}, {}
    for run in result["results"]:
        records = run["records"]
        asked.setdefault(run["system"], set()).update(r["index"] for r in records if r["cancel_requested"] is not None)
        aborted.setdefault(run["system"], set()).update(r["index"] for r in records if r["status"] == "aborted")
    assert asked["diffusers"] == asked["step4"] and aborted["diffusers"] == asked["diffusers"], (asked, aborted)
    assert aborted["step4"] <= asked["step4"], (asked, aborted)
    return asked["step4"]


WAN_STUDIO = {"height": 32, "width": 32, "num_frames": 9, "fps": 8, "max_sequence_length": 16,
              "num_inference_steps": 4, "guidance_scale": 2.0, "negative_prompt": ""}


def test_serving_benchmark_video_smoke(tmp_path, capsys, monkeypatch):
    """--kind video on a tiny Wan checkpoint: the stock WanPipeline.__call__ against step mode,
    every request with its frame count (two counts: two batch keys that take turns). Its first
    child (the stock pipeline's run) runs in a process of its own, as the benchmark runs them."""
    monkeypatch.setattr(serving, "_child", children := ChildrenInThisProcess(first_in_a_process=True))
    tiny_wan = build_tiny_wan(tmp_path / "wan", studio_config=WAN_STUDIO)
    result = serving.main([
        "--kind", "video", "--model", str(tiny_wan), "--systems", "diffusers", "step4", "--requests", "6",
        "--users", "3", "--steps-mix", "3", "5", "--frames-mix", "5", "9", "--sizes", "32", "--cancel-fraction", "0.3",
        "--seed", "3", "--no-ceiling", "--out", str(tmp_path / "serving.json"),
    ])
    printed = capsys.readouterr().out
    assert "frames [5, 9]" in printed
    summaries = {s["system"]: s for s in result["summaries"]}
    for name, s in summaries.items():
        assert s["completed"] + s["aborted"] == 6 and s["failed"] == 0, name
        assert s["throughput_rpm"] == pytest.approx(60 * s["completed"] / s["wall_s"])
    # The same seeded workload (seed 3 cancels two of the six) went to both systems.
    assert len(cancels_asked_by_both(result)) == 2
    step4 = summaries["step4"]
    assert step4["peak_batch"] >= 2 and summaries["diffusers"]["peak_batch"] == 1
    assert step4["first_preview_p50_s"] > 0 and step4["cancel_latency_mean_s"] > 0
    assert step4["serving_step_s"] > 0 and step4["engine_cancel_s"] > 0
    assert "admission p50" in printed and "step-times" in printed
    assert children.ran == ["diffusers", "step4"]
    # The ceiling's bare forward, here in-process (a child process each costs this machine ~15 s).
    ceiling = systems.measure_denoiser(str(tiny_wan), size=32, batch_sizes=(1, 2), repeats=1, frames=5)
    assert set(ceiling["per_image_step_s"]) == {1, 2} and ceiling["decode_s"] > 0
    with pytest.raises(SystemExit):  # the images route can't serve a video model
        serving.main(["--kind", "video", "--model", str(tiny_wan), "--systems", "http8"])

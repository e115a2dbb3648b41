"""The serving benchmark's summaries: per-system figures from the recorded runs, the markdown
table, the targets and the per-request timelines (benchmarks/serving.py runs the systems)."""

from __future__ import annotations

import statistics

from benchmarks.workload import Workload


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    low, high = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


def summarize(result: dict) -> dict:
    records = result["records"]
    done = [r for r in records if r["status"] == "completed"]
    latency = [r["finished"] - r["submitted"] for r in done]
    queue_delay = [r["admitted"] - r["submitted"] for r in records if r["admitted"] is not None]
    preview = [r["first_preview"] - r["submitted"] for r in records if r["first_preview"] is not None]
    # Per request: from its first denoise step beginning to its first preview arriving.
    preview_after_admission = [r["first_preview"] - r["admitted"] for r in records
                               if r["first_preview"] is not None and r["admitted"] is not None]
    joined = [r["admitted_batch"] for r in records if r.get("admitted_batch") is not None]
    cancel = [r["finished"] - r["cancel_requested"] for r in records if r["cancel_requested"] is not None]
    sizes = {int(b): n for b, n in result["forwards_by_batch_size"].items()}
    forwards = sum(sizes.values())
    return {
        "system": result["system"],
        "completed": len(done),
        "aborted": sum(r["status"] == "aborted" for r in records),
        "failed": sum(r["status"] == "failed" for r in records),
        "wall_s": result["wall_s"],
        "throughput_rpm": 60 * len(done) / result["wall_s"],
        "cpu_s": result.get("cpu_s"),
        "cpu_throughput_rpm": 60 * len(done) / result["cpu_s"] if result.get("cpu_s") else None,
        "latency_mean_s": statistics.fmean(latency) if latency else None,
        "latency_p50_s": _pct(latency, 0.5),
        "latency_p99_s": _pct(latency, 0.99),
        "queue_delay_mean_s": statistics.fmean(queue_delay) if queue_delay else None,
        "admission_p50_s": _pct(queue_delay, 0.5),
        "admission_p99_s": _pct(queue_delay, 0.99),
        "first_preview_p50_s": _pct(preview, 0.5),
        "first_preview_after_admission_p50_s": _pct(preview_after_admission, 0.5),
        "joined_batch_mean": statistics.fmean(joined) if joined else None,
        "cancel_latency_mean_s": statistics.fmean(cancel) if cancel else None,
        "cancel_latency_max_s": max(cancel) if cancel else None,
        "mean_batch": sum(b * n for b, n in sizes.items()) / forwards if forwards else None,
        "peak_batch": max(sizes) if sizes else None,
        "rows_skipped_share": (result.get("rows_skipped", 0) / (result.get("rows_computed", 0) + result.get("rows_skipped", 0))
                               if result.get("rows_computed", 0) + result.get("rows_skipped", 0) else None),
        "solo_step_s": result["solo_step_s"],
        "serving_step_s": result.get("serving_step_s"),
        "engine_cancel_s": result.get("engine_cancel_s"),
        "engine_first_preview_s": result.get("engine_first_preview_s"),
        "solo_latency_s": result["solo_latency_s"],
        "peak_rss_mb": result["peak_rss_mb"],
        "peak_gpu_mb": result["peak_gpu_mb"],
    }


def timeline(result: dict, width: int = 60) -> str:
    records = result["records"]
    t0 = min(r["submitted"] for r in records)
    t1 = max(r["finished"] for r in records)
    scale = width / max(t1 - t0, 1e-9)
    lines = [f"{result['system']}: '.' waiting, '#' computing, 'x' cancelled ({t1 - t0:.2f} s across)"]
    for r in records:
        a = int((r["submitted"] - t0) * scale)
        b = int(((r["admitted"] or r["finished"]) - t0) * scale)
        c = max(b + 1, int((r["finished"] - t0) * scale))
        mark = "x" if r["status"] == "aborted" else "#"
        lines.append(f"  req {r['index']:>3} {r['steps']:>3} steps |{' ' * a}{'.' * (b - a)}{mark * (c - b)}")
    return "\n".join(lines)


def _pct_text(share: float | None) -> str:
    return "-" if share is None else f"{share:.0%}"


def _fmt(value, digits=3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def median_round(rounds: list[dict]) -> tuple[dict, dict]:
    """A system's round with the median throughput (the lower middle one for an even count;
    every metric then comes from one real run) and its summary, which also lists the
    throughput of every round."""
    summaries = [summarize(r) for r in rounds]
    order = sorted(range(len(rounds)), key=lambda i: summaries[i]["throughput_rpm"])
    chosen = order[(len(order) - 1) // 2]
    summary = summaries[chosen]
    summary["throughput_rounds_rpm"] = [s["throughput_rpm"] for s in summaries]
    return rounds[chosen], summary


def average_timings(timings: list[dict]) -> dict:
    """The mean of several `measure_denoiser` results; each one is kept under "timings"."""
    batch_sizes = [int(b) for b in timings[0]["per_image_step_s"]]
    averaged = {
        "per_image_step_s": {
            b: statistics.fmean(t["per_image_step_s"][str(b)] for t in timings) for b in batch_sizes
        },
        "encode_s": statistics.fmean(t["encode_s"] for t in timings),
        "decode_s": statistics.fmean(t["decode_s"] for t in timings),
        "timings": timings,
    }
    if all("per_image_step_cpu_s" in t for t in timings):
        averaged["per_image_step_cpu_s"] = {
            b: statistics.fmean(t["per_image_step_cpu_s"][str(b)] for t in timings) for b in batch_sizes}
        averaged["encode_cpu_s"] = statistics.fmean(t["encode_cpu_s"] for t in timings)
        averaged["decode_cpu_s"] = statistics.fmean(t["decode_cpu_s"] for t in timings)
    return averaged


def report(summaries: list[dict], ceiling: dict | None, workload: Workload) -> str:
    base = next((s for s in summaries if s["system"] == "diffusers"), None)
    rows = [
        "| system | done | aborted | wall s | req/min | x diffusers | lat mean s | p50 | p99 | queue mean s "
        "| admission p50 s | first preview p50 s | cancel mean s | cancel max s | mean batch | peak batch "
        "| rows skipped | CPU s | req per CPU-min | peak RSS MB |",
        "|" + "---|" * 20,
    ]
    for s in summaries:
        ratio = s["throughput_rpm"] / base["throughput_rpm"] if base and base["throughput_rpm"] else None
        rows.append(
            f"| {s['system']} | {s['completed']} | {s['aborted']} | {_fmt(s['wall_s'], 2)} | {_fmt(s['throughput_rpm'], 1)} "
            f"| {_fmt(ratio, 2)} | {_fmt(s['latency_mean_s'])} | {_fmt(s['latency_p50_s'])} | {_fmt(s['latency_p99_s'])} "
            f"| {_fmt(s['queue_delay_mean_s'])} | {_fmt(s['admission_p50_s'])} | {_fmt(s['first_preview_p50_s'])} "
            f"| {_fmt(s['cancel_latency_mean_s'])} | {_fmt(s['cancel_latency_max_s'])} | {_fmt(s['mean_batch'], 2)} "
            f"| {s['peak_batch'] or '-'} | {_pct_text(s.get('rows_skipped_share'))} | {_fmt(s.get('cpu_s'), 1)} "
            f"| {_fmt(s.get('cpu_throughput_rpm'), 1)} | {_fmt(s['peak_rss_mb'], 0)} |"
        )
    lines = ["\n".join(rows)]
    if any(len(s.get("throughput_rounds_rpm", ())) > 1 for s in summaries):
        lines.append("\nThroughput of every round, req/min (the table shows each system's median round): "
                     + "; ".join(f"{s['system']} " + ", ".join(f"{t:.0f}" for t in s["throughput_rounds_rpm"])
                                 for s in summaries) + ".")
    if ceiling:
        per = ceiling["per_image_step_s"]
        lines.append(
            "\nBare denoiser forward, per image-step: "
            + ", ".join(f"batch {b}: {1000 * t:.2f} ms" for b, t in sorted(per.items(), key=lambda kv: int(kv[0])))
            + f"; encode {1000 * ceiling['encode_s']:.1f} ms, decode {1000 * ceiling['decode_s']:.1f} ms per request."
        )
        if len(ceiling.get("timings", ())) > 1:
            largest = str(max(int(b) for b in per))
            each = " and ".join(f"{1000 * t['per_image_step_s'][largest]:.2f}" for t in ceiling["timings"])
            lines.append(f"(The mean of two timings, before and after the systems: {each} ms per image-step "
                         f"at batch {largest}.)")
        if "ceiling_rpm" in ceiling:
            lines.append(f"Ceiling throughput at full batches of {ceiling['ceiling_batch']}: {ceiling['ceiling_rpm']:.1f} req/min"
                         + (f" ({ceiling['ceiling_cpu_rpm']:.1f} per CPU-minute)" if ceiling.get("ceiling_cpu_rpm") else "")
                         + ".")
    return "\n".join(lines)


def targets(summaries: list[dict], ceiling: dict | None) -> list[str]:
    by = {s["system"]: s for s in summaries}
    out = []
    if "diffusers" in by:
        d = by["diffusers"]
        for name in ("step1", "step8", "request"):
            if name in by:
                out.append(
                    f"single request latency {name} / diffusers: {by[name]['solo_latency_s'] / d['solo_latency_s']:.3f} (target <= 1.03)"
                )
                break
        if "step8" in by:
            out.append(f"step8 throughput / diffusers: {by['step8']['throughput_rpm'] / d['throughput_rpm']:.2f}x (target >= 2x)")
    if "step8" in by and "request" in by:
        out.append(f"step8 throughput / request mode: {by['step8']['throughput_rpm'] / by['request']['throughput_rpm']:.2f}x (target >= 1)")
    if "step8" in by and ceiling and "ceiling_rpm" in ceiling:
        out.append(f"step8 throughput / ceiling: {by['step8']['throughput_rpm'] / ceiling['ceiling_rpm']:.2f} (target >= 0.90)")
    if "step8-cache" in by:
        cached = by["step8-cache"]
        if "step8" in by:
            plain = by["step8"]
            out.append(f"step8-cache throughput / step8: {cached['throughput_rpm'] / plain['throughput_rpm']:.2f}x "
                       f"by wall time, {cached['cpu_throughput_rpm'] / plain['cpu_throughput_rpm']:.2f}x by CPU time "
                       f"({_pct_text(cached['rows_skipped_share'])} of the rows skipped)")
        if ceiling and "ceiling_rpm" in ceiling:
            out.append(f"step8-cache throughput / ceiling: {cached['throughput_rpm'] / ceiling['ceiling_rpm']:.2f} "
                       "by wall time" + (f", {cached['cpu_throughput_rpm'] / ceiling['ceiling_cpu_rpm']:.2f} by CPU "
                                         "time" if ceiling.get("ceiling_cpu_rpm") else "") + " (target >= 1.5)")
    if "step8-onedecode" in by and "step8" in by:
        out.append(f"step8 (batched decodes) throughput / step8-onedecode: "
                   f"{by['step8']['throughput_rpm'] / by['step8-onedecode']['throughput_rpm']:.2f}x")
    for name in ("step8", "step4"):
        if name in by and by[name]["serving_step_s"]:
            s = by[name]
            step = s["serving_step_s"]  # the engine's mean step while this workload ran
            out.append(f"{name} mean engine step while serving: {1000 * step:.1f} ms (the unit below)")
            if s["admission_p50_s"] is not None:
                out.append(f"{name} admission p50: {s['admission_p50_s'] / step:.2f} step-times (target <= 1.5)")
            if s["engine_cancel_s"] is not None:
                out.append(f"{name} cancel latency (cancel call -> slot freed, engine-side) mean: "
                           f"{s['engine_cancel_s'] / step:.2f} step-times (target <= 1); until the client "
                           f"hears 'aborted': {s['cancel_latency_mean_s'] / step:.2f}")
            if s["first_preview_after_admission_p50_s"] is not None and ceiling:
                after = s["first_preview_after_admission_p50_s"]
                budget = ceiling["encode_s"] + step
                out.append(f"{name} first preview, admission -> preview p50 per request: {1000 * after:.0f} ms "
                           f"(target: encode + 1 step = {1000 * budget:.0f} ms); requests join forwards of "
                           f"{s['joined_batch_mean']:.1f} rows on average, the mean forward has {s['mean_batch']:.1f}")
            break
    return out

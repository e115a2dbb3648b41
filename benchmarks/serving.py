"""Serving benchmark: stepstudio side by side with the alternatives, on one checkpoint, in one run.

    python benchmarks/serving.py                                   # 8 closed-loop users, built-in model
    python benchmarks/serving.py --workload open --rate 6 --requests 48
    python benchmarks/serving.py --systems diffusers step8 --requests 16 --cancel-fraction 0
    python benchmarks/serving.py --kind video                      # the built-in video model, 9 frames

Systems: `diffusers` (FluxPipeline.__call__ one request at a time), `request` (stepstudio
request mode, max batch 8), `stepN` (stepstudio step mode with max batch N), `httpN` (step
mode with max batch N behind the OpenAI-compatible HTTP API: the serving layer's cost;
no cancels are sent there, since an HTTP client can't see steps). Step caching is off in every
stepstudio system (`step_cache=0`) unless its name ends in `-cache` (`step8-cache`,
`request-cache`): those send `--step-cache THRESHOLD` (default: the model's own). A name
ending in `-onedecode` decodes every finished request on its own instead of sharing one VAE
call with the requests that finish in the same step (`step8-onedecode`). Each system
runs in its own subprocess (so peak memory is its own) on the same seeded workload.
A `ceiling` run, before and after the systems, times the bare batched denoiser forward to
show how much batching can give.

Writes a JSON file with every record and prints a markdown table, ratios against the
diffusers baseline, the targets, and a per-request timeline ("." waiting, "#" computing).

`--kind video` serves a video model (default: the built-in one, `builtin-video`) the same way:
`diffusers` is then the stock `WanPipeline.__call__`, every request also has a frame count
(`--frames-mix`), and its prompts come from the moving-shapes world.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.serving_summary import (  # noqa: E402, F401 (_fmt, _pct and summarize: for the other benchmarks)
    _fmt,
    _pct,
    average_timings,
    median_round,
    report,
    summarize,
    targets,
    timeline,
)
from benchmarks.workload import Workload, make_workload  # noqa: E402

DEFAULT_SYSTEMS = ("diffusers", "request", "step1", "step4", "step8")


# ---------------------------------------------------------------------------- one system (child)
SYSTEM_OPTIONS = ("cache", "onedecode")  # name suffixes of the stepstudio systems


def _make_system(name: str, model: str, preview_every: int, guidance: float | None, step_cache: float | None = None):
    from benchmarks.systems import DiffusersSystem, EngineSystem, HttpSystem

    base, *options = name.split("-")
    if name == "diffusers":
        return DiffusersSystem(model, preview_every, guidance_scale=guidance)
    if set(options) - set(SYSTEM_OPTIONS) or (options and base.startswith("http")):
        raise ValueError(f"unknown system {name!r}: the stepstudio systems' options are -cache and -onedecode.")
    engine_options = {"step_cache": step_cache if "cache" in options else 0.0,
                      "batched_decodes": "onedecode" not in options}
    if base.startswith("http") and base[4:].isdigit():
        return HttpSystem(model, max_batch=int(base[4:]), preview_every=preview_every, guidance_scale=guidance)
    if base == "request":
        return EngineSystem(model, mode="request", max_batch=8, preview_every=preview_every, guidance_scale=guidance,
                            **engine_options)
    if base.startswith("step") and base[4:].isdigit():
        return EngineSystem(model, mode="step", max_batch=int(base[4:]), preview_every=preview_every,
                            guidance_scale=guidance, **engine_options)
    raise ValueError(f"unknown system {name!r}: use diffusers, request, stepN or httpN (e.g. step8), "
                     "stepstudio ones with -cache or -onedecode (e.g. step8-cache).")


def _drive(system, workload: Workload) -> list:
    """Send the workload: closed loop (each user waits for its previous request) or open loop."""
    tickets, lock = [], threading.Lock()

    def keep(ticket):
        with lock:
            tickets.append(ticket)
        return ticket

    if workload.kind == "closed":

        def user_loop(user: int) -> None:
            for item in (i for i in workload.items if i.user == user):
                keep(system.submit(item)).wait()

        users = [threading.Thread(target=user_loop, args=(u,)) for u in range(workload.users)]
        for t in users:
            t.start()
        for t in users:
            t.join()
    else:
        start = time.perf_counter()
        for item in workload.items:
            delay = start + item.arrival_s - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            keep(system.submit(item))
        for ticket in list(tickets):
            ticket.wait()
    return [t.record for t in tickets]


# Engine-side histograms read around the measured run (the warm-up excluded).
_ENGINE_HISTOGRAMS = {
    "serving_step_s": "stepstudio_step_seconds",
    "engine_cancel_s": "stepstudio_cancel_latency_seconds",  # cancel call -> slot freed
    "engine_first_preview_s": "stepstudio_first_preview_seconds",
}


def _engine_rows(system) -> tuple[int, int]:
    """(rows computed, rows skipped) by the engine so far; (0, 0) for systems without one."""
    if not hasattr(system, "engine"):
        return 0, 0
    stats = system.engine.snapshot().stats
    return stats.rows_computed, stats.rows_skipped


def _engine_histogram_totals(system) -> dict[str, tuple[float, float]]:
    """(sum, count) of each engine histogram; empty for systems without an engine."""
    if not hasattr(system, "engine"):
        return {}
    registry = system.engine.metrics.registry
    return {key: (registry.get_sample_value(f"{metric}_sum") or 0.0, registry.get_sample_value(f"{metric}_count") or 0.0)
            for key, metric in _ENGINE_HISTOGRAMS.items()}


def run_system(name: str, model: str, workload: Workload, preview_every: int, step_cache: float | None = None) -> dict:
    import torch

    system = _make_system(name, model, preview_every, workload.guidance_scale, step_cache)
    # Warm-up: one request alone, outside the measurement; it also calibrates the step time.
    warm = workload.items[0]
    from dataclasses import replace

    warm_ticket = system.submit(replace(warm, index=-1, cancel_after_step=None))
    warm_ticket.wait()
    warm_record = warm_ticket.record
    warm_sizes = dict(system.batch_sizes())
    solo_step_s = None
    if hasattr(system, "engine"):
        stages = system.engine.snapshot().stats.stages
        solo_step_s = stages.denoise_step_s
    else:
        solo_step_s = (warm_record.finished - warm_record.admitted) / warm.steps

    before, rows_before = _engine_histogram_totals(system), _engine_rows(system)
    started, cpu_started = time.perf_counter(), time.process_time()
    records = _drive(system, workload)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    rows_computed, rows_skipped = (after - earlier for after, earlier in zip(_engine_rows(system), rows_before))
    engine_means = {}
    for key, (total, count) in _engine_histogram_totals(system).items():
        total_before, count_before = before[key]
        engine_means[key] = (total - total_before) / (count - count_before) if count > count_before else None
    sizes = {b: n - warm_sizes.get(b, 0) for b, n in system.batch_sizes().items() if n - warm_sizes.get(b, 0) > 0}
    system.close()
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    gpu_mb = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
    return {
        "system": name,
        "wall_s": wall,
        "cpu_s": cpu,  # this process's CPU time over the run: its work, less moved by other load
        "solo_step_s": solo_step_s,
        **engine_means,  # serving_step_s: the unit of admission and cancel latency
        "solo_latency_s": warm_record.finished - warm_record.submitted,
        "forwards_by_batch_size": sizes,
        "rows_computed": rows_computed,
        "rows_skipped": rows_skipped,
        "peak_rss_mb": peak_rss_mb,
        "peak_gpu_mb": gpu_mb,
        "records": [asdict(r) for r in sorted(records, key=lambda r: r.index)],
    }


def child_argv(system: str, args, workload_file: Path, out_file: Path) -> list[str]:
    """main's arguments for one system's run (or the ceiling's timing) on its own: it writes its
    result to `out_file`."""
    argv = ["--run-system", system, "--model", args.model, "--workload-file", str(workload_file),
            "--preview-every", str(args.preview_every), "--out", str(out_file)]
    argv += ["--threads", str(args.threads)] if args.threads else []
    return argv + (["--step-cache", str(args.step_cache)] if args.step_cache is not None else [])


def _child(system: str, args, workload_file: Path, out_file: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, __file__, *child_argv(system, args, workload_file, out_file)], check=True, env=env)
    return json.loads(out_file.read_text())


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", choices=["image", "video"], default="image",
                        help="what the model makes (video: requests have frames, diffusers is WanPipeline)")
    parser.add_argument("--model", default=None,
                        help="model folder, or 'builtin' (default) / 'builtin-video' (default with --kind video)")
    parser.add_argument("--systems", nargs="+", default=list(DEFAULT_SYSTEMS))
    parser.add_argument("--workload", choices=["closed", "open"], default="closed")
    parser.add_argument("--users", type=int, default=8, help="closed loop: concurrent users")
    parser.add_argument("--rate", type=float, default=4.0, help="open loop: arrivals per second")
    parser.add_argument("--arrivals", choices=["poisson", "fixed"], default="poisson")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--steps-mix", type=int, nargs="+", default=[10, 20, 30])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64])
    parser.add_argument("--frames-mix", type=int, nargs="+", default=[9], help="--kind video: frame counts drawn")
    parser.add_argument("--cancel-fraction", type=float, default=0.1)
    parser.add_argument("--preview-every", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--guidance-scale", type=float, default=None,
                        help="override the model's default guidance (1 = no CFG; default: the model's, e.g. true CFG)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads in each system's process")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every system this many times, in rotating order, and report each one's "
                             "median-throughput round (this machine's speed drifts between runs)")
    parser.add_argument("--no-ceiling", action="store_true", help="skip timing the bare batched denoiser")
    parser.add_argument("--step-cache", type=float, default=None, metavar="THRESHOLD",
                        help="the step-caching threshold of the -cache systems (default: the model's own)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "serving.json"))
    # internal: run one system in this process
    parser.add_argument("--run-system", help=argparse.SUPPRESS)
    parser.add_argument("--workload-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.model is None:
        args.model = "builtin-video" if args.kind == "video" else "builtin"

    if args.run_system:
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        workload = Workload.from_json(Path(args.workload_file).read_text())
        if args.run_system == "ceiling":
            from benchmarks.systems import measure_denoiser

            result = measure_denoiser(args.model, size=workload.items[0].size, batch_sizes=(1, 8),
                                      guidance_scale=workload.guidance_scale, frames=workload.items[0].frames)
        else:
            result = run_system(args.run_system, args.model, workload, args.preview_every, args.step_cache)
        Path(args.out).write_text(json.dumps(result))
        return result

    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}.")
    if args.kind == "video" and any(name.startswith("http") for name in args.systems):
        parser.error("httpN sends to /v1/images/generations, which serves image models only; "
                     "with --kind video use diffusers, request and stepN.")
    workload = make_workload(
        args.workload, args.requests, args.users, args.rate, tuple(args.steps_mix), tuple(args.sizes),
        args.cancel_fraction, args.seed, args.arrivals, args.guidance_scale,
        tuple(args.frames_mix) if args.kind == "video" else (),
    )
    results, summaries = [], []
    with tempfile.TemporaryDirectory() as tmp:
        workload_file = Path(tmp) / "workload.json"
        workload_file.write_text(workload.to_json())
        # The bare denoiser is timed before and after the systems, and the two are averaged:
        # this machine's speed drifts over minutes, and the ratio to the ceiling is only as
        # good as the ceiling's timing.
        timings = []
        if not args.no_ceiling:
            print("timing the bare denoiser ...", file=sys.stderr, flush=True)
            timings.append(_child("ceiling", args, workload_file, Path(tmp) / "ceiling-before.json"))
        runs: dict[str, list[dict]] = {system: [] for system in args.systems}
        for round_index in range(args.rounds):
            # Each round starts at another system, so no system always runs in the same slot.
            shift = round_index % len(args.systems)
            for system in args.systems[shift:] + args.systems[:shift]:
                print(f"running {system} (round {round_index + 1} of {args.rounds}) ...", file=sys.stderr, flush=True)
                runs[system].append(_child(system, args, workload_file, Path(tmp) / f"{system}-{round_index}.json"))
        for system in args.systems:
            result, summary = median_round(runs[system])
            results.append(result)
            summaries.append(summary)
        ceiling = None
        if timings:
            print("timing the bare denoiser again ...", file=sys.stderr, flush=True)
            timings.append(_child("ceiling", args, workload_file, Path(tmp) / "ceiling-after.json"))
            ceiling = average_timings(timings)
            per = ceiling["per_image_step_s"]
            batch = max(per)
            # Every request is encoded and runs its steps (a cancelled one up to its cancel);
            # only the completed ones are decoded and counted, as in the systems' runs.
            completed = sum(i.cancel_after_step is None for i in workload.items)
            total_steps = sum(i.cancel_after_step or i.steps for i in workload.items)
            seconds = (total_steps * per[batch] + len(workload.items) * ceiling["encode_s"]
                       + completed * ceiling["decode_s"])
            ceiling["ceiling_batch"] = batch
            ceiling["ceiling_rpm"] = 60 * completed / seconds
            cpu = ceiling.get("per_image_step_cpu_s")
            if cpu:  # the same sum in CPU time
                cpu_seconds = (total_steps * cpu[batch] + len(workload.items) * ceiling["encode_cpu_s"]
                               + completed * ceiling["decode_cpu_s"])
                ceiling["ceiling_cpu_rpm"] = 60 * completed / cpu_seconds

    machine = f"{platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}"
    print(f"\n## Serving benchmark ({args.workload} loop, {args.requests} requests, "
          f"{args.users if args.workload == 'closed' else f'{args.rate}/s'} "
          f"{'users' if args.workload == 'closed' else 'arrivals'}, steps {args.steps_mix}, sizes {args.sizes}, "
          f"{f'frames {args.frames_mix}, ' if args.kind == 'video' else ''}"
          f"cancel {args.cancel_fraction:.0%}, guidance {args.guidance_scale or 'model default'}, "
          f"{f'step cache {args.step_cache:g} (-cache systems), ' if args.step_cache is not None else ''}"
          f"seed {args.seed}; {machine})\n")
    print(report(summaries, ceiling, workload))
    print("\nTargets:")
    for line in targets(summaries, ceiling):
        print(f"- {line}")
    print()
    for result in results:
        print(timeline(result))
        print()
    everything = {"args": {k: v for k, v in vars(args).items() if k not in ("run_system", "workload_file")},
                  "machine": machine, "summaries": summaries, "ceiling": ceiling, "results": results,
                  "all_rounds": runs if args.rounds > 1 else None}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(everything, indent=1))
    print(f"wrote {out}", file=sys.stderr)
    return everything


if __name__ == "__main__":
    main()

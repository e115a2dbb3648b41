"""Engine replicas on Ray Serve: 16 concurrent users against 1 and 2 replicas, and what Ray adds per event.

    python benchmarks/replicas.py                          # built-in model, 16 users x 2 requests
    python benchmarks/replicas.py --systems local replicas1 replicas2 --users 16 --requests-per-user 4
    python benchmarks/replicas.py --json benchmarks/results/replicas.json

Systems (each replica and the in-process engine get ONE torch thread, pinned to one core):
  local      one Engine in this process (no Ray): the reference for what one core does
  replicasN  N engine replicas on a local Ray cluster (serve/), driven through ReplicatedEngine,
             the facade the studio uses; requests routed by serve/router.py
Users are closed-loop threads: each submits a request, waits for its image, submits the next.
The load runs --repeats times per system (this machine is shared); the median run is shown.
Every request is the model's default (64x64, 20 steps, true CFG: 2 rows per request).

Then the per-event overhead: one replica of the toy model (no compute), requests of many steps,
with and without previews, measured by the facade's `stepstudio_relay_seconds` histogram (from
the replica's engine emitting a progress event to the facade receiving it), and the submit
round trip (prepare on a replica + routing + admission) against an in-process engine.

Writes the records as JSON (--json) and prints markdown tables. Ray and Serve are shut down at
the end of every system, whatever happens.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine import Completed, Engine, GenerationParams, ServingLimits  # noqa: E402

PROMPTS = (
    "a large red circle on a blue background, left",
    "a small yellow square on a black background, center",
    "a large green triangle on a white background, top",
    "a small purple circle on an orange background, right",
)


# ---------------------------------------------------------------------------- load
def drive(engine, users: int, per_user: int, steps: int | None) -> dict:
    """Closed loop: `users` threads, each sending `per_user` requests one after another."""
    records, lock = [], threading.Lock()

    def user(index: int) -> None:
        for n in range(per_user):
            params = GenerationParams(prompt=PROMPTS[(index + n) % len(PROMPTS)], seed=1000 * index + n,
                                      num_inference_steps=steps)
            submitted = time.perf_counter()
            handle = engine.submit(params, session_id=f"user-{index}")
            accepted = time.perf_counter()
            final = handle.result(timeout=600)
            done = time.perf_counter()
            replica = getattr(engine, "replica_of", lambda _: "local")(handle.request_id)
            with lock:
                records.append({"user": index, "submit_s": accepted - submitted, "latency_s": done - submitted,
                                "ok": isinstance(final, Completed), "replica": replica})

    threads = [threading.Thread(target=user, args=(u,)) for u in range(users)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    latencies = sorted(r["latency_s"] for r in records)
    return {
        "requests": len(records), "failed": sum(not r["ok"] for r in records), "wall_s": wall,
        "images_per_min": 60 * len(records) / wall,
        "latency_mean_s": statistics.fmean(latencies), "latency_p50_s": latencies[len(latencies) // 2],
        "latency_p95_s": latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))],
        "submit_mean_ms": 1000 * statistics.fmean(r["submit_s"] for r in records),
        "by_replica": {name: sum(r["replica"] == name for r in records) for name in sorted({r["replica"] for r in records})},
    }


def repeated(run_once, repeats: int) -> dict:
    """`run_once()` `repeats` times (this machine is shared: one run can be unlucky); the run with
    the median throughput, with every run's throughput and the load average around them."""
    runs = []
    for _ in range(repeats):
        load_before = os.getloadavg()[0]
        result = run_once()
        result["load_avg"] = (load_before, os.getloadavg()[0])
        runs.append(result)
    runs.sort(key=lambda r: r["images_per_min"])
    median = dict(runs[len(runs) // 2])
    median["images_per_min_runs"] = [round(r["images_per_min"], 1) for r in runs]
    median["load_avg_runs"] = [r["load_avg"] for r in runs]
    return median


def mean_batch(forwards_by_size: dict) -> float:
    count = sum(forwards_by_size.values())
    return sum(size * n for size, n in forwards_by_size.items()) / count if count else 0.0


def run_local(model: str, users: int, per_user: int, steps: int | None, max_batch: int, repeats: int) -> dict:
    """One in-process engine on one core (this process pinned to it while it runs)."""
    import torch

    from pipelines.loader import load_pipeline

    cores, threads = os.sched_getaffinity(0), torch.get_num_threads()
    os.sched_setaffinity(0, {min(cores)})
    torch.set_num_threads(1)
    try:
        engine = Engine(load_pipeline(model), max_batch_requests=max_batch, limits=ServingLimits(max_per_session=64))
        engine.start()
        try:
            drive(engine, 2, 1, steps)  # warm-up

            def once() -> dict:
                before = dict(engine.snapshot().stats.forwards_by_batch_size)
                result = drive(engine, users, per_user, steps)
                after = engine.snapshot().stats.forwards_by_batch_size
                result["mean_batch"] = mean_batch({k: after[k] - before.get(k, 0) for k in after})
                return result

            result = repeated(once, repeats)
        finally:
            engine.close()
    finally:  # Ray's processes, started later from this one, must not inherit the pinning
        os.sched_setaffinity(0, cores)
        torch.set_num_threads(threads)
    return result


def replica_settings(model: str, replicas: int, max_batch: int, factory: tuple = ()):
    from serve.settings import ReplicaSettings, ServeSettings

    replica = ReplicaSettings(model=model, max_batch=max_batch, torch_threads=1, pin_cpus=True,
                              limits=ServingLimits(max_steps=1000, max_per_session=64), **dict(factory))
    return ServeSettings(replica=replica, replicas=replicas, cpus_per_replica=1.0)


def run_replicas(model: str, replicas: int, users: int, per_user: int, steps: int | None, max_batch: int,
                 repeats: int) -> dict:
    from serve.local import local_replicas

    started = time.perf_counter()
    with local_replicas(replica_settings(model, replicas, max_batch)) as engine:
        ready_s = time.perf_counter() - started
        drive(engine, 2 * replicas, 1, steps)  # warm-up: every replica has run a forward

        def once() -> dict:
            before = {label: dict(s.stats.forwards_by_batch_size) for label, s in engine.refresh().replicas}
            result = drive(engine, users, per_user, steps)
            after = {label: s.stats.forwards_by_batch_size for label, s in engine.refresh().replicas}
            result["mean_batch"] = mean_batch({
                size: sum(after[label].get(size, 0) - before.get(label, {}).get(size, 0) for label in after)
                for size in {size for counts in after.values() for size in counts}})
            return result

        result = repeated(once, repeats)
        result["start_s"] = ready_s
    return result


# ---------------------------------------------------------------------------- per-event overhead
def histogram(exposition: str, name: str) -> dict:
    """sum, count and cumulative buckets of one unlabelled histogram."""
    buckets, total, count = [], 0.0, 0.0
    for line in exposition.splitlines():
        if line.startswith(f"{name}_bucket{{"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if bound == "+Inf" else float(bound), float(line.rsplit(" ", 1)[1])))
        elif line.startswith(f"{name}_sum "):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith(f"{name}_count "):
            count = float(line.rsplit(" ", 1)[1])
    return {"sum": total, "count": count, "buckets": buckets}


def quantile_bound(hist: dict, q: float) -> float:
    """The upper bound of the bucket the q-quantile falls in."""
    wanted = q * hist["count"]
    return next(bound for bound, seen in hist["buckets"] if seen >= wanted)


def relay_overhead(requests: int, steps: int) -> dict:
    """Toy model (no compute), one replica, against the same engine in this process:
    - latency: steps spaced 20 ms apart, so nothing queues: Ray's transport per progress event
      (the facade's `stepstudio_relay_seconds`), without and with previews;
    - rate: no spacing at all, the progress events per second one replica's streams carry;
    - submit(): the round trip the facade makes before it admits a request."""
    from pipelines.toy import ToyPipeline
    from serve.local import local_replicas

    results = {}
    local = Engine(ToyPipeline(), max_batch_requests=8, limits=ServingLimits(max_steps=1000, max_per_session=64))
    local.start()
    try:
        results["local_submit_ms"] = 1000 * statistics.fmean(_submit_times(local, 50))
    finally:
        local.close()
    for delay in (0.0, 0.02):
        factory = (("pipeline_factory", "pipelines.toy:ToyPipeline"), ("pipeline_kwargs", (("step_delay_s", delay),)))
        with local_replicas(replica_settings("toy", 1, 8, factory=factory)) as engine:
            if delay == 0.0:
                results["replica_submit_ms"] = 1000 * statistics.fmean(_submit_times(engine, 50))
                results["replica_events_per_s"] = _event_rate(engine, requests, steps)
                continue
            for preview_every in (0, 1):
                before = histogram(engine.metrics.exposition().decode(), "stepstudio_relay_seconds")
                handles = [engine.submit(GenerationParams(prompt=f"event {i}", num_inference_steps=steps // 2,
                                                          preview_every=preview_every), session_id=f"relay-{i}")
                           for i in range(requests)]
                for handle in handles:
                    assert isinstance(handle.result(timeout=600), Completed)
                after = histogram(engine.metrics.exposition().decode(), "stepstudio_relay_seconds")
                delta = {"sum": after["sum"] - before["sum"], "count": after["count"] - before["count"],
                         "buckets": [(b, n - m) for (b, n), (_, m) in zip(after["buckets"], before["buckets"])]}
                key = "with_previews" if preview_every else "no_previews"
                results[key] = {"events": int(delta["count"]), "mean_ms": 1000 * delta["sum"] / delta["count"],
                                "p50_le_ms": 1000 * quantile_bound(delta, 0.5),
                                "p95_le_ms": 1000 * quantile_bound(delta, 0.95)}
    results["preview_jpeg_256px_ms"] = _jpeg_round_trip_ms(256)
    return results


def _event_rate(engine, requests: int, steps: int) -> float:
    """Progress events per second the caller receives when the engine produces them as fast as it can."""
    started = time.perf_counter()
    handles = [engine.submit(GenerationParams(prompt=f"rate {i}", num_inference_steps=steps), session_id=f"rate-{i}")
               for i in range(requests)]
    events = sum(1 for handle in handles for event in handle.events(timeout=600) if type(event).__name__ == "Progress")
    return events / (time.perf_counter() - started)


def _jpeg_round_trip_ms(size: int) -> float:
    """Encode + decode of one preview of `size` px, as the replica and the facade do."""
    from PIL import Image

    from serve.wire import decode_image, encode_image

    image = Image.effect_noise((size, size), 64).convert("RGB")
    started = time.perf_counter()
    for _ in range(20):
        decode_image(encode_image(image))
    return 1000 * (time.perf_counter() - started) / 20


def _submit_times(engine, count: int) -> list[float]:
    """Seconds each submit() call takes (sequential; each request is left to finish)."""
    times, handles = [], []
    for i in range(count):
        started = time.perf_counter()
        handles.append(engine.submit(GenerationParams(prompt=f"submit {i}", num_inference_steps=2),
                                     session_id=f"submit-{i % 32}"))
        times.append(time.perf_counter() - started)
        if len(handles) >= 32:
            handles.pop(0).result(timeout=120)
    for handle in handles:
        handle.result(timeout=120)
    return times


# ---------------------------------------------------------------------------- report
def table(results: dict) -> str:
    rows = ["| system | images/min (median; every run) | latency mean / p50 / p95 (s) | mean batch (requests) | "
            "submit (ms) | requests per replica |", "|---|---|---|---|---|---|"]
    for name, r in results.items():
        rows.append(
            f"| {name} | {r['images_per_min']:.0f} ({', '.join(f'{v:.0f}' for v in r['images_per_min_runs'])}) | "
            f"{r['latency_mean_s']:.2f} / {r['latency_p50_s']:.2f} / "
            f"{r['latency_p95_s']:.2f} | {r['mean_batch']:.1f} | {r['submit_mean_ms']:.1f} | "
            f"{', '.join(f'{k}: {v}' for k, v in r['by_replica'].items())} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin")
    parser.add_argument("--systems", nargs="+", default=["local", "replicas1", "replicas2"])
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--requests-per-user", type=int, default=2)
    parser.add_argument("--steps", type=int, default=None, help="denoise steps (default: the model's)")
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="load runs per system (the median one is shown)")
    parser.add_argument("--relay-requests", type=int, default=4)
    parser.add_argument("--relay-steps", type=int, default=200)
    parser.add_argument("--no-relay", action="store_true", help="skip the per-event overhead run")
    parser.add_argument("--json", default=None, help="write every figure here")
    args = parser.parse_args(argv)

    load = {}
    for system in args.systems:
        print(f"running {system} ...", flush=True)
        if system == "local":
            load[system] = run_local(args.model, args.users, args.requests_per_user, args.steps, args.max_batch,
                                     args.repeats)
        elif system.startswith("replicas") and system[8:].isdigit():
            load[system] = run_replicas(args.model, int(system[8:]), args.users, args.requests_per_user, args.steps,
                                        args.max_batch, args.repeats)
        else:
            parser.error(f"unknown system {system!r}: use local or replicasN")
    relay = None if args.no_relay else relay_overhead(args.relay_requests, args.relay_steps)

    print(f"\n{args.users} closed-loop users x {args.requests_per_user} requests, model {args.model}, "
          f"max batch {args.max_batch}, 1 torch thread per engine\n")
    print(table(load))
    if relay is not None:
        print("\nper-event overhead (toy model, 1 replica, steps 20 ms apart):\n")
        print("| | events | mean (ms) | p50 <= (ms) | p95 <= (ms) |\n|---|---|---|---|---|")
        for key in ("no_previews", "with_previews"):
            r = relay[key]
            print(f"| replica -> studio, {key.replace('_', ' ')} | {r['events']} | {r['mean_ms']:.2f} | "
                  f"{r['p50_le_ms']:.1f} | {r['p95_le_ms']:.1f} |")
        print(f"\nprogress events/s one replica's streams carried (engine without compute): "
              f"{relay['replica_events_per_s']:.0f}")
        print(f"submit(): in-process {relay['local_submit_ms']:.2f} ms, through a replica {relay['replica_submit_ms']:.2f} ms")
        print(f"a 256 px preview, JPEG encode + decode: {relay['preview_jpeg_256px_ms']:.2f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg": os.getloadavg()},
            "args": vars(args), "load": load, "relay": relay}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Mixed sizes: requests of several sizes, aspect ratios and prompt lengths, packed into one forward,
against size groups taking turns and against diffusers one request at a time, in one run.

    python benchmarks/mixed_sizes.py                      # built-in model, 8 users, 5 sizes, 2 rounds
    python benchmarks/mixed_sizes.py --requests 24 --rounds 1 --steps 8

Systems (each on the same seeded workload, in this process, one after the other, alternating their
order between rounds):
  packed     step mode, max batch 8: every running request in ONE forward per step, whatever its size
  turns      the same engine with packing off: each size is its own batch key, and the size groups
             take cost-fair turns (stepstudio before packing)
  diffusers  FluxPipeline.__call__, one request at a time
  ceiling    the bare packed denoiser forward over 8 rows drawn from the workload's sizes, with no
             engine around it: the images per second if the engine cost nothing

Also measured:
- a small request's latency beside a large one: a 48x48 request alone, then the same request
  submitted one step after a 128x128 request started (packed and turns);
- pixels: every request's image in `packed` against its image in `turns` (where each size has its
  forward to itself) and in `diffusers` (the stock pipeline), in uint8 levels.

Writes benchmarks/results/mixed_sizes.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.serving_summary import _pct  # noqa: E402
from benchmarks.workload import WorkItem, Workload, make_workload  # noqa: E402

DEFAULT_SIZES = ("64x64", "96x64", "64x96", "128x128", "48x48", "128x72")
SMALL, LARGE = (48, 48), (128, 128)


def parse_size(text: str) -> tuple[int, int]:
    width, _, height = text.lower().partition("x")
    return int(width), int(height or width)


def mixed_prompts(count: int, seed: int) -> list[str]:
    """Prompts of the built-in model's world, naming more or fewer parts (so of different lengths)."""
    from tools.shapes_world_v2 import Named, caption, random_scene

    rng = np.random.default_rng(seed)
    forms = (Named(), Named(size=False, position=False), Named(size=False, background=False, position=False),
             Named(position=False), Named(size=False, color=False))
    return [caption(random_scene(rng, 64, 64), forms[i % len(forms)], phrase_position=bool(i % 2)) for i in range(count)]


def run_closed_loop(system, workload: Workload) -> tuple[list, float]:
    """Each user sends its requests one after the other; returns the records and the wall time."""
    records, lock = [], threading.Lock()

    def user(index: int) -> None:
        for item in (i for i in workload.items if i.user == index):
            ticket = system.submit(item)
            ticket.wait()
            with lock:
                records.append(ticket.record)

    started = time.perf_counter()
    threads = [threading.Thread(target=user, args=(u,)) for u in range(workload.users)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return records, time.perf_counter() - started


def figures(records: list, wall_s: float) -> dict:
    latency = [r.finished - r.submitted for r in records if r.status == "completed"]
    return {"completed": len(latency), "wall_s": wall_s, "images_per_s": len(latency) / wall_s,
            "latency_p50_s": _pct(latency, 0.5), "latency_p95_s": _pct(latency, 0.95)}


def engine_system(pipeline, packs: bool, max_tokens: int | None, keep_images: bool = True):
    from benchmarks.systems import EngineSystem

    return EngineSystem("builtin", mode="step", max_batch=8, preview_every=0, step_cache=0.0, packs=packs,
                        pipeline=pipeline, keep_images=keep_images, max_batch_tokens=max_tokens)


def small_beside_large(pipeline, packs: bool, steps: int, max_tokens: int | None) -> dict:
    """Latency of a 48x48 request alone, and submitted once a 128x128 one has run its first step."""
    system = engine_system(pipeline, packs, max_tokens, keep_images=False)
    small = WorkItem(index=0, user=0, arrival_s=0.0, prompt="a red circle", steps=steps, size=SMALL[0], seed=1,
                     cancel_after_step=None, height=SMALL[1])
    large = WorkItem(index=1, user=1, arrival_s=0.0, prompt="a large blue square", steps=steps, size=LARGE[0], seed=2,
                     cancel_after_step=None, height=LARGE[1])
    try:
        system.submit(small).wait()  # warm-up
        alone = system.submit(small)
        alone.wait()
        big = system.submit(large)
        while big.record.steps_done < 1:
            time.sleep(0.001)
        beside = system.submit(small)
        beside.wait()
        big.wait()
    finally:
        system.close()
    alone_s = alone.record.finished - alone.record.submitted
    beside_s = beside.record.finished - beside.record.submitted
    return {"alone_s": alone_s, "beside_large_s": beside_s, "ratio": beside_s / alone_s}


@torch.no_grad()
def ceiling(pipeline, sizes: list[tuple[int, int]], repeats: int) -> dict:
    """The bare packed forward over 8 rows of these sizes (each with its CFG row): seconds per forward."""
    from engine import Engine, GenerationParams
    from pipelines.interface import Batch, RequestState

    engine = Engine(pipeline)  # for its parameter resolution only; never started
    states = []
    for index in range(8):
        width, height = sizes[index % len(sizes)]
        params = engine.prepare_params(GenerationParams(prompt=f"a red circle {index}", width=width, height=height,
                                                        seed=index, step_cache=0))
        state = RequestState(request_id=str(index), params=params)
        pipeline.prepare_encode(state)
        states.append(state)
    batch = Batch(tuple(states))
    pipeline.denoise_step(batch)
    trials = []
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(repeats):
            pipeline.denoise_step(batch)
        trials.append((time.perf_counter() - started) / repeats)
    return {"forward_s": statistics.median(trials), "rows": len(states)}


def pixel_gap(ours: dict, theirs: dict) -> int | None:
    shared = sorted(set(ours) & set(theirs))
    if not shared:
        return None
    return max(int(np.abs(np.asarray(ours[i], dtype=int) - np.asarray(theirs[i], dtype=int)).max()) for i in shared)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin")
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--sizes", default=",".join(DEFAULT_SIZES), help="comma-separated WIDTHxHEIGHT")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="the engine's token budget per forward (default: the engine's, 8 requests of the model's default size)")
    parser.add_argument("--diffusers-requests", type=int, default=16,
                        help="requests diffusers serves per round (it is slow; the first N of the workload)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--ceiling-repeats", type=int, default=10, help="bare forwards per timing of the ceiling (3 timings)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "mixed_sizes.json")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from benchmarks.systems import DiffusersSystem
    from pipelines.loader import load_pipeline

    sizes = [parse_size(text) for text in args.sizes.split(",")]
    workload = make_workload("closed", args.requests, args.users, 1.0, (args.steps,), tuple(sizes), 0.0, args.seed,
                             prompts=mixed_prompts(args.requests, args.seed))
    short = Workload(workload.kind, min(args.users, args.diffusers_requests), 1.0,
                     tuple(WorkItem(**{**item.__dict__, "user": item.index % min(args.users, args.diffusers_requests)})
                           for item in workload.items[: args.diffusers_requests]))
    pipeline = load_pipeline(args.model)
    if not getattr(pipeline, "packs", False):
        raise SystemExit(f"{args.model} does not pack rows of different sizes: nothing to compare.")
    rounds: list[dict] = []
    images: dict[str, dict] = {}
    for round_index in range(args.rounds):
        order = ["packed", "turns", "diffusers"] if round_index % 2 == 0 else ["diffusers", "turns", "packed"]
        this_round = {}
        for name in order:
            if name == "diffusers":
                system = DiffusersSystem(args.model, preview_every=0, keep_images=True)
                records, wall = run_closed_loop(system, short)
            else:
                system = engine_system(pipeline, packs=name == "packed", max_tokens=args.max_tokens)
                records, wall = run_closed_loop(system, workload)
            system.close()
            this_round[name] = figures(records, wall)
            if name != "diffusers":
                this_round[name]["mean_requests_per_forward"] = _mean_batch(system)
            images[name] = system.images
            pipeline.packs = True  # EngineSystem(packs=False) turned it off
            print(f"round {round_index + 1} {name}: {this_round[name]['images_per_s']:.2f} images/s", flush=True)
        rounds.append(this_round)
    forward = ceiling(pipeline, sizes, repeats=args.ceiling_repeats)
    probe = {name: small_beside_large(pipeline, packs=name == "packed", steps=args.steps, max_tokens=args.max_tokens)
             for name in ("packed", "turns")}
    pipeline.packs = True

    def median(name: str, key: str) -> float:
        return statistics.median(r[name][key] for r in rounds)

    summary = {
        name: {key: median(name, key) for key in rounds[0][name] if rounds[0][name][key] is not None}
        for name in ("packed", "turns", "diffusers")
    }
    ceiling_images_per_s = forward["rows"] / (forward["forward_s"] * args.steps)
    result = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "sizes": [f"{w}x{h}" for w, h in sizes], "torch_threads": torch.get_num_threads(),
        "rounds": rounds, "summary": summary, "ceiling": {**forward, "images_per_s": ceiling_images_per_s},
        "small_beside_large": probe,
        "pixels": {"packed_vs_turns_max_levels": pixel_gap(images["packed"], images["turns"]),
                   "packed_vs_diffusers_max_levels": pixel_gap(images["packed"], images["diffusers"])},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(report(result))
    return result


def _mean_batch(system) -> float | None:
    sizes = system.batch_sizes()
    forwards = sum(sizes.values())
    return sum(b * n for b, n in sizes.items()) / forwards if forwards else None


def report(result: dict) -> str:
    summary, packed = result["summary"], result["summary"]["packed"]["images_per_s"]
    lines = ["| system | images/s | x turns | x packed | latency p50 | latency p95 | requests per forward |",
             "|---|---|---|---|---|---|---|"]
    turns = summary["turns"]["images_per_s"]
    for name in ("packed", "turns", "diffusers"):
        row = summary[name]
        lines.append(f"| {name} | {row['images_per_s']:.2f} | {row['images_per_s'] / turns:.2f} | "
                     f"{row['images_per_s'] / packed:.2f} | {row['latency_p50_s']:.2f} s | {row['latency_p95_s']:.2f} s | "
                     f"{row.get('mean_requests_per_forward', 1.0):.1f} |")
    ceiling = result["ceiling"]["images_per_s"]
    lines.append(f"| ceiling (bare packed forward) | {ceiling:.2f} | {ceiling / turns:.2f} | {ceiling / packed:.2f} | | | 8 |")
    probe = result["small_beside_large"]
    lines.append("")
    lines.append("| a 48x48 request | alone | beside a 128x128 one | ratio |")
    lines.append("|---|---|---|---|")
    for name in ("packed", "turns"):
        p = probe[name]
        lines.append(f"| {name} | {p['alone_s']:.2f} s | {p['beside_large_s']:.2f} s | {p['ratio']:.2f} |")
    pixels = result["pixels"]
    lines.append("")
    lines.append(f"pixels: packed against turns differ by at most {pixels['packed_vs_turns_max_levels']} levels, "
                 f"against diffusers by at most {pixels['packed_vs_diffusers_max_levels']} (uint8)")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

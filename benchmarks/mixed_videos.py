"""Mixed videos: clips of two sizes and lengths (the built-in video model v2's 64x64 x 9 frames and
96x64 x 13 frames) packed into one forward, against the two canvases taking turns, in one run.

    python benchmarks/mixed_videos.py                     # 8 users, 32 clips, 20 steps, 2 rounds
    python benchmarks/mixed_videos.py --requests 16 --rounds 1 --steps 8

Systems (the same seeded workload, in this process, alternating their order between rounds):
  packed   step mode, max batch 8: every running clip in ONE forward per step, whatever its canvas
  turns    the same engine with packing off: each canvas is its own batch key, the groups take
           cost-fair turns

Also: every clip's first frame in `packed` against the same clip's in `turns` (uint8 levels).
Writes benchmarks/results/mixed_videos.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.mixed_sizes import _mean_batch, engine_system, figures, pixel_gap, run_closed_loop  # noqa: E402
from benchmarks.workload import WorkItem, Workload, moving_shape_prompts  # noqa: E402
from tools.evaluate_video import parse_canvas  # noqa: E402
from tools.moving_shapes_world import V2_CANVASES, Canvas  # noqa: E402


def video_workload(canvases: list[Canvas], requests: int, users: int, steps: int, seed: int) -> Workload:
    """Held-out moving-shape prompts, the canvases taking turns request by request."""
    prompts = moving_shape_prompts(requests, seed)
    items = tuple(
        WorkItem(index=i, user=i % users, arrival_s=0.0, prompt=prompts[i], steps=steps, size=canvas.width,
                 seed=seed + i, cancel_after_step=None, frames=canvas.frames, height=canvas.height)
        for i, canvas in enumerate(canvases[i % len(canvases)] for i in range(requests))
    )
    return Workload("closed", users, 1.0, items)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin-video-v2")
    parser.add_argument("--canvases", default=",".join(canvas.name for canvas in V2_CANVASES),
                        help="comma-separated WIDTHxHEIGHTxFRAMES")
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "mixed_videos.json")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from pipelines.loader import load_pipeline

    canvases = [parse_canvas(text) for text in args.canvases.split(",")]
    workload = video_workload(canvases, args.requests, args.users, args.steps, args.seed)
    pipeline = load_pipeline(args.model)
    if not getattr(pipeline, "packs", False):
        raise SystemExit(f"{args.model} does not pack rows of different sizes: nothing to compare.")
    rounds, clips = [], {}
    for round_index in range(args.rounds):
        this_round = {}
        for name in (("packed", "turns") if round_index % 2 == 0 else ("turns", "packed")):
            system = engine_system(pipeline, packs=name == "packed", max_tokens=None)
            records, wall = run_closed_loop(system, workload)
            system.close()
            pipeline.packs = True  # EngineSystem(packs=False) turned it off
            this_round[name] = {**figures(records, wall), "mean_requests_per_forward": _mean_batch(system)}
            clips[name] = system.images
            print(f"round {round_index + 1} {name}: {this_round[name]['images_per_s']:.2f} clips/s", flush=True)
        rounds.append(this_round)
    summary = {name: {key: statistics.median(r[name][key] for r in rounds) for key in rounds[0][name]}
               for name in ("packed", "turns")}
    result = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "torch_threads": torch.get_num_threads(), "rounds": rounds, "summary": summary,
              "packed_vs_turns_max_levels": pixel_gap(clips["packed"], clips["turns"])}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(report(result))
    return result


def report(result: dict) -> str:
    summary = result["summary"]
    turns = summary["turns"]["images_per_s"]
    lines = ["| system | clips/s | x turns | latency p50 | latency p95 | requests per forward |", "|---|---|---|---|---|---|"]
    for name in ("packed", "turns"):
        row = summary[name]
        lines.append(f"| {name} | {row['images_per_s']:.2f} | {row['images_per_s'] / turns:.2f} | "
                     f"{row['latency_p50_s']:.2f} s | {row['latency_p95_s']:.2f} s | {row['mean_requests_per_forward']:.1f} |")
    lines.append("")
    lines.append(f"first frames: packed against turns differ by at most {result['packed_vs_turns_max_levels']} levels (uint8)")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

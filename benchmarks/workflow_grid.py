"""X/Y plot benchmark: a guidance x steps grid as ONE workflow run vs the same images one by one,
and (with --two-stage) a two-stage workflow, txt2img then img2img of each image, chained vs stage by stage.

    python benchmarks/workflow_grid.py                       # built-in model, 4x4 grid, 3 rounds
    python benchmarks/workflow_grid.py --guidance 1 3 --steps 5 10 --rounds 1
    python benchmarks/workflow_grid.py --two-stage           # the grid, then the two-stage systems too
    python benchmarks/workflow_grid.py --systems chained stages-one-after-the-other   # two stages only

Grid systems (all end to end, on the same prompt and seed):
- `workflow`: the studio (`python app.py` in its own process, on a free port) running the grid
  as one workflow through gradio_client's `/run_workflow`: its branches are engine requests
  that share forwards.
- `studio-one-by-one`: the same studio, the same images through `/generate`, each waiting for
  the previous one: how the X/Y plots of other UIs run their cells.
- `diffusers-one-by-one`: the stock `FluxPipeline.__call__` per image, one after another (no
  server): a plain script's X/Y loop. Its "first preview" is the end of its first step (the
  earliest moment a preview could exist).

Two-stage systems (the same studio process; stage 1 is a steps sweep, one txt2img cell per
`--stage1-steps` value; stage 2 redraws each stage-1 image at `--strength` with `--stage2-prompt`):
- `chained`: ONE workflow run, stage 1's Sampler images linked into stage 2's Sampler. Each
  stage-2 branch is submitted as soon as its own stage-1 cell finishes, so the stage 2 of a
  few-step cell shares forwards with stage 1 of the many-step cells.
- `stages-one-after-the-other`: a run of stage 1 alone, then, once ALL of it finished, a run of
  stage 2 alone: one Load image node (the PNG data URL `/run_workflow` returned) and one Sampler
  per stage-1 image. How a UI without chained stages does it.

Reported per system (median round): wall time, speed-up, time from the start to each cell's
first preview and to each cell's image (two stages: per stage), and the mean batch (the
`batch_size` of running branches in the streamed status). Writes
benchmarks/results/workflow_grid.json: the grid under "summaries", two stages under "two_stage".
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SYSTEMS = ("workflow", "studio-one-by-one", "diffusers-one-by-one")
TWO_STAGE_SYSTEMS = ("chained", "stages-one-after-the-other")
PROMPT = "a large green circle on an orange background, right"
STAGE2_PROMPT = "a large blue circle on an orange background, right"


def link(source: str, source_port: str, target: str, target_port: str) -> dict:
    return {"from": {"node": source, "port": source_port}, "to": {"node": target, "port": target_port}}


def grid_workflow(prompt: str, seed: int, guidance: list[float], steps: list[int]) -> dict:
    return {
        "version": 1,
        "nodes": [
            {"id": "p", "type": "prompt", "values": {"text": prompt}},
            {"id": "d", "type": "seed", "values": {"seed": seed}},
            {"id": "g", "type": "sweep", "values": {"param": "guidance", "values": ", ".join(f"{g:g}" for g in guidance)}},
            {"id": "t", "type": "sweep", "values": {"param": "steps", "values": ", ".join(str(s) for s in steps)}},
            {"id": "s", "type": "sampler"},
            {"id": "grid", "type": "grid", "values": {"x": "guidance", "y": "steps"}},
        ],
        "links": [link("p", "prompt", "s", "prompt"), link("d", "seed", "s", "seed"),
                  link("g", "values", "s", "guidance"), link("t", "values", "s", "steps"),
                  link("s", "images", "grid", "images")],
    }


def cells(guidance: list[float], steps: list[int]) -> list[tuple[float, int]]:
    """The grid's cells in the workflow's branch order (steps is the sampler's earlier input)."""
    return [(g, s) for s, g in itertools.product(steps, guidance)]


# ---------------------------------------------------------------------------- two-stage workflows
@dataclass(frozen=True)
class TwoStages:
    """Stage 1: one txt2img cell per value of `stage1_steps`; stage 2: img2img of each stage-1 image."""

    prompt: str
    seed: int
    stage1_steps: list[int]
    stage2_prompt: str
    strength: float
    stage2_steps: int


def seed_node(plan: TwoStages) -> dict:
    return {"id": "d", "type": "seed", "values": {"seed": plan.seed}}


def stage1_part(plan: TwoStages) -> tuple[list[dict], list[dict]]:
    """Nodes and links of stage 1: a steps sweep into Sampler `s1` (the seed node `d` serves both stages)."""
    nodes = [{"id": "p", "type": "prompt", "values": {"text": plan.prompt}}, seed_node(plan),
             {"id": "t", "type": "sweep", "values": {"param": "steps", "values": ", ".join(map(str, plan.stage1_steps))}},
             {"id": "s1", "type": "sampler"}]
    links = [link("p", "prompt", "s1", "prompt"), link("d", "seed", "s1", "seed"), link("t", "values", "s1", "steps")]
    return nodes, links


def stage2_settings(plan: TwoStages) -> list[dict]:
    """Stage 2's value nodes (but the seed node), shared by every stage-2 Sampler."""
    return [{"id": "p2", "type": "prompt", "values": {"text": plan.stage2_prompt}},
            {"id": "k", "type": "strength", "values": {"strength": plan.strength}},
            {"id": "n2", "type": "steps", "values": {"steps": plan.stage2_steps}}]


def stage2_sampler_links(sampler: str, image_source: tuple[str, str]) -> list[dict]:
    return [link(*image_source, sampler, "image"), link("p2", "prompt", sampler, "prompt"),
            link("d", "seed", sampler, "seed"), link("k", "strength", sampler, "strength"),
            link("n2", "steps", sampler, "steps")]


def chained_workflow(plan: TwoStages) -> dict:
    """Both stages in one run: `s1`'s images feed `s2`, one stage-2 branch per stage-1 cell."""
    nodes, links = stage1_part(plan)
    nodes += stage2_settings(plan) + [{"id": "s2", "type": "sampler"}]
    links += stage2_sampler_links("s2", ("s1", "images"))
    return {"version": 1, "nodes": nodes, "links": links}


def stage1_workflow(plan: TwoStages) -> dict:
    nodes, links = stage1_part(plan)
    return {"version": 1, "nodes": nodes, "links": links}


def stage2_workflow(plan: TwoStages, pictures: list[str]) -> dict:
    """Stage 2 alone: a Load image (a data URL) and a Sampler `s2-<cell>` per stage-1 image,
    since a Sampler input takes one link."""
    nodes, links = [seed_node(plan), *stage2_settings(plan)], []
    for cell, picture in enumerate(pictures):
        nodes += [{"id": f"li-{cell}", "type": "load_image", "values": {"image": picture}},
                  {"id": f"s2-{cell}", "type": "sampler"}]
        links += stage2_sampler_links(f"s2-{cell}", (f"li-{cell}", "image"))
    return {"version": 1, "nodes": nodes, "links": links}


# ---------------------------------------------------------------------------- systems
@dataclass
class RunTimes:
    """What one /run_workflow call showed, per branch index: when it was first seen running, first
    had a preview and had completed (s since the system's start), and every running batch size."""

    running: dict[int, float] = field(default_factory=dict)
    first_preview: dict[int, float] = field(default_factory=dict)
    done: dict[int, float] = field(default_factory=dict)
    batch_sizes: list[int] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def follow_run(client, workflow: dict, start: float) -> tuple[dict, RunTimes]:
    """Run `workflow` to its end; returns its final status (every branch's `image` a PNG data URL)."""
    job = client.submit(workflow=workflow, api_name="/run_workflow")
    times = RunTimes()
    for update in job:
        if isinstance(update[0], Exception):  # an update gradio_client could not fetch (docs/workflows.md: From Python)
            times.skipped.append(repr(update[0]))
            continue
        now = time.perf_counter() - start
        for branch in update[0]["branches"]:
            index = branch["index"]
            if branch["state"] == "running" or branch["step"]:
                times.running.setdefault(index, now)
            if branch["preview"]:
                times.first_preview.setdefault(index, now)
            if branch["state"] == "completed":
                times.done.setdefault(index, now)
            if branch["state"] == "running" and branch["batch_size"]:
                times.batch_sizes.append(branch["batch_size"])
    status = job.result()[0]
    assert status["state"] == "completed", status["state"]
    return status, times


def mean_batch(*runs: RunTimes) -> float | None:
    sizes = [size for run in runs for size in run.batch_sizes]
    return statistics.fmean(sizes) if sizes else None


def run_workflow(client, workflow: dict) -> dict:
    start = time.perf_counter()
    status, times = follow_run(client, workflow, start)
    wall = time.perf_counter() - start
    return {"wall_s": wall, "first_preview_s": [times.first_preview.get(i) for i in range(status["total"])],
            "image_s": [times.done.get(i, wall) for i in range(status["total"])],
            "mean_batch": mean_batch(times), "skipped_updates": times.skipped}


def stage_times(status: dict, times: RunTimes, cell_of: dict[int, int], wall: float) -> dict:
    """Per-cell timings of the branches in `cell_of` (branch index -> stage-1 cell), in cell order."""
    by_cell = sorted(cell_of.items(), key=lambda item: item[1])
    assert all(status["branches"][i]["state"] == "completed" for i in cell_of)
    return {"running_s": [times.running.get(i) for i, _ in by_cell],
            "first_preview_s": [times.first_preview.get(i) for i, _ in by_cell],
            "image_s": [times.done.get(i, wall) for i, _ in by_cell]}


def stage1_cells(status: dict) -> dict[int, int]:
    """Stage-1 branch index -> its cell (its place in the steps sweep)."""
    indexes = [b["index"] for b in status["branches"] if b["sampler"] == "s1"]
    return {index: cell for cell, index in enumerate(sorted(indexes))}


def run_chained(client, plan: TwoStages) -> dict:
    start = time.perf_counter()
    status, times = follow_run(client, chained_workflow(plan), start)
    wall = time.perf_counter() - start
    stage1 = stage1_cells(status)
    # A stage-2 branch names its `parent`: the stage-1 branch whose image it starts from.
    stage2 = {b["index"]: stage1[b["parent"]] for b in status["branches"] if b["sampler"] == "s2"}
    return {"wall_s": wall, "stage1": stage_times(status, times, stage1, wall),
            "stage2": stage_times(status, times, stage2, wall),
            "mean_batch": mean_batch(times), "skipped_updates": times.skipped}


def run_stages_one_after_the_other(client, plan: TwoStages) -> dict:
    start = time.perf_counter()
    first_status, first_times = follow_run(client, stage1_workflow(plan), start)
    stage1 = stage1_cells(first_status)
    stage1_done = time.perf_counter() - start
    pictures = [first_status["branches"][index]["image"] for index in sorted(stage1, key=stage1.get)]
    second_status, second_times = follow_run(client, stage2_workflow(plan, pictures), start)
    wall = time.perf_counter() - start
    # Stage 2's sampler `s2-<cell>` says which stage-1 image its branch starts from.
    stage2 = {b["index"]: int(b["sampler"].removeprefix("s2-")) for b in second_status["branches"]}
    return {"wall_s": wall, "stage1": stage_times(first_status, first_times, stage1, stage1_done),
            "stage2": stage_times(second_status, second_times, stage2, wall),
            "mean_batch": mean_batch(first_times, second_times),
            "skipped_updates": first_times.skipped + second_times.skipped}


def run_studio_one_by_one(client, prompt: str, seed: int, grid: list[tuple[float, int]], size: int) -> dict:
    start = time.perf_counter()
    first_preview, done = [], []
    for guidance, steps in grid:
        job = client.submit(prompt=prompt, negative_prompt="", width=size, height=size, steps=steps,
                            guidance_scale=guidance, seed=seed, api_name="/generate")
        preview_at = None
        for update in job:
            if isinstance(update[0], Exception):  # as in run_workflow
                continue
            preview = update[1]
            if preview is not None and preview_at is None:
                preview_at = time.perf_counter() - start
        status = job.result()[0]
        assert status["state"] == "completed", status
        first_preview.append(preview_at)
        done.append(time.perf_counter() - start)
    return {"wall_s": time.perf_counter() - start, "first_preview_s": first_preview, "image_s": done,
            "mean_batch": 1.0}


def run_diffusers_one_by_one(pipe, prompt: str, seed: int, grid: list[tuple[float, int]], size: int,
                             negative_prompt: str, max_sequence_length: int) -> dict:
    import torch

    start = time.perf_counter()
    first_step, done = [], []
    for guidance, steps in grid:
        seen: list[float] = []

        def on_step(pipeline, step, timestep, tensors):
            if not seen:
                seen.append(time.perf_counter() - start)
            return tensors

        pipe(prompt, negative_prompt=negative_prompt, true_cfg_scale=guidance, height=size, width=size,
             num_inference_steps=steps, max_sequence_length=max_sequence_length,
             generator=torch.Generator().manual_seed(seed), callback_on_step_end=on_step)
        first_step.append(seen[0])
        done.append(time.perf_counter() - start)
    return {"wall_s": time.perf_counter() - start, "first_preview_s": first_step, "image_s": done,
            "mean_batch": 1.0}


# ---------------------------------------------------------------------------- main
@contextlib.contextmanager
def studio_process(folder: Path, max_branches: int, max_steps: int, threads: int):
    """`python app.py` on a free port in its own process (as users run it); yields its URL."""
    import socket

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    command = [sys.executable, str(ROOT / "app.py"), "--model", str(folder), "--port", str(port),
               "--max-branches", str(max_branches), "--max-steps", str(max_steps), "--no-save"]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/"
    try:
        # Only a start that hangs reaches this: a loaded machine has taken minutes to import and load.
        deadline = time.monotonic() + 600
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the studio exited: {process.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(url + "healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the studio did not start within 600 s")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(30)


def median_round(records: list[dict]) -> dict:
    return sorted(records, key=lambda r: r["wall_s"])[len(records) // 2]


def summary(records: list[dict]) -> dict:
    """The median-wall round, with its cell timings summarised."""
    chosen = median_round(records)
    previews = [t for t in chosen["first_preview_s"] if t is not None]
    return {
        "wall_s": chosen["wall_s"],
        "wall_rounds_s": [r["wall_s"] for r in records],
        "first_preview_max_s": max(previews) if previews else None,
        "first_preview_median_s": statistics.median(previews) if previews else None,
        "first_image_s": min(chosen["image_s"]),
        "last_image_s": max(chosen["image_s"]),
        "mean_batch": chosen["mean_batch"],
        "round": chosen,
    }


def stage_summary(stage: dict) -> dict:
    previews = [t for t in stage["first_preview_s"] if t is not None]
    return {"first_preview_s": min(previews) if previews else None,
            "first_image_s": min(stage["image_s"]), "last_image_s": max(stage["image_s"])}


def two_stage_summary(records: list[dict]) -> dict:
    """The median-wall round, each stage's first preview and first/last image."""
    chosen = median_round(records)
    return {"wall_s": chosen["wall_s"], "wall_rounds_s": [r["wall_s"] for r in records],
            "stage1": stage_summary(chosen["stage1"]), "stage2": stage_summary(chosen["stage2"]),
            "mean_batch": chosen["mean_batch"], "round": chosen}


def with_speedups(summaries: dict[str, dict], base: str = "stages-one-after-the-other") -> dict[str, dict]:
    """Each two-stage summary with its speed-up over stage by stage (its wall time / this one's)."""
    for s in summaries.values():
        s["x_one_after_the_other"] = summaries[base]["wall_s"] / s["wall_s"] if base in summaries else None
    return summaries


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin", help="'builtin', or a diffusers FLUX folder")
    parser.add_argument("--guidance", type=float, nargs="+", default=[1.0, 2.0, 3.0, 4.0])
    parser.add_argument("--steps", type=int, nargs="+", default=[10, 15, 20, 25])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS + TWO_STAGE_SYSTEMS)
    parser.add_argument("--two-stage", action="store_true", help="run the two-stage systems too")
    parser.add_argument("--stage1-steps", type=int, nargs="+", default=[6, 12, 18, 24],
                        help="two stages: one stage-1 cell per value (txt2img, --prompt, the model's guidance)")
    parser.add_argument("--stage2-steps", type=int, default=20,
                        help="two stages: stage 2's steps (of which steps x strength run)")
    parser.add_argument("--strength", type=float, default=0.6, help="two stages: stage 2's strength")
    parser.add_argument("--stage2-prompt", default=STAGE2_PROMPT)
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "workflow_grid.json")
    args = parser.parse_args(argv)
    if args.two_stage:
        args.systems += [name for name in TWO_STAGE_SYSTEMS if name not in args.systems]
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)

    import torch
    from diffusers import FluxPipeline
    from gradio_client import Client

    from pipelines.loader import BUILTIN_MODEL_DIR
    from pipelines.studio_config import read_studio_config

    torch.set_num_threads(args.threads)
    folder = BUILTIN_MODEL_DIR if args.model == "builtin" else Path(args.model)
    studio_config = read_studio_config(folder)
    size = studio_config.width or 64
    grid = cells(args.guidance, args.steps)
    plan = TwoStages(args.prompt, args.seed, args.stage1_steps, args.stage2_prompt, args.strength, args.stage2_steps)
    two_stage_systems = [name for name in args.systems if name in TWO_STAGE_SYSTEMS]
    stock = None
    if "diffusers-one-by-one" in args.systems:
        stock = FluxPipeline.from_pretrained(folder, use_safetensors=True)
        stock.set_progress_bar_config(disable=True)
    max_sequence_length = studio_config.max_sequence_length or 512
    records: dict[str, list[dict]] = {name: [] for name in args.systems}
    max_branches = max(64, len(grid), 2 * len(args.stage1_steps))
    max_steps = max(100, *args.steps, *args.stage1_steps, args.stage2_steps)
    with studio_process(folder, max_branches=max_branches, max_steps=max_steps, threads=args.threads) as url:
        client = Client(url, verbose=False)
        runners = {
            "workflow": lambda: run_workflow(client, grid_workflow(args.prompt, args.seed, args.guidance, args.steps)),
            "studio-one-by-one": lambda: run_studio_one_by_one(client, args.prompt, args.seed, grid, size),
            "diffusers-one-by-one": lambda: run_diffusers_one_by_one(
                stock, args.prompt, args.seed, grid, size, studio_config.negative_prompt or "", max_sequence_length),
            "chained": lambda: run_chained(client, plan),
            "stages-one-after-the-other": lambda: run_stages_one_after_the_other(client, plan),
        }
        # Warm-ups: first-call costs (image-to-image's too) stay out of the rounds.
        if "workflow" in args.systems:
            runners["workflow"]()
        if two_stage_systems:
            runners["chained"]()
        for round_index in range(args.rounds):
            shift = round_index % len(args.systems)
            for name in args.systems[shift:] + args.systems[:shift]:
                records[name].append(runners[name]())
                print(f"round {round_index + 1}: {name} {records[name][-1]['wall_s']:.2f} s", flush=True)

    result = {
        "setup": {"model": str(folder), "guidance": args.guidance, "steps": args.steps, "cells": len(grid),
                  "seed": args.seed, "prompt": args.prompt, "rounds": args.rounds, "threads": args.threads,
                  "machine": f"{platform.machine()}, {platform.python_version()}"},
        "summaries": {name: summary(rs) for name, rs in records.items() if name in SYSTEMS},
    }
    if two_stage_systems:
        result["two_stage"] = {
            "setup": {"stage1_steps": args.stage1_steps, "cells": len(args.stage1_steps), "prompt": args.prompt,
                      "stage2_prompt": args.stage2_prompt, "strength": args.strength,
                      "stage2_steps": args.stage2_steps},
            "summaries": with_speedups({name: two_stage_summary(records[name]) for name in two_stage_systems}),
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(markdown(result))
    return result


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def markdown(result: dict) -> str:
    lines = grid_markdown(result) if result["summaries"] else []
    if "two_stage" in result:
        lines += ([""] if lines else []) + two_stage_markdown(result["two_stage"], result["setup"])
    return "\n".join(lines)


def grid_markdown(result: dict) -> list[str]:
    setup, summaries = result["setup"], result["summaries"]
    lines = [f"X/Y grid: guidance {setup['guidance']} x steps {setup['steps']} ({setup['cells']} images), "
             f"seed {setup['seed']}, {setup['rounds']} rounds (median round shown), {setup['machine']}", "",
             "| system | wall s | x one-by-one (studio) | x one-by-one (diffusers) | first preview, median / last cell s "
             "| first image s | last image s | mean batch |",
             "|---|---|---|---|---|---|---|---|"]
    base = {name: summaries[name]["wall_s"] for name in ("studio-one-by-one", "diffusers-one-by-one") if name in summaries}
    for name, s in summaries.items():
        ratio = lambda other: f"{base[other] / s['wall_s']:.2f}" if other in base else "-"  # noqa: E731
        preview = (f"{s['first_preview_median_s']:.2f} / {s['first_preview_max_s']:.2f}"
                   if s["first_preview_max_s"] is not None else "-")
        batch = f"{s['mean_batch']:.1f}" if s["mean_batch"] else "-"
        lines.append(f"| {name} | {s['wall_s']:.2f} | {ratio('studio-one-by-one')} | {ratio('diffusers-one-by-one')} "
                     f"| {preview} | {s['first_image_s']:.2f} | {s['last_image_s']:.2f} | {batch} |")
    lines.append("")
    lines.append("Wall time of every round, s: " + "; ".join(
        f"{name} " + ", ".join(f"{w:.2f}" for w in s["wall_rounds_s"]) for name, s in summaries.items()))
    return lines


def two_stage_markdown(two_stage: dict, grid_setup: dict) -> list[str]:
    setup, summaries = two_stage["setup"], two_stage["summaries"]
    lines = [f"Two stages: txt2img at steps {setup['stage1_steps']} ({setup['cells']} images), then img2img of each "
             f"at strength {setup['strength']:g} of {setup['stage2_steps']} steps ({setup['stage2_prompt']!r}), "
             f"seed {grid_setup['seed']}, {grid_setup['rounds']} rounds (median round shown)", "",
             "| system | wall s | x one-after-the-other | first preview, stage 1 / stage 2 s "
             "| stage-1 images, first / last s | stage-2 images, first / last s | mean batch |",
             "|---|---|---|---|---|---|---|"]
    for name, s in summaries.items():
        one, two = s["stage1"], s["stage2"]
        batch = f"{s['mean_batch']:.1f}" if s["mean_batch"] else "-"
        lines.append(f"| {name} | {s['wall_s']:.2f} | {seconds(s['x_one_after_the_other'])} "
                     f"| {seconds(one['first_preview_s'])} / {seconds(two['first_preview_s'])} "
                     f"| {one['first_image_s']:.2f} / {one['last_image_s']:.2f} "
                     f"| {two['first_image_s']:.2f} / {two['last_image_s']:.2f} | {batch} |")
    lines.append("")
    lines.append("Each cell's stage-1 / stage-2 image, s: " + "; ".join(
        f"{name} " + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in zip(s["round"]["stage1"]["image_s"],
                                                                  s["round"]["stage2"]["image_s"]))
        for name, s in summaries.items()))
    lines.append("Wall time of every round, s: " + "; ".join(
        f"{name} " + ", ".join(f"{w:.2f}" for w in s["wall_rounds_s"]) for name, s in summaries.items()))
    return lines


if __name__ == "__main__":
    main()

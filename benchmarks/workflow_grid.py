"""X/Y plot benchmark: a guidance x steps grid as ONE workflow run vs the same images one by one.

    python benchmarks/workflow_grid.py                       # built-in model, 4x4 grid, 3 rounds
    python benchmarks/workflow_grid.py --guidance 1 3 --steps 5 10 --rounds 1

Systems (all end to end, on the same prompt and seed):
- `workflow`: the studio (`python app.py` in its own process, on a free port) running the grid
  as one workflow through gradio_client's `/run_workflow`: its branches are engine requests
  that share forwards.
- `studio-one-by-one`: the same studio, the same images through `/generate`, each waiting for
  the previous one: how the X/Y plots of other UIs run their cells.
- `diffusers-one-by-one`: the stock `FluxPipeline.__call__` per image, one after another (no
  server): a plain script's X/Y loop. Its "first preview" is the end of its first step (the
  earliest moment a preview could exist).

Reported per system (median round): wall time, speed-up, time from the start to each cell's
first preview and to each cell's image. Writes benchmarks/results/workflow_grid.json.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SYSTEMS = ("workflow", "studio-one-by-one", "diffusers-one-by-one")
PROMPT = "a large green circle on an orange background, right"


def grid_workflow(prompt: str, seed: int, guidance: list[float], steps: list[int]) -> dict:
    link = lambda a, ap, b, bp: {"from": {"node": a, "port": ap}, "to": {"node": b, "port": bp}}  # noqa: E731
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


# ---------------------------------------------------------------------------- systems
def run_workflow(client, workflow: dict) -> dict:
    start = time.perf_counter()
    job = client.submit(workflow=workflow, api_name="/run_workflow")
    first_preview: dict[int, float] = {}
    done: dict[int, float] = {}
    batch_sizes = []
    skipped: list[str] = []
    for update in job:
        if isinstance(update[0], Exception):  # an update gradio_client could not fetch (docs/workflows.md: From Python)
            skipped.append(repr(update[0]))
            continue
        status = update[0]
        now = time.perf_counter() - start
        for branch in status["branches"]:
            if branch["preview"] and branch["index"] not in first_preview:
                first_preview[branch["index"]] = now
            if branch["state"] == "completed" and branch["index"] not in done:
                done[branch["index"]] = now
            if branch["state"] == "running" and branch["batch_size"]:
                batch_sizes.append(branch["batch_size"])
    status = job.result()[0]
    wall = time.perf_counter() - start
    assert status["state"] == "completed", status["state"]
    return {"wall_s": wall, "first_preview_s": [first_preview.get(i) for i in range(status["total"])],
            "image_s": [done.get(i, wall) for i in range(status["total"])],
            "mean_batch": statistics.fmean(batch_sizes) if batch_sizes else None, "skipped_updates": skipped}


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
               "--max-branches", str(max_branches), "--max-steps", str(max_steps)]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the studio exited: {process.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(url + "healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the studio did not start within 120 s")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(30)


def summary(records: list[dict]) -> dict:
    """The median-wall round, with its cell timings summarised."""
    chosen = sorted(records, key=lambda r: r["wall_s"])[len(records) // 2]
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


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin", help="'builtin', or a diffusers FLUX folder")
    parser.add_argument("--guidance", type=float, nargs="+", default=[1.0, 2.0, 3.0, 4.0])
    parser.add_argument("--steps", type=int, nargs="+", default=[10, 15, 20, 25])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "workflow_grid.json")
    args = parser.parse_args(argv)

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
    stock = FluxPipeline.from_pretrained(folder, use_safetensors=True)
    stock.set_progress_bar_config(disable=True)
    max_sequence_length = studio_config.max_sequence_length or 512
    records: dict[str, list[dict]] = {name: [] for name in args.systems}
    with studio_process(folder, max_branches=max(64, len(grid)), max_steps=max(100, *args.steps),
                        threads=args.threads) as url:
        client = Client(url, verbose=False)
        runners = {
            "workflow": lambda: run_workflow(client, grid_workflow(args.prompt, args.seed, args.guidance, args.steps)),
            "studio-one-by-one": lambda: run_studio_one_by_one(client, args.prompt, args.seed, grid, size),
            "diffusers-one-by-one": lambda: run_diffusers_one_by_one(
                stock, args.prompt, args.seed, grid, size, studio_config.negative_prompt or "", max_sequence_length),
        }
        if "workflow" in args.systems:
            runners["workflow"]()  # warm-up: first-call costs stay out of the rounds
        for round_index in range(args.rounds):
            shift = round_index % len(args.systems)
            for name in args.systems[shift:] + args.systems[:shift]:
                records[name].append(runners[name]())
                print(f"round {round_index + 1}: {name} {records[name][-1]['wall_s']:.2f} s", flush=True)

    summaries = {name: summary(rs) for name, rs in records.items()}
    result = {
        "setup": {"model": str(folder), "guidance": args.guidance, "steps": args.steps, "cells": len(grid),
                  "seed": args.seed, "prompt": args.prompt, "rounds": args.rounds, "threads": args.threads,
                  "machine": f"{platform.machine()}, {platform.python_version()}"},
        "summaries": summaries,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(markdown(result))
    return result


def markdown(result: dict) -> str:
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
    return "\n".join(lines)


if __name__ == "__main__":
    main()

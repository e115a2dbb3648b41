"""LoRA serving benchmark: users with different LoRA adapters, served three ways, in one run.

    python benchmarks/lora_serving.py                          # 8 users, 1 request each, built-in model, 5 repeats
    python benchmarks/lora_serving.py --rounds 3               # each user sends 3 requests, one after another
    python benchmarks/lora_serving.py --users 4 --steps 10 --repeats 1 --json /tmp/lora.json

Four random adapters (rank `--rank`, on the attention projections to_q/to_k/to_v/to_out.0, written
in the diffusers/PEFT format with `tests/tiny_loras.py`) are loaded for the built-in model. Each user
runs with one adapter set, `USER_LORAS[user % 8]`: two users run the base model, two share adapter
`a` and two share `b` at different scales, one each runs `c` and `d`. Closed loop: every user sends
`--rounds` requests at the model's default steps and size, each after its previous one finished.

Systems (all in this process, one after another, on the same seeded requests):
- `shared`: stepstudio's engine (step mode, max batch = users) with every adapter loaded: rows with
  different adapters run in ONE forward, each row with its own deltas (pipelines/lora_rows.py).
- `split`: the same engine and pipeline, but a request only shares a forward with requests of the
  same adapter set, names and scales (`SplitByAdapterSet` puts the set into the batch key): the
  policy of servers that keep different `lora_request` / `lora_scale` values in separate batches
  (vLLM-Omni). The groups take turns, as any groups of the engine do.
- `diffusers`: the stock `FluxPipeline.__call__`, one request at a time, its adapter patched in per
  request: `load_lora_weights` + `set_adapters` before, `unload_lora_weights` after (how UIs that
  patch the model's weights for a request's adapters work, ComfyUI/A1111-like).
- `no-adapters`: `shared` with the same requests naming no adapter: what the per-row deltas cost.

Reported per system (its median-wall repeat): wall time, images/s and its ratio to `shared`, time
from submit to the request's first step (its admission: for `diffusers`, once its adapter is
patched in) and latency (mean, p95), requests and model rows per forward (true CFG puts two rows
per request), the mean forward time, how many forwards mixed adapter sets, and the time spent
patching adapters in and out. Writes every record and forward to `--json`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.serving import _drive, _fmt, _pct  # noqa: E402
from benchmarks.systems import DiffusersSystem, EngineSystem  # noqa: E402
from benchmarks.workflow_grid import median_round  # noqa: E402
from benchmarks.workload import WorkItem, Workload, make_workload  # noqa: E402
from engine import Engine, GenerationParams, ServingLimits  # noqa: E402
from pipelines.lora_request import LoraUse  # noqa: E402

SYSTEMS = ("shared", "split", "diffusers", "no-adapters")
ADAPTERS = ("a", "b", "c", "d")
# User u runs with USER_LORAS[u % 8]: the base model twice, a and b each at two scales, c, d.
USER_LORAS: tuple[tuple[LoraUse, ...], ...] = (
    (),
    (LoraUse("a", 1.0),),
    (LoraUse("b", 0.8),),
    (),
    (LoraUse("c", 1.0),),
    (LoraUse("a", 0.5),),
    (LoraUse("d", 0.6),),
    (LoraUse("b", 0.3),),
)

AdapterSet = tuple[tuple[str, float], ...]


def adapter_set(loras: tuple[LoraUse, ...]) -> AdapterSet:
    """A request's adapters as a hashable value: (name, scale) pairs, sorted by name."""
    return tuple(sorted((use.name, float(use.scale)) for use in loras))


def write_adapters(pipe, folder: Path, rank: int, magnitude: float) -> dict[str, Path]:
    """One random PEFT-format adapter per name in ADAPTERS for the diffusers pipeline `pipe`."""
    from tests.tiny_loras import build_tiny_lora

    return {name: build_tiny_lora(pipe, folder / name, seed=index, rank=rank, alpha=float(rank), magnitude=magnitude)
            for index, name in enumerate(ADAPTERS)}


# ---------------------------------------------------------------------------- what each forward held
class ForwardLog:
    """Every forward of a denoiser: the requests in it (id and adapter set, in row order), its model
    rows and how long it took. Whoever calls the denoiser sets `current` before each forward."""

    def __init__(self, denoiser) -> None:
        self.forwards: list[dict] = []
        self.current: list[tuple[object, AdapterSet]] = []
        self._started, self._rows = 0.0, 0
        denoiser.register_forward_pre_hook(self._before, with_kwargs=True)
        denoiser.register_forward_hook(self._after)

    def _before(self, module, args, kwargs) -> None:
        self._rows = (args[0] if args else kwargs["hidden_states"]).shape[0]
        self._started = time.perf_counter()

    def _after(self, module, args, output) -> None:
        self.forwards.append({"requests": [request for request, _ in self.current],
                              "sets": [list(map(list, s)) for _, s in self.current],
                              "rows": self._rows, "s": time.perf_counter() - self._started})

    def take(self) -> list[dict]:
        forwards, self.forwards = self.forwards, []
        return forwards


def log_step_pipeline(pipeline) -> ForwardLog:
    """A ForwardLog of the step pipeline's denoiser, told each batch's requests by its denoise_step."""
    log = ForwardLog(pipeline.denoiser)
    denoise_step = pipeline.denoise_step

    def logged(batch):
        log.current = [(state.request_id, adapter_set(state.params.loras)) for state in batch.states]
        return denoise_step(batch)

    pipeline.denoise_step = logged
    return log


# ---------------------------------------------------------------------------- systems
class SplitByAdapterSet:
    """A step pipeline whose batch key also holds the request's adapter set (names and scales), so
    requests with different adapters never share a forward. Everything else is the pipeline's."""

    def __init__(self, pipeline) -> None:
        self._pipeline = pipeline

    def __getattr__(self, name: str):
        return getattr(self._pipeline, name)

    def batch_key(self, params):
        return (self._pipeline.batch_key(params), adapter_set(params.loras))


class LoraEngineSystem(EngineSystem):
    """`EngineSystem` (step mode) on an already loaded pipeline, every request with its user's adapters."""

    def __init__(self, pipeline, user_loras: list[tuple[LoraUse, ...]], max_batch: int, preview_every: int) -> None:
        self.pipeline = pipeline
        self.user_loras = user_loras
        self.preview_every = preview_every
        self.guidance_scale = None  # the model's default (true CFG for the built-in model)
        limits = ServingLimits(max_steps=1000, max_size=4096, max_queue=100_000, max_per_session=100_000)
        self.engine = Engine(pipeline, mode="step", max_batch_requests=max_batch, limits=limits).start()

    def params(self, item: WorkItem):
        return replace(super().params(item), loras=self.user_loras[item.user])


class PatchingDiffusersSystem(DiffusersSystem):
    """`DiffusersSystem` (FluxPipeline.__call__, one request at a time) that patches each request's
    adapters in before its call (load_lora_weights + set_adapters) and out after (unload_lora_weights)."""

    def __init__(self, model: str, files: dict[str, Path], user_loras: list[tuple[LoraUse, ...]]) -> None:
        super().__init__(model, preview_every=0)
        self.files, self.user_loras = files, user_loras
        self.stock = self.pipe
        self.log = ForwardLog(self.stock.transformer)
        self.patch_s: list[float] = []  # load + unload time of each request that had adapters
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()  # (item, record), in the worker queue's order
        self._order = threading.Lock()
        self.pipe = self._patched_call  # what the worker calls for each request

    def submit(self, item: WorkItem):
        with self._order:
            ticket = super().submit(item)
            self._jobs.put((item, ticket.record))
        return ticket

    def _patched_call(self, **call_arguments):
        item, record = self._jobs.get()
        uses = self.user_loras[item.user]
        started = time.perf_counter()
        for use in uses:
            self.stock.load_lora_weights(str(self.files[use.name]), adapter_name=use.name)
        if uses:
            self.stock.set_adapters([use.name for use in uses], [use.scale for use in uses])
        record.admitted = patched = time.perf_counter()  # its first step can begin now
        self.log.current = [(item.index, adapter_set(uses))]
        try:
            return self.stock(**call_arguments)
        finally:
            if uses:
                unloading = time.perf_counter()
                self.stock.unload_lora_weights()
                self.patch_s.append(patched - started + time.perf_counter() - unloading)


# ---------------------------------------------------------------------------- one run of one system
def run_once(name: str, make_system, workload: Workload, warm: WorkItem) -> dict:
    """A fresh system (`make_system()` -> (system, its ForwardLog)), its warm-up request (alone, not
    measured), then the workload; its records and forwards."""
    system, log = make_system()
    try:
        prompt_cache = getattr(getattr(system, "pipeline", None), "prompt_cache", None)
        if prompt_cache is not None:  # every run encodes its own prompts (the systems share a pipeline)
            prompt_cache.clear()
        system.submit(replace(warm, index=-1)).wait()
        log.take()
        patch_before = len(getattr(system, "patch_s", ()))
        started = time.perf_counter()
        records = _drive(system, workload)
        wall = time.perf_counter() - started
        forwards = log.take()
        patch_s = getattr(system, "patch_s", [])[patch_before:]
    finally:
        system.close()
    return {"system": name, "wall_s": wall, "records": [asdict(r) for r in sorted(records, key=lambda r: r.index)],
            "forwards": forwards, "patch_s": sum(patch_s), "patches": len(patch_s)}


def summarize(run: dict, steps: int) -> dict:
    records, forwards = run["records"], run["forwards"]
    done = [r for r in records if r["status"] == "completed"]
    latency = [r["finished"] - r["submitted"] for r in done]
    first_step = [r["admitted"] - r["submitted"] for r in records if r["admitted"] is not None]
    forwards_per_request = Counter(request for f in forwards for request in f["requests"])
    return {
        "system": run["system"],
        "requests": len(records),
        "images": len(done),
        "wall_s": run["wall_s"],
        "images_per_s": len(done) / run["wall_s"],
        "first_step_mean_s": statistics.fmean(first_step) if first_step else None,
        "first_step_p95_s": _pct(first_step, 0.95),
        "latency_mean_s": statistics.fmean(latency) if latency else None,
        "latency_p95_s": _pct(latency, 0.95),
        "forwards": len(forwards),
        "requests_per_forward": statistics.fmean(len(f["requests"]) for f in forwards) if forwards else None,
        "rows_per_forward": statistics.fmean(f["rows"] for f in forwards) if forwards else None,
        "forward_ms_mean": 1000 * statistics.fmean(f["s"] for f in forwards) if forwards else None,
        # Forwards whose requests did not all run the same adapter set.
        "mixed_forwards": sum(len({tuple(map(tuple, s)) for s in f["sets"]}) > 1 for f in forwards),
        "adapter_sets_per_forward_max": max((len({tuple(map(tuple, s)) for s in f["sets"]}) for f in forwards),
                                            default=0),
        # Every request ran exactly `steps` steps (its own count), and in how many forwards per step (the
        # stock pipeline's true CFG calls the transformer twice a step; the engine puts both rows in one).
        "steps_exact": all(r["steps_done"] == r["steps"] == steps for r in records),
        "forwards_per_request_step": sorted({n / steps for n in forwards_per_request.values()}),
        "requests_in_forwards": len(forwards_per_request),
        "patch_s": run["patch_s"],
        "patches": run["patches"],
    }


def summary(runs: list[dict], steps: int) -> dict:
    """The median-wall repeat's summary, with every repeat's wall time and that repeat's run."""
    chosen = median_round(runs)
    return {**summarize(chosen, steps), "wall_repeats_s": [r["wall_s"] for r in runs], "run": chosen}


# ---------------------------------------------------------------------------- the deltas alone
def time_deltas(pipeline, workload: Workload, user_loras: list[tuple[LoraUse, ...]], trials: int = 7,
                calls: int = 3) -> dict:
    """The bare batched forward (`denoise_step`, no engine) of one request per user, with the users'
    adapters and without any: ms per forward, the median of `trials` trials of `calls` forwards each,
    the two kinds taking turns (this machine's speed drifts)."""
    import torch

    from pipelines.interface import Batch, RequestState

    engine = Engine(pipeline)  # only for its parameter resolution; never started
    batches = {}
    for kind, loras_of in (("with", user_loras), ("without", [()] * len(user_loras))):
        states = []
        for user, item in enumerate(workload.items[:len(user_loras)]):
            params = engine.prepare_params(GenerationParams(
                prompt=item.prompt, width=item.size, height=item.size, num_inference_steps=item.steps, seed=item.seed,
                loras=loras_of[user]))
            state = RequestState(request_id=f"{kind}-{user}", params=params)
            pipeline.prepare_encode(state)
            states.append(state)
        batches[kind] = Batch(tuple(states))
    times: dict[str, list[float]] = {kind: [] for kind in batches}
    with torch.no_grad():
        for kind, batch in batches.items():
            pipeline.denoise_step(batch)  # warm-up
        for _ in range(trials):
            for kind, batch in batches.items():
                started = time.perf_counter()
                for _ in range(calls):
                    pipeline.denoise_step(batch)
                times[kind].append((time.perf_counter() - started) / calls)
    with_ms, without_ms = (1000 * statistics.median(times[kind]) for kind in ("with", "without"))
    return {"requests": len(batches["with"].states), "with_ms": with_ms, "without_ms": without_ms,
            "trials_ms": {kind: [1000 * t for t in ts] for kind, ts in times.items()}}


# ---------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin", help="'builtin', or a diffusers FLUX folder")
    parser.add_argument("--users", type=int, default=8, help="concurrent users (user u runs USER_LORAS[u %% 8])")
    parser.add_argument("--rounds", type=int, default=1, help="requests each user sends, one after another")
    parser.add_argument("--steps", type=int, default=None, help="denoise steps per request (default: the model's)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="run every system this many times in rotating order; the table shows the median-wall one")
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument("--rank", type=int, default=8, help="rank of the random adapters")
    parser.add_argument("--magnitude", type=float, default=0.1,
                        help="std of the random adapter weights (0.1: a visible change, no NaNs)")
    parser.add_argument("--preview-every", type=int, default=0, help="engine previews every k steps (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: on this shared 2-core machine, 2 threads swing run to run)")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "lora_serving.json",
                        help="where to write every record and forward")
    parser.add_argument("--no-deltas", dest="deltas", action="store_false",
                        help="skip timing the bare forward with and without the adapters")
    args = parser.parse_args(argv)
    if args.users < 1 or args.rounds < 1 or args.repeats < 1 or (args.steps is not None and args.steps < 1):
        parser.error("--users, --rounds, --repeats and --steps must be at least 1.")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)

    import torch

    from pipelines.loader import BUILTIN_MODELS, load_pipeline

    threads_before = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        pipeline = load_pipeline(args.model)
        defaults = pipeline.info.defaults
        steps = args.steps or defaults.num_inference_steps
        size = defaults.width
        workload = make_workload("closed", args.users * args.rounds, args.users, 0.0, (steps,), (size,), 0.0,
                                 args.seed)
        user_loras = [USER_LORAS[user % len(USER_LORAS)] for user in range(args.users)]
        # The warm-up request runs with an adapter (user 1's), so first-call costs of the deltas stay out.
        warm = workload.items[1 % len(workload.items)]
        model = str(BUILTIN_MODELS.get(args.model, args.model))
        with tempfile.TemporaryDirectory() as tmp:
            files = write_adapters(pipeline.pipe, Path(tmp), args.rank, args.magnitude)
            for name, file in files.items():
                pipeline.load_lora(name, file)
            log = log_step_pipeline(pipeline)

            def engine_system(wrapped, loras):
                return lambda: (LoraEngineSystem(wrapped, loras, args.users, args.preview_every), log)

            def make_diffusers():
                system = PatchingDiffusersSystem(model, files, user_loras)
                return system, system.log

            makers = {
                "shared": engine_system(pipeline, user_loras),
                "split": engine_system(SplitByAdapterSet(pipeline), user_loras),
                "no-adapters": engine_system(pipeline, [()] * args.users),
                "diffusers": make_diffusers,
            }
            runs: dict[str, list[dict]] = {name: [] for name in args.systems}
            for repeat in range(args.repeats):
                shift = repeat % len(args.systems)
                for name in args.systems[shift:] + args.systems[:shift]:
                    runs[name].append(run_once(name, makers[name], workload, warm))
                    print(f"repeat {repeat + 1}: {name} {runs[name][-1]['wall_s']:.2f} s", file=sys.stderr, flush=True)
            deltas = time_deltas(pipeline, workload, user_loras) if args.deltas else None
            timed = log.take()
            if deltas:
                deltas["rows"] = timed[-1]["rows"]
    finally:
        torch.set_num_threads(threads_before)

    result = {
        "setup": {"model": args.model, "users": args.users, "rounds": args.rounds, "requests": len(workload.items),
                  "steps": steps, "size": size, "repeats": args.repeats, "threads": args.threads, "rank": args.rank,
                  "seed": args.seed, "user_loras": [[use.to_json() for use in loras] for loras in user_loras],
                  "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}"},
        "summaries": {name: summary(rs, steps) for name, rs in runs.items()},
        "deltas": deltas,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    print(markdown(result))
    return result


def markdown(result: dict) -> str:
    setup, summaries = result["setup"], result["summaries"]
    shared = summaries.get("shared")
    lines = [f"LoRA serving: {setup['users']} users x {setup['rounds']} request(s) = {setup['requests']} images, "
             f"{setup['steps']} steps at {setup['size']}x{setup['size']}, 4 adapters of rank {setup['rank']} "
             f"(+ the base model), {setup['threads']} torch thread(s), median of {setup['repeats']} repeat(s); "
             f"{setup['machine']}", "",
             "| system | images | wall s | images/s | x shared | first step mean / p95 s | latency mean / p95 s "
             "| requests / forward | rows / forward | forward ms | forwards mixing adapter sets | patching s |",
             "|" + "---|" * 12]
    for name, s in summaries.items():
        ratio = s["images_per_s"] / shared["images_per_s"] if shared else None
        lines.append(
            f"| {name} | {s['images']}/{s['requests']} | {s['wall_s']:.2f} | {s['images_per_s']:.2f} | {_fmt(ratio, 2)} "
            f"| {_fmt(s['first_step_mean_s'])} / {_fmt(s['first_step_p95_s'])} "
            f"| {_fmt(s['latency_mean_s'], 2)} / {_fmt(s['latency_p95_s'], 2)} "
            f"| {_fmt(s['requests_per_forward'], 2)} | {_fmt(s['rows_per_forward'], 2)} | {_fmt(s['forward_ms_mean'], 1)} "
            f"| {s['mixed_forwards']} of {s['forwards']} | {s['patch_s']:.2f} |")
    lines.append("")
    lines.append("Wall time of every repeat, s: " + "; ".join(
        f"{name} " + ", ".join(f"{w:.2f}" for w in s["wall_repeats_s"]) for name, s in summaries.items()))
    if shared and "no-adapters" in summaries:
        plain = summaries["no-adapters"]
        lines.append(f"Per-row deltas: shared / no-adapters wall {shared['wall_s'] / plain['wall_s']:.2f}x, "
                     f"mean forward {shared['forward_ms_mean'] / plain['forward_ms_mean']:.2f}x "
                     f"({shared['forward_ms_mean']:.1f} ms against {plain['forward_ms_mean']:.1f} ms at "
                     f"{shared['rows_per_forward']:.1f} and {plain['rows_per_forward']:.1f} rows).")
    deltas = result.get("deltas")
    if deltas:
        cfg = " with true CFG" if deltas["rows"] == 2 * deltas["requests"] else ""
        lines.append(f"Bare forward of {deltas['requests']} requests ({deltas['rows']} rows{cfg}), "
                     f"median of {len(deltas['trials_ms']['with'])} alternating trials: {deltas['with_ms']:.1f} ms "
                     f"with the users' adapters, {deltas['without_ms']:.1f} ms without "
                     f"({deltas['with_ms'] / deltas['without_ms']:.2f}x).")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

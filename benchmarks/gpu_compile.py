"""The batching curve again with the denoiser compiled the way the studio's `--compile` does it
(`pipelines.loader.compile_denoiser`: `torch.compile(dynamic=True)` on the transformer).

Compiling a 12B transformer takes minutes that can't be estimated beforehand, and a running
compile can't be stopped from inside the process. So it runs in a child process with a hard
timeout (the compile section's time), which writes its results after every measurement:
whatever finished before the timeout is kept, and what it did not reach is recorded as skipped.

    python benchmarks/gpu_compile.py --settings gpu --backend inductor --seconds 170 --out compiled.json  (the child)
"""

from __future__ import annotations

import time

PROCESS_STARTED = time.perf_counter()  # the child's budget counts its imports too

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.gpu_budget import Section, TimeBudget  # noqa: E402

EXIT_MARGIN_S = 5.0  # the child plans to end this much before it would be killed


# ---------------------------------------------------------------------------- the parent's side
def compiled_curve(settings, section: Section, workdir: Path) -> dict:
    if settings.compile_backend is None:
        section.skip("compiled batching curve", reason=f"{settings.name}: torch.compile is skipped on this device "
                                                       "(Inductor needs minutes on a CPU; --compile-backend eager "
                                                       "runs the section's code without it)")
        return {"rows": []}
    seconds = section.left()
    if seconds < 30:
        section.skip("compiled batching curve", seconds + 30)
        return {"rows": []}
    out = workdir / "compiled.json"
    command = [sys.executable, str(Path(__file__).resolve()), "--settings", settings.name,
               "--backend", settings.compile_backend, "--seconds", f"{seconds - EXIT_MARGIN_S:.0f}", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    timed_out = False
    try:
        subprocess.run(command, timeout=seconds, env=env, check=False)
    except subprocess.TimeoutExpired:
        timed_out = True
    result = json.loads(out.read_text()) if out.exists() else {"rows": [], "error": "the child wrote nothing"}
    result["backend"] = settings.compile_backend
    for skipped in result.pop("skipped", []):
        section.skipped.append(skipped)
    measured = {row["batch"] for row in result["rows"]}
    if timed_out or "error" in result:
        why = "the child was stopped at the section's time limit" if timed_out else f"the child failed: {result['error']}"
        for batch in settings.curve_batches:
            if batch not in measured:
                section.skip(f"compiled batching curve: batch {batch}", reason=why)
    return result


# ---------------------------------------------------------------------------- the child
def run_child(settings, seconds: float, out: Path) -> None:
    import torch

    from benchmarks.gpu_serving import batching_curve, run_batch
    from benchmarks.gpu_stand_in import build_stand_in
    from pipelines.loader import compile_denoiser

    section = TimeBudget(seconds, {"compile": seconds}, started=PROCESS_STARTED).section("compile")
    result: dict = {"rows": [], "skipped": section.skipped}

    def save() -> None:  # whole files only: the parent may kill this process at any moment
        partial = out.with_suffix(".partial")
        partial.write_text(json.dumps(result, indent=1))
        partial.replace(out)

    try:
        pipeline, weights = build_stand_in(settings.stand_in, torch.device(settings.device),
                                           getattr(torch, settings.dtype))
        result["init_s"] = weights["init_s"]
        if settings.compile_backend == "inductor":
            compile_denoiser(pipeline)  # what the studio's --compile does
        else:
            for denoiser in pipeline.denoisers:
                denoiser.compile(dynamic=True, backend=settings.compile_backend)
        started = time.perf_counter()
        run_batch(pipeline, settings.curve_size, batch=1, steps=1)  # the first call compiles
        result["first_call_s"] = time.perf_counter() - started
        save()
        curve = batching_curve(pipeline, settings.curve_size, settings.curve_batches, settings.curve_steps, section,
                               on_row=lambda row: (result["rows"].append(row), save()))
        result["rows"] = curve["rows"]  # now with speedups against the compiled batch 1
    except Exception as exc:  # noqa: BLE001 - reported to the parent through the file
        result["error"] = f"{type(exc).__name__}: {exc}"
    save()


def main() -> None:
    from benchmarks.gpu_settings import DRY_RUN, GPU

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", choices=[GPU.name, DRY_RUN.name], required=True)
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    settings = replace(GPU if args.settings == GPU.name else DRY_RUN, compile_backend=args.backend)
    if settings.torch_threads:
        import torch

        torch.set_num_threads(settings.torch_threads)
    run_child(settings, args.seconds, args.out)


if __name__ == "__main__":
    main()

"""The GPU check: one command that measures stepstudio's CUDA path in at most 8 minutes.

    python benchmarks/gpu_check.py                      # on one CUDA GPU: bf16, FLUX.1-dev-sized
    python benchmarks/gpu_check.py --dry-run            # the same code on the CPU, tiny, < 1 minute
    python benchmarks/gpu_check.py --sections parity memory --time-budget 120
    python benchmarks/gpu_check.py --sections plans     # the memory plans on emulated 24/16/12 GB cards

Sections, in this order, each within its share of `--time-budget` (benchmarks/gpu_budget.py;
whatever would not fit is skipped and listed, with the reason):

1. parity   every family's step pipeline (each `build_tiny_<name>` of tests/tiny_checkpoints.py)
            against its stock diffusers `__call__`, alone and co-batched, in the device's dtype,
            with the attention kernel that really ran (benchmarks/gpu_parity.py)
2. memory   a FLUX.1-dev-sized transformer with random weights: weights, and the peak memory of
            one forward per image size and batch size (benchmarks/gpu_memory.py)
3. plans    the same transformer with T5-XXL- and CLIP-L-sized text encoders and a VAE's bytes under
            each memory plan (resident, offload, fp8, lowvram), uncapped and under allocator caps
            emulating 24, 16 and 12 GB cards: which plans fit (against choose_plan's arithmetic),
            s/step and images/s for 8 users at 1024x1024, peak memory, and one step's predictions
            against resident's (benchmarks/gpu_plans.py)
4. serving  the same transformer served by the engine: step mode vs request mode vs the stock
            FluxPipeline one request at a time at 1024x1024, admission and cancel latency in
            step-times, and the batching curve at 512x512 (benchmarks/gpu_serving.py)
5. caching  per-row step caching on the same transformer at 1024x1024: rows skipped, images/s
            against caching off, and that a threshold skipping nothing is exactly caching off
            (benchmarks/gpu_caching.py)
6. packing  rows at 512, 768 and 1024 in ONE packed forward of the same transformer, with
            flash-attn's varlen kernel (when installed), one SDPA call per size, and padding to
            the largest; against one forward per size; parity of every row with its solo forward
            in bf16 (benchmarks/gpu_packing.py)
7. compile  the batching curve again with the studio's `--compile`, in a child process that is
            stopped at the section's time limit (benchmarks/gpu_compile.py)

Writes `gpu_check.json` (every measurement) and `gpu_check.md` (the tables; a dry run writes
`gpu_check_dry_run.*`) to `--out-dir` (default benchmarks/results/), and prints the tables.

On the lent GPU machine (the device tool: an H200, no internet; its python3 has torch, CUDA,
transformers, accelerate and safetensors but no diffusers, so diffusers travels as a wheel):

    once, here, in the repository root:
        echo /.whl/ >> .git/info/exclude
        python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
            --platform manylinux2014_x86_64 -d .whl diffusers==0.42.1

    then one `run` with carry [".whl"] and timeout_s 540; the command (one line; no
    `pip install -e .` is needed, the script puts the repository on sys.path itself):

        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit; set -o pipefail; PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py --out-dir $OUT 2>&1 | tee $OUT/gpu_check.log

    gpu_check.md, gpu_check.json and the log come back; the tables go into docs/benchmarks.md by hand.
"""

from __future__ import annotations

import os
import time

PROCESS_STARTED = time.perf_counter()  # the budget counts the imports too
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every model here is local: never wait on a network

import argparse  # noqa: E402
import datetime  # noqa: E402
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.gpu_budget import Section, TimeBudget  # noqa: E402
from benchmarks.gpu_settings import DRY_RUN, GPU, SECTIONS, CheckSettings  # noqa: E402

DEFAULT_OUT_DIR = ROOT / "benchmarks" / "results"


def machine_info(device: torch.device) -> dict:
    def version(package: str) -> str | None:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return None

    on_cuda = device.type == "cuda"
    return {
        "device_name": torch.cuda.get_device_name(device) if on_cuda else f"CPU ({platform.machine()})",
        "device_memory_gib": torch.cuda.get_device_properties(device).total_memory / 2**30 if on_cuda else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "diffusers": version("diffusers"),
        "transformers": version("transformers"),
        "flash_attn": version("flash-attn"),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "date": datetime.date.today().isoformat(),
    }


class RealSizeModel:
    """The stand-in pipeline, built once on first use and shared by the sections that need it."""

    def __init__(self, settings: CheckSettings) -> None:
        self.settings = settings
        self._built = None

    def get(self):
        if self._built is None:
            from benchmarks.gpu_stand_in import build_stand_in

            self._built = build_stand_in(self.settings.stand_in, torch.device(self.settings.device),
                                         getattr(torch, self.settings.dtype))
        return self._built

    def release(self) -> None:
        import gc

        self._built = None
        gc.collect()  # engines and pipelines hold the transformer in reference cycles
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------- the sections
def run_parity(settings: CheckSettings, section: Section, model: RealSizeModel, workdir: Path) -> dict:
    from benchmarks.gpu_parity import check_every_family

    return check_every_family(section, workdir, torch.device(settings.device), getattr(torch, settings.dtype))


def run_memory(settings: CheckSettings, section: Section, model: RealSizeModel, workdir: Path) -> dict:
    from benchmarks.gpu_memory import measure_memory

    pipeline, weights = model.get()
    return measure_memory(pipeline, settings.memory_sizes, settings.memory_batches, section, weights)


def run_plans(settings: CheckSettings, section: Section, model: RealSizeModel, workdir: Path) -> dict:
    from benchmarks.gpu_plans import measure_plans

    return measure_plans(settings, section, model)  # releases the shared model: it casts weights to float8


def run_serving(settings: CheckSettings, section: Section, model: RealSizeModel, workdir: Path) -> dict:
    from benchmarks.gpu_serving import batching_curve, compare_modes
    from benchmarks.gpu_stand_in import stock_pipeline

    pipeline, _ = model.get()
    modes = compare_modes(pipeline, stock_pipeline(pipeline.transformer), settings.serving_size,
                          settings.serving_requests, settings.serving_steps, section)
    curve = batching_curve(pipeline, settings.curve_size, settings.curve_batches, settings.curve_steps, section)
    return {"modes": modes, "curve": curve}


def run_caching(settings: CheckSettings, section: Section, model: RealSizeModel, workdir: Path) -> dict:
    from benchmarks.gpu_caching import measure_caching

    pipeline, _ = model.get()
    return measure_caching(pipeline, settings, section)


def run_packing(settings: CheckSettings, section: Section, model: RealSizeModel, workdir: Path) -> dict:
    from benchmarks.gpu_packing import measure_packing

    pipeline, _ = model.get()
    return measure_packing(pipeline.transformer, settings.packing_sizes, settings.stand_in.text_tokens,
                           settings.packing_per_size, settings.packing_repeats, section)


def run_compile(settings: CheckSettings, section: Section, model: RealSizeModel, workdir: Path) -> dict:
    from benchmarks.gpu_compile import compiled_curve

    model.release()  # the child builds its own copy: two 24 GB copies need not coexist
    return compiled_curve(settings, section, workdir)


RUNNERS = {"parity": run_parity, "memory": run_memory, "plans": run_plans, "serving": run_serving,
           "caching": run_caching, "packing": run_packing, "compile": run_compile}


# ---------------------------------------------------------------------------- the whole check
def quiet_libraries() -> None:
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    for logging_module in (diffusers_logging, transformers_logging):
        logging_module.set_verbosity_error()
        logging_module.disable_progress_bar()


def write(report: dict, out_dir: Path, stem: str) -> tuple[Path, Path]:
    from benchmarks.gpu_report import markdown

    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, markdown_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    json_path.write_text(json.dumps(report, indent=1, default=str))
    markdown_path.write_text(markdown(report))
    return json_path, markdown_path


def run_check(settings: CheckSettings, sections: list[str], budget_s: float, out_dir: Path) -> dict:
    budget = TimeBudget(budget_s, {name: settings.plan_s[name] for name in SECTIONS if name in sections},
                        started=PROCESS_STARTED)
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    quiet_libraries()
    device = torch.device(settings.device)
    report = {"settings": settings.to_json(), "machine": machine_info(device), "budget_s": budget_s, "wall_s": 0.0,
              "sections": {name: {"status": "not selected"} for name in SECTIONS}}
    stem = "gpu_check" if settings.name == GPU.name else "gpu_check_dry_run"
    model = RealSizeModel(settings)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as workdir:
        for name in SECTIONS:
            if name not in sections:
                continue
            section = budget.section(name)
            print(f"[{budget.elapsed():5.0f} s] {name}: until {section.deadline - budget.started:.0f} s", flush=True)
            try:
                data = RUNNERS[name](settings, section, model, Path(workdir))
                status = "ran"
            except Exception as exc:  # noqa: BLE001 - a failed section is reported; the others still run
                traceback.print_exc()
                data, status = {"error": f"{type(exc).__name__}: {exc}"}, "failed"
            report["sections"][name] = {"status": status, "seconds": section.elapsed(), "skipped": section.skipped, **data}
            report["wall_s"] = budget.elapsed()
            write(report, out_dir, stem)  # after every section: a stopped run keeps what it finished
    report["wall_s"] = budget.elapsed()
    json_path, markdown_path = write(report, out_dir, stem)
    print(markdown_path.read_text())
    print(f"wrote {json_path} and {markdown_path} in {report['wall_s']:.0f} s", flush=True)
    return report


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU, float32, a 2-block FLUX instead of the 12B one, batch sizes 1..2, no compile")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--time-budget", type=float, default=None,
                        help=f"seconds for the whole check (default {GPU.budget_s:.0f}; dry run {DRY_RUN.budget_s:.0f})")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    parser.add_argument("--compile-backend", choices=["inductor", "eager"], default=None,
                        help="torch.compile backend of the compile section (default: inductor on the GPU, "
                             "none in a dry run; eager only traces, to prove the section's code quickly)")
    args = parser.parse_args(argv)
    settings = DRY_RUN if args.dry_run else GPU
    if args.compile_backend:
        settings = replace(settings, compile_backend=args.compile_backend)
    if settings.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device is visible: run it on the GPU machine, or with --dry-run here.")
    return run_check(settings, args.sections, args.time_budget or settings.budget_s, args.out_dir)


if __name__ == "__main__":
    main()

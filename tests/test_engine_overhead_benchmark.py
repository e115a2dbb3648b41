"""The engine-overhead benchmark runs and measures real steps (a smoke run, not a timing test)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import engine_overhead  # noqa: E402


def test_overhead_benchmark_runs_every_step_of_every_request():
    # measure() itself asserts that every request completed and that exactly 20 forwards ran.
    engine_overhead.measure(running=4, steps=20)

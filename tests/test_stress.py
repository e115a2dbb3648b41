"""The stress run (benchmarks/stress.py), in its own process: a short form here, the full
1,000 requests with -m slow."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.stress import EXPECTED, KINDS

ROOT = Path(__file__).resolve().parent.parent


def stress(tmp_path: Path, requests: int, workers: int, seed: int) -> dict:
    out = tmp_path / "stress.json"
    done = subprocess.run(
        [sys.executable, "benchmarks/stress.py", "--requests", str(requests), "--workers", str(workers),
         "--seed", str(seed), "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert done.returncode == (0 if not report["problems"] else 1)
    return report


def _check(report: dict, requests: int) -> None:
    assert report["problems"] == []
    assert sum(report["answers"].values()) == requests
    # Each kind of call got only what it should (benchmarks/stress_callers.py says what an answer
    # means): hostile input refused under its own field (never taken, never a 5xx), each fault
    # failed with its own message (a 500 that is not the fault's generation_failed is wrong),
    # forged History tokens listed nothing, a cancelled job's sibling done.
    assert sum(sum(answers.values()) for answers in report["by_kind"].values()) == requests
    for kind, answers in report["by_kind"].items():
        assert set(answers) <= EXPECTED[kind], (kind, answers)
    assert "wrong" not in report["answers"] and "hang" not in report["answers"], report["answers"]
    assert report["tracebacks"]["unexpected"] == 0, report["tracebacks"]["examples"]
    engine = report["engine"]
    # Every request the engine took ended exactly once, and nothing is left behind.
    assert report["final_events_per_request"] == {"1": engine["submitted"]}
    assert (engine["in_flight"], engine["states_in_memory"], engine["queue_view"]) == (0, 0, 0)
    assert engine["submitted"] == engine["completed"] + engine["aborted"] + engine["error"]
    # The engine crash at the end answered everyone, then the server stopped.
    assert report["crash"]["http_waiting"] == [503, "engine_failed"]
    assert report["crash"]["gradio_waiting"].startswith("gr.Error: the engine stopped after an internal error")
    assert report["crash"]["server_stopped"] is True


def test_a_short_stress_run_keeps_every_invariant(tmp_path):
    report = stress(tmp_path, requests=100, workers=8, seed=1)
    _check(report, 100)
    # The mix really had each kind of caller in it, by each way in (faults and hostile input both
    # over HTTP and through gradio_client), and each kind's expected answer.
    assert set(report["by_kind"]) == set(EXPECTED)
    assert {kind.partition("/")[0] for kind in report["by_kind"]} == set(KINDS)
    assert {"completed", "rejected", "failed", "aborted", "disconnected", "listed nothing"} <= set(report["answers"])
    assert report["tracebacks"]["injected"] > 0  # the faults did fire, and were told apart


@pytest.mark.slow
def test_the_full_stress_run_keeps_every_invariant(tmp_path):
    _check(stress(tmp_path, requests=1000, workers=16, seed=0), 1000)

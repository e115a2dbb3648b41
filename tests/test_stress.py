"""The stress run (benchmarks/stress.py): a short form here, the full 1,000 requests with -m slow."""

from __future__ import annotations

import pytest

from benchmarks.stress import run


def _check(report, requests: int) -> None:
    assert report.problems == []
    assert sum(report.answers.values()) == requests
    assert set(report.answers) <= {"completed", "rejected", "failed", "aborted", "disconnected"}
    # Every request the engine took ended exactly once, and nothing is left behind.
    assert report.final_events_per_request == {"1": report.engine["submitted"]}
    assert (report.engine["in_flight"], report.engine["states_in_memory"], report.engine["queue_view"]) == (0, 0, 0)
    assert report.engine["submitted"] == report.engine["completed"] + report.engine["aborted"] + report.engine["error"]
    # The engine crash at the end answered everyone.
    assert report.crash["http_waiting"] == (503, "engine_failed")
    assert report.crash["gradio_waiting"].startswith("gr.Error: the engine stopped after an internal error")
    assert report.crash["server_stopped"] is True


def test_a_short_stress_run_keeps_every_invariant():
    report = run(requests=100, workers=8, seed=1)
    _check(report, 100)
    # The mix really had each kind of caller in it.
    assert {"completed", "rejected", "failed", "aborted", "disconnected"} <= set(report.answers)


@pytest.mark.slow
def test_the_full_stress_run_keeps_every_invariant():
    report = run(requests=1000, workers=16, seed=0)
    _check(report, 1000)

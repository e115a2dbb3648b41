"""A workflow run survives its process: a real `python app.py` running an 8-branch, two-stage
workflow (4 seeds, then each of their pictures redrawn) is killed (SIGKILL) or stopped (SIGTERM)
with branches done, running and waiting; started again on the same outputs folder, it runs the
branches still owed, and only those, from the pictures saved before (docs/durability.md)."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest
from PIL import Image

from pipelines.params import image_digest
from studio.outputs import parse_infotext
from studio.page.restart_banner import RestartNotices, restart_notice
from studio.store.recovery import ResumeReport
from studio.workflows.registry import RunRegistry
from tests.studio_helpers import connect
from tests.test_durable_restart import count, rows
from tests.test_http_api import wait_until
from tests.test_reliability_app import app_process

STEPS = 10
FIRST_SEEDS = (31, 32, 33, 34)
REDRAW_SEED = 7


def link(source: str, port: str, target: str, target_port: str | None = None) -> dict:
    return {"from": {"node": source, "port": port}, "to": {"node": target, "port": target_port or port}}


def two_stage_workflow() -> dict:
    """Stage 1: 4 seeds of one prompt; stage 2: each of their pictures redrawn at strength 0.5."""
    return {
        "version": 1,
        "nodes": [
            {"id": "prompt", "type": "prompt", "values": {"text": "a red circle"}},
            {"id": "seeds", "type": "seed_batch", "values": {"start": FIRST_SEEDS[0], "count": len(FIRST_SEEDS)}},
            {"id": "steps", "type": "steps", "values": {"steps": STEPS}},
            {"id": "first", "type": "sampler", "values": {}},
            {"id": "again", "type": "prompt", "values": {"text": "a yellow circle"}},
            {"id": "seed", "type": "seed", "values": {"seed": REDRAW_SEED}},
            {"id": "strength", "type": "strength", "values": {"strength": 0.5}},
            {"id": "redraw", "type": "sampler", "values": {}},
        ],
        "links": [link("prompt", "prompt", "first"), link("seeds", "seed", "first"),
                  link("steps", "steps", "first"), link("first", "images", "redraw", "image"),
                  link("again", "prompt", "redraw", "prompt"), link("seed", "seed", "redraw"),
                  link("steps", "steps", "redraw"), link("strength", "strength", "redraw")],
    }


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_a_workflow_run_finishes_every_branch_exactly_once_after_the_process_ends_mid_run(tmp_path, stop):
    outputs = tmp_path / "outputs"
    database = outputs / "studio.db"
    # Two branches at the engine at a time: the others wait in the run's own queue.
    studio_args = ("--port", "0", "--outputs", str(outputs), "--max-steps", str(STEPS), "--max-per-session", "2")
    with app_process(*studio_args, step_delay_s=0.2) as first:
        job = connect(first.url()).submit(workflow=two_stage_workflow(), api_name="/run_workflow")
        wait_until(lambda: count(database, "workflow_branches") >= 2, timeout=300, what="two branches to end")
        first.process.send_signal(stop)
        first.process.wait(60)
        del job
    ended = rows(database, "SELECT branch, path FROM workflow_branches ORDER BY branch")
    assert count(database, "workflow_runs") == 1
    assert 2 <= len(ended) < 8, ended  # some ended, some still owed
    assert all(path is not None for _, path in ended)  # each ended with its picture saved
    assert count(database, "history") == len(ended)
    before = {path: Image.open(path).tobytes() for _, path in ended}

    with app_process(*studio_args, step_delay_s=0.01) as second:
        second.url()
        wait_until(lambda: count(database, "workflow_runs") == 0, timeout=300, what="the run to finish")
        assert f"resuming 1 workflow runs from before the restart ({8 - len(ended)} branches)" in second.output

    # Exactly once: 8 results, the 4 first-stage seeds and 4 redraws, each file once.
    saved = rows(database, "SELECT path, parameters FROM history ORDER BY id")
    seeds = sorted(parse_infotext(text)["seed"] for _, text in saved)
    assert seeds == sorted(FIRST_SEEDS + (REDRAW_SEED,) * 4), saved
    # Each redraw started from one first-stage picture as saved (loaded from its file when that
    # branch had ended before the stop), each from a different one.
    firsts = {image_digest(Image.open(path).convert("RGB")) for path, text in saved
              if parse_infotext(text)["seed"] != REDRAW_SEED}
    redrawn_from = [_field(text, "Init image") for _, text in saved if parse_infotext(text)["seed"] == REDRAW_SEED]
    assert sorted(redrawn_from) == sorted(firsts) and len(firsts) == 4
    assert {_field(text, "Denoising strength") for _, text in saved if "Init image" in text} == {"0.5"}
    files = sorted(path.name for path in outputs.glob("*/*.png"))
    assert files == sorted(path.rsplit("/", 1)[1] for path, _ in saved) and len(files) == 8
    assert not list(outputs.rglob("*.partial*"))
    # What ended before the stop was kept as it was, not made again.
    assert {path: Image.open(path).tobytes() for path in before} == before
    assert count(database, "workflow_branches") == 0


def _field(infotext: str, key: str) -> str:
    """One `Key: value` of a saved result's parameters text."""
    return infotext.rsplit(f"{key}: ", 1)[1].split(",")[0].strip('"')


def test_each_owner_is_told_once_what_a_restart_resumed():
    report = ResumeReport()
    report.resumed_by_owner.update({"a" * 32: 3, "b" * 32: 1})
    notices = RestartNotices(report)
    assert notices.for_owner("a" * 32) == restart_notice(3)
    assert restart_notice(3).startswith("**The studio restarted; 3 of your requests were resumed.**")
    assert restart_notice(1).startswith("**The studio restarted; 1 of your requests was resumed.**")
    assert notices.for_owner("a" * 32) is None  # told already
    assert notices.for_owner("c" * 32) is None and notices.for_owner(None) is None  # nothing of theirs
    assert notices.for_owner("b" * 32) == restart_notice(1)


def test_a_returning_tab_adopts_the_sessions_of_its_resumed_work_and_acts_for_them():
    report = ResumeReport()
    report.resumed_for("a" * 32, "ui:gone-tab", 3)
    report.resumed_for("a" * 32, "ui:other-gone-tab")
    assert (report.resumed_by_owner["a" * 32], report.sessions_by_owner["a" * 32]) == (
        4, {"ui:gone-tab", "ui:other-gone-tab"})
    cancelled = []
    registry = RunRegistry()
    for run_id, session in (("resumed", "ui:gone-tab"), ("stranger", "ui:someone-else")):
        registry.add(SimpleNamespace(run_id=run_id, session_id=session, cancel=lambda r=run_id: cancelled.append(r)))

    assert registry.sessions_of("ui:new-tab") == ("ui:new-tab",) and registry.runs_of("ui:new-tab") == []
    with pytest.raises(PermissionError):
        registry.own("resumed", "ui:new-tab")
    registry.adopt("ui:new-tab", report.sessions_by_owner["a" * 32] | {"ui:new-tab"})
    assert registry.sessions_of("ui:new-tab") == ("ui:new-tab", "ui:gone-tab", "ui:other-gone-tab")
    assert [run.run_id for run in registry.runs_of("ui:new-tab")] == ["resumed"]
    (adopted,) = registry.runs_of_adopted("ui:new-tab")  # what the Simple tab's queue follows
    assert adopted.run_id == "resumed" and registry.is_live(adopted)
    assert registry.own("resumed", "ui:new-tab").run_id == "resumed"
    assert registry.cancel_session("ui:new-tab") == 1 and cancelled == ["resumed"]  # never the stranger's
    registry.finished(adopted)
    assert not registry.is_live(adopted) and registry.runs_of_adopted("ui:new-tab") == [adopted]  # listed, ended
    registry.release("ui:new-tab")  # the tab closed
    assert registry.sessions_of("ui:new-tab") == ("ui:new-tab",) and registry.runs_of_adopted("ui:new-tab") == []

"""At start: the workflow runs (the editor's and the Simple tab's) that still owed branches when the
studio stopped run those branches again, with nobody watching: each result joins its owner's
History as it would have, and the page tells the owner how many were resumed.

    resume_runs(runner, report, max_age_s=86400)   # after studio.store.recovery.resume_accepted

A resumed run is the run it was: the same id, workflow, session and seeds (so the same pictures),
and the branches that had ended keep their results (a later stage starts from its saved picture).
Its branches start again from step 0 and share forwards with everything else. A run that started
longer than `max_age_s` ago, or that this server can no longer run (a model gone, a limit
lowered), is dropped and logged.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path

from PIL import Image

from studio.store.recovery import ResumeReport
from studio.store.store import JournaledRun
from studio.workflows.format import WorkflowError

log = logging.getLogger(__name__)


def resume_runs(runner, report: ResumeReport, max_age_s: float) -> threading.Thread | None:
    """`runner`: the page's WorkflowRunner. Counts what it resumes in `report`; returns the thread
    that follows the resumed runs (None when there are none)."""
    outputs = runner.outputs
    if outputs is None or not outputs.enabled or not outputs.index.is_durable:
        return None
    store = outputs.index
    resumed = []
    for journaled in store.pending_runs():
        if time.time() - journaled.accepted_at > max_age_s:
            log.warning("workflow run %s is not run again: it started more than %g s before the restart",
                        journaled.id, max_age_s)
            store.run_finished(journaled.id)
            report.dropped += 1
            continue
        try:
            run, compiled = runner.start(journaled.source, journaled.session, journaled.owner, run_id=journaled.id,
                                         seeds=journaled.seeds, ended_before=_saved_pictures(journaled))
        except (WorkflowError, ValueError) as error:
            log.warning("workflow run %s is not run again: this server no longer takes it: %s", journaled.id, error)
            store.run_finished(journaled.id)
            report.dropped += 1
            continue
        owed = sum(not branch.is_finished for branch in run.branches)
        if not owed:  # every branch had ended; only the run's own end was not recorded
            store.run_finished(journaled.id)
            continue
        store.run_resumed(journaled.id)
        report.resumed_for(journaled.owner, journaled.session, owed)
        resumed.append((run, compiled, journaled))
    if not resumed:
        return None
    log.info("resuming %d workflow runs from before the restart (%d branches)", len(resumed),
             sum(sum(not b.is_finished for b in run.branches) for run, _, _ in resumed))
    thread = threading.Thread(target=asyncio.run, args=(_follow_all(runner, resumed, report),),
                              name="stepstudio-resumed-runs", daemon=True)
    thread.start()
    return thread


def _saved_pictures(journaled: JournaledRun) -> dict[int, Image.Image | None]:
    """The ended branches with their saved pictures (None: ended without one, or its file is gone)."""
    pictures: dict[int, Image.Image | None] = {}
    for index, path in journaled.ended.items():
        pictures[index] = None
        if path is not None and Path(path).exists():
            with Image.open(path) as picture:
                pictures[index] = picture.convert("RGB")
    return pictures


async def _follow_all(runner, resumed: list, report: ResumeReport) -> None:
    await asyncio.gather(*(_follow(runner, run, compiled, journaled, report) for run, compiled, journaled in resumed))


async def _follow(runner, run, compiled, journaled: JournaledRun, report: ResumeReport) -> None:
    workflow = compiled.workflow.to_json() if journaled.saves_workflow else None
    try:
        async for view in runner.follow(run, journaled.owner, workflow, resumed=True):
            report.request_ids.update(b.request_id for b in view.branches if b.request_id)
    except Exception as error:  # noqa: BLE001 - a stop under it (it stays owed), or one run's own fault
        log.info("resumed workflow run %s ended early: %s", run.run_id, error)

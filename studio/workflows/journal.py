"""A workflow run's record in the durable store (studio.store), from its start until every branch
has ended, so that a restart runs the branches still owed (studio.workflows.resume).

    journal = RunJournal.begin(outputs, run, owner, saves_workflow=True)   # None: nothing is kept (--no-save)
    await journal.branch_ended(view, workflow, stopping=not engine.accepting)
                                                   # each branch once it ended: a result is saved
                                                   # and the branch marked ended in one commit
    journal.close(keep=not engine.accepting)       # keep: the studio is stopping under the run

What is kept: the workflow JSON (pictures included), the seed each sampler drew (the run makes the
same pictures again), the caller's session and owner, and how each ended branch ended. A branch
that ends without a result while the studio is stopping has not ended for the journal: it runs
again. A run its
caller stopped (Cancel, a closed tab) leaves the journal when its stream ends.
"""

from __future__ import annotations

import asyncio
import json
import logging

from studio.outputs import OutputStore, SavedOutput
from studio.workflows.run import WorkflowRun
from studio.workflows.run_views import BranchView

log = logging.getLogger(__name__)


class RunJournal:
    def __init__(self, outputs: OutputStore, run: WorkflowRun, owner: str) -> None:
        self.outputs = outputs
        self.store = outputs.index
        self.run = run
        self.owner = owner
        self._recorded = set(run.ended_before)  # branches whose end is in the store

    @classmethod
    def begin(cls, outputs: OutputStore | None, run: WorkflowRun, owner: str, saves_workflow: bool,
              resumed: bool = False) -> "RunJournal | None":
        """Record the run (a resumed one is recorded already); None when nothing is kept: no outputs
        folder, or a caller whose results are not saved."""
        if outputs is None or not outputs.enabled or not outputs.index.is_durable or not owner:
            return None
        if not resumed:
            source = json.dumps(run.compiled.workflow.to_json(), ensure_ascii=False)
            outputs.index.accept_run(run.run_id, run.session_id, owner, source, run.seeds, saves_workflow)
        return cls(outputs, run, owner)

    def is_recorded(self, index: int) -> bool:
        return index in self._recorded

    async def branch_ended(self, view: BranchView, workflow: dict | None, stopping: bool) -> None:
        """Save a finished branch's result and mark it ended in the same commit; mark a branch that
        ended without one, unless the studio is `stopping` (then whatever ended it, the stop's
        abort or a refusal of the closing engine, it stays owed and runs again)."""
        index = view.branch.index
        if index in self._recorded or not view.is_finished:
            return
        if view.result is None and (stopping or view.status.is_shutdown):
            return
        self._recorded.add(index)

        def mark(saved: SavedOutput | None) -> None:
            path = None if saved is None else (saved.poster or saved.path)
            self.store.branch_ended(self.run.run_id, index, path)

        try:
            if view.result is not None:
                await asyncio.to_thread(self.outputs.save, view.result, self.owner, workflow, mark, view.caption)
            else:
                await asyncio.to_thread(mark, None)
        except OSError as exc:  # a full disk: the run goes on; this branch is not run again
            log.warning("could not save branch %d of run %s: %s", index, self.run.run_id, exc)
            await asyncio.to_thread(mark, None)

    def close(self, keep: bool) -> None:
        """The run's stream ended: forget the run, unless the studio is stopping under it (then its
        unfinished branches run again at the next start)."""
        if keep and not all(b.branch.index in self._recorded for b in self.run.branches):
            log.info("workflow run %s stays in the store: the studio is stopping", self.run.run_id)
            return
        self.store.run_finished(self.run.run_id)

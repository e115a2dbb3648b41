"""Running a compiled workflow: its branches as engine requests of one session, and their state.

    run = WorkflowRun(engine, compiled, session_id="tab-1", preview_every=2)
    async for view in run.updates():      # a RunView after every batch of engine events
        ...
    run.cancel()                          # the whole run, at the next step boundary
    run.cancel_branch(3)                  # one branch

Admission: the run submits its branches in order, as many as the engine takes for this session;
the per-session in-flight limit (`--max-per-session`) counts a run's branches like any other
requests. A run larger than the limit is not refused: its other branches wait in the run's own
queue ("waiting") and go to the engine as earlier ones finish. A branch the engine has no room
for yet is not a refused request (it is submitted `from_waiting_queue`, so
`stepstudio_requests_rejected_total` does not count it); the engine's
`stepstudio_workflow_branches_waiting` gauge counts the waiting branches of every run instead.
Every submitted branch is an ordinary engine request, so branches with equal batch keys (and
other sessions' requests) share each denoise forward.

Every branch is validated by the engine (`prepare_params`: model defaults, seed, the model's
and server's limits) before the first one is submitted, so a run either starts whole or not
at all; a branch that starts from an earlier stage's image is validated with a stand-in picture
of the size it will have. Each submitted branch is followed by a studio.tracker
`RequestTracker` (its status is the branch's, its cancel the branch's cancel). Aggregation:
each node's state comes from the branches it takes part in.

Stages: a branch that starts from another branch's image waits in the run's queue until that
branch has finished, and is submitted then (no barrier between stages: stage 2 of one branch
denoises beside stage 1 of another). Ready later-stage branches go to the engine before
earlier-stage ones still waiting, so finished results come sooner. Its picture (resized to the
branch's size, Lanczos) and mask are made in a worker thread. When the branch it starts from
is cancelled or fails, it ends "aborted" without running; cancelling a branch cancels every
branch that starts from it.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
import uuid
from dataclasses import replace
from typing import AsyncIterator

from PIL import Image

from engine import AdmissionError, Completed, EngineClient, EngineClosedError, GenerationParams, Timings
from pipelines.errors import ParamError
from studio.tracker import (
    ABORTED,
    COMPLETED,
    FAILED,
    FINAL_STATES,
    QUEUED,
    RUNNING,
    WAITING,
    RequestTracker,
    Status,
)
from studio.pictures import sized
from studio.workflows.branches import Branch, with_run_settings
from studio.workflows.compiler import CompiledWorkflow
from studio.workflows.format import Problem, WorkflowError
from studio.workflows.grid import render_grid
from studio.workflows.run_views import BranchView, RunView, cell_word, node_state, result_image

RETRY_ADMISSION_S = 0.25  # when the engine refuses and none of the run's branches is in flight
_SEED_RANGE = 2**32
_RUN_SEQUENCE = itertools.count()


def _random_sampler_seeds(compiled: CompiledWorkflow) -> dict[str, int]:
    """One random seed per sampler, shared by its branches that set none (X/Y cells differ only
    in what was swept)."""
    chooser = random.SystemRandom()
    return {branch.sampler: chooser.randrange(_SEED_RANGE) for branch in compiled.branches}


class WorkflowRun:
    def __init__(self, engine: EngineClient, compiled: CompiledWorkflow, session_id: str, preview_every: int = 0,
                 *, run_id: str | None = None, seeds: dict[str, int] | None = None,
                 ended_before: dict[int, Image.Image | None] | None = None) -> None:
        """`run_id`, `seeds` and `ended_before` resume a run from before a restart: its id, the seed
        each sampler drew then, and the branches that had ended (with their picture, or None when
        they ended without one); those are not run again."""
        self.engine = engine
        self.compiled = compiled
        self.session_id = session_id
        self.run_id = run_id or uuid.uuid4().hex
        self.sequence = next(_RUN_SEQUENCE)  # start order of runs in this process
        self.seeds = seeds = {**_random_sampler_seeds(compiled), **(seeds or {})}
        problems: list[Problem] = []
        prepared: dict[int, GenerationParams] = {}
        for branch in compiled.branches:
            if branch.parent is not None and branch.parent not in prepared:
                continue  # the branch it starts from was refused (that is the problem reported)
            try:
                params = engine.prepare_params(_with_stand_in_pictures(
                    branch, with_run_settings(branch, seeds[branch.sampler], preview_every), prepared))
            except ValueError as exc:
                # The refused field names the node and port that set it; other refusals, the sampler.
                node_id, port = branch.source_of(exc.field) if isinstance(exc, ParamError) else (branch.sampler, None)
                problems.append(Problem(f"branch {branch.index} ({branch.label}): {exc}", node_id, port))
                continue
            prepared[branch.index] = params
        if problems:
            raise WorkflowError(problems)
        # Written only on the run's event loop: each event replaces its branch's view.
        self.branches: list[BranchView] = [BranchView(b, prepared[b.index], Status.waiting(prepared[b.index]))
                                           for b in compiled.branches]
        self.ended_before = {i for i in (ended_before or {}) if 0 <= i < len(self.branches)}
        for index in self.ended_before:
            self.branches[index] = _ended_before_restart(self.branches[index], ended_before[index])
        self._children: dict[int, list[int]] = {}
        for branch in compiled.branches:
            if branch.parent is not None:
                self._children.setdefault(branch.parent, []).append(branch.index)
        self._trackers: dict[int, RequestTracker] = {}  # the submitted branches
        self._pictures: dict[int, tuple] = {}  # branch -> (init image, mask) made for it, once ready
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inbox: asyncio.Queue | None = None
        self._tasks: list[asyncio.Task] = []  # listeners and picture makers, cancelled at the end
        self._lock = threading.Lock()  # cancels may come from other threads
        self._cancel_requests: list[int | None] = []  # None = the whole run
        self._grid_cache: dict[str, tuple[int, Image.Image]] = {}
        self._waiting_counted = 0  # this run's share of the engine's branches-waiting gauge

    # ------------------------------------------------------------------ control (any thread)
    def cancel(self) -> None:
        """Stop the whole run: waiting branches never start, the others stop at the next step boundary."""
        self._request_cancel(None)

    def cancel_branch(self, index: int) -> bool:
        """Stop one branch, and every branch of a later stage that starts from it; False when there
        is no such branch or it already ended."""
        if not 0 <= index < len(self.branches) or self.branches[index].is_finished:
            return False
        self._request_cancel(index)
        return True

    def _request_cancel(self, index: int | None) -> None:
        targets = None if index is None else {index, *self.compiled.descendants(index)}
        with self._lock:
            self._cancel_requests.append(index)
            loop, inbox = self._loop, self._inbox
            submitted = [tracker for i, tracker in self._trackers.items() if targets is None or i in targets]
        # Submitted branches are told at once (non-blocking; each tracker asks the engine once), so
        # the engine stops them at its next step boundary whatever the run's own loop is doing; the
        # loop marks the waiting ones.
        for tracker in submitted:
            tracker.cancel()
        if loop is not None and inbox is not None:
            try:
                loop.call_soon_threadsafe(inbox.put_nowait, ("wake", None))
            except RuntimeError:  # the run's loop is closed: the run is over anyway
                pass

    # ------------------------------------------------------------------ the run (its event loop)
    async def updates(self) -> AsyncIterator[RunView]:
        """Submit the branches and yield a RunView after every batch of events, until every
        branch ended. Closing this generator cancels whatever is still running."""
        inbox: asyncio.Queue = asyncio.Queue()
        with self._lock:
            self._loop, self._inbox = asyncio.get_running_loop(), inbox
        try:
            self._apply_cancels()
            self._make_pictures([b.branch.index for b in self.branches
                                 if b.branch.start is not None and not b.is_finished
                                 and (b.branch.parent is None or self.branches[b.branch.parent].result is not None)])
            self._submit_more()
            self._count_waiting()
            await self._draw_grids()
            yield self.view()
            while not all(b.is_finished for b in self.branches):
                kind, payload = await inbox.get()
                self._apply(kind, payload)
                while not inbox.empty():  # one view for everything that happened in this step
                    self._apply(*inbox.get_nowait())
                self._apply_cancels()
                self._submit_more()
                self._count_waiting()
                await self._draw_grids()
                yield self.view()
        finally:
            self._count_waiting(ended=True)
            with self._lock:
                self._loop = self._inbox = None
            for tracker in self._trackers.values():
                tracker.cancel()  # non-blocking; a no-op for ended or already cancelled requests
            for task in self._tasks:
                task.cancel()

    def _apply(self, kind: str, payload) -> None:
        if kind == "status":
            index, status = payload
            self.branches[index] = replace(self.branches[index], status=status)
            if status.state == COMPLETED and index in self._children:
                self._make_pictures(self._children[index])
        elif kind == "pictures":
            self._pictures.update(payload)

    def _make_pictures(self, indices: list[int]) -> None:
        """Make the pictures of branches whose source is ready (a Load image's, or a finished
        branch's image) in a worker thread; they arrive in the inbox as a "pictures" event."""
        if not indices:
            return
        jobs = []
        for index in indices:
            view = self.branches[index]
            start = view.branch.start
            source = start.picture if start.parent is None else result_image(self.branches[start.parent])
            jobs.append((index, source, (view.params.width, view.params.height), start.mask))

        def make() -> dict[int, tuple]:
            return {index: (sized(source, size), None if mask is None else mask.render(size))
                    for index, source, size, mask in jobs}

        async def deliver(inbox: asyncio.Queue) -> None:
            inbox.put_nowait(("pictures", await asyncio.to_thread(make)))

        self._tasks.append(asyncio.ensure_future(deliver(self._inbox)))

    def _apply_cancels(self) -> None:
        with self._lock:
            requests, self._cancel_requests = self._cancel_requests, []
        for index in requests:
            targets = range(len(self.branches)) if index is None else (index, *self.compiled.descendants(index))
            for i in targets:
                if self.branches[i].is_finished:
                    continue
                tracker = self._trackers.get(i)
                if tracker is None:  # still in the run's own queue: it never reaches the engine
                    self._stop(i, ABORTED, "cancelled before it started")
                else:  # submitted after the cancel was asked: tell the engine now (once)
                    tracker.cancel()  # the engine's Aborted event ends it at the next step boundary

    def _count_waiting(self, ended: bool = False) -> None:
        """Bring this run's share of the engine's gauge of waiting branches up to date (to 0 once
        the run has ended)."""
        waiting = 0 if ended else sum(b.state == WAITING for b in self.branches)
        self.engine.metrics.branches_waiting.inc(waiting - self._waiting_counted)
        self._waiting_counted = waiting

    def _ready(self) -> list[int]:
        """The waiting branches that may go to the engine now, later stages first (each stage in
        branch order). A branch whose source branch ended without an image ends here."""
        ready = []
        for view in self.branches:
            index, parent = view.branch.index, view.branch.parent
            if view.state != WAITING or index in self._trackers:
                continue
            if parent is not None and self.branches[parent].is_finished and self.branches[parent].result is None:
                self._stop(index, ABORTED, f"not run: branch {parent}, whose image it starts from, "
                                           f"{'was cancelled' if self.branches[parent].state == ABORTED else 'failed'}")
            elif view.branch.start is None or index in self._pictures:
                ready.append(index)
        return sorted(ready, key=lambda i: (self.branches[i].branch.parent is None, i))

    def _submit_more(self) -> None:
        """Submit ready branches until the engine has no room (this session's limit). A refusal for
        room is the branch still waiting, not a refused call: the engine is told so
        (`from_waiting_queue`) and does not count it as a rejected request."""
        inbox = self._inbox
        for index in self._ready():
            progress = self.branches[index]
            params = progress.params
            if index in self._pictures:
                init_image, mask_image = self._pictures[index]
                params = replace(params, init_image=init_image, mask_image=mask_image)
            try:
                handle = self.engine.submit(params, session_id=self.session_id, from_waiting_queue=True)
            except EngineClosedError as exc:
                for view in self.branches:
                    if not view.is_finished and view.branch.index not in self._trackers:
                        self._stop(view.branch.index, FAILED, str(exc))
                return
            except AdmissionError:
                in_flight = any(self.branches[i].state in (QUEUED, RUNNING) for i in self._trackers)
                if not in_flight:  # nothing of ours will finish to make room: look again shortly
                    asyncio.get_running_loop().call_later(RETRY_ADMISSION_S, inbox.put_nowait, ("wake", None))
                return
            except ValueError as exc:  # prepared and checked already; only a changed server gets here
                self._stop(index, FAILED, str(exc))
                continue
            tracker = RequestTracker(handle)
            with self._lock:  # cancels read the trackers from other threads
                self._trackers[index] = tracker
            self.branches[index] = replace(progress, params=params, status=tracker.status)
            self._tasks.append(asyncio.ensure_future(self._listen(index, tracker, inbox)))

    def _stop(self, index: int, state: str, message: str) -> None:
        """End a branch the engine never had (cancelled while waiting, or refused)."""
        self.branches[index] = replace(self.branches[index], status=self.branches[index].status.stopped(state, message))

    @staticmethod
    async def _listen(index: int, tracker: RequestTracker, inbox: asyncio.Queue) -> None:
        async for status, event in tracker.updates():
            if event is not None:  # the first status (as submitted) is the branch's already
                inbox.put_nowait(("status", (index, status)))

    # ------------------------------------------------------------------ views
    def view(self) -> RunView:
        nodes = {
            node_id: node_state([self.branches[i] for i in indices])
            for node_id, indices in self.compiled.node_branches.items()
        }
        states = [b.state for b in self.branches]
        done = sum(state in FINAL_STATES for state in states)
        if done < len(states):
            state = RUNNING
        elif all(s == COMPLETED for s in states):
            state = COMPLETED
        elif COMPLETED in states:
            state = "partial"
        else:
            state = FAILED if FAILED in states else ABORTED
        return RunView(self.run_id, state, done, len(states), tuple(self.branches), nodes, self._grids())

    def _grids(self) -> dict[str, Image.Image]:
        """Each grid, drawn again only when one of its branches ended since the last drawing."""
        for layout, finished, images, states in self._stale_grids():
            self._grid_cache[layout.node_id] = (finished, render_grid(layout, images, states))
        return {layout.node_id: self._grid_cache[layout.node_id][1] for layout in self.compiled.grids}

    async def _draw_grids(self) -> None:
        """Draw the stale grids in a worker thread (a grid of full-size images would stall the
        event loop), so the next view finds them drawn."""
        stale = self._stale_grids()
        if stale:
            drawn = await asyncio.to_thread(
                lambda: [render_grid(layout, images, states) for layout, _, images, states in stale])
            for (layout, finished, _, _), image in zip(stale, drawn):
                self._grid_cache[layout.node_id] = (finished, image)

    def _stale_grids(self) -> list[tuple]:
        """(layout, branches ended, their images, every cell's word) of each grid one of whose
        branches ended since its last drawing."""
        stale = []
        for layout in self.compiled.grids:
            members = [i for row in layout.cells for i in row if i is not None]
            finished = sum(self.branches[i].is_finished for i in members)
            cached = self._grid_cache.get(layout.node_id)
            if cached is None or cached[0] != finished:
                images = {i: result_image(self.branches[i]) for i in members if self.branches[i].result}
                states = {i: cell_word(self.branches[i]) for i in members}
                stale.append((layout, finished, images, states))
        return stale


def _ended_before_restart(view: BranchView, picture: Image.Image | None) -> BranchView:
    """A branch that ended before a restart: completed with its saved picture (a later stage
    starts from it), or ended without one."""
    if picture is None:
        return replace(view, status=view.status.stopped(ABORTED, "ended before the studio restarted"))
    now = time.time()
    result = Completed((picture,), view.params.seed, view.params, Timings(now, now, now))
    return replace(view, status=replace(view.status, state=COMPLETED, step=view.status.total, result=result))


def _with_stand_in_pictures(branch: Branch, params: GenerationParams,
                            prepared: dict[int, GenerationParams]) -> GenerationParams:
    """A branch that starts from a picture, as the engine will see it, with blank pictures of its
    size standing in for the real ones (made when its source is ready): the size is the branch's
    own, or its source's (a Load image's picture, or the branch it starts from) scaled."""
    start = branch.start
    if start is None:
        return params
    width, height = params.width, params.height
    if width is None or height is None:
        parent = prepared[start.parent]
        width, height = start.size_from((parent.width, parent.height))
    return replace(params, width=width, height=height, init_image=Image.new("RGB", (width, height)),
                   mask_image=None if start.mask is None else Image.new("L", (width, height)))

"""A tab's own queue: every request it started (Simple tab and workflow runs), one row each with
its one progress bar, and the tab's results. Pure views over the run registry, so every
handler of a tab renders the same thing from the same state.

The rows are HTML; a row's × carries its run id and branch index, a queued row's ⤒ its request id,
and the page turns a press on either into the component's `stop` event (see `CANCEL_JS`;
studio.page.queue_controls.move_from_page handles the ⤒).
"""

from __future__ import annotations

import html
import threading
from collections import OrderedDict

from PIL import Image

from studio.tracker import COMPLETED, QUEUED, RUNNING, WAITING
from studio.workflows.run import WorkflowRun
from studio.workflows.run_views import BranchView

RESULTS_PER_TAB = 24
TABS_KEPT = 512  # tabs whose results are kept in memory (the oldest go first)

TAB_QUEUE_CSS = """
.ss-jobs { display: flex; flex-direction: column; gap: 3px; font-size: 0.85rem; min-height: 2.4rem; }
.ss-jobs .ss-empty { opacity: 0.7; font-style: italic; }
.ss-job { display: grid; grid-template-columns: minmax(8rem, 1fr) 9rem 15rem 1.4rem 1.4rem; gap: 8px; align-items: center;
  padding: 3px 6px; border-radius: 6px; background: var(--background-fill-secondary); }
.ss-job progress { width: 100%; height: 10px; }
.ss-job .ss-job-prompt { white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.ss-job .ss-job-state { font-variant-numeric: tabular-nums; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.ss-job[data-state="failed"] .ss-job-state, .ss-job[data-state="aborted"] .ss-job-state { color: var(--error-text-color, #b91c1c); }
.ss-job-front { cursor: pointer; border: none; background: none; font-size: 1rem; padding: 0; }
.ss-job-cancel { cursor: pointer; border: none; background: none; color: var(--error-text-color, #b91c1c);
  font-weight: 700; font-size: 1rem; padding: 0; }
"""

# A press on a row's × becomes the component's `stop` event with {run_id, index}. On pointerdown,
# not click: the rows are redrawn every step, and a click needs the same element under
# both halves of the press.
CANCEL_JS = """
element.addEventListener('pointerdown', (event) => {
  const front = event.target.closest('[data-front-request]');
  if (front) {
    event.preventDefault();
    trigger('stop', {action: 'front', request_id: front.dataset.frontRequest});
    return;
  }
  const button = event.target.closest('[data-cancel-run]');
  if (!button) return;
  event.preventDefault();
  trigger('stop', {run_id: button.dataset.cancelRun, index: Number(button.dataset.index)});
});
"""


PAUSED_TEXT = {"session": "paused (this tab's queue)", "engine": "paused by the operator"}


def _state_text(branch: BranchView) -> str:
    if branch.state == WAITING:
        return "waiting in this tab"
    if branch.state == QUEUED:
        text = f"queued, position {branch.position}" if branch.position else "queued"
        return text + (f" · {PAUSED_TEXT.get(branch.paused, 'paused')}" if branch.paused else "")
    if branch.state == RUNNING:
        mates = f" · batch of {branch.batch_size}" if branch.batch_size > 1 else ""
        return f"step {branch.step}/{branch.total}{mates}"
    if branch.state == COMPLETED:
        return f"done · {branch.total} steps"
    return branch.state + (f": {branch.message}" if branch.message else "")


def render_tab_queue(runs: list[WorkflowRun]) -> str:
    """One row per request of the tab's runs, oldest first."""
    rows = []
    for run in runs:
        for branch in run.branches:
            params = branch.params
            ended = branch.is_finished
            cancel = "" if ended else (
                f'<button class="ss-job-cancel" title="Cancel this request" data-cancel-run="{run.run_id}" '
                f'data-index="{branch.branch.index}">×</button>')
            front = "<span></span>" if branch.state != QUEUED or not branch.request_id else (
                f'<button class="ss-job-front" title="Move to the front of this tab\'s queue" '
                f'data-front-request="{branch.request_id}">⤒</button>')
            rows.append(
                f'<div class="ss-job" data-state="{branch.state}" data-step="{branch.step}" data-total="{branch.total}" '
                f'data-seed="{params.seed}" data-request="{branch.request_id or ""}">'
                f'<span class="ss-job-prompt" title="{html.escape(params.prompt)}">{html.escape(params.prompt)}</span>'
                f'<span class="ss-job-meta">seed {params.seed} · {params.width}x{params.height}</span>'
                f'<span><progress value="{branch.step}" max="{max(branch.total, 1)}"></progress> '
                f'<span class="ss-job-state">{html.escape(_state_text(branch))}</span></span>{front}{cancel}</div>')
    if not rows:
        rows.append('<div class="ss-empty">Nothing queued. Press Generate (or Shift+Enter in the prompt).</div>')
    return '<div class="ss-jobs">' + "".join(rows) + "</div>"


def latest_preview(runs: list[WorkflowRun]) -> BranchView | None:
    """The newest running request with a preview (what the tab's preview panel shows)."""
    for run in reversed(runs):
        for branch in reversed(run.branches):
            if branch.state == RUNNING and branch.preview is not None:
                return branch
    return None


class TabResults:
    """Each tab's finished results, kept on the server (every handler of a tab adds to the same
    list, so clicks that overlap never lose each other's images). Listed newest request first:
    by the order the requests were made, not the order they finished in (requests that share
    forwards finish in the same step)."""

    def __init__(self, per_tab: int = RESULTS_PER_TAB, tabs: int = TABS_KEPT) -> None:
        self._results: OrderedDict[str, list] = OrderedDict()
        self._following: dict[str, int] = {}  # a tab's Generate streams still following their runs
        self._per_tab, self._tabs = per_tab, tabs
        self._lock = threading.Lock()

    def add(self, session_id: str, order: tuple, media: Image.Image | str, caption: str) -> None:
        """`order`: when the request was made, e.g. (run sequence, branch index)."""
        with self._lock:
            results = self._results.setdefault(session_id, [])
            self._results.move_to_end(session_id)
            results.append((order, media, caption))
            results.sort(key=lambda item: item[0], reverse=True)
            del results[self._per_tab:]
            while len(self._results) > self._tabs:
                self._results.popitem(last=False)

    def of(self, session_id: str) -> list[tuple[Image.Image | str, str]]:
        with self._lock:
            return [(media, caption) for _, media, caption in self._results.get(session_id, ())]

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._results.pop(session_id, None)

    # Several Generate streams of one tab run at once, and their updates reach the page in no
    # fixed order: an earlier stream's last update, made before a later request's result was
    # added, may arrive after the later stream's. So the gallery a tab ends with is sent by the
    # stream that ends last, after every other stream of the tab added its results.
    def stream_started(self, session_id: str) -> None:
        with self._lock:
            self._following[session_id] = self._following.get(session_id, 0) + 1

    def stream_ended(self, session_id: str) -> bool:
        """One of the tab's streams ended (call once per stream_started); True when it was the last
        one still following: its last update carries the tab's whole gallery."""
        with self._lock:
            left = self._following.get(session_id, 0) - 1
            if left > 0:
                self._following[session_id] = left
                return False
            self._following.pop(session_id, None)
            return True

"""The workflow runs of every session, so cancels (other events, the API) reach their run and a
tab can list its own queue. Runs stay listed a while after they end (the tab shows how they
ended); only the session that started a run may cancel it, or a tab that adopted that session.

Adopting: after a restart, the runs resumed for a browser run in the sessions of tabs that are
gone. The browser's returning tab adopts those sessions (`adopt`), and from then on acts for them
as for its own: it lists their runs, cancels them, and its queue controls pause, resume and clear
them (`sessions_of`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable

from studio.workflows.run import WorkflowRun

KEEP_FINISHED_PER_SESSION = 8  # ended runs a session still sees in its queue list


class RunRegistry:
    def __init__(self, keep_finished: int = KEEP_FINISHED_PER_SESSION) -> None:
        self._runs: OrderedDict[str, WorkflowRun] = OrderedDict()  # in start order
        self._live: set[str] = set()
        self._keep_finished = keep_finished
        self._adopted: dict[str, tuple[str, ...]] = {}  # a tab's session -> the sessions it adopted
        self._lock = threading.Lock()

    def adopt(self, session_id: str, sessions: Iterable[str]) -> None:
        """`session_id` (a returning browser's tab) acts for `sessions` too from now on."""
        with self._lock:
            adopted = tuple(sorted(set(sessions) - {session_id}))
            if adopted:
                self._adopted[session_id] = adopted

    def release(self, session_id: str) -> None:
        """The tab closed: what it adopted is left for the browser's next tab to adopt."""
        with self._lock:
            self._adopted.pop(session_id, None)

    def sessions_of(self, session_id: str) -> tuple[str, ...]:
        """The engine sessions `session_id` acts for: its own first, then those it adopted."""
        with self._lock:
            return (session_id, *self._adopted.get(session_id, ()))

    def add(self, run: WorkflowRun) -> None:
        with self._lock:
            self._runs[run.run_id] = run
            self._live.add(run.run_id)

    def finished(self, run: WorkflowRun) -> None:
        """The run's stream ended: keep it listed, dropping the session's oldest ended runs."""
        with self._lock:
            self._live.discard(run.run_id)
            ended = [r for r in self._runs.values() if r.session_id == run.session_id and r.run_id not in self._live]
            for old in ended[: max(0, len(ended) - self._keep_finished)]:
                del self._runs[old.run_id]

    def runs_of_adopted(self, session_id: str) -> list[WorkflowRun]:
        """The runs of the sessions `session_id` adopted (not its own), oldest first."""
        adopted = self.sessions_of(session_id)[1:]
        with self._lock:
            return [run for run in self._runs.values() if run.session_id in adopted]

    def is_live(self, run: WorkflowRun) -> bool:
        """Whether the run has not ended yet."""
        with self._lock:
            return run.run_id in self._live

    def runs_of(self, session_id: str) -> list[WorkflowRun]:
        """The session's runs (and its adopted sessions'), oldest first: live ones and the last few ended ones."""
        sessions = self.sessions_of(session_id)
        with self._lock:
            return [run for run in self._runs.values() if run.session_id in sessions]

    def own(self, run_id: object, session_id: str) -> WorkflowRun | None:
        """The caller's live run, or None when it ended or never existed. PermissionError for another's."""
        if not isinstance(run_id, str):
            return None
        with self._lock:
            run_id = run_id.strip()
            run = self._runs.get(run_id) if run_id in self._live else None
        if run is not None and run.session_id not in self.sessions_of(session_id):
            raise PermissionError("that run belongs to another session; it can't be cancelled from here.")
        return run

    def cancel(self, run_id: object, session_id: str, branch: int | None = None) -> dict:
        """Cancel a run (branch None or -1) or one of its branches, at the next step boundary."""
        run = self.own(run_id, session_id)
        if run is None:
            return {"run_id": run_id, "cancelled": False, "message": "no such run in flight (it may have ended)"}
        if branch is None or branch < 0:
            run.cancel()
            return {"run_id": run.run_id, "cancelled": True, "message": "cancelling the run at the next step boundary"}
        cancelled = run.cancel_branch(branch)
        message = (f"cancelling branch {branch} at the next step boundary" if cancelled
                   else f"branch {branch} is unknown or already ended")
        return {"run_id": run.run_id, "cancelled": cancelled, "message": message}

    def cancel_session(self, session_id: str) -> int:
        """Cancel every live run of a session (and of the sessions it adopted); returns how many."""
        sessions = self.sessions_of(session_id)
        with self._lock:
            runs = [self._runs[i] for i in self._live if self._runs[i].session_id in sessions]
        for run in runs:
            run.cancel()
        return len(runs)

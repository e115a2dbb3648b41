"""How the GPU check spends its minutes: one wall-clock budget, split into sections that run in order.

Each section may run until the time the sections after it have planned for themselves is all
that is left, so time a section does not use flows on to the next one, and no section can eat
a later one's share. Inside a section every piece of work is asked for first (`fits`, with an
estimate of its cost); what would not fit is recorded as skipped, with the reason, instead of
run. The check then always ends within its budget and says what it left out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Section:
    name: str
    started: float  # on the budget's clock
    deadline: float
    clock: Callable[[], float]
    skipped: list[dict] = field(default_factory=list)  # {"what", "reason"} of the work left out

    def left(self) -> float:
        return self.deadline - self.clock()

    def fits(self, estimate_s: float) -> bool:
        return estimate_s <= self.left()

    def skip(self, what: str, estimate_s: float | None = None, reason: str | None = None) -> None:
        if reason is None:
            reason = f"needs about {estimate_s:.0f} s; {max(0.0, self.left()):.0f} s were left in this section"
        self.skipped.append({"what": what, "reason": reason})

    def run_if_it_fits(self, what: str, estimate_s: float, work: Callable[[], object]):
        """`work()` when its estimate fits (its result), else record it as skipped (None)."""
        if not self.fits(estimate_s):
            self.skip(what, estimate_s)
            return None
        print(f"    {what} (about {estimate_s:.0f} s of {self.left():.0f} s left)", flush=True)
        return work()

    def elapsed(self) -> float:
        return self.clock() - self.started


class TimeBudget:
    """`plan`: each selected section's planned seconds, in run order; scaled down to fit
    `total_s` when they add up to more."""

    def __init__(self, total_s: float, plan: dict[str, float], clock: Callable[[], float] = time.perf_counter,
                 started: float | None = None) -> None:
        if total_s <= 0:
            raise ValueError(f"the time budget must be positive, got {total_s} s.")
        self.total_s = total_s
        planned = sum(plan.values())
        scale = min(1.0, total_s / planned) if planned else 1.0
        self.plan = {name: seconds * scale for name, seconds in plan.items()}
        self.clock = clock
        self.started = clock() if started is None else started  # e.g. the process's start

    def elapsed(self) -> float:
        return self.clock() - self.started

    def section(self, name: str) -> Section:
        """Open section `name` now: its deadline leaves the later sections their planned time."""
        order = list(self.plan)
        if name not in order:
            raise ValueError(f"section {name!r} is not in this budget's plan {order}.")
        later = sum(self.plan[s] for s in order[order.index(name) + 1:])
        deadline = self.started + self.total_s - later
        return Section(name, started=self.clock(), deadline=deadline, clock=self.clock)

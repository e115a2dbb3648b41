"""The admission ledger alone: what it lets in, what it refuses and counts, and its door.
(The engine's and the facade's use of it are tested through them: test_engine_fairness,
test_serve_replicas.)"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry, Counter

from engine import (
    AdmissionLedger,
    EngineClosedError,
    EngineFailedError,
    QueueFullError,
    RequestCost,
    ServingLimits,
    SessionLimitError,
)

UNIT = 100  # the cost of a default request in these tests


@dataclass(frozen=True)
class Entry:
    request_id: str
    session_id: str
    cost: RequestCost


def entry(request_id: str, session: str = "s", units: int = 1) -> Entry:
    return Entry(request_id, session, RequestCost(rows=1, tokens=UNIT, steps=units))


def ledger(**kwargs) -> tuple[AdmissionLedger, Counter]:
    rejected = Counter("rejected", "refusals", ["reason"], registry=CollectorRegistry())
    return AdmissionLedger(rejected, **kwargs), rejected


def refusals(rejected: Counter) -> dict[str, float]:
    return {sample.labels["reason"]: sample.value for sample in rejected.collect()[0].samples
            if sample.name.endswith("_total")}


def admit(book: AdmissionLedger, item: Entry, limits: ServingLimits, **kwargs) -> None:
    with book.admitting(item, limits, UNIT, **kwargs):
        pass


def test_the_queue_the_session_count_and_the_session_cost_are_each_refused_and_counted_once():
    book, rejected = ledger()
    limits = ServingLimits(max_queue=3, max_per_session=2, max_session_cost=3.0)
    admit(book, entry("a1", "a", units=2), limits)
    with pytest.raises(SessionLimitError, match=r"already cost 2\.0 default requests and this one costs 2\.0"):
        admit(book, entry("a2", "a", units=2), limits)
    admit(book, entry("a2", "a", units=1), limits)
    with pytest.raises(SessionLimitError, match=r"already has 2 requests in flight \(limit 2\)"):
        admit(book, entry("a3", "a"), limits)
    admit(book, entry("b1", "b", units=50), limits)  # a session with nothing in flight may always send one
    with pytest.raises(QueueFullError, match=r"the queue is full \(3 requests in flight\)"):
        admit(book, entry("c1", "c"), limits)
    assert [e.request_id for e in book.entries()] == ["a1", "a2", "b1"] and len(book) == 3
    assert refusals(rejected) == {"session_limit": 2.0, "queue_full": 1.0}


def test_a_waiting_caller_is_refused_without_being_counted():
    book, rejected = ledger()
    limits = ServingLimits(max_per_session=1)
    admit(book, entry("a1"), limits)
    with pytest.raises(SessionLimitError):
        admit(book, entry("a2"), limits, count_no_room=False)
    assert refusals(rejected) == {}


def test_released_slots_free_the_session_once_and_the_count_is_reported():
    counts: list[int] = []
    book, _ = ledger(on_count=counts.append)
    limits = ServingLimits(max_per_session=1)
    first = entry("a1")
    admit(book, first, limits)
    assert book.release([first, first]) == [first]
    assert book.release([first]) == [] and book.get("a1") is None
    admit(book, entry("a2"), limits)  # the session's one slot is free again
    assert counts == [1, 0, 1]


def test_an_error_in_the_admitting_body_takes_the_entry_back_out():
    counts: list[int] = []
    book, _ = ledger(on_count=counts.append)
    with pytest.raises(RuntimeError, match="queue closed"):
        with book.admitting(entry("a1"), ServingLimits(max_per_session=1), UNIT):
            raise RuntimeError("queue closed")
    assert len(book) == 0 and counts == [1, 0]
    admit(book, entry("a2"), ServingLimits(max_per_session=1))


def test_closing_runs_its_step_once_under_the_lock_and_refuses_everyone_after():
    book, rejected = ledger(owner="the studio")
    steps: list[bool] = []
    assert book.close(then=lambda: steps.append(book._lock.locked())) is True
    assert book.close(then=lambda: steps.append(True)) is False
    assert steps == [True] and book.closed and book.failure is None
    with pytest.raises(EngineClosedError, match="^the studio is shutting down; no new requests are accepted.$"):
        book.check_open()
    with pytest.raises(EngineClosedError):
        admit(book, entry("a1"), ServingLimits())
    assert refusals(rejected) == {"closed": 2.0}


def test_a_failure_is_kept_even_after_a_normal_close_and_named_in_every_refusal():
    book, _ = ledger()
    book.close()
    assert book.close(failure="the engine stopped after an internal error (boom)") is False
    assert book.failure == "the engine stopped after an internal error (boom)"
    with pytest.raises(EngineFailedError, match=r"^the engine stopped after an internal error \(boom\); no new"):
        admit(book, entry("a1"), ServingLimits())


def test_admissions_from_many_threads_never_pass_the_session_limit():
    book, rejected = ledger()
    limits = ServingLimits(max_per_session=5, max_queue=1000)
    outcomes: list[bool] = []

    def try_one(index: int) -> None:
        try:
            admit(book, entry(f"r{index}"), limits)
            outcomes.append(True)
        except SessionLimitError:
            outcomes.append(False)

    threads = [threading.Thread(target=try_one, args=(i,)) for i in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (outcomes.count(True), len(book), refusals(rejected)) == (5, 5, {"session_limit": 35.0})

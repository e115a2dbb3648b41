"""The facade's metrics: every replica's engine metrics (label `replica`) and its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client import Counter as PromCounter

from serve.board import ReplicaBoard

RELAY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)


class ReplicatedMetrics:
    """`exposition()`: every replica's engine metrics (label `replica`) and the facade's own."""

    def __init__(self, board: ReplicaBoard) -> None:
        self._board = board
        self.registry = CollectorRegistry()
        r = self.registry
        self.replicas_live = Gauge("stepstudio_replicas_live", "Engine replicas that reported recently", registry=r)
        self.requests_in_flight = Gauge(
            "stepstudio_replicated_requests_in_flight", "Requests submitted through this studio and not ended", registry=r)
        self.requests_lost = PromCounter(
            "stepstudio_replica_lost_requests", "Requests failed because their engine replica died and none was left",
            registry=r)
        self.requests_rerun = PromCounter(
            "stepstudio_replica_rerun_requests",
            "Requests run again from the start on another replica because theirs died", registry=r)
        self.requests_rejected = PromCounter(
            "stepstudio_replicated_requests_rejected", "Submissions refused by the studio's admission", ["reason"],
            registry=r)
        for reason in ("invalid", "queue_full", "session_limit", "closed", "unavailable"):
            self.requests_rejected.labels(reason)
        # The studio's workflow runs set it, as on one engine; named apart from the replicas' own
        # (always 0: runs live in the studio), which /metrics carries too.
        self.branches_waiting = Gauge(
            "stepstudio_replicated_workflow_branches_waiting",
            "Workflow branches waiting in their run's own queue for room in their session (not yet submitted)",
            registry=r)
        self.relay_seconds = Histogram(
            "stepstudio_relay_seconds", "A replica's progress event, from its engine to this studio (Ray's stream)",
            buckets=RELAY_BUCKETS, registry=r)

    def exposition(self) -> bytes:
        return self._board.exposition() + generate_latest(self.registry)

"""Every replica seen together: the latest report of each, one snapshot, one metrics text.

The facade refreshes the board from all replicas' reports a few times a second; the studio's
views and `/metrics` read it without waiting on any replica.

- `snapshot()` is a `ReplicatedSnapshot`: an `EngineSnapshot` of every replica's requests
  (request ids as the studio knows them, times on the local clock) and summed figures, plus
  `replicas`: (label, that replica's own snapshot) pairs for a per-replica queue view.
- `exposition()` is every replica's Prometheus text with a `replica` label on each sample.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, replace

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from engine import EngineSnapshot, EngineStats, RequestView, StageStats
from serve.wire import ReplicaReport


@dataclass(frozen=True)
class ReplicatedSnapshot(EngineSnapshot):
    """Every replica's requests in one snapshot; `replicas` keeps each replica's own."""

    replicas: tuple[tuple[str, EngineSnapshot], ...] = ()


@dataclass(frozen=True)
class _Seen:
    report: ReplicaReport
    clock_offset: float  # add to the replica's perf_counter times to get ours
    received_at: float  # our perf_counter


class ReplicaBoard:
    """Latest report per replica; a replica not heard from for `stale_after_s` is gone."""

    def __init__(self, stale_after_s: float) -> None:
        self.stale_after_s = stale_after_s
        self._seen: dict[str, _Seen] = {}  # replica id -> latest report

    def update(self, reports: list[ReplicaReport], received_at: float, sent_at: float | None = None) -> None:
        """Reports asked for at `sent_at` and in at `received_at` (our clock): each replica's clock
        is taken to have read `report.clock` halfway between."""
        midpoint = received_at if sent_at is None else (sent_at + received_at) / 2
        for report in reports:
            self._seen[report.replica_id] = _Seen(report, midpoint - report.clock, received_at)
        self._seen = {rid: seen for rid, seen in self._seen.items() if received_at - seen.received_at <= self.stale_after_s}

    def forget(self, replica_id: str) -> None:
        """A replica is known dead (one of its streams broke): drop it now, not when stale."""
        self._seen.pop(replica_id, None)

    @property
    def reports(self) -> list[ReplicaReport]:
        return [seen.report for seen in self._ordered()]

    @property
    def live_count(self) -> int:
        return sum(seen.report.alive for seen in self._seen.values())

    def clock_offset(self, replica_id: str) -> float:
        seen = self._seen.get(replica_id)
        return 0.0 if seen is None else seen.clock_offset

    def _ordered(self) -> list[_Seen]:
        return sorted(self._seen.values(), key=lambda seen: (seen.report.replica, seen.report.replica_id))

    # ------------------------------------------------------------------ snapshot
    def snapshot(self, our_ids: dict[str, str], mode: str = "step", max_batch_requests: int = 0) -> ReplicatedSnapshot:
        """`our_ids`: replica engine id -> the id the studio knows the request by."""
        parts = [(seen.report.replica, _localized(seen.report.snapshot, seen.clock_offset, our_ids))
                 for seen in self._ordered()]
        snapshots = [part for _, part in parts]
        stats = _summed_stats([s.stats for s in snapshots], mode, max_batch_requests)
        requests = tuple(view for s in snapshots for view in s.requests)
        return ReplicatedSnapshot(taken_at=time.perf_counter(), requests=requests, stats=stats, replicas=tuple(parts))

    # ------------------------------------------------------------------ metrics
    def exposition(self) -> bytes:
        """Every replica's metrics, each sample labelled with its replica."""
        families: dict[str, Metric] = {}
        for seen in self._ordered():
            label = seen.report.replica
            for family in text_string_to_metric_families(seen.report.metrics.decode("utf-8")):
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                for sample in family.samples:
                    merged.samples.append(sample._replace(labels={**sample.labels, "replica": label}))
        return generate_latest(_Families(list(families.values())))


class _Families:
    """What `generate_latest` reads: an object with `collect()`."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self):
        return iter(self._families)


def _localized(snapshot: EngineSnapshot, offset: float, our_ids: dict[str, str]) -> EngineSnapshot:
    """The replica's snapshot on our clock, with the studio's request ids."""

    def our(request_id: str) -> str:
        return our_ids.get(request_id, request_id)

    def view(v: RequestView) -> RequestView:
        return replace(
            v, request_id=our(v.request_id), batch=tuple(our(r) for r in v.batch),
            submitted_at=v.submitted_at + offset, started_at=None if v.started_at is None else v.started_at + offset,
        )

    return EngineSnapshot(taken_at=snapshot.taken_at + offset, requests=tuple(view(v) for v in snapshot.requests),
                          stats=snapshot.stats, pauses=snapshot.pauses)


def _summed_stats(stats: list[EngineStats], mode: str, max_batch_requests: int) -> EngineStats:
    """Figures of all replicas together: counts and rates add up, stage times average."""
    forwards_by_size: Counter = Counter()
    finished: Counter = Counter()
    for s in stats:
        forwards_by_size.update(s.forwards_by_batch_size)
        finished.update(s.finished)

    def averaged(stages: list[StageStats]) -> StageStats:
        def mean(name: str) -> float | None:
            values = [getattr(s, name) for s in stages if getattr(s, name) is not None]
            return sum(values) / len(values) if values else None
        return StageStats(encode_s=mean("encode_s"), denoise_step_s=mean("denoise_step_s"), decode_s=mean("decode_s"))

    models = dict.fromkeys(model for s in stats for model in s.stages_by_model)

    return EngineStats(
        mode=stats[0].mode if stats else mode,
        max_batch_requests=sum(s.max_batch_requests for s in stats) or max_batch_requests,
        current_batch_size=sum(s.current_batch_size for s in stats),
        current_batch_tokens=sum(s.current_batch_tokens for s in stats),
        steps_per_s=sum(s.steps_per_s for s in stats),
        forwards=sum(s.forwards for s in stats),
        forwards_by_batch_size=dict(forwards_by_size),
        finished=dict(finished),
        stages=averaged([s.stages for s in stats]),
        stages_by_model={model: averaged([s.stages_by_model[model] for s in stats if model in s.stages_by_model])
                         for model in models},
        rows_computed=sum(s.rows_computed for s in stats),
        rows_skipped=sum(s.rows_skipped for s in stats),
    )

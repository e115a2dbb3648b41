"""Prometheus metrics of one engine (its own registry, so several engines can coexist in tests)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Buckets sized for both a CPU toy model (ms) and real GPU models (seconds).
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


class EngineMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests_finished = Counter(
            "stepstudio_requests_finished", "Requests that ended, by final status", ["status"], registry=r
        )
        self.requests_submitted = Counter("stepstudio_requests_submitted", "Requests accepted into the queue", registry=r)
        self.requests_rejected = Counter(
            "stepstudio_requests_rejected",
            "Submissions refused before queueing, once per refused call (a workflow run's branch waiting for room is "
            "not one: see stepstudio_workflow_branches_waiting)",
            ["reason"],
            registry=r,
        )
        self.errors = Counter("stepstudio_errors", "Requests ended by an error, by failing stage", ["stage"], registry=r)
        self.queue_depth = Gauge("stepstudio_queue_depth", "Requests waiting to be admitted", registry=r)
        self.running = Gauge("stepstudio_running_requests", "Requests admitted and not finished", registry=r)
        # Set by the studio's workflow runs (studio/workflows/run.py), which submit through this engine.
        self.branches_waiting = Gauge(
            "stepstudio_workflow_branches_waiting",
            "Workflow branches waiting in their run's own queue for room in their session (not yet submitted)",
            registry=r,
        )
        self.batch_size = Histogram(
            "stepstudio_batch_size",
            "Requests per model forward (a request with true CFG puts 2 rows in it: see stepstudio_forward_rows)",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.forward_rows = Histogram(
            "stepstudio_forward_rows", "Model rows per forward (CFG negative rows included)", buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.rows_computed = Counter(
            "stepstudio_rows_computed", "Model rows that ran every block of the model (CFG negative rows included)",
            registry=r,
        )
        self.rows_skipped = Counter(
            "stepstudio_rows_skipped",
            "Model rows that reused their request's cached residual instead of the model's later blocks "
            "(step caching, GenerationParams.step_cache)",
            registry=r,
        )
        self.forward_rows_skipped = Histogram(
            "stepstudio_forward_rows_skipped", "Model rows per forward that reused their cached residual (step caching)",
            buckets=(0,) + _BATCH_BUCKETS, registry=r,
        )
        self.step_seconds = Histogram(
            "stepstudio_step_seconds", "Wall time of one engine step (forward + updates)", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.request_latency = Histogram(
            "stepstudio_request_latency_seconds", "Submit to final image", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.admission_latency = Histogram(
            "stepstudio_admission_latency_seconds",
            "Submit to first denoise step",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.first_preview_latency = Histogram(
            "stepstudio_first_preview_seconds", "Submit to first live preview", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.cancel_latency = Histogram(
            "stepstudio_cancel_latency_seconds", "Cancel call to slot freed", buckets=_LATENCY_BUCKETS, registry=r
        )

        # Known label values start at 0 so dashboards and rate() see a series before its first event.
        for status in ("completed", "aborted", "error"):
            self.requests_finished.labels(status)
        for reason in ("invalid", "queue_full", "session_limit", "closed"):
            self.requests_rejected.labels(reason)
        for stage in ("prepare_encode", "denoise_step", "step_scheduler", "post_decode", "engine"):
            self.errors.labels(stage)

    def record_skips(self, forward_rows: int, skipped_rows: int) -> None:
        """One forward's rows: those that computed and those that reused their cached residual."""
        self.rows_computed.inc(forward_rows - skipped_rows)
        self.rows_skipped.inc(skipped_rows)
        self.forward_rows_skipped.observe(skipped_rows)

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric of this engine."""
        return generate_latest(self.registry)

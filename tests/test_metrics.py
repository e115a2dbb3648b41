"""The engine's Prometheus metrics, as GET /metrics shows them, move with what really happens."""

from __future__ import annotations

import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from engine import (
    EngineClosedError,
    GenerationParams,
    QueueFullError,
    ServingLimits,
    SessionLimitError,
)
from tests.test_http_api import metric, raw_post, running_api, wait_until

FAMILIES = {
    "stepstudio_requests_finished": "counter",
    "stepstudio_requests_submitted": "counter",
    "stepstudio_requests_rejected": "counter",
    "stepstudio_errors": "counter",
    "stepstudio_queue_depth": "gauge",
    "stepstudio_running_requests": "gauge",
    "stepstudio_workflow_branches_waiting": "gauge",
    "stepstudio_batch_size": "histogram",
    "stepstudio_forward_rows": "histogram",
    "stepstudio_step_seconds": "histogram",
    "stepstudio_request_latency_seconds": "histogram",
    "stepstudio_admission_latency_seconds": "histogram",
    "stepstudio_first_preview_seconds": "histogram",
    "stepstudio_cancel_latency_seconds": "histogram",
}


class Counts:
    """Deltas of /metrics samples since this object was made."""

    def __init__(self, http) -> None:
        self.http = http
        self.names = [
            ("stepstudio_requests_submitted_total", {}),
            *[("stepstudio_requests_finished_total", {"status": s}) for s in ("completed", "error", "aborted")],
            *[("stepstudio_requests_rejected_total", {"reason": r}) for r in ("invalid", "queue_full", "closed")],
            ("stepstudio_errors_total", {"stage": "denoise_step"}),
            ("stepstudio_request_latency_seconds_count", {}),
            ("stepstudio_admission_latency_seconds_count", {}),
            ("stepstudio_cancel_latency_seconds_count", {}),
        ]
        self.before = self._read()

    def _read(self) -> dict[str, float]:
        return {self._key(n, l): metric(self.http, n, **l) for n, l in self.names}

    @staticmethod
    def _key(name: str, labels: dict) -> str:
        return name + "".join(f"[{v}]" for v in labels.values())

    def delta(self, api) -> dict[str, float]:
        # A response can beat the engine's bookkeeping by a moment: wait for the published idle state.
        wait_until(lambda: not api.engine.snapshot().requests, what="the engine to settle")
        now = self._read()
        return {key: now[key] - self.before[key] for key in now if now[key] != self.before[key]}


def test_metrics_endpoint_serves_every_family_in_prometheus_text():
    with running_api() as api:
        response = api.http.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"] == CONTENT_TYPE_LATEST
        families = {family.name: family for family in text_string_to_metric_families(response.text)}
        assert {name: families[name].type for name in FAMILIES if name in families} == FAMILIES
        # What the batch figures count is said in their help text.
        assert families["stepstudio_batch_size"].documentation.startswith("Requests per model forward")
        assert families["stepstudio_forward_rows"].documentation.startswith("Model rows per forward")
        # Known labels exist at 0 before anything happened (so rate() works from the start).
        assert metric(api.http, "stepstudio_requests_finished_total", status="error") == 0
        assert metric(api.http, "stepstudio_requests_rejected_total", reason="queue_full") == 0


def test_counters_move_as_requests_complete_fail_and_are_cancelled():
    with running_api(step_delay_s=0.01) as api:
        counts = Counts(api.http)
        steps_before = metric(api.http, "stepstudio_step_seconds_count")

        ok = api.http.post("/v1/images/generations", json={"prompt": "a cat", "n": 2, "num_inference_steps": 4})
        assert ok.status_code == 200
        assert counts.delta(api) == {
            "stepstudio_requests_submitted_total": 2,
            "stepstudio_requests_finished_total[completed]": 2,
            "stepstudio_request_latency_seconds_count": 2,
            "stepstudio_admission_latency_seconds_count": 2,
        }
        # 2 requests x 4 steps = 8 rows, in 4 shared forwards (5 if the 2nd arrived a step late).
        assert metric(api.http, "stepstudio_batch_size_sum") == 8
        assert metric(api.http, "stepstudio_step_seconds_count") - steps_before in (4, 5)

        failed = api.http.post("/v1/images/generations", json={"prompt": "boom [fail:denoise_step]"})
        assert failed.status_code == 500
        counts = Counts(api.http)
        invalid = api.http.post("/v1/images/generations", json={"prompt": "a cat", "size": "60x64"})
        assert invalid.status_code == 400
        assert counts.delta(api) == {"stepstudio_requests_rejected_total[invalid]": 1}

        counts = Counts(api.http)
        sock = raw_post(api.url, {"prompt": "a slow one", "num_inference_steps": 100})
        wait_until(lambda: metric(api.http, "stepstudio_running_requests") == 1, what="running gauge = 1")
        sock.close()
        wait_until(lambda: metric(api.http, "stepstudio_running_requests") == 0, what="running gauge = 0")
        assert counts.delta(api) == {
            "stepstudio_requests_submitted_total": 1,
            "stepstudio_requests_finished_total[aborted]": 1,
            "stepstudio_admission_latency_seconds_count": 1,
            "stepstudio_cancel_latency_seconds_count": 1,
        }
        totals = {
            status: metric(api.http, "stepstudio_requests_finished_total", status=status)
            for status in ("completed", "error", "aborted")
        }
        assert totals == {"completed": 2, "error": 1, "aborted": 1}
        assert metric(api.http, "stepstudio_errors_total", stage="denoise_step") == 1


def test_queue_gauges_and_rejections():
    with running_api(step_delay_s=0.01, max_batch_requests=1, limits=ServingLimits(max_queue=2)) as api:
        first = api.engine.submit(GenerationParams(prompt="one", num_inference_steps=100), session_id="a")
        second = api.engine.submit(GenerationParams(prompt="two", num_inference_steps=100), session_id="b")
        wait_until(
            lambda: (metric(api.http, "stepstudio_running_requests"), metric(api.http, "stepstudio_queue_depth")) == (1, 1),
            what="one request running and one waiting",
        )

        full = api.http.post("/v1/images/generations", json={"prompt": "three"})
        assert full.status_code == 429
        with pytest.raises(QueueFullError):
            api.engine.submit(GenerationParams(prompt="four"), session_id="c")
        assert metric(api.http, "stepstudio_requests_rejected_total", reason="queue_full") == 2

        first.cancel()
        second.cancel()
        wait_until(lambda: metric(api.http, "stepstudio_queue_depth") == 0, what="queue depth = 0")
        assert metric(api.http, "stepstudio_running_requests") == 0

        api.engine.close()
        closed = api.http.post("/v1/images/generations", json={"prompt": "five"})
        assert closed.status_code == 503
        with pytest.raises(EngineClosedError):
            api.engine.submit(GenerationParams(prompt="six"))
        assert metric(api.http, "stepstudio_requests_rejected_total", reason="closed") == 2


def test_a_refused_call_counts_once_and_a_request_kept_waiting_not_at_all():
    with running_api(step_delay_s=0.01, limits=ServingLimits(max_per_session=1, max_queue=2)) as api:
        def rejected(reason: str) -> float:
            return metric(api.http, "stepstudio_requests_rejected_total", reason=reason)

        held = api.engine.submit(GenerationParams(prompt="one", num_inference_steps=100), session_id="a")
        with pytest.raises(SessionLimitError, match="already has 1 requests in flight"):
            api.engine.submit(GenerationParams(prompt="two"), session_id="a")
        assert rejected("session_limit") == 1
        # A caller that keeps its request waiting and tries again (a workflow run's branch) was
        # not refused: however often it tries, nothing more is counted.
        for _ in range(3):
            with pytest.raises(SessionLimitError):
                api.engine.submit(GenerationParams(prompt="two"), session_id="a", from_waiting_queue=True)
        assert rejected("session_limit") == 1

        other = api.engine.submit(GenerationParams(prompt="three", num_inference_steps=100), session_id="b")
        with pytest.raises(QueueFullError):
            api.engine.submit(GenerationParams(prompt="four"), session_id="c")
        with pytest.raises(QueueFullError):
            api.engine.submit(GenerationParams(prompt="four"), session_id="c", from_waiting_queue=True)
        assert (rejected("queue_full"), rejected("session_limit")) == (1, 1)
        assert metric(api.http, "stepstudio_workflow_branches_waiting") == 0  # no workflow run here
        held.cancel()
        other.cancel()


def test_first_preview_latency_is_observed_once_per_request():
    with running_api() as api:
        handles = [
            api.engine.submit(GenerationParams(prompt=f"p{i}", num_inference_steps=6, preview_every=2), session_id="s")
            for i in range(2)
        ]
        for handle in handles:
            handle.result(timeout=30)
        assert metric(api.http, "stepstudio_first_preview_seconds_count") == 2
        api.engine.submit(GenerationParams(prompt="no previews", num_inference_steps=3)).result(timeout=30)
        assert metric(api.http, "stepstudio_first_preview_seconds_count") == 2

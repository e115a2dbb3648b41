"""The replica machinery's pure parts, without Ray: the routing policy and its bookkeeping, the
board that merges replicas' snapshots and metrics, what crosses the process boundary, the
settings a Serve config gives, the per-replica queue view, and that nothing of Ray is imported
without --replicas."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from engine import (
    Aborted,
    Completed,
    EngineClosedError,
    EngineFailedError,
    EngineSnapshot,
    EngineStats,
    GenerationParams,
    Progress,
    QueueFullError,
    RequestView,
    SessionLimitError,
    Timings,
)
from engine.metrics import EngineMetrics
from engine.snapshot import StageStats
from serve.board import ReplicaBoard
from serve.routing import RESERVATION_TTL_S, ReplicaLoad, RoutingTable, preference_order
from serve.settings import ServeSettings, settings_from_args
from serve.wire import (
    Rejected,
    ReplicaReport,
    WireProgress,
    event_from_wire,
    event_to_wire,
)
from studio.page.ui import render_queues

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------- routing policy
def test_a_replica_running_the_key_with_room_comes_first_even_when_busier():
    loads = [ReplicaLoad("a", in_flight=1, with_key=0), ReplicaLoad("b", in_flight=5, with_key=3)]
    assert preference_order(loads, max_batch_requests=8) == ["b", "a"]


def test_a_full_batch_sends_the_request_to_the_least_loaded_replica():
    loads = [ReplicaLoad("a", in_flight=2, with_key=0), ReplicaLoad("b", in_flight=8, with_key=8),
             ReplicaLoad("c", in_flight=3, with_key=1)]
    # c runs the key with room; b's batch of the key is full, so b goes last (most loaded).
    assert preference_order(loads, max_batch_requests=8) == ["c", "a", "b"]
    loads[2] = ReplicaLoad("c", in_flight=3, with_key=0)
    assert preference_order(loads, max_batch_requests=8) == ["a", "c", "b"]


def test_among_replicas_with_room_the_least_loaded_wins_then_the_fuller_batch():
    loads = [ReplicaLoad("a", 4, 2), ReplicaLoad("b", 3, 1), ReplicaLoad("c", 3, 2)]
    assert preference_order(loads, max_batch_requests=4) == ["c", "b", "a"]


def test_idle_replicas_are_ordered_by_id_for_stable_choices():
    assert preference_order([ReplicaLoad("b", 0, 0), ReplicaLoad("a", 0, 0)], 8) == ["a", "b"]


def test_the_table_counts_reservations_and_confirmed_requests_until_released():
    table = RoutingTable()
    table.reserve("r1", "a", "K", now=0.0)
    table.confirm("r2", "b", "J", now=0.0)
    table.reserve("r3", "a", "J", now=0.0)
    assert table.loads(["a", "b"], "K", now=1.0) == [ReplicaLoad("a", 2, 1), ReplicaLoad("b", 1, 0)]
    table.confirm("r1", "b", "K", now=1.0)  # Serve sent it elsewhere after all
    assert table.replica_of("r1") == "b"
    assert table.loads(["a", "b"], "K", now=1.0) == [ReplicaLoad("a", 1, 0), ReplicaLoad("b", 2, 1)]
    table.release("r2")
    assert table.loads(["a", "b"], "J", now=1.0) == [ReplicaLoad("a", 1, 1), ReplicaLoad("b", 1, 0)]


def test_an_unconfirmed_reservation_expires_and_a_dead_replica_is_forgotten():
    table = RoutingTable()
    table.reserve("r1", "a", "K", now=0.0)
    table.confirm("r2", "a", "K", now=0.0)
    table.confirm("r3", "b", "K", now=0.0)
    assert table.loads(["a"], "K", now=RESERVATION_TTL_S + 1)[0] == ReplicaLoad("a", 1, 1)
    table.forget_replica("b")
    assert table.loads(["b"], "K", now=RESERVATION_TTL_S + 1)[0] == ReplicaLoad("b", 0, 0)
    assert table.replica_of("r3") is None


# ---------------------------------------------------------------------------- the board
def _stats(batch: int, finished: dict, step_s: float | None, forwards: dict) -> EngineStats:
    return EngineStats(mode="step", max_batch_requests=4, current_batch_size=batch, steps_per_s=10.0 * batch,
                       forwards=sum(forwards.values()), forwards_by_batch_size=forwards, finished=finished,
                       stages=StageStats(encode_s=None, denoise_step_s=step_s, decode_s=0.5),
                       stages_by_model={"m": StageStats(denoise_step_s=step_s)})


def _view(request_id: str, session: str, batch: tuple[str, ...], submitted: float, started: float | None) -> RequestView:
    return RequestView(request_id=request_id, session_id=session, prompt="p", state="running" if started else "waiting",
                       step=1 if started else 0, total=8, position=None if started else 1, submitted_at=submitted,
                       started_at=started, batch=batch, eta_s=None)


def _report(replica_id: str, label: str, clock: float, views: tuple, stats: EngineStats, metrics: bytes = b"",
            alive: bool = True) -> ReplicaReport:
    return ReplicaReport(replica_id=replica_id, replica=label, pid=1, device="cpu", clock=clock,
                         snapshot=EngineSnapshot(taken_at=clock, requests=views, stats=stats), metrics=metrics,
                         alive=alive, failure=None)


def test_the_board_merges_snapshots_with_our_ids_and_clock():
    board = ReplicaBoard(stale_after_s=2.0)
    r0 = _report("id0", "replica 0", clock=100.0,
                 views=(_view("e1", "s1", ("e1", "e2"), 90.0, 95.0), _view("e2", "s2", ("e1", "e2"), 91.0, 95.0)),
                 stats=_stats(2, {"completed": 3}, 0.2, {1: 2, 2: 5}))
    r1 = _report("id1", "replica 1", clock=5000.0, views=(_view("e3", "s1", (), 4990.0, None),),
                 stats=_stats(0, {"completed": 1, "aborted": 2}, 0.4, {1: 1}))
    board.update([r1, r0], received_at=1000.0)
    snapshot = board.snapshot({"e1": "ours1", "e3": "ours3"})
    assert [label for label, _ in snapshot.replicas] == ["replica 0", "replica 1"]
    assert [v.request_id for v in snapshot.requests] == ["ours1", "e2", "ours3"]
    first = snapshot.requests[0]
    assert first.batch == ("ours1", "e2") and first.batch_mates == ("e2",)
    # Replica 0's clock is 900 s behind ours, replica 1's 4000 s ahead.
    assert (first.submitted_at, first.started_at) == (990.0, 995.0)
    assert snapshot.requests[2].submitted_at == 990.0 and snapshot.requests[2].started_at is None
    stats = snapshot.stats
    assert (stats.current_batch_size, stats.max_batch_requests, stats.forwards) == (2, 8, 8)
    assert stats.forwards_by_batch_size == {1: 3, 2: 5}
    assert stats.finished == {"completed": 4, "aborted": 2}
    assert stats.steps_per_s == 20.0
    assert stats.stages.denoise_step_s == pytest.approx(0.3) and stats.stages.encode_s is None
    assert stats.stages_by_model["m"].denoise_step_s == pytest.approx(0.3)  # each model's times too
    assert board.live_count == 2 and board.clock_offset("id1") == -4000.0


def test_a_replica_not_heard_from_goes_stale_and_a_dead_one_goes_at_once():
    board = ReplicaBoard(stale_after_s=2.0)
    stats = _stats(0, {}, None, {})
    board.update([_report("id0", "replica 0", 0.0, (), stats), _report("id1", "replica 1", 0.0, (), stats)], 10.0)
    board.update([_report("id0", "replica 0", 1.0, (), stats)], 11.5)
    assert [r.replica for r in board.reports] == ["replica 0", "replica 1"]
    board.update([_report("id0", "replica 0", 2.0, (), stats)], 12.5)
    assert [r.replica for r in board.reports] == ["replica 0"]
    board.forget("id0")
    assert board.reports == [] and board.live_count == 0


def test_the_board_labels_every_metric_sample_with_its_replica():
    board = ReplicaBoard(stale_after_s=2.0)
    reports = []
    for index, done in enumerate((3, 5)):
        metrics = EngineMetrics()
        metrics.requests_finished.labels("completed").inc(done)
        metrics.running.set(index + 1)
        reports.append(_report(f"id{index}", f"replica {index}", 0.0, (), _stats(0, {}, None, {}),
                               metrics=metrics.exposition()))
    board.update(reports, received_at=0.0)
    lines = board.exposition().decode().splitlines()
    assert 'stepstudio_requests_finished_total{replica="replica 0",status="completed"} 3.0' in lines
    assert 'stepstudio_requests_finished_total{replica="replica 1",status="completed"} 5.0' in lines
    assert 'stepstudio_running_requests{replica="replica 1"} 2.0' in lines
    assert sum(line.startswith("# TYPE stepstudio_running_requests ") for line in lines) == 1


# ---------------------------------------------------------------------------- the wire
def test_a_progress_preview_crosses_as_jpeg_and_comes_back_an_image():
    preview = Image.new("RGB", (32, 32), (200, 30, 40))
    wire = event_to_wire(Progress(step=3, total=8, batch_size=2, preview=preview))
    assert isinstance(wire, WireProgress) and wire.preview[:2] == b"\xff\xd8"
    event = event_from_wire(wire)
    assert (event.step, event.total, event.batch_size) == (3, 8, 2)
    assert event.preview.size == (32, 32)
    assert all(abs(a - b) <= 3 for a, b in zip(event.preview.getpixel((16, 16)), (200, 30, 40)))
    frames = event_from_wire(event_to_wire(Progress(1, 2, 1, preview=[preview, preview]))).preview
    assert [frame.size for frame in frames] == [(32, 32), (32, 32)]


def test_a_completed_event_keeps_its_image_exactly_and_moves_to_our_clock():
    image = Image.new("RGB", (8, 8), (1, 2, 3))
    completed = Completed(images=(image,), seed=7, params=GenerationParams(prompt="p"),
                          timings=Timings(submitted_at=10.0, started_at=11.0, finished_at=15.0))
    local = event_from_wire(event_to_wire(completed), clock_offset=100.0)
    assert local.images[0].tobytes() == image.tobytes()
    assert (local.timings.submitted_at, local.timings.started_at, local.timings.finished_at) == (110.0, 111.0, 115.0)
    assert event_from_wire(Aborted("x")) == Aborted("x")


@pytest.mark.parametrize(("error", "kind", "retry_elsewhere"), [
    (ValueError("width=65 is not allowed"), "invalid", False),
    (SessionLimitError("limit"), "session_limit", False),
    (QueueFullError("full"), "queue_full", True),
    (EngineClosedError("closed"), "closed", True),
    (EngineFailedError("crashed"), "failed", True),
])
def test_a_refusal_keeps_its_kind_and_message(error, kind, retry_elsewhere):
    rejected = Rejected.of(error, "id0")
    assert (rejected.kind, rejected.message, rejected.is_replica_trouble) == (kind, str(error), retry_elsewhere)
    again = rejected.as_error()
    assert type(again) is type(error) and str(again) == str(error)


# ---------------------------------------------------------------------------- settings
def test_serve_config_args_become_studio_options_and_a_deployment():
    options, settings = settings_from_args({"model": "toy", "max_batch": 4, "replicas": 3, "torch_threads": 2,
                                            "api_keys": [["alice", "sk-1"]], "auth": ["u", "p"]})
    assert (options.model, options.max_batch, options.api_keys, options.auth) == ("toy", 4, (("alice", "sk-1"),), ("u", "p"))
    assert isinstance(settings, ServeSettings)
    assert (settings.replicas, settings.cpus_per_replica, settings.gpus_per_replica) == (3, 2.0, 0.0)
    replica = settings.replica
    assert (replica.model, replica.max_batch, replica.torch_threads, replica.pin_cpus) == ("toy", 4, 2, True)
    assert replica.limits == options.limits
    assert settings.max_ongoing_requests == options.limits.max_queue + 16


def test_a_gpu_deployment_takes_one_gpu_per_replica_and_no_cpu_threads():
    _, settings = settings_from_args({"replicas": 8, "gpus_per_replica": 1})
    assert (settings.gpus_per_replica, settings.cpus_per_replica) == (1, 1.0)
    assert (settings.replica.torch_threads, settings.replica.pin_cpus) == (None, False)


def test_unknown_serve_config_args_are_named():
    with pytest.raises(ValueError, match=r"unknown args \['replica', 'threads'\]"):
        settings_from_args({"replica": 2, "threads": 1})
    with pytest.raises(ValueError, match="replicas must be a positive integer, got 0"):
        settings_from_args({"replicas": 0})


# ---------------------------------------------------------------------------- queue view
def test_the_queue_view_has_one_table_per_replica():
    board = ReplicaBoard(stale_after_s=2.0)
    stats = _stats(1, {}, 0.1, {})
    board.update([_report("id0", "replica 0", 0.0, (_view("aaaaaaaa11", "me", ("aaaaaaaa11",), 0.0, 0.5),), stats),
                  _report("id1", "replica 1", 0.0, (_view("bbbbbbbb22", "other", ("bbbbbbbb22",), 0.0, 0.5),), stats)],
                 received_at=1.0)
    html = render_queues(board.snapshot({}), "me", show_prompts=False)
    first, second = html.split('data-replica="replica 1"')
    assert 'data-replica="replica 0"' in first and "<code>aaaaaaaa</code>" in first and "bbbbbbbb" not in first
    assert "<code>bbbbbbbb</code>" in second
    plain = EngineSnapshot(taken_at=0.0, requests=(), stats=stats)
    assert "data-replica" not in render_queues(plain, "me", show_prompts=False)


# ---------------------------------------------------------------------------- no Ray by default
def test_the_default_app_never_imports_ray():
    code = ("import sys, app\n"
            "app.build_parser().parse_args(['--replicas', '2'])\n"
            "import studio.app, engine\n"
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.') or m == 'serve'))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"

"""Two engine replicas on a local Ray cluster, through the studio's facade (`ReplicatedEngine`).

One cluster for the module: 2 replicas of the toy model (a real step engine each, one core
each, 4 requests per forward, 50 ms per step), the Serve router of serve/router.py, no HTTP
proxy. Checked: events streamed from a replica (previews included) give the same image as a
local engine; a cancel reaches the replica and frees its slot within a step; requests join the
replica that runs their batch key until its batch is full; the queue view and /metrics show
both replicas; admission counts a session's requests on every replica; a replica killed while it
holds requests fails them at once, naming it, and the next request is served by the other (last:
Serve replaces the killed replica in the background; tests/test_serve_faults.py, slow, waits for it).
Needs the `serve` extra (pip install -e '.[serve]'); skipped without it.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install -e '.[serve]')")

from engine import (  # noqa: E402
    CLEAR_REASON,
    Aborted,
    Completed,
    Engine,
    Failed,
    GenerationParams,
    PauseState,
    Progress,
    Queued,
    ServingLimits,
    SessionLimitError,
)
from pipelines.toy import ToyPipeline  # noqa: E402
from serve.local import local_replicas  # noqa: E402
from serve.queue_control import same_pauses  # noqa: E402
from serve.settings import ReplicaSettings, ServeSettings  # noqa: E402
from studio.page.ui import render_queues  # noqa: E402

STEP_S = 0.05
MAX_BATCH = 4
LONG = 400  # steps: a request that runs until it is cancelled


@pytest.fixture(scope="module")
def engine():
    replica = ReplicaSettings(
        model="toy", pipeline_factory="pipelines.toy:ToyPipeline", pipeline_kwargs=(("step_delay_s", STEP_S),),
        max_batch=MAX_BATCH, limits=ServingLimits(max_steps=LONG, max_per_session=3), torch_threads=1, pin_cpus=True,
    )
    with local_replicas(ServeSettings(replica=replica, replicas=2, refresh_s=0.25)) as engine:
        yield engine


@pytest.fixture(autouse=True)
def no_pause_left_behind(engine):
    """A test that fails midway must not leave the next one a paused queue or engine."""
    yield
    for session in engine.pause_state.sessions:
        engine.resume_queue(session)
    if engine.pause_state.engine:
        engine.resume_engine()


def _admitted(engine, params: GenerationParams, session: str):
    """Submit, and wait until the replica's engine has queued it (so the next one is routed after)."""
    handle = engine.submit(params, session_id=session)
    assert isinstance(next(handle.events(timeout=60)), Queued)
    return handle


def _cancel_all(engine, handles) -> None:
    for handle in handles:
        handle.cancel()
    for handle in handles:
        assert isinstance(handle.result(timeout=30), Aborted)
    assert engine.requests_in_flight == 0


def _metric(engine, name: str, replica: str) -> float:
    prefix = f'{name}{{replica="{replica}"'
    values = [float(line.rsplit(" ", 1)[1]) for line in engine.metrics.exposition().decode().splitlines()
              if line.startswith(prefix)]
    assert len(values) == 1, (name, replica, values)
    return values[0]


def _step_buckets(engine, replica: str) -> dict[float, float]:
    """`replica`'s stepstudio_step_seconds histogram (a step: one forward and its updates): bound -> count."""
    counts = {}
    for line in engine.metrics.exposition().decode().splitlines():
        if line.startswith("stepstudio_step_seconds_bucket{") and f'replica="{replica}"' in line:
            counts[float(re.search(r'le="([^"]+)"', line).group(1))] = float(line.rsplit(" ", 1)[1])
    assert counts, replica
    return counts


def _slowest_step_since(before: dict[float, float], after: dict[float, float]) -> float:
    """The upper bound of the slowest step timed between two readings of a step histogram: the
    smallest bucket that holds every step since (the smallest bucket when none ran)."""
    since = {bound: after[bound] - before.get(bound, 0) for bound in after}
    return min(bound for bound, count in since.items() if count == since[float("inf")])


def test_the_facade_describes_the_replicas_model_and_limits(engine):
    assert (engine.info.name, engine.mode, engine.max_batch_requests, engine.limits.max_per_session) == ("toy", "step", 4, 3)
    assert sorted(report.replica for report in engine.replicas) == ["replica 0", "replica 1"]
    assert len({report.pid for report in engine.replicas}) == 2
    assert engine.is_alive and engine.failure is None
    assert (engine.models.names, engine.models.default, list(engine.infos)) == (("toy",), "toy", ["toy"])
    assert engine.limits_for("toy") == engine.limits and engine.limits.max_size == 64
    with pytest.raises(ValueError, match="model='sd' is not loaded here; the loaded models are: toy"):
        engine.limits_for("sd")
    assert not hasattr(engine.models["toy"], "unknown_words")  # the toy pipeline can't tell
    prepared = engine.prepare_params(GenerationParams(prompt="a red circle"))
    assert (prepared.model, prepared.width, prepared.height, prepared.num_inference_steps) == ("toy", 64, 64, 8)
    assert isinstance(prepared.seed, int)
    # The replica's engine prepares: the same params, batch key (as its repr, for the router) and cost.
    remote = engine.prepare(GenerationParams(prompt="a red circle", seed=3))
    local = Engine(ToyPipeline()).prepare(GenerationParams(prompt="a red circle", seed=3))
    assert (remote.params, remote.batch_key, remote.cost) == (local.params, repr(local.batch_key), local.cost)
    with pytest.raises(ValueError, match="width=60 must be a multiple of 8 for the toy model"):
        engine.submit(GenerationParams(prompt="x", width=60), session_id="bad")
    assert engine.requests_in_flight == 0


def test_progress_and_previews_stream_from_a_replica_as_from_a_local_engine(engine):
    params = GenerationParams(prompt="a red circle", num_inference_steps=6, seed=5, preview_every=2)
    local = Engine(ToyPipeline(), max_batch_requests=MAX_BATCH).start()
    try:
        expected = list(local.submit(params, session_id="local").events(timeout=60))
    finally:
        local.close()
    handle = engine.submit(params, session_id="stream")
    events = list(handle.events(timeout=60))
    assert [type(e).__name__ for e in events] == ["Queued", "Started"] + ["Progress"] * 6 + ["Completed"]
    progress = [e for e in events if isinstance(e, Progress)]
    assert [(p.step, p.total, p.batch_size) for p in progress] == [(step, 6, 1) for step in range(1, 7)]
    with_preview = [(p.step, p.preview.size) for p in progress if p.preview is not None]
    assert with_preview == [(2, (8, 8)), (4, (8, 8))]
    assert with_preview == [(e.step, e.preview.size) for e in expected if isinstance(e, Progress) and e.preview]
    final = events[-1]
    assert (final.seed, final.params, final.images[0].size) == (5, expected[-1].params, (64, 64))
    assert final.images[0].tobytes() == expected[-1].images[0].tobytes()
    assert engine.replica_of(handle.request_id) in ("replica 0", "replica 1")
    assert engine.requests_in_flight == 0


def test_a_cancel_reaches_the_replica_and_frees_its_slot_within_a_step(engine):
    handle = _admitted(engine, GenerationParams(prompt="long", num_inference_steps=LONG, seed=1), "cancel")
    for event in handle.events(timeout=60):
        if isinstance(event, Progress) and event.step >= 3:
            break
    replica = engine.replica_of(handle.request_id)
    engine.refresh()
    steps_before = _step_buckets(engine, replica)
    cancels_before = _metric(engine, "stepstudio_cancel_latency_seconds_count", replica)
    latency_before = _metric(engine, "stepstudio_cancel_latency_seconds_sum", replica)
    aborted_before = dict(engine.snapshot().replicas)[replica].stats.finished.get("aborted", 0)

    assert engine.cancel(handle.request_id, "cancel") is True
    assert handle.result(timeout=10) == Aborted("cancelled by the user", cause="cancelled")
    assert engine.requests_in_flight == 0
    # The replica's engine aborts it at its next step boundary: the request leaves its snapshot.
    deadline = time.monotonic() + 10
    while True:
        part = dict(engine.refresh().replicas)[replica]
        if part.stats.finished.get("aborted", 0) == aborted_before + 1:
            break
        assert time.monotonic() < deadline, "the replica never aborted the request"
    assert handle.request_id not in [view.request_id for view in part.requests]
    assert _metric(engine, "stepstudio_cancel_latency_seconds_count", replica) == cancels_before + 1
    # Its own measure, from the cancel reaching the engine to the slot freed: at most one step. It
    # is held against the replica's own slowest step while the cancel was on its way (the step
    # histogram's smallest bucket holding every step since just before the cancel), not against a
    # fixed time or the mean: a loaded machine slows both alike.
    latency = _metric(engine, "stepstudio_cancel_latency_seconds_sum", replica) - latency_before
    slowest = _slowest_step_since(steps_before, _step_buckets(engine, replica))
    assert latency <= slowest, (latency, slowest)


def test_requests_join_the_replica_running_their_batch_key_until_its_batch_is_full(engine):
    sizes = [64, 32, 64, 32, 64, 64, 64]
    handles = [_admitted(engine, GenerationParams(prompt=f"request {i}", width=size, height=size,
                                                  num_inference_steps=LONG), f"route-{i}")
               for i, size in enumerate(sizes)]
    placed = [engine.replica_of(handle.request_id) for handle in handles]
    first, second = placed[0], placed[1]
    assert first != second
    # 64 px requests join the first replica until it holds a full batch of 4; the 5th goes to
    # the least loaded replica (2 requests against 4).
    assert placed == [first, second, first, second, first, first, second]

    # The queue view and /metrics show both replicas, each with its own requests.
    snapshot = engine.refresh()
    parts = dict(snapshot.replicas)
    assert sorted(parts) == ["replica 0", "replica 1"]
    on = {label: {view.request_id for view in part.requests} for label, part in parts.items()}
    assert on[first] == {handles[i].request_id for i in (0, 2, 4, 5)}
    assert on[second] == {handles[i].request_id for i in (1, 3, 6)}
    assert {view.request_id for view in snapshot.requests} == {handle.request_id for handle in handles}
    html = render_queues(snapshot, "route-0", show_prompts=False)
    assert html.count('class="ss-replica"') == 2
    mine = html.split(f'data-replica="{first}"')[1].split('class="ss-replica"')[0]
    assert f"<code>{handles[0].request_id[:8]}</code>" in mine and "<td>you</td>" in mine
    for label, count in ((first, 4), (second, 3)):
        queued = _metric(engine, "stepstudio_queue_depth", label) + _metric(engine, "stepstudio_running_requests", label)
        assert queued == count
    _cancel_all(engine, handles)


def test_a_sessions_limit_counts_its_requests_on_every_replica(engine):
    handles = [_admitted(engine, GenerationParams(prompt=f"mine {size}", width=size, height=size,
                                                  num_inference_steps=LONG), "limited")
               for size in (64, 32, 16)]
    assert {engine.replica_of(handle.request_id) for handle in handles} == {"replica 0", "replica 1"}
    with pytest.raises(SessionLimitError, match=r"this session already has 3 requests in flight \(limit 3\)"):
        engine.submit(GenerationParams(prompt="one more"), session_id="limited")
    with pytest.raises(PermissionError, match="belongs to another session"):
        engine.cancel(handles[0].request_id, "someone else")
    _cancel_all(engine, handles)


def _until(what: str, check, timeout_s: float = 30.0):
    """Poll `check()` (each call refreshes what it needs) until it holds."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _replica_pauses(engine) -> list[PauseState]:
    engine.refresh()
    return [report.snapshot.pauses for report in engine.replicas]


def test_replica_pause_states_compare_by_what_they_hold():
    ours = PauseState(sessions=frozenset({"q"}), ends=(("q", 1000.0001),))
    assert same_pauses(PauseState(sessions=frozenset({"q"}), ends=(("q", 1000.0),)), ours)
    assert not same_pauses(PauseState(sessions=frozenset({"q"})), ours)  # no end
    assert not same_pauses(PauseState(engine=True, sessions=frozenset({"q"}), ends=ours.ends), ours)
    assert not same_pauses(PauseState(), ours)


def test_pause_move_clear_and_resume_reach_every_replica(engine):
    engine.pause_queue("q")
    ends = engine.pause_state.ends_at("q")
    assert ends is not None and engine.pause_reason("q") == "session"
    assert engine.snapshot().pauses.sessions == frozenset({"q"})  # the views say so at once
    # Every replica holds the pause, with the one end the facade chose.
    _until("both replicas paused", lambda: [p.ends_at("q") for p in _replica_pauses(engine)] == [ends, ends])
    held = []
    for size in (64, 32, 64):  # 64 px on one replica, 32 px on the other
        held.append(engine.submit(GenerationParams(prompt=f"held {size}", width=size, height=size,
                                                   num_inference_steps=LONG), session_id="q"))
        assert next(held[-1].events(timeout=60)).paused == "session"
    on = [engine.replica_of(handle.request_id) for handle in held]
    assert on[0] == on[2] != on[1]

    # A move applies on the replica that holds the request: the second 64 px request goes first there.
    assert engine.move_request(held[2].request_id, "q") is True
    _until("the moved request first on its replica", lambda: [
        (v.request_id, v.position, v.paused) for v in dict(engine.refresh().replicas)[on[0]].requests] == [
        (held[2].request_id, 1, "session"), (held[0].request_id, 2, "session")])
    with pytest.raises(ValueError, match=rf"request_id={held[1].request_id[:8]} waits on {on[1]} and "
                                         rf"before={held[0].request_id[:8]} on {on[0]}: with --replicas each replica"):
        engine.move_request(held[1].request_id, "q", before=held[0].request_id)
    with pytest.raises(PermissionError, match="belongs to another session"):
        engine.move_request(held[0].request_id, "someone else")
    assert engine.move_request("no-such-request", "q") is False

    # A clear reaches both replicas: nothing of the paused queue ever ran.
    assert engine.clear_queue("q") == 3
    assert [handle.result(timeout=30) for handle in held] == [Aborted(CLEAR_REASON, cause="cancelled")] * 3
    assert not any(isinstance(event, Progress) for handle in held for event in handle.history)

    engine.resume_queue("q")
    assert engine.pause_state.sessions == frozenset() and engine.pause_reason("q") == ""
    _until("both replicas resumed", lambda: all(p.sessions == frozenset() for p in _replica_pauses(engine)))
    after = engine.submit(GenerationParams(prompt="after the resume", num_inference_steps=4), session_id="q")
    assert isinstance(after.result(timeout=60), Completed)

    # The operator's pause holds every replica's queue; its resume lets it run.
    engine.pause_engine()
    _until("both replicas' engines paused", lambda: all(p.engine for p in _replica_pauses(engine)))
    waiting = engine.submit(GenerationParams(prompt="waits", num_inference_steps=4), session_id="r")
    assert next(waiting.events(timeout=60)).paused == "engine"
    engine.resume_engine()
    assert isinstance(waiting.result(timeout=60), Completed) and engine.requests_in_flight == 0


def test_a_replica_that_missed_a_change_is_told_the_pauses_again(engine):
    engine.pause_queue("s")
    ends = engine.pause_state.ends_at("s")
    _until("both replicas paused", lambda: [p.ends_at("s") for p in _replica_pauses(engine)] == [ends, ends])
    # Behind the facade's back (as a replica started after the pause would be): both resumed.
    engine._handle.broadcast("resume_queue", "s").results(timeout_s=30)
    time.sleep(0.3)  # their engines publish it; the facade sees reports that differ from its own pauses
    _until("the replicas paused again", lambda: [p.ends_at("s") for p in _replica_pauses(engine)] == [ends, ends])
    engine.resume_queue("s")
    _until("both replicas resumed", lambda: all(p.sessions == frozenset() for p in _replica_pauses(engine)))


def _counter(engine, name: str) -> float:
    lines = [line for line in engine.metrics.exposition().decode().splitlines() if line.startswith(name + " ")]
    assert len(lines) == 1, lines
    return float(lines[0].rsplit(" ", 1)[1])


RERUN_STEPS = 100  # 5 s at 50 ms a step: still running when its replica is killed


# Last in this module: the killed replica's replacement starts in the background after it.
def test_a_killed_replicas_requests_run_again_on_the_other_and_each_caller_gets_one_result(engine):
    """README, Ray Serve: "A replica that dies (SIGKILL in the tests) hands the requests it holds,
    running or queued, to the replicas that are up: each runs again from the start with its seed
    ... New requests go to the replicas that are up"."""
    held = [_admitted(engine, GenerationParams(prompt=f"held {i}", num_inference_steps=RERUN_STEPS, seed=10 + i),
                      f"held-{i}") for i in range(2)]
    other = _admitted(engine, GenerationParams(prompt="elsewhere", width=32, height=32, num_inference_steps=LONG),
                      "elsewhere")
    for handle in (*held, other):
        assert any(isinstance(event, Progress) for event in handle.events(timeout=60))  # running
    victim, survivor = engine.replica_of(held[0].request_id), engine.replica_of(other.request_id)
    assert engine.replica_of(held[1].request_id) == victim != survivor  # 64 px together, 32 px on the other
    engine.refresh()
    pid = {report.replica: report.pid for report in engine.replicas}[victim]
    lost_before = _counter(engine, "stepstudio_replica_lost_requests_total")
    rerun_before = _counter(engine, "stepstudio_replica_rerun_requests_total")

    os.kill(pid, signal.SIGKILL)
    # The other replica's request is untouched: still running (queued once) until cancelled.
    assert engine.cancel(other.request_id, "elsewhere") is True
    assert other.result(timeout=30) == Aborted("cancelled by the user", cause="cancelled")
    assert sum(isinstance(event, Queued) for event in other.history) == 1
    for handle in held:
        assert isinstance(handle.result(timeout=120), Completed)
        events = handle.history
        # One final event, after a second Queued: the request ran again from step 1.
        assert [type(event) for event in events if isinstance(event, (Completed, Aborted, Failed))] == [Completed]
        queued_at = [i for i, event in enumerate(events) if isinstance(event, Queued)]
        assert len(queued_at) == 2, [type(event).__name__ for event in events]
        again = [event.step for event in events[queued_at[1]:] if isinstance(event, Progress)]
        assert again == list(range(1, RERUN_STEPS + 1))
        assert engine.replica_of(handle.request_id) == survivor
    assert _counter(engine, "stepstudio_replica_rerun_requests_total") == rerun_before + 2
    assert _counter(engine, "stepstudio_replica_lost_requests_total") == lost_before
    # Run from the start with the same seed: the picture a request that never moved gives.
    for handle in held:
        fresh = engine.submit(handle.params, session_id="fresh").result(timeout=60)
        assert fresh.images[0].tobytes() == handle.last_event.images[0].tobytes()

    after = engine.submit(GenerationParams(prompt="after the kill", num_inference_steps=4), session_id="after")
    assert isinstance(after.result(timeout=60), Completed)  # on the survivor, or on Serve's replacement by now
    assert engine.requests_in_flight == 0

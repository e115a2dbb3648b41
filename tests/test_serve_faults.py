"""A replica killed mid-run (SIGKILL, as an OOM kill or a lost node would): its requests run again
on the survivor and each ends once, the other replica's requests finish, new requests succeed on
the survivor, and Serve brings the replica count back. Nothing hangs: every wait has a deadline.
Slow (a cluster of its own and Serve's replacement of the replica); needs the `serve` extra."""

from __future__ import annotations

import os
import signal
import time

import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install -e '.[serve]')")

from engine import Completed, Failed, GenerationParams, Progress, Queued, ServingLimits  # noqa: E402
from serve.local import local_replicas  # noqa: E402
from serve.settings import ReplicaSettings, ServeSettings  # noqa: E402

pytestmark = pytest.mark.slow

STEPS = 60  # 60 x 50 ms: the survivors are still running when the other replica dies


@pytest.fixture(scope="module")
def engine():
    replica = ReplicaSettings(
        model="toy", pipeline_factory="pipelines.toy:ToyPipeline", pipeline_kwargs=(("step_delay_s", 0.05),),
        max_batch=4, limits=ServingLimits(max_steps=STEPS), torch_threads=1, pin_cpus=True,
    )
    with local_replicas(ServeSettings(replica=replica, replicas=2, refresh_s=0.25)) as engine:
        yield engine


def test_a_killed_replicas_requests_finish_on_the_other_and_serve_replaces_it(engine):
    handles = []
    for i, size in enumerate((64, 32, 64, 32)):  # two batch keys: one per replica
        handle = engine.submit(GenerationParams(prompt=f"request {i}", width=size, height=size,
                                                num_inference_steps=STEPS), session_id=f"s{i}")
        assert isinstance(next(handle.events(timeout=60)), Queued)
        handles.append(handle)
    for handle in handles:
        assert any(isinstance(e, Progress) for e in handle.events(timeout=60))  # every one is running
    placed = [engine.replica_of(handle.request_id) for handle in handles]
    victim, survivor = placed[0], placed[1]
    assert victim != survivor and placed == [victim, survivor, victim, survivor]
    engine.refresh()
    pids = {report.replica: report.pid for report in engine.replicas}
    killed_at = time.monotonic()
    os.kill(pids[victim], signal.SIGKILL)

    finals = [handle.result(timeout=120) for handle in handles]
    assert [type(final) for final in finals] == [Completed] * 4
    for index in (0, 2):  # run again from step 1 on the survivor, after a second Queued
        assert sum(isinstance(event, Queued) for event in handles[index].history) == 2
        assert engine.replica_of(handles[index].request_id) == survivor
    assert engine.requests_in_flight == 0
    lines = engine.metrics.exposition().decode().splitlines()
    assert 'stepstudio_replica_rerun_requests_total 2.0' in lines
    assert 'stepstudio_replica_lost_requests_total 0.0' in lines

    after = engine.submit(GenerationParams(prompt="after the kill", num_inference_steps=4), session_id="after")
    assert isinstance(after.result(timeout=60), Completed)
    assert engine.replica_of(after.request_id) == survivor

    # Serve starts a replacement (the dead one's rank comes back with a new process).
    deadline = killed_at + 180
    while True:
        reports = {report.replica: report.pid for report in engine.replicas}
        if len(reports) == 2:
            break
        assert time.monotonic() < deadline, f"no replacement replica after 180 s: {reports}"
        time.sleep(engine.refresh_s)  # pacing only: the board is refreshed on its own
    assert reports[victim] != pids[victim] and reports[survivor] == pids[survivor]
    again = [engine.submit(GenerationParams(prompt=f"again {size}", width=size, height=size, num_inference_steps=4),
                           session_id=f"again{size}") for size in (64, 32)]
    assert [type(handle.result(timeout=60)) for handle in again] == [Completed, Completed]


def test_a_replica_whose_engine_crashed_fails_its_requests_by_name_and_is_replaced(engine):
    bystander = engine.submit(GenerationParams(prompt="a bystander", num_inference_steps=STEPS), session_id="by")
    assert any(isinstance(e, Progress) for e in bystander.events(timeout=60))
    where = engine.replica_of(bystander.request_id)
    engine.refresh()
    pid_before = {report.replica: report.pid for report in engine.replicas}[where]
    # Same batch key, room in the batch: the crashing request joins the bystander's replica.
    crash = engine.submit(GenerationParams(prompt="[crash] a red circle", num_inference_steps=STEPS), session_id="x")
    expected = Failed(f"the engine stopped after an internal error (EngineCrash: injected crash of the engine "
                      f"thread) ({where}; the other replicas keep serving)", stage="replica")
    assert crash.result(timeout=60) == expected
    assert bystander.result(timeout=60) == expected
    assert engine.replica_of(crash.request_id) == where

    # Until Serve's health check replaces it, the broken replica refuses and the facade retries elsewhere.
    after = engine.submit(GenerationParams(prompt="after the crash", num_inference_steps=4), session_id="after")
    assert isinstance(after.result(timeout=60), Completed)
    assert engine.replica_of(after.request_id) != where
    deadline = time.monotonic() + 180
    while True:
        reports = {report.replica: report for report in engine.replicas}
        if len(reports) == 2 and all(r.alive for r in reports.values()) and reports[where].pid != pid_before:
            break
        assert time.monotonic() < deadline, f"the crashed replica was not replaced in 180 s: {reports}"
        time.sleep(engine.refresh_s)  # pacing only: the board is refreshed on its own

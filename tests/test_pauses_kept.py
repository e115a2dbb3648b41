"""Paused queues outlive a restart: the store keeps each caller's pause with its end and the operator's
pause (schema version 4, migrated from 3 keeping every row); at start they are paused again, an ended
one is not, and the operator's only when an admin key can lift it. A real studio restarted on the same
outputs folder answers its caller "paused", until the same time."""

from __future__ import annotations

import sqlite3
import time

import httpx

from engine import Engine, GenerationParams, PauseState, ServingLimits
from pipelines.toy import ToyPipeline
from studio.store import database
from studio.store.pauses import keep_pauses
from studio.store.store import StudioStore
from tests.studio_helpers import live_studio
from tests.test_studio_store import opened_as_version


def test_a_version_3_database_migrates_to_4_with_no_pauses_and_its_rows_kept(tmp_path, monkeypatch):
    store = opened_as_version(3, tmp_path, monkeypatch)
    store.accept("image", "tab-1", "a" * 32, GenerationParams(prompt="kept", seed=5))
    store.add_url_image("u1.png", "http:key:alice", 10, 2e9)
    store.close()
    with sqlite3.connect(tmp_path / "studio.db") as connection:
        assert connection.execute("PRAGMA user_version").fetchone() == (3,)
    store = StudioStore.open(tmp_path)
    try:
        assert [(e.session, e.params.prompt, e.params.seed) for e in store.pending()] == [("tab-1", "kept", 5)]
        assert store.url_images() == [("u1.png", "http:key:alice", 10, 2e9)]
        assert store.pauses() == PauseState() and store.counts()["pauses"] == 0
    finally:
        store.close()
    with sqlite3.connect(tmp_path / "studio.db") as connection:
        assert connection.execute("PRAGMA user_version").fetchone() == (database.SCHEMA_VERSION,) == (4,)


def test_the_store_keeps_the_pauses_it_is_given_in_place_of_the_old_ones():
    store = StudioStore.open(None)
    store.save_pauses(PauseState(engine=True, sessions=frozenset({"a", "b"}), ends=(("a", 1234.5),)))
    assert store.pauses() == PauseState(engine=True, sessions=frozenset({"a", "b"}), ends=(("a", 1234.5),))
    store.save_pauses(PauseState(sessions=frozenset({"c"})))
    assert store.pauses() == PauseState(sessions=frozenset({"c"}))


def _restart(store_folder, **kwargs) -> tuple[Engine, StudioStore, PauseState]:
    engine = Engine(ToyPipeline(), limits=ServingLimits(pause_expiry_s=600))
    store = StudioStore.open(store_folder)
    restored = keep_pauses(engine, store, **kwargs)
    return engine, store, restored


def test_pauses_are_made_again_at_start_with_their_ends_and_every_change_is_kept(tmp_path):
    engine, store, restored = _restart(tmp_path, start_paused=False, operator_can_resume=True)
    assert restored == PauseState()
    soon = time.time() + 0.2
    engine.pause_queue("alice")  # ends 600 s from now (the server's expiry)
    engine.pause_queue("bob", until=soon)
    engine.pause_engine()
    alices_end = engine.pause_state.ends_at("alice")
    assert store.pauses() == engine.pause_state  # kept as each call returned
    store.close()

    time.sleep(0.3)  # bob's pause ends while the studio is down
    engine, store, restored = _restart(tmp_path, start_paused=False, operator_can_resume=True)
    assert restored == PauseState(engine=True, sessions=frozenset({"alice"}), ends=(("alice", alices_end),))
    assert engine.pause_reason("alice") == "engine" and engine.pause_state == restored
    assert store.pauses() == restored  # bob's ended pause is gone from the store too
    engine.resume_engine()
    engine.resume_queue("alice")
    assert store.pauses() == PauseState()
    store.close()


def test_the_operators_pause_comes_back_only_when_an_admin_key_can_lift_it(tmp_path):
    engine, store, _ = _restart(tmp_path, start_paused=False, operator_can_resume=True)
    engine.pause_engine()
    store.close()
    engine, store, restored = _restart(tmp_path, start_paused=False, operator_can_resume=False)
    assert restored.engine is False and store.pauses().engine is False
    store.close()
    engine, store, restored = _restart(tmp_path, start_paused=True, operator_can_resume=False)
    assert restored.engine is True and store.pauses().engine is True  # --start-paused: kept like any pause
    store.close()


def test_a_callers_paused_queue_is_still_paused_after_the_studio_restarts(tmp_path):
    options = dict(api_keys=(("alice", "key-alice"),), admin_key="key-operator", pause_expiry_s=900)
    alice = {"Authorization": "Bearer key-alice"}
    with live_studio(ToyPipeline(), outputs=tmp_path, **options) as (server, engine):
        paused = httpx.post(server.url + "v1/queue/pause", headers=alice, json={}, timeout=60).json()
        assert paused["paused"] is True and 899 <= paused["pause_ends_in_s"] <= 900
        assert paused["message"].endswith("(it resumes by itself in 15 m 00 s)")
        httpx.post(server.url + "v1/admin/pause", headers={"Authorization": "Bearer key-operator"}, timeout=60)
    with live_studio(ToyPipeline(), outputs=tmp_path, **options) as (server, engine):
        queue = httpx.get(server.url + "v1/queue", headers=alice, timeout=60).json()
        assert (queue["paused"], queue["paused_until"], queue["engine_paused"]) == (True, paused["paused_until"], True)
        handle = engine.submit(GenerationParams(prompt="waits", num_inference_steps=2), session_id="http:key:alice")
        assert next(handle.events(timeout=30)).paused == "engine"
        httpx.post(server.url + "v1/admin/resume", headers={"Authorization": "Bearer key-operator"}, timeout=60)
        resumed = httpx.post(server.url + "v1/queue/resume", headers=alice, json={}, timeout=60).json()
        assert (resumed["paused"], resumed["paused_until"]) == (False, None)
        assert type(handle.result(timeout=30)).__name__ == "Completed"

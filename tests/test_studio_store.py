"""The durable store on its own (studio/store): schema migrations keep what a database holds, and
the workflow-run journal's rows come back as they were written."""

from __future__ import annotations

import sqlite3

import pytest

from engine import GenerationParams
from studio.store import database
from studio.store.database import SCHEMA_VERSION
from studio.store.store import StudioStore


def opened_as_version(version: int, folder, monkeypatch) -> StudioStore:
    """The store of `folder` as a studio of schema `version` opened it (its migrations only)."""
    with monkeypatch.context() as old:
        old.setattr(database, "MIGRATIONS", database.MIGRATIONS[:version])
        old.setattr(database, "SCHEMA_VERSION", version)
        return StudioStore.open(folder)


def test_a_version_1_database_migrates_to_the_current_schema_keeping_its_rows(tmp_path, monkeypatch):
    # A database as the first schema's studios wrote it, with one accepted request in it.
    store = opened_as_version(1, tmp_path, monkeypatch)
    store.accept("image", "tab-1", "a" * 32, GenerationParams(prompt="kept", seed=5))
    store.close()
    with sqlite3.connect(tmp_path / "studio.db") as connection:
        assert connection.execute("PRAGMA user_version").fetchone() == (1,)
        assert "workflow_runs" not in {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}

    store = StudioStore.open(tmp_path)
    try:
        assert [(entry.session, entry.params.prompt, entry.params.seed) for entry in store.pending()] == [
            ("tab-1", "kept", 5)]
        assert store.counts()["workflow_runs"] == 0
    finally:
        store.close()
    with sqlite3.connect(tmp_path / "studio.db") as connection:
        assert connection.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (4,)


def test_a_journaled_run_comes_back_with_how_its_branches_ended():
    store = StudioStore.open(None)
    store.accept_run("run-1", "tab-1", "a" * 32, '{"version": 1}', {"sampler": 42}, saves_workflow=True)
    store.accept_run("run-2", "tab-2", "b" * 32, '{"version": 1}', {}, saves_workflow=False)
    store.branch_ended("run-1", 0, "2026-12-03/00001-42.png")
    store.branch_ended("run-1", 2, None)
    store.run_resumed("run-1")
    [first, second] = store.pending_runs()
    assert (first.id, first.session, first.owner, first.seeds, first.saves_workflow, first.restarts, first.ended) == (
        "run-1", "tab-1", "a" * 32, {"sampler": 42}, True, 1, {0: "2026-12-03/00001-42.png", 2: None})
    assert (second.id, second.saves_workflow, second.ended) == ("run-2", False, {})
    store.run_finished("run-1")  # its branches go with it
    assert [run.id for run in store.pending_runs()] == ["run-2"]
    assert store.counts()["workflow_branches"] == 0


def test_a_branch_end_written_with_a_failing_commit_is_not_kept():
    store = StudioStore.open(None)
    store.accept_run("run-1", "tab-1", "a" * 32, "{}", {}, saves_workflow=False)
    with pytest.raises(RuntimeError), store.transaction():
        store.branch_ended("run-1", 0, "x.png")
        raise RuntimeError("the History row could not be written")
    assert store.pending_runs()[0].ended == {}


def test_an_outputs_folder_that_cannot_be_made_is_a_store_error_naming_it(tmp_path):
    """`python app.py` turns a StoreError into its status-2 message: a file where the outputs
    folder should be was a traceback."""
    taken = tmp_path / "outputs"
    taken.write_text("a file, not a folder")
    with pytest.raises(database.StoreError, match=r"the outputs folder .*outputs can't be made: File exists "
                                                  r"\(pick another --outputs, or --no-save\)"):
        StudioStore.open(taken)
    assert taken.read_text() == "a file, not a folder"

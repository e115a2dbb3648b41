"""Nothing accepted is lost when the studio's process ends under it: a real `python app.py`,
killed (SIGKILL) or stopped (SIGTERM) mid-step with images and video jobs in flight, started again
on the same outputs folder, finishes every accepted request exactly once, and a `url` image it
served before still answers (docs/durability.md).
A database it can't use stops it with exit status 2 and a way out."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.studio_helpers import START_TIMEOUT_S, connect
from tests.test_http_api import wait_until
from tests.test_reliability_app import ROOT, app_process, in_flight

IMAGE_SEEDS = (11, 12, 13)
VIDEO_SEEDS = (21, 22, 23, 24, 25, 26)  # the crash test: 6 video jobs
STEPS = 10


def rows(database: Path, sql: str) -> list[tuple]:
    """Read the studio's database from outside, as another process would (read-only)."""
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=10) as connection:
        return connection.execute(sql).fetchall()


def count(database: Path, table: str) -> int:
    return rows(database, f"SELECT count(*) FROM {table}")[0][0]


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_accepted_images_and_video_jobs_finish_exactly_once_after_the_process_ends_mid_step(tmp_path, stop):
    outputs = tmp_path / "outputs"
    database = outputs / "studio.db"
    studio_args = ("--port", "0", "--model", "toy-video", "--model", "toy", "--outputs", str(outputs),
                   "--max-steps", str(STEPS))
    with app_process(*studio_args, step_delay_s=0.25) as first:
        url = first.url()
        served = httpx.post(url + "v1/images/generations", timeout=120, json={
            "model": "toy", "prompt": "kept", "size": "8x8", "response_format": "url", "seed": 3,
            "num_inference_steps": 2}).json()["data"][0]["url"]
        png = httpx.get(served).content
        caller = connect(url)
        jobs = [caller.submit(f"image {seed}", "", 8, 8, STEPS, 1.0, seed, "", None, api_name="/generate")
                for seed in IMAGE_SEEDS]
        videos = [httpx.post(url + "v1/videos", json={"prompt": f"video {seed}", "model": "toy-video", "seed": seed,
                                                      "num_inference_steps": STEPS}, timeout=30).json()
                  for seed in VIDEO_SEEDS]
        assert all(video["status"] in ("queued", "in_progress") for video in videos), videos
        accepted = len(IMAGE_SEEDS) + len(VIDEO_SEEDS)
        wait_until(lambda: count(database, "accepted") == accepted and in_flight(url) == accepted, timeout=120,
                   what="every request accepted and at the engine")
        wait_until(lambda: httpx.get(url + "v1/videos/" + videos[0]["id"]).json()["progress"] > 0, timeout=120,
                   what="a denoise step done")
        first.process.send_signal(stop)
        first.process.wait(60)
        del jobs  # their streams ended with the process
    # Nothing of them was finished: every one is still accepted, and no result is indexed.
    assert count(database, "accepted") == accepted and count(database, "history") == 0

    with app_process(*studio_args, step_delay_s=0.01) as second:
        url = second.url()
        for video in videos:
            wait_until(lambda: httpx.get(url + "v1/videos/" + video["id"]).json()["status"] == "completed",
                       timeout=120, what=f"{video['id']} to complete after the restart")
        wait_until(lambda: count(database, "accepted") == 0, timeout=120, what="every accepted request to finish")
        retrieved = [httpx.get(url + "v1/videos/" + video["id"]).json() for video in videos]
        assert [(video["seed"], video["progress"], video["resumed_after_restart"]) for video in retrieved] == [
            (seed, 100, True) for seed in VIDEO_SEEDS]
        mp4 = httpx.get(url + f"v1/videos/{videos[1]['id']}/content").content
        assert mp4[4:8] == b"ftyp"  # an MP4, downloadable
        # The url image served before the stop (the studio listens on another port now: its path is the key).
        again = httpx.get(url + "v1/images/files/" + served.rsplit("/", 1)[1])
        assert (again.status_code, again.content) == (200, png) and png.startswith(b"\x89PNG")
        assert f"resuming {accepted} accepted requests" in second.output
        assert f"resumed {accepted} accepted requests" in second.output

    # Exactly once: 3 images and 6 videos indexed, each file once, with the seed it was asked with.
    saved = rows(database, "SELECT kind, path, poster, parameters FROM history ORDER BY id")
    assert sorted(kind for kind, *_ in saved) == ["image"] * len(IMAGE_SEEDS) + ["video"] * len(VIDEO_SEEDS)
    seeds = sorted(int(text.rsplit("Seed: ", 1)[1].split(",")[0]) for *_, text in saved)
    assert seeds == sorted(IMAGE_SEEDS + VIDEO_SEEDS)
    files = sorted(path.name for path in outputs.glob("*/*") if path.parent.name != "history")
    indexed = sorted(Path(p).name for _, path, poster, _ in saved for p in (path, poster) if p)
    assert files == sorted(indexed + [f"{video['id']}.{suffix}" for video in videos for suffix in ("jpg", "mp4", "webp")]
                           + [served.rsplit("/", 1)[1]])
    assert not list(outputs.rglob("*.partial*"))
    assert [path.suffix for path in (outputs / "video-jobs").iterdir()].count(".mp4") == len(VIDEO_SEEDS)


def _start_exit_status(outputs: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "app.py", "--model", "toy", "--port", "0", "--outputs", str(outputs)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_database_the_studio_cannot_use_stops_it_with_status_2_and_a_way_out(tmp_path):
    truncated, newer, locked, foreign = (tmp_path / name for name in ("truncated", "newer", "locked", "foreign"))
    for folder in (truncated, newer, locked, foreign):
        folder.mkdir()
    # A database cut short: its first page only, as a crash of a copy or a full disk may leave it.
    with sqlite3.connect(newer / "studio.db") as made:
        made.execute("CREATE TABLE accepted (id INTEGER)")
        made.execute("PRAGMA user_version = 99")
    (truncated / "studio.db").write_bytes((newer / "studio.db").read_bytes()[:100])
    with sqlite3.connect(foreign / "studio.db") as made:
        made.execute("CREATE TABLE photos (id INTEGER)")
    holder = sqlite3.connect(locked / "studio.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another program holds the database's write lock
    try:
        processes = {folder.name: _start_exit_status(folder) for folder in (truncated, newer, locked, foreign)}
        results = {name: (process.wait(START_TIMEOUT_S), process.stdout.read()) for name, process in processes.items()}
    finally:
        holder.close()
    assert {name: code for name, (code, _) in results.items()} == dict.fromkeys(processes, 2), results
    messages = {name: output.strip().splitlines()[-1] for name, (_, output) in results.items()}
    assert "can't be read as the studio's database" in messages["truncated"] and "mv " in messages["truncated"]
    assert "schema version 99, newer than this studio knows (4)" in messages["newer"]
    assert "is locked by another process" in messages["locked"]
    assert "not a studio's" in messages["foreign"]
    assert all("serving on" not in output for _, output in results.values())
    # Nothing was reset: each file is as it was.
    assert rows(newer / "studio.db", "PRAGMA user_version") == [(99,)]


def test_two_studios_on_one_outputs_folder_the_second_exits_2(tmp_path):
    outputs = tmp_path / "outputs"
    with app_process("--port", "0", "--outputs", str(outputs)) as first:
        first.url()
        second = _start_exit_status(outputs)
        assert second.wait(START_TIMEOUT_S) == 2
        assert f"is in use by another studio (pid {first.process.pid})" in second.stdout.read()

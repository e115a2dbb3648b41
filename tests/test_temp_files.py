"""The one time to live for temp files on disk (studio/server/temp_files.py): a TempFolder's
files go after its ttl, when a new one is made and at every sweep of the studio's sweeper; the
ones a process wrote go at its exit; Gradio's cached files go after theirs, all at the stop."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
from pathlib import Path

import gradio as gr
import pytest
from PIL import Image

from studio.server.temp_files import TempFileSweeper, TempFolder, temp_folders

ROOT = Path(__file__).resolve().parent.parent


def _aged(path: Path, seconds: float) -> Path:
    os.utime(path, (time.time() - seconds, time.time() - seconds))
    return path


def test_new_files_are_unique_empty_and_named_as_asked(tmp_path):
    folder = TempFolder("previews", ttl_s=600, parent=tmp_path)
    first, second = folder.new_file(".gif", prefix="req-1-"), folder.new_file(".gif", prefix="req-1-")
    assert first != second and first.parent == second.parent == tmp_path / "previews"
    assert first.name.startswith("req-1-") and first.suffix == ".gif" and first.stat().st_size == 0


def test_a_new_file_first_removes_the_expired_ones_of_any_process(tmp_path):
    folder = TempFolder("videos", ttl_s=600, parent=tmp_path)
    (tmp_path / "videos").mkdir()
    foreign_old = tmp_path / "videos" / "other-process.mp4"
    foreign_old.write_bytes(b"an hour old")
    _aged(foreign_old, 3600)
    foreign_young = tmp_path / "videos" / "other-young.mp4"
    foreign_young.write_bytes(b"a second old")
    made = folder.new_file(".mp4")
    assert sorted(path.name for path in (tmp_path / "videos").iterdir()) == sorted([made.name, "other-young.mp4"])


def test_delete_older_than_counts_and_delete_written_leaves_other_processes_files(tmp_path):
    folder = TempFolder("previews", ttl_s=600, parent=tmp_path)
    old, young = folder.new_file(".gif"), folder.new_file(".gif")
    _aged(old, 900)
    assert folder.delete_older_than(600) == 1
    assert not old.exists() and young.exists()
    foreign = tmp_path / "previews" / "not-ours.gif"
    foreign.write_bytes(b"gif")
    assert folder.delete_written() == 1
    assert not young.exists() and foreign.exists()
    assert folder.delete_written() == 0


def test_a_time_to_live_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="ttl_s must be positive, got 0"):
        TempFolder("previews", ttl_s=0, parent=tmp_path)


def test_every_live_folder_is_known_to_the_sweeper_and_a_dropped_one_leaves(tmp_path):
    folder = TempFolder("kept", ttl_s=60, parent=tmp_path)
    assert folder in temp_folders()
    dropped = TempFolder("dropped", ttl_s=60, parent=tmp_path)
    made = dropped.new_file(".tmp")
    del dropped
    gc.collect()
    assert [found.path.name for found in temp_folders() if found.path.parent == tmp_path] == ["kept"]
    assert not made.exists()  # a dropped folder takes its files with it


def test_one_sweep_takes_gradios_and_every_folders_expired_files_and_the_stop_only_gradios(tmp_path):
    picture = tmp_path / "picture.png"  # content of this test's own: Gradio names cached files by their hash
    Image.frombytes("RGB", (8, 8), os.urandom(8 * 8 * 3)).save(picture)
    with gr.Blocks() as demo:
        image = gr.Image()
    cached = image.move_resource_to_block_cache(str(picture))
    assert cached != str(picture) and os.path.exists(cached)
    short, long = TempFolder("short", ttl_s=60, parent=tmp_path), TempFolder("long", ttl_s=7200, parent=tmp_path)
    expired, kept = _aged(short.new_file(".gif"), 120), _aged(long.new_file(".mp4"), 120)
    sweeper = TempFileSweeper(demo, ttl_s=3600, every_s=3600)
    # Gradio's file is young; short's is past its 60 s; long's has 7200 s. (The count may include
    # expired files of other folders alive in this process, e.g. the studio's own in the temp folder.)
    assert sweeper.sweep() >= 1
    assert not expired.exists() and kept.exists() and os.path.exists(cached)
    _aged(Path(cached), 7200)
    assert sweeper.sweep() >= 1 and not os.path.exists(cached)
    young_gif = short.new_file(".gif")
    assert sweeper.stop() == 0  # nothing of Gradio's is left; the folders' young files keep their time
    assert young_gif.exists() and kept.exists()


def test_the_files_a_process_wrote_go_when_it_exits_and_no_others(tmp_path):
    code = (
        "import sys\nfrom pathlib import Path\nfrom studio.server.temp_files import TempFolder\n"
        "folder = TempFolder('videos', ttl_s=600, parent=Path(sys.argv[1]))\n"
        "print(folder.new_file('.mp4'))\n"
    )
    (tmp_path / "videos").mkdir()
    other = tmp_path / "videos" / "another-studio.mp4"
    other.write_bytes(b"mp4")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    written = Path(done.stdout.strip())
    assert written.parent == tmp_path / "videos" and not written.exists()
    assert [path.name for path in (tmp_path / "videos").iterdir()] == ["another-studio.mp4"]

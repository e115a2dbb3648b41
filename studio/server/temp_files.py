"""The studio's temp files on disk, and the one sweeper that deletes them after their time to live.

Two kinds of folder hold them:
- Gradio's cache: every preview and result Gradio sends is written there. A studio's files in it
  go once they are older than --temp-file-ttl, and all of them when the studio stops.
- `TempFolder`s: files the studio writes itself for Gradio to send (a video's preview GIF, a
  finished MP4). Gradio copies a returned file into its cache, so these can go soon after: each
  file older than its folder's time to live goes when a new one is made and at every sweep; the
  ones this process wrote go when it exits. Every TempFolder is swept by the running studio's
  `TempFileSweeper` (they register themselves), so no folder of temp files has its own timer.

Stores with an expiry their users see (the HTTP API's image URLs, video jobs) keep their files in
memory with their own time to live (studio/api/image_files.py, studio/api/video_jobs.py).

Gradio names a cached file by its content hash and reuses one that is already there, in a
folder every Gradio process on the machine shares by default. A studio that judged age by
mtime there could delete, right after sending it, an identical file another process wrote
hours ago; its stop could delete files another live studio is sending. So `python app.py`
gives its process a cache folder of its own first (`use_private_cache_folder`).

Gradio's own `delete_cache` does this from a worker thread while handlers keep adding files
to the same sets, and its loop ends for good on the first "Set changed size during
iteration". This sweeper takes a copy of each set before it looks at it, and never stops.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

from studio.server import server_compat

if TYPE_CHECKING:
    import gradio as gr

log = logging.getLogger(__name__)


def use_private_cache_folder() -> Path:
    """Point Gradio's cache (GRADIO_TEMP_DIR) at a new folder of this process's own, inside
    the one it would use, removed when the process exits. Call before gradio is imported:
    some of its modules read the variable at import."""
    shared = Path(os.environ.get("GRADIO_TEMP_DIR") or Path(tempfile.gettempdir()) / "gradio")
    shared.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f"stepstudio-{os.getpid()}-", dir=shared)).resolve()
    os.environ["GRADIO_TEMP_DIR"] = str(folder)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def delete_temp_files(demo: gr.Blocks, older_than_s: float | None) -> int:
    """Delete the files `demo` wrote to Gradio's cache (None: all of them); returns how many.
    Files a component keeps on purpose (examples) stay."""
    keep = server_compat.paths_kept_in_cache(demo)
    cutoff = None if older_than_s is None else time.time() - older_than_s
    deleted = 0
    for files in server_compat.temp_file_sets(demo):
        for path in _copy(files):
            if path in keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                if cutoff is None or os.lstat(path).st_mtime < cutoff:
                    os.remove(path)
                    deleted += 1
                else:
                    continue
            files.discard(path)
    return deleted


def _copy(files: set) -> list:
    for _ in range(10):  # another thread may be adding a file right now: try again
        try:
            return list(files)
        except RuntimeError:
            time.sleep(0.001)
    return []


class TempFolder:
    """A folder of temp files (in the system's temp folder, shared by every studio on the machine)
    whose files go `ttl_s` after they were last written:

        PREVIEWS = TempFolder("stepstudio-previews", ttl_s=600)
        path = PREVIEWS.new_file(".gif")        # an empty new file of this process's own
    """

    def __init__(self, name: str, ttl_s: float, parent: Path | None = None) -> None:
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s!r}.")
        self.path = Path(parent if parent is not None else tempfile.gettempdir()) / name
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._written: set[Path] = set()  # this process's files: only these go at its exit
        weakref.finalize(self, _delete_paths, self._written)  # at exit (or when dropped)
        _FOLDERS.add(self)

    def new_file(self, suffix: str = "", prefix: str = "stepstudio-") -> Path:
        """A new empty file of a name no other has; the expired files go first."""
        self.path.mkdir(parents=True, exist_ok=True)
        self.delete_older_than(self.ttl_s)
        handle, name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=self.path)
        os.close(handle)
        with self._lock:
            self._written.add(Path(name))
        return Path(name)

    def delete_older_than(self, age_s: float) -> int:
        """Delete the files here last written more than `age_s` ago (whichever process wrote
        them); returns how many went."""
        cutoff = time.time() - age_s
        deleted = []
        with contextlib.suppress(FileNotFoundError):
            for path in self.path.iterdir():
                with contextlib.suppress(OSError):  # another process may have removed it already
                    if path.is_file() and path.stat().st_mtime < cutoff:
                        path.unlink()
                        deleted.append(path)
        with self._lock:
            self._written.difference_update(deleted)
        return len(deleted)

    def delete_written(self) -> int:
        """Delete every file this process wrote here; returns how many went."""
        return _delete_paths(self._written)


# Every TempFolder alive: the sweeper sweeps them all (a dropped one leaves by itself).
_FOLDERS: weakref.WeakSet[TempFolder] = weakref.WeakSet()


def temp_folders() -> list[TempFolder]:
    return list(_FOLDERS)


def _delete_paths(paths: set[Path]) -> int:
    deleted = 0
    for path in list(paths):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            deleted += 1
        paths.discard(path)
    return deleted


class TempFileSweeper:
    """Every `every_s`, on its own thread: deletes `demo`'s files in Gradio's cache older than
    `ttl_s`, and every TempFolder's older than its own time to live. `stop()` deletes all of
    `demo`'s (a TempFolder's files may belong to another studio of the process: they keep
    their time to live, and go at the latest when the process exits)."""

    def __init__(self, demo: gr.Blocks, ttl_s: float, every_s: float) -> None:
        self.demo = demo
        self.ttl_s = ttl_s
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stepstudio-temp-files", daemon=True)

    def start(self) -> "TempFileSweeper":
        self._thread.start()
        return self

    def sweep(self) -> int:
        """Delete every temp file past its time to live now; returns how many went."""
        deleted = delete_temp_files(self.demo, self.ttl_s)
        for folder in temp_folders():
            deleted += folder.delete_older_than(folder.ttl_s)
        return deleted

    def stop(self) -> int:
        """Stop sweeping and delete every temp file of `demo`; returns how many went."""
        self._stop.set()
        return delete_temp_files(self.demo, None)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - one bad sweep must not end the sweeping
                log.exception("deleting old temp files failed; trying again in %.0f s", self.every_s)

"""Gradio's temp files (every preview and result it sends is written to its cache folder):
deleted once they are older than a time to live, and all of them when the studio stops.

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
from pathlib import Path
from typing import TYPE_CHECKING

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
    keep: set = set()
    for block in list(demo.blocks.values()):
        keep.update(getattr(block, "keep_in_cache", ()))
    cutoff = None if older_than_s is None else time.time() - older_than_s
    deleted = 0
    for files in list(demo.temp_file_sets):
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


class TempFileSweeper:
    """Deletes `demo`'s temp files older than `ttl_s`, every `every_s`, on its own thread."""

    def __init__(self, demo: gr.Blocks, ttl_s: float, every_s: float) -> None:
        self.demo = demo
        self.ttl_s = ttl_s
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stepstudio-temp-files", daemon=True)

    def start(self) -> "TempFileSweeper":
        self._thread.start()
        return self

    def stop(self) -> int:
        """Stop sweeping and delete every temp file; returns how many went."""
        self._stop.set()
        return delete_temp_files(self.demo, None)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                delete_temp_files(self.demo, self.ttl_s)
            except Exception:  # noqa: BLE001 - one bad sweep must not end the sweeping
                log.exception("deleting old temp files failed; trying again in %.0f s", self.every_s)

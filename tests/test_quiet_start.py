"""`python app.py` starts quietly: up to "serving on", everything it prints is one of its own log
lines (no library warnings, no progress bars), and the libraries' settings that quiet the model
loading (pipelines/quiet_loading.py) are back as they were once a model has loaded."""

from __future__ import annotations

import logging
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import huggingface_hub.utils as hub
import pytest
from diffusers.utils import logging as diffusers_logging
from transformers.utils import logging as transformers_logging

from pipelines.quiet_loading import quiet_libraries
from studio.store.database import SCHEMA_VERSION
from tests.studio_helpers import START_TIMEOUT_S, wait_until_serving

ROOT = Path(__file__).resolve().parent.parent
# app.py's log format ("%(asctime)s %(levelname)s %(name)s: %(message)s") from the studio's loggers.
OWN_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                      r"(stepstudio|(studio|engine|pipelines|serve)(\.\w+)*): ")


def start_output(*args: str) -> list[str]:
    """What `python app.py ARGS` prints (stdout and stderr; a progress bar's carriage returns
    split lines) up to its "serving on" line; the studio is then stopped."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("DIFFUSERS_VERBOSITY", "TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS")}
    process = subprocess.Popen([sys.executable, "app.py", *args], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=env)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in process.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)  # the process has closed its output

    threading.Thread(target=read, daemon=True).start()
    output: list[str] = []
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while not output or "serving on http" not in output[-1]:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            assert line is not None, f"the studio ended with status {process.wait()}:\n" + "\n".join(output)
            output.append(line)
        # Stopped once it answers: a SIGTERM before uvicorn has its signal handlers is lost (the
        # no-op handler of StudioServer.run is in place then).
        wait_until_serving(process, re.search(r"serving on (http://\S+)", output[-1]).group(1))
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    return output


def test_the_default_studio_prints_only_its_own_log_lines_until_it_serves():
    """The built-in image and video models: diffusers, transformers and the hub print nothing."""
    output = start_output("--port", "0", "--no-save")
    text = "\n".join(output)
    assert "it/s]" not in text and "[transformers]" not in text, text
    assert [line for line in output if not OWN_LINE.match(line)] == [], text
    assert [line.split(": ", 1)[1] for line in output if "schema" in line] == [
        f"the in-memory store: schema migrated from version 0 to {SCHEMA_VERSION}"], text


@pytest.mark.parametrize("hub_bars", [True, False])
def test_quiet_loading_restores_each_library_setting(hub_bars):
    """Within: diffusers and transformers at ERROR (their errors still print), no progress bars.
    After, even when the load raised: each setting as before, the hub's download bars included."""
    libraries = (diffusers_logging, transformers_logging)
    hub_bars_before = not hub.are_progress_bars_disabled()
    if not hub_bars:
        hub.disable_progress_bars()
    try:
        before = [(library.get_verbosity(), library.is_progress_bar_enabled()) for library in libraries]
        hub_before = hub.are_progress_bars_disabled()
        with pytest.raises(ValueError, match="an unreadable checkpoint"), quiet_libraries():
            assert [(library.get_verbosity(), library.is_progress_bar_enabled()) for library in libraries] == [
                (logging.ERROR, False)] * 2
            raise ValueError("an unreadable checkpoint")
        assert [(library.get_verbosity(), library.is_progress_bar_enabled()) for library in libraries] == before
        assert hub.are_progress_bars_disabled() == hub_before
    finally:
        if hub_bars_before:
            hub.enable_progress_bars()

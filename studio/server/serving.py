"""uvicorn serving the studio's app (studio.app.build_app), in the foreground or on a background thread.

    StudioServer(app, host, port).run()      # blocking (the CLI); SIGTERM / Ctrl-C stop it gracefully
    server = StudioServer(app, "127.0.0.1", 0).start()   # background thread (tests); .url, .stop()

Stopping (SIGTERM, Ctrl-C, `stop()`) goes in this order: the engine stops admitting and aborts
every request at its next step boundary, so every waiting caller is answered (503
`shutting_down` over HTTP, a gr.Error in the page); once those answers have left, Gradio's streams
close and uvicorn ends, giving what is left `shutdown_timeout_s`. Gradio's temp files go once
uvicorn has closed every connection, so no download of a preview is cut off. When the engine
thread itself stops (a crash), the server stops the same way.

A low-level piece of the server, like the guards and temp files: it reads what build_app left on
`app.state` and imports neither the API routes nor the page.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
import time

import fastapi
import gradio as gr
import uvicorn

from engine import EngineClient
from studio.config import StudioOptions
from studio.server import server_compat
from studio.server.sockets import bind_socket
from studio.server.temp_files import TempFileSweeper

log = logging.getLogger(__name__)

# How often temp files past their time to live are looked for: Gradio's cached ones (--temp-file-ttl)
# and every TempFolder's (studio.server.temp_files).
TEMP_FILE_SWEEP_S = 300


class StudioServer:
    """uvicorn serving the studio app, in the foreground or on a background thread."""

    def __init__(
        self,
        app: fastapi.FastAPI,
        host: str = "127.0.0.1",
        port: int = 7860,
        *,
        sock: socket.socket | None = None,
        stop_with_engine: bool = True,
    ) -> None:
        self._socket = sock or bind_socket(host, port)
        self.host = host
        self.port = self._socket.getsockname()[1]
        self._demo: gr.Blocks | None = getattr(app.state, "demo", None)
        self._gradio_app = getattr(app.state, "gradio_app", None)
        self._engine: EngineClient | None = getattr(app.state, "engine", None)
        options: StudioOptions = getattr(app.state, "options", None) or StudioOptions()
        self.shutdown_timeout_s = options.shutdown_timeout_s
        config = uvicorn.Config(
            app, log_level="warning", http=server_compat.timed_protocol(options.request_timeout_s),
            timeout_graceful_shutdown=max(1, round(options.shutdown_timeout_s)),
        )
        self._server = server_compat.GracefulServer(config, on_first_signal=self._stop_on_signal)
        self._thread: threading.Thread | None = None
        # Previews and results Gradio wrote to its temp folder go after temp_file_ttl_s, and all at the stop;
        # the studio's own TempFolders' files after their own time to live.
        self._sweeper = None if self._demo is None else TempFileSweeper(
            self._demo, options.temp_file_ttl_s, min(TEMP_FILE_SWEEP_S, options.temp_file_ttl_s)).start()
        self._stopping = threading.Lock()
        self._stop_thread: threading.Thread | None = None
        if stop_with_engine and self._engine is not None:
            threading.Thread(target=self._stop_when_engine_stops, name="stepstudio-engine-watch", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def run(self) -> None:
        """Serve until SIGTERM / Ctrl-C (or the engine stops), then stop gracefully."""
        # uvicorn raises the signal it caught again once it is done; this handler takes it, so a
        # graceful stop exits with status 0 instead of dying by the signal. It is uvicorn's own
        # handler: a SIGTERM that comes before uvicorn has set up its signals stops it all the same.
        previous = signal.signal(signal.SIGTERM, self._server.handle_exit)
        try:
            self._server.run(sockets=[self._socket])
        finally:
            signal.signal(signal.SIGTERM, previous)
            self._finish_stop()
            self._delete_temp_files()

    def start(self, timeout_s: float = 30.0) -> "StudioServer":
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="stepstudio-http", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the studio server did not start on {self.url}")
            time.sleep(0.05)
        return self

    def wait(self) -> None:
        """Block until the background server ends; SIGTERM and Ctrl-C stop it gracefully."""
        handlers = {sig: signal.signal(sig, lambda *_: self._begin_stop()) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            while self._thread is not None and self._thread.is_alive():
                self._thread.join(0.5)
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            self._finish_stop()
            self._delete_temp_files()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop gracefully (as on SIGTERM) and wait for the server thread."""
        self._begin_stop()
        self._finish_stop(timeout_s)
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._delete_temp_files()

    # ------------------------------------------------------------------ stopping
    def _stop_on_signal(self, sig: int) -> None:
        log.info("stopping: %s", signal.Signals(sig).name)
        self._begin_stop()

    def _begin_stop(self) -> None:
        """Non-blocking: the stop runs on its own thread (this may be a signal handler)."""
        with self._stopping:
            if self._stop_thread is None:
                self._stop_thread = threading.Thread(target=self._stop_in_order, name="stepstudio-stop", daemon=True)
                self._stop_thread.start()

    def _finish_stop(self, timeout_s: float | None = None) -> None:
        if self._stop_thread is not None:
            self._stop_thread.join(self.shutdown_timeout_s + 5 if timeout_s is None else timeout_s)

    def _stop_in_order(self) -> None:
        deadline = time.monotonic() + self.shutdown_timeout_s
        if self._engine is not None:
            self._engine.shutdown()  # no new requests; every running one ends at its next step boundary
            if not self._engine.wait_stopped(timeout=max(0.1, deadline - time.monotonic())):
                log.warning("the engine did not stop within %.1f s", self.shutdown_timeout_s)
        self._wait_for_gradio_answers(deadline)
        self._close_demo()
        self._server.should_exit = True

    def _delete_temp_files(self) -> None:
        """Once uvicorn is done: earlier, a preview a client is still downloading would vanish
        under its response (FileNotFoundError)."""
        if self._sweeper is not None:
            self._sweeper.stop()

    def _close_demo(self) -> None:
        """End Gradio's queue, heartbeat and event streams, on the server's loop (Gradio's stop
        event is an asyncio.Event: set from another thread, it would wake nobody)."""
        loop = self._server.loop
        if self._demo is None or loop is None or loop.is_closed():
            return

        async def close() -> None:
            self._demo.close(verbose=False)
            if self._gradio_app is not None:
                server_compat.stop_open_streams(self._gradio_app)  # the heartbeat streams of open pages

        try:
            asyncio.run_coroutine_threadsafe(close(), loop).result(timeout=5)
        except Exception:  # noqa: BLE001 - the loop may be ending already; uvicorn's own timeout remains
            log.warning("Gradio's streams could not be closed before the server stops", exc_info=True)

    def _wait_for_gradio_answers(self, deadline: float) -> None:
        """Until Gradio has sent every finished event's last message (or the deadline): closing its
        queue earlier would replace those answers with "Server stopped unexpectedly"."""
        while self._demo is not None and time.monotonic() < deadline:
            if not server_compat.has_unsent_answers(self._demo):
                return
            time.sleep(0.02)

    def _stop_when_engine_stops(self) -> None:
        self._engine.wait_stopped()
        if self._engine.failure is not None:
            log.critical("stopping the server: %s", self._engine.failure)
        self._begin_stop()

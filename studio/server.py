"""The studio's web server: one FastAPI app with the HTTP API routes and Gradio mounted at "/".

    app = build_app(engine, config)          # FastAPI: /v1/..., /healthz, /metrics, Gradio at /
    StudioServer(app, host, port).run()      # blocking (the CLI)
    server = StudioServer(app, "127.0.0.1", 0).start()   # background thread (tests); .url, .stop()

The HTTP API router is included before Gradio is mounted, since a mount at "/" matches
every path.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

import fastapi
import gradio as gr
import uvicorn

from engine import Engine
from studio.config import StudioOptions
from studio.http_api import HttpApiConfig, build_router
from studio.ui import STUDIO_CSS, build_ui

log = logging.getLogger(__name__)

# Gradio runs at most this many events at once (its default of 40 would cap concurrent sessions).
MAX_GRADIO_THREADS = 256


def build_demo(engine: Engine, config: StudioOptions) -> gr.Blocks:
    """The Blocks with its queue set so Gradio never serialises sessions (the engine batches)."""
    demo = build_ui(engine, config)
    demo.max_threads = MAX_GRADIO_THREADS  # must precede queue() when mounting
    demo.queue(default_concurrency_limit=None)
    return demo


def http_api_config(config: StudioOptions) -> HttpApiConfig:
    """With --auth USER:PASS, the HTTP API wants PASS as its bearer token (the OpenAI client's
    api_key), so the studio's login guards both doors."""
    return HttpApiConfig(api_keys=frozenset({config.auth[1]}) if config.auth else frozenset())


def build_app(engine: Engine, config: StudioOptions) -> fastapi.FastAPI:
    app = fastapi.FastAPI(title="stepstudio", docs_url=None, redoc_url=None, openapi_url="/v1/openapi.json")
    app.include_router(build_router(engine, http_api_config(config)))
    demo = build_demo(engine, config)
    app.state.demo = demo
    return gr.mount_gradio_app(
        app,
        demo,
        path="/",
        auth=config.auth,
        css=STUDIO_CSS,
        server_name=config.host,
        server_port=config.port,
        footer_links=["api", "gradio"],
    )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class StudioServer:
    """uvicorn serving the studio app, in the foreground or on a background thread."""

    def __init__(self, app: fastapi.FastAPI, host: str = "127.0.0.1", port: int = 7860) -> None:
        self.host = host
        self.port = port or free_port(host)
        self._demo: gr.Blocks | None = getattr(app.state, "demo", None)
        self._server = uvicorn.Server(
            uvicorn.Config(app, host=host, port=self.port, log_level="warning", timeout_graceful_shutdown=1)
        )
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def run(self) -> None:
        """Serve until interrupted (Ctrl-C / SIGTERM)."""
        self._server.run()

    def start(self, timeout_s: float = 30.0) -> "StudioServer":
        self._thread = threading.Thread(target=self._server.run, name="stepstudio-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the studio server did not start on {self.url}")
            time.sleep(0.05)
        return self

    def wait(self) -> None:
        """Block until the background server ends; Ctrl-C stops it."""
        try:
            while self._thread is not None and self._thread.is_alive():
                self._thread.join(0.5)
        except KeyboardInterrupt:
            self.stop()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._demo is not None:
            self._demo.close(verbose=False)  # ends Gradio's queue and heartbeat streams first
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)

"""The studio's composition root: one FastAPI app with the HTTP API routes and Gradio mounted at "/".

    app = build_app(engine, config)          # FastAPI: /v1/..., /healthz, /metrics, Gradio at /
    StudioServer(app, host, port).run()      # studio.server.serving: uvicorn, stopped gracefully

The HTTP API router is included before Gradio is mounted, since a mount at "/" matches
every path. This module sits above everything it wires (studio.api, studio.page, studio.store,
studio.server's pieces); nothing in the studio imports it, so the routes below it never import a
module that imports them.
"""

from __future__ import annotations

import dataclasses
import logging

import fastapi
import gradio as gr

from engine import EngineClient
from studio.api.http_routes import HttpApiConfig, build_router
from studio.api.video_routes import video_jobs_for
from studio.config import StudioOptions
from studio.outputs import OutputStore
from studio.page.resumed_runs import resume_runs
from studio.page.ui import STUDIO_CSS, build_ui, output_store
from studio.page.workflow_tab import WorkflowRunner
from studio.server import server_compat
from studio.server.file_answers import WholeFileAnswers
from studio.server.guards import StudioGuards, input_counts
from studio.server.throttle import FailedAttempts
from studio.store.durable import DurableRequests
from studio.store.pauses import keep_pauses
from studio.store.recovery import ResumeReport, resume_accepted
from studio.store.store import StudioStore
from studio.workflows.registry import RunRegistry

log = logging.getLogger(__name__)

# Gradio runs at most this many events at once (its default of 40 would cap concurrent sessions).
MAX_GRADIO_THREADS = 256


def for_engine(config: StudioOptions, engine: EngineClient) -> StudioOptions:
    """The options with the limits the engine really applies (a max size of None becomes the
    model's own), so the page's sliders offer what the engine accepts."""
    return dataclasses.replace(config, max_size=engine.limits.max_size)


def build_demo(engine: EngineClient, config: StudioOptions, outputs: OutputStore | None = None,
               durable: DurableRequests | None = None, runner: WorkflowRunner | None = None,
               resumed: ResumeReport | None = None) -> gr.Blocks:
    """The Blocks with its queue set so Gradio never serialises sessions (the engine batches)."""
    config = for_engine(config, engine)
    demo = build_ui(engine, config, outputs, durable, runner, resumed)
    server_compat.cap_events_at_once(demo, MAX_GRADIO_THREADS)  # must precede queue() when mounting
    demo.queue(default_concurrency_limit=None)
    return demo


def http_api_config(config: StudioOptions) -> HttpApiConfig:
    """Per-user keys from --api-key; with --auth USER:PASS, PASS is also USER's key, so the
    studio's login guards both doors."""
    # The HTTP API answers a slow body with its own 408 (10 s), before the connection's deadline
    # (request_timeout_s) would hang up without an answer.
    body_timeout_s = min(HttpApiConfig.body_timeout_s, config.request_timeout_s / 2)
    return HttpApiConfig(api_keys=config.http_api_keys, body_timeout_s=body_timeout_s, admin_key=config.admin_key)


def build_app(engine: EngineClient, config: StudioOptions, store: StudioStore | None = None) -> fastapi.FastAPI:
    """`store`: the studio's durable store (opened on --outputs when None; StoreError when it
    can't be used). The work it holds from before a restart runs again (studio.store.recovery,
    studio.page.resumed_runs); `app.state.resumed` says what was resumed."""
    config = for_engine(config, engine)
    outputs = output_store(engine, config, store)
    durable = DurableRequests(outputs.index)
    api_config = http_api_config(config)
    attempts = FailedAttempts(delay_s=api_config.failed_key_delay_s, max_failures=api_config.max_failed_keys)
    # The OpenAPI document is served by the router (behind the API keys when there are some).
    app = fastapi.FastAPI(title="stepstudio", docs_url=None, redoc_url=None, openapi_url=None)
    # Finished /v1/videos jobs are saved like the page's results.
    router = build_router(engine, api_config, attempts, outputs=outputs,
                          video_jobs=video_jobs_for(api_config, outputs, durable))
    app.include_router(router)
    # The pauses kept from before a restart (and --start-paused), before the page is built (it says
    # whether the studio is paused) and the resumed work is queued; every later change is kept.
    keep_pauses(engine, outputs.index, start_paused=config.start_paused,
                operator_can_resume=config.admin_key is not None)
    runner = WorkflowRunner(engine, config, RunRegistry(), outputs)
    resumed = ResumeReport()  # filled in below; the page tells each returning owner its count
    demo = build_demo(engine, config, outputs, durable, runner, resumed)
    app.state.demo = demo
    app.state.engine = engine
    app.state.options = config
    app = gr.mount_gradio_app(
        app,
        demo,
        path="/",
        auth=config.auth,
        css=STUDIO_CSS,
        server_name=config.host,
        server_port=config.port,
        footer_links=["api", "gradio"],
        show_error=False,  # a gr.Error's message is shown; an unexpected exception's text is not
        allowed_paths=[config.outputs] if config.outputs else None,  # History hands saved files back
    )
    server_compat.check_file_paths_like_launch(demo)  # a file input must be one the caller uploaded
    app.add_middleware(WholeFileAnswers)  # a file that changes while Gradio sends it: no half answer
    app.add_middleware(StudioGuards, attempts=attempts, input_counts=input_counts(demo), demo=demo)
    app.state.attempts = attempts
    app.state.gradio_app = server_compat.mounted_gradio_app(app)
    server_compat.check_installed(demo, app.state.gradio_app)  # a Gradio internal gone: an error naming it, now
    server_compat.cache_pictures_without_rewriting()  # a picture sent again is not rewritten under its reader
    app.state.store = outputs.index
    app.state.resumed = resume_accepted(engine, durable, outputs, router.video_jobs, config.resume_max_age_s, resumed)
    resume_runs(runner, resumed, config.resume_max_age_s)
    return app

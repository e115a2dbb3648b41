"""The studio's page: three tabs over one shared engine, and the live pipeline and queue views.

    Workflow   the node editor (studio/page/workflow_tab.py), the default tab
    Simple     a form with its own queue (studio/page/simple_tab.py)
    History    this browser's saved results (studio/page/history_tab.py)

Each part has its own module that builds its components and wires its events; this one lays
them out and connects what they share: the engine, the run registry, the output store, the
browser's token and the tabs. The named API endpoints are wired here too
(studio/api/gradio_endpoints.py, and `/run_workflow` with the editor).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from engine import Engine
from studio.api.gradio_endpoints import wire_api_endpoints
from studio.bridge import session_id_of
from studio.config import StudioOptions
from studio.media import model_fps, write_mp4
from studio.outputs import OutputStore
from studio.page.graph_view import GRAPH_CSS, render_graph
from studio.page.history_tab import build_history_tab, wire_history_tab
from studio.page.queue_view import QUEUE_CSS, render_queue
from studio.page.simple_tab import build_simple_tab, wire_simple_tab
from studio.page.tab_queue import TAB_QUEUE_CSS, TabResults
from studio.page.workflow_tab import (
    WorkflowRunner,
    build_workflow_tab,
    wire_workflow_api,
    wire_workflow_tab,
)
from studio.workflows.registry import RunRegistry

BROWSER_STORAGE_KEY = "stepstudio-browser"

STUDIO_CSS = QUEUE_CSS + GRAPH_CSS + TAB_QUEUE_CSS + """
#ss-preview img, #ss-result img { width: 100%; height: 100%; object-fit: contain; image-rendering: pixelated; }
#ss-gallery img, #ss-history img { image-rendering: pixelated; object-fit: contain !important; }
#ss-gallery .grid-container { grid-template-columns: repeat(auto-fill, minmax(110px, 130px)) !important; }
.ss-unknown { color: var(--error-text-color, #b45309); font-size: 0.85rem; }
"""


@dataclass(frozen=True)
class LiveViews:
    """The pipeline graph and the queue table. Both come from one engine snapshot: on the timer,
    and in every update of a tab's own requests, so the tab's rows, the queue and the graph agree."""

    timer: gr.Timer
    graph: gr.HTML
    queue: gr.HTML
    engine: Engine
    show_prompts: bool

    @property
    def components(self) -> list:
        return [self.graph, self.queue]

    def render(self, session: str) -> dict:
        snapshot = self.engine.snapshot()
        return {self.queue: render_queues(snapshot, session, self.show_prompts),
                self.graph: render_graph(snapshot, self.engine.infos, session)}


def render_queues(snapshot, session: str, show_prompts: bool) -> str:
    """The queue table; with engine replicas (serve/), one table per replica under its label: their
    snapshot then carries `replicas`, (label, that replica's EngineSnapshot) pairs."""
    parts = getattr(snapshot, "replicas", ())
    if not parts:
        return render_queue(snapshot, session, show_prompts)
    return "".join(f'<div class="ss-replica" data-replica="{html.escape(label)}"><b>{html.escape(label)}</b>'
                   f"{render_queue(part, session, show_prompts)}</div>" for label, part in parts)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'s' * (count != 1)}"


def _build_header(engine: Engine) -> None:
    models = ", ".join(f"`{name}` ({info.family}, {info.output_kind}s)" for name, info in engine.infos.items())
    gr.Markdown(
        f"## stepstudio · {' + '.join(f'`{name}`' for name in engine.models.names)}\n"
        f"{_plural(len(engine.models.names), 'model')}: {models}. One shared engine in **{engine.mode}** mode "
        f"(up to {_plural(engine.max_batch, 'request')} per forward): requests join a running batch at the "
        "next denoise step."
    )


def _build_live_views(engine: Engine, config: StudioOptions) -> LiveViews:
    with gr.Accordion("Pipeline and queue (live, all sessions)", open=True):
        graph = gr.HTML("", elem_id="ss-graph")
        queue = gr.HTML("", elem_id="ss-queue")
    return LiveViews(gr.Timer(config.queue_refresh_s), graph, queue, engine, config.show_prompts)


def _wire_live_views(views: LiveViews) -> None:
    def refresh(request: gr.Request) -> dict:
        return views.render(session_id_of(request))

    views.timer.tick(refresh, outputs=views.components, queue=False, api_name="ui_refresh_views",
                     api_visibility="private", show_progress="hidden")


def output_store(engine: Engine, config: StudioOptions) -> OutputStore:
    folder = Path(config.outputs).expanduser() if config.outputs else None
    return OutputStore(folder, model=engine.info.name, fps=model_fps(engine.info), write_video=write_mp4,
                       fps_by_model={name: model_fps(info) for name, info in engine.infos.items()})


def build_ui(engine: Engine, config: StudioOptions) -> gr.Blocks:
    """The whole page; every browser tab is its own session, all share `engine`."""
    store = output_store(engine, config)
    runner = WorkflowRunner(engine, config, RunRegistry(), store)
    results = TabResults()
    with gr.Blocks(title=f"stepstudio · {' + '.join(engine.models.names)}") as demo:
        # The History token (studio.server.history_owners), kept under a key that survives restarts.
        browser_token = gr.BrowserState("", storage_key=BROWSER_STORAGE_KEY, secret=store.owners.browser_state_secret)
        _build_header(engine)
        with gr.Tabs(elem_id="ss-tabs") as tabs:
            with gr.Tab("Workflow", id="workflow", elem_id="ss-tab-workflow"):
                workflow_tab = build_workflow_tab(engine)
            with gr.Tab("Simple", id="simple", elem_id="ss-tab-simple"):
                form, panel = build_simple_tab(engine, config)
            with gr.Tab("History", id="history", elem_id="ss-tab-history") as history_page:
                history = build_history_tab(store)
        views = _build_live_views(engine, config)
        wire_workflow_tab(runner, workflow_tab, browser_token, views)
        wire_simple_tab(runner, results, form, panel, browser_token, views)
        wire_history_tab(engine, store, history, history_page, browser_token, form, workflow_tab.editor, tabs, demo)
        _wire_live_views(views)
        wire_api_endpoints(engine, config, store)
        wire_workflow_api(runner)

        def forget_tab(request: gr.Request) -> None:
            results.forget(session_id_of(request))

        demo.unload(forget_tab)
    return demo

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
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr

from engine import EngineClient
from studio.api.gradio_endpoints import wire_api_endpoints
from studio.config import StudioOptions
from studio.media import model_fps, write_mp4
from studio.outputs import OutputStore
from studio.page.graph_view import GRAPH_CSS, render_graph
from studio.page.history_tab import build_history_tab, wire_history_tab
from studio.page.queue_view import QUEUE_CSS, render_queue
from studio.page.restart_banner import RESTART_BANNER_CSS, build_restart_banner, wire_restart_banner
from studio.page.simple_tab import build_simple_tab, wire_simple_tab
from studio.page.tab_queue import TAB_QUEUE_CSS, TABS_KEPT, TabResults
from studio.page.workflow_tab import (
    WorkflowRunner,
    build_workflow_tab,
    wire_workflow_api,
    wire_workflow_tab,
)
from studio.queue_snapshot import Viewer
from studio.sessions import session_id_of
from studio.store.durable import DurableRequests
from studio.store.recovery import ResumeReport
from studio.store.store import StudioStore
from studio.workflows.registry import RunRegistry

BROWSER_STORAGE_KEY = "stepstudio-browser"

STUDIO_CSS = QUEUE_CSS + GRAPH_CSS + TAB_QUEUE_CSS + RESTART_BANNER_CSS + """
#ss-preview img, #ss-result img { width: 100%; height: 100%; object-fit: contain; image-rendering: pixelated; }
#ss-gallery img, #ss-history img { image-rendering: pixelated; object-fit: contain !important; }
/* A video's live preview (a looping GIF of latent-sized frames) fills the preview panel, as an image's does. */
#ss-animation img.ss-animation { display: block; width: 100%; height: 256px; object-fit: contain;
  image-rendering: pixelated; background: var(--background-fill-secondary, #f3f4f6); border-radius: 6px; }
#ss-history-view img { image-rendering: pixelated; }
/* Captions name what tells results apart (swept values, seed): two lines, not one cut short. */
#ss-workflow-results .caption-label, #ss-history .caption-label { white-space: normal !important;
  overflow-wrap: anywhere; line-height: 1.2; }
#ss-gallery .grid-container { grid-template-columns: repeat(auto-fill, minmax(110px, 130px)) !important; }
#ss-history .grid-container { grid-template-columns: repeat(auto-fill, minmax(120px, 150px)) !important; }
.ss-unknown { color: var(--error-text-color, #b45309); font-size: 0.85rem; }
#ss-header p { margin: 0; font-size: 0.9rem; line-height: 1.4; }
/* One message at a time: Gradio stacks every error in one growing toast ("Error (3)"); the newest
   is the one that is about what the user just did. */
.toast-messages > .toast-message-item:has(~ .toast-message-item), .toast-messages > .toast-separator,
.toast-title .toast-count { display: none; }
"""


RESEND_S = 5.0  # the timer sends a tab its views again this often even unchanged (heals a reordered update)


@dataclass(frozen=True)
class Sent:
    """What a tab was last sent of the live views, and when."""

    queue: int  # hashes of the HTML sent
    graph: int
    streamed_at: float  # when a run's stream last sent them (-inf: never)
    resent_at: float  # when the timer last sent both, changed or not


class SentViews:
    """What each tab was last sent of the live views. The oldest tabs are forgotten first; a
    forgotten tab is simply sent everything again."""

    def __init__(self, tabs: int = TABS_KEPT) -> None:
        self._sent: OrderedDict[str, Sent] = OrderedDict()
        self._tabs = tabs
        self._lock = threading.Lock()

    def get(self, session: str) -> Sent | None:
        with self._lock:
            return self._sent.get(session)

    def put(self, session: str, sent: Sent) -> None:
        with self._lock:
            self._sent[session] = sent
            self._sent.move_to_end(session)
            while len(self._sent) > self._tabs:
                self._sent.popitem(last=False)

    def forget(self, session: str) -> None:
        with self._lock:
            self._sent.pop(session, None)


@dataclass(frozen=True)
class LiveViews:
    """The pipeline graph and the queue table. Both come from one engine snapshot: on the timer,
    and in the updates of a tab's own runs (at most once per refresh period, and always in a
    run's last update), so the tab's rows, the queue and the graph agree. A view is sent only
    when it changed; the timer leaves a tab alone while a run's stream is sending it the views."""

    timer: gr.Timer
    graph: gr.HTML
    queue: gr.HTML
    engine: EngineClient
    show_prompts: bool
    refresh_s: float
    resumed_ids: Container[str] = ()  # requests run again after a restart (ResumeReport.request_ids)
    # a tab's session -> every session it acts for (RunRegistry.sessions_of): their requests are "you"
    sessions_of: Callable[[str], tuple[str, ...]] = lambda session: (session,)
    sent: SentViews = field(default_factory=SentViews)

    @property
    def components(self) -> list:
        return [self.graph, self.queue]

    def render(self, session: str, final: bool = False) -> dict:
        """For a run's stream: the views that changed, if a refresh period has passed since the
        tab was last sent them by a stream or `final` (the run's last update)."""
        queue, graph = self._render(session, from_stream=True, final=final)
        return {component: html for component, html in ((self.queue, queue), (self.graph, graph)) if html is not None}

    def refresh(self, session: str) -> dict:
        """For the timer: both views, each a gr.skip() when it would change nothing."""
        queue, graph = self._render(session, from_stream=False)
        return {self.queue: gr.skip() if queue is None else queue, self.graph: gr.skip() if graph is None else graph}

    def _render(self, session: str, from_stream: bool, final: bool = False) -> tuple[str | None, str | None]:
        """(queue, graph) HTML to send, None for one to leave as it is."""
        now = time.monotonic()
        last = self.sent.get(session)
        if last is not None and not final and now - last.streamed_at < self.refresh_s:
            return None, None  # a run's stream sent them less than a refresh period ago
        snapshot = self.engine.snapshot()
        viewer = self.sessions_of(session)
        queue = render_queues(snapshot, viewer, self.show_prompts, self.resumed_ids)
        graph = render_graph(snapshot, self.engine.infos, viewer)
        resend = last is None or (not from_stream and now - last.resent_at >= RESEND_S)
        self.sent.put(session, Sent(
            hash(queue), hash(graph),
            streamed_at=now if from_stream else (last.streamed_at if last else -math.inf),
            resent_at=now if resend and not from_stream else (last.resent_at if last else -math.inf)))
        return (queue if resend or hash(queue) != last.queue else None,
                graph if resend or hash(graph) != last.graph else None)


def render_queues(snapshot, session: Viewer, show_prompts: bool, resumed: Container[str] = ()) -> str:
    """The queue table; with engine replicas (serve/), one table per replica under its label: their
    snapshot then carries `replicas`, (label, that replica's EngineSnapshot) pairs."""
    parts = getattr(snapshot, "replicas", ())
    if not parts:
        return render_queue(snapshot, session, show_prompts, resumed=resumed)
    return "".join(f'<div class="ss-replica" data-replica="{html.escape(label)}"><b>{html.escape(label)}</b>'
                   f"{render_queue(part, session, show_prompts, resumed=resumed)}</div>" for label, part in parts)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'s' * (count != 1)}"


def _build_header(engine: EngineClient) -> None:
    """One line over the tabs: the Workflow tab's canvas takes the rest of the window."""
    models = ", ".join(f"`{name}` ({info.family}, {info.output_kind}s)" for name, info in engine.infos.items())
    gr.Markdown(
        f"**stepstudio** · {' + '.join(f'`{name}`' for name in engine.models.names)} · "
        f"{_plural(len(engine.models.names), 'model')}: {models}. One shared engine in **{engine.mode}** mode "
        f"(up to {_plural(engine.max_batch_requests, 'request')} per forward): requests join a running batch at the "
        "next denoise step.",
        elem_id="ss-header",
    )


def _build_live_views(engine: EngineClient, config: StudioOptions, resumed: ResumeReport | None,
                      registry: RunRegistry) -> LiveViews:
    with gr.Accordion("Pipeline and queue (live, all sessions)", open=True):
        graph = gr.HTML("", elem_id="ss-graph")
        queue = gr.HTML("", elem_id="ss-queue")
    return LiveViews(gr.Timer(config.queue_refresh_s), graph, queue, engine, config.show_prompts, config.queue_refresh_s,
                     () if resumed is None else resumed.request_ids, registry.sessions_of)


def _wire_live_views(views: LiveViews) -> None:
    def refresh(request: gr.Request) -> dict:
        return views.refresh(session_id_of(request))

    views.timer.tick(refresh, outputs=views.components, queue=False, api_name="ui_refresh_views",
                     api_visibility="private", show_progress="hidden")


def output_store(engine: EngineClient, config: StudioOptions, index: StudioStore | None = None) -> OutputStore:
    """The outputs folder's store; `index`: the studio's durable store (opened on the folder when None)."""
    folder = Path(config.outputs).expanduser() if config.outputs else None
    return OutputStore(folder, model=engine.info.name, fps=model_fps(engine.info), write_video=write_mp4,
                       fps_by_model={name: model_fps(info) for name, info in engine.infos.items()}, index=index)


def build_ui(engine: EngineClient, config: StudioOptions, store: OutputStore | None = None,
             durable: DurableRequests | None = None, runner: WorkflowRunner | None = None,
             resumed: ResumeReport | None = None) -> gr.Blocks:
    """The whole page; every browser tab is its own session, all share `engine`. `store`,
    `durable` and `runner`: the app's (made here when None); `resumed`: what a restart resumed,
    told to each returning owner."""
    store = store or output_store(engine, config)
    durable = durable or DurableRequests(store.index)
    runner = runner or WorkflowRunner(engine, config, RunRegistry(), store)
    results = TabResults()
    with gr.Blocks(title=f"stepstudio · {' + '.join(engine.models.names)}") as demo:
        # The History token (studio.server.history_owners), kept under a key that survives restarts.
        browser_token = gr.BrowserState("", storage_key=BROWSER_STORAGE_KEY, secret=store.owners.browser_state_secret)
        _build_header(engine)
        banner = build_restart_banner()
        with gr.Tabs(elem_id="ss-tabs") as tabs:
            with gr.Tab("Workflow", id="workflow", elem_id="ss-tab-workflow"):
                workflow_tab = build_workflow_tab(engine)
            with gr.Tab("Simple", id="simple", elem_id="ss-tab-simple"):
                form, panel = build_simple_tab(engine, config)
            with gr.Tab("History", id="history", elem_id="ss-tab-history") as history_page:
                history = build_history_tab(store)
        views = _build_live_views(engine, config, resumed, runner.registry)
        wire_workflow_tab(runner, workflow_tab, browser_token, views)
        wire_simple_tab(runner, results, form, panel, browser_token, views)
        wire_history_tab(engine, store, history, history_page, browser_token, form, workflow_tab.editor, tabs, demo,
                         runner.tab_tokens)
        _wire_live_views(views)
        wire_restart_banner(banner, resumed, store.owners, runner.registry, browser_token, demo, panel.queue,
                            config.queue_refresh_s)
        wire_api_endpoints(engine, config, store, durable, resumed)
        wire_workflow_api(runner)

        def forget_tab(request: gr.Request) -> None:
            results.forget(session_id_of(request))
            views.sent.forget(session_id_of(request))
            runner.registry.release(session_id_of(request))

        demo.unload(forget_tab)
    return demo

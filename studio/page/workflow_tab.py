"""The Workflow tab (a node editor) and the `/run_workflow` API, over the shared engine.

The editor is a `gr.HTML` component: its value is the workflow JSON, kept current by the
browser code in `studio/page/web/node_editor.js` (drawflow, vendored in `assets/vendor/drawflow`).
Run fires the component's `submit` event; the handler compiles the workflow
(`studio.workflows.compiler`), runs it (`studio.workflows.run`) and streams the run's state back
into the editor's `run_state` prop, which the browser code draws on the nodes (each picture sent
once: studio/page/run_state.py). The same run loop serves gradio_client callers through
`/run_workflow`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr
from PIL import Image

from engine import EngineClient, GenerationParams
from studio.config import StudioOptions
from studio.media import final_media, model_fps
from studio.outputs import OutputStore, save_quietly
from studio.page.queue_controls import QueueControls, build_queue_controls, wire_queue_controls
from studio.page.run_state import (
    RUN_FILES_FOLDER,
    EditorRunState,
    RunFiles,
    RunStateEncoder,
    invalid_state,
    path_of,
)
from studio.page.tab_tokens import TabTokens
from studio.server.server_compat import event_payload
from studio.server.temp_files import TempFolder
from studio.sessions import session_id_of
from studio.tracker import ABORTED, COMPLETED
from studio.user_errors import user_error
from studio.workflows.compiler import CompiledWorkflow, compile_workflow
from studio.workflows.format import (
    Problem,
    WorkflowError,
    for_saving,
    parse_workflow,
)
from studio.workflows.journal import RunJournal
from studio.workflows.limits import ModelLimits, WorkflowLimits
from studio.workflows.nodes import node_type_specs
from studio.workflows.registry import RunRegistry
from studio.workflows.run import WorkflowRun
from studio.workflows.run_views import BranchView, RunView

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
WEB_DIR = Path(__file__).resolve().parent / "web"
VENDOR_DIR = REPO / "assets" / "vendor" / "drawflow"
EXAMPLES_DIR = REPO / "assets" / "workflows"
DEFAULT_EXAMPLE = "text-to-image"
QUEUE_PREFIX = "sse"  # the ids of the tab's queue controls: #sse-pause-queue, #sse-queue-row, ...

# The component's markup never changes (drawflow owns what is inside); a template that used
# `value` or a prop would be re-rendered by Gradio and wipe the editor.
EDITOR_TEMPLATE = '<div class="sse-root" data-editor="stepstudio"></div>'
EDITOR_JS = "StepStudioEditor.mount(element, props, trigger, watch);"


def load_examples(folder: Path = EXAMPLES_DIR) -> dict[str, dict]:
    """The shipped workflows by name (file name without .json), each checked to parse."""
    examples = {}
    for path in sorted(folder.glob("*.json")):
        workflow = parse_workflow(path.read_text())
        examples[path.stem] = workflow.to_json()
    return examples


def workflow_limits(engine: EngineClient, config: StudioOptions) -> WorkflowLimits:
    """Every loaded model's limits (the engine's default model first) and the branch limit."""
    models = []
    for name, info in engine.infos.items():
        limits = engine.limits_for(name)
        models.append(ModelLimits(
            name=name,
            max_steps=limits.max_steps,
            max_size=limits.max_size,
            max_frames=limits.max_frames,
            frame_counts=tuple(info.supported_frame_counts),
            size_multiple=max(info.size_multiple, 1),
            schedulers=tuple(info.schedulers),
            uses_negative_prompt=info.uses_negative_prompt,
            makes_video=info.output_kind == "video",
            sizes=tuple(info.supported_sizes),
            size_range=info.size_range,
            image_inputs=tuple(info.image_inputs),
            loras=tuple(info.loras),
        ))
    return WorkflowLimits(tuple(models), max_branches=config.max_branches)


def compile_source(source: object, limits: WorkflowLimits,
                   picture_files: Callable[[str], bytes] | None = None) -> CompiledWorkflow:
    """A workflow from the editor or an API caller: JSON text, or an already decoded object."""
    if source is None or (isinstance(source, str) and not source.strip()):
        raise WorkflowError([Problem("the workflow is empty: send its JSON (version, nodes, links).")])
    return compile_workflow(parse_workflow(source), limits, picture_files)


def _model_field_defaults(engine: EngineClient) -> dict[str, dict]:
    """New nodes start at the default model's settings (Frames at the first video model's)."""
    defaults = engine.info.defaults
    video = next((info.defaults for info in engine.infos.values() if info.output_kind == "video"), None)
    return {
        "size": {"width": defaults.width, "height": defaults.height},
        "steps": {"steps": defaults.num_inference_steps},
        "guidance": {"scale": defaults.guidance_scale},
        "frames": {"frames": video.num_frames if video else 1},
        "lora": {"name": engine.info.loras[0] if engine.info.loras else ""},
    }


# ---------------------------------------------------------------------------- results gallery
class ResultsGallery:
    """Finished branches as (image or video file, caption), grids first. A video's MP4 is written
    once per branch (again only if its temp file went meanwhile). Encodes: call it in a worker thread."""

    def __init__(self, fps_of: Callable[[GenerationParams], int]) -> None:
        self.fps_of = fps_of
        self._media: dict[int, Image.Image | str] = {}

    def media(self, progress: BranchView) -> Image.Image | str:
        media = self._media.get(progress.branch.index)
        if media is None or (isinstance(media, str) and not os.path.exists(media)):
            media = self._media[progress.branch.index] = final_media(progress.result, fps=self.fps_of(progress.params))
        return media

    def items(self, view: RunView, grid_files: dict[str, str] | None = None) -> list[tuple[Image.Image | str, str]]:
        """`grid_files`: node id -> the file a grid was already written to (the editor's), sent
        as it is instead of being encoded again."""
        grid_files = grid_files or {}
        items = [(grid_files.get(node_id, image), f"grid {node_id}") for node_id, image in view.grids.items()]
        for progress in view.branches:
            if progress.result is not None:
                items.append((self.media(progress), progress.caption))
        return items


@dataclass
class WorkflowRunner:
    """Compile, register, run and save one workflow for one session (the editor, the Simple tab
    and the API share it)."""

    engine: EngineClient
    config: StudioOptions
    registry: RunRegistry
    outputs: OutputStore | None = None
    tab_tokens: TabTokens = field(default_factory=TabTokens)  # each page tab's History owner

    def fps_of(self, params: GenerationParams) -> int:
        """Frames per second of a request's video: its own model's (not the default model's)."""
        return model_fps(self.engine.infos[self.engine.models.resolve(params.model)])

    def caller_owner(self, session_id: str) -> str:
        """Whose history an API caller's result joins: its engine session's (studio.server.history_owners)."""
        return "" if self.outputs is None else self.outputs.owners.of_caller(session_id)

    async def page_owner(self, browser_token: object, session_id: str) -> str:
        """Whose history a page tab's result joins: the browser's, when this server signed its token
        (it survives reloads); without one (a first visit's click before the browser kept the token
        its load is issuing), the browser's all the same (studio.page.tab_tokens)."""
        if self.outputs is None:
            return ""
        return self.outputs.owners.of_browser(browser_token) or await self.tab_tokens.owner_without_token(
            session_id, self.outputs.owners)

    def start(self, source: object, session_id: str, owner: str | None = None,
              **resume) -> tuple[WorkflowRun, CompiledWorkflow]:
        """Raises WorkflowError naming every problem; nothing is submitted then. `owner` (a
        page_owner's or caller_owner's key): whose saved results a Load image may name. `resume`: WorkflowRun's
        run_id, seeds and ended_before, for a run from before a restart. Decodes pictures and
        checks every branch: call it in a worker thread."""
        pictures = None
        if owner and self.outputs is not None and self.outputs.enabled:
            pictures = functools.partial(self.outputs.saved_picture, owner)
        compiled = compile_source(source, workflow_limits(self.engine, self.config), pictures)
        run = WorkflowRun(self.engine, compiled, session_id, self.config.preview_every, **resume)
        return run, compiled

    async def start_for(self, source: object, request: gr.Request, page_token: object = None, from_page: bool = False
                        ) -> tuple[WorkflowRun, CompiledWorkflow, str]:
        """`start` for a Gradio caller, in a worker thread: (run, compiled, the owner its results are
        saved for). `from_page`: the editor's Run, with the browser's History token. Raises WorkflowError."""
        session = session_id_of(request)
        owner = await self.page_owner(page_token, session) if from_page else self.caller_owner(session)
        run, compiled = await asyncio.to_thread(self.start, source, session, owner)
        return run, compiled, owner

    async def follow(self, run: WorkflowRun, owner: str, workflow: dict | None = None,
                     resumed: bool = False) -> AsyncIterator[RunView]:
        """The run's views until it ends; each finished branch is saved for `owner` (a
        page_owner's or caller_owner's key), with the workflow JSON when it came from the editor. The run is kept in
        the durable store until it ends (studio.workflows.journal); `resumed`: it is kept already."""
        self.registry.add(run)
        journal = await asyncio.to_thread(RunJournal.begin, self.outputs, run, owner, workflow is not None, resumed)
        saved: set[int] = set(run.ended_before)
        saved_workflow = None if workflow is None else for_saving(workflow)
        updates = run.updates()
        view = None
        try:
            async with contextlib.aclosing(updates):
                async for view in updates:
                    for branch in view.branches:
                        if journal is not None:
                            await journal.branch_ended(branch, saved_workflow, stopping=not self.engine.accepting)
                        elif branch.result is not None and branch.branch.index not in saved:
                            saved.add(branch.branch.index)
                            await save_quietly(self.outputs, branch.result, owner, saved_workflow,
                                               caption=branch.caption)
                    if view.is_final and self.engine.accepting:  # in History before the page says it ended
                        await self._save_grids(view, run, owner, saved_workflow)
                    yield view
        finally:
            self.registry.finished(run)
            if journal is not None:
                journal.close(keep=not self.engine.accepting)
        if view is not None and view.state != COMPLETED and self._shut_down():
            # After the last view (the editor draws where each branch stopped), the same error
            # every other caller in flight gets at a shutdown.
            reason = next((b.message for b in view.branches if b.state == ABORTED and b.message), "it is stopping")
            raise user_error(f"The server is shutting down: {reason}. Try again once it is back.",
                             "Server shutting down")

    async def _save_grids(self, view: RunView, run: WorkflowRun, owner: str, workflow: dict | None) -> None:
        """A run's X/Y grids, as they ended, join its owner's History (a grid none of whose cells
        finished does not). A failed write (a full disk) is logged; the run has ended anyway."""
        if self.outputs is None or not self.outputs.enabled or not owner:
            return
        for layout in run.compiled.grids:
            cells = [view.branches[index] for row in layout.cells for index in row if index is not None]
            finished = next((cell for cell in cells if cell.result is not None), None)
            if finished is None or layout.node_id not in view.grids:
                continue
            caption = f"grid: {layout.x_axis or '-'} × {layout.y_axis or '-'}"
            try:
                await asyncio.to_thread(self.outputs.save_grid, view.grids[layout.node_id], finished.params, owner,
                                        workflow, caption)
            except OSError as exc:
                log.warning("could not save the grid of run %s: %s", run.run_id, exc)

    def _shut_down(self) -> bool:
        """The engine was shut down (SIGTERM, Ctrl-C), as opposed to crashed (its failure says why)."""
        return not self.engine.accepting and self.engine.failure is None


# ---------------------------------------------------------------------------- the tab
@dataclass(frozen=True)
class WorkflowTab:
    editor: gr.HTML
    results: gr.Gallery
    controls: QueueControls  # Pause / Resume / Clear of the tab's queue (the same session as the Simple tab's)


def _static_url(path: Path) -> str:
    version = int(path.stat().st_mtime)
    return f"gradio_api/file={path}?v={version}"


# The editor's browser code, in the order it loads (the browser runs these scripts in this order):
# what every file shares, then the editor's methods by concern (joined to node_editor.js's NodeEditor
# as that file loads), then its gestures, one file each (attached to the editor as it mounts), and
# node_editor.js last.
EDITOR_KIT = ("editor_kit.js",)
EDITOR_METHODS = ("editor_pictures.js", "editor_workflow.js", "editor_toolbar.js", "editor_run_view.js")
EDITOR_PARTS = ("editor_colors.js", "editor_bypass.js", "editor_selection.js", "editor_clipboard.js",
                "editor_search.js", "editor_link_drop.js", "editor_groups.js", "editor_menus.js", "editor_minimap.js",
                "editor_window.js", "editor_shortcuts.js")
EDITOR_FILES = (*EDITOR_KIT, *EDITOR_METHODS, *EDITOR_PARTS, "node_editor.js")


def editor_head() -> str:
    gr.set_static_paths([str(WEB_DIR), str(VENDOR_DIR)])
    return (
        f'<link rel="stylesheet" href="{_static_url(VENDOR_DIR / "drawflow.min.css")}">'
        f'<script src="{_static_url(VENDOR_DIR / "drawflow.min.js")}"></script>'
        f'<link rel="stylesheet" href="{_static_url(WEB_DIR / "node_editor.css")}">'
        f'<link rel="stylesheet" href="{_static_url(WEB_DIR / "editor_gestures.css")}">'
        + "".join(f'<script src="{_static_url(WEB_DIR / name)}"></script>' for name in EDITOR_FILES)
        + f'<link rel="stylesheet" href="{_static_url(WEB_DIR / "lightbox.css")}">'
        + f'<script src="{_static_url(WEB_DIR / "lightbox.js")}"></script>'
    )


def build_workflow_tab(engine: EngineClient) -> WorkflowTab:
    examples = load_examples()
    default = examples.get(DEFAULT_EXAMPLE) or next(iter(examples.values()), {"version": 1, "nodes": [], "links": []})

    editor = gr.HTML(
        value=json.dumps(default),
        html_template=EDITOR_TEMPLATE,
        js_on_load=EDITOR_JS,
        head=editor_head(),
        elem_id="ss-node-editor",
        node_types=node_type_specs(_model_field_defaults(engine)),
        examples=examples,
        default_example=DEFAULT_EXAMPLE,
        schedulers=sorted({name for info in engine.infos.values() for name in info.schedulers}),
        models=list(engine.models.names),
        loras=sorted({name for info in engine.infos.values() for name in info.loras}),
        run_state=None,
        # The tab's Pause / Resume / Clear row and its line, which the editor puts on its run bar.
        queue_controls=[f"{QUEUE_PREFIX}-queue-row", f"{QUEUE_PREFIX}-queue-note"],
    )
    results = gr.Gallery(label="Run results (grids first)", columns=8, height=220, object_fit="contain",
                         format="png", preview=False, allow_preview=True, elem_id="ss-workflow-results")
    controls = build_queue_controls(QUEUE_PREFIX, engine.pause_state.engine)
    return WorkflowTab(editor, results, controls)


def cancel_from_page(registry: RunRegistry, event: gr.EventData, request: gr.Request) -> None:
    """A page's × or Cancel sent {run_id, index} (index -1: the whole run) as a `stop` event."""
    data = event_payload(event)
    index = data.get("index", -1)
    if isinstance(index, bool) or not isinstance(index, int):
        raise user_error(f"index must be a branch number, got {index!r:.20}.", "Bad request")
    try:
        registry.cancel(data.get("run_id"), session_id_of(request), branch=index)
    except PermissionError as exc:
        raise user_error(str(exc), "Not your run") from None


def wire_workflow_tab(runner: WorkflowRunner, tab: WorkflowTab, browser_token: gr.BrowserState, live) -> None:
    """`live`: the page's LiveViews, redrawn with the run's updates (at most once per refresh
    period, and in its last one)."""
    files = RunFiles(TempFolder(RUN_FILES_FOLDER, ttl_s=runner.config.temp_file_ttl_s,
                                parent=Path(gr.utils.get_upload_folder())))

    async def run(workflow: str, token: str, request: gr.Request):
        states = EditorRunState(runner.config.preview_max_px, runner.fps_of, files)
        gallery = ResultsGallery(runner.fps_of)
        session = session_id_of(request)
        try:
            started, compiled, owner = await runner.start_for(workflow, request, token, from_page=True)
        except WorkflowError as exc:
            yield {tab.editor: gr.update(run_state=invalid_state(exc))}
            raise user_error(str(exc), "Workflow not run") from None
        def encoded(view: RunView) -> tuple[dict, dict]:
            return states.update(view, compiled), live.render(session, final=view.is_final)

        finished_seen = -1
        async for view in runner.follow(started, owner, compiled.workflow.to_json()):
            # Pictures are encoded and written, and the views drawn, in a worker thread: the
            # event loop keeps serving.
            state, views = await asyncio.to_thread(encoded, view)
            outputs: dict = {tab.editor: gr.update(run_state=state), **views}
            finished = sum(b.result is not None for b in view.branches)
            if finished != finished_seen or view.is_final:
                finished_seen = finished
                grid_files = {node_id: path_of(url) for node_id, url in state["grids"].items() if url}
                outputs[tab.results] = await asyncio.to_thread(gallery.items, view, grid_files)
            yield outputs

    tab.editor.submit(run, inputs=[tab.editor, browser_token], outputs=[tab.editor, tab.results, *live.components],
                      concurrency_limit=None,
                      api_name="ui_run_workflow", api_visibility="private", show_progress="hidden")

    def cancel(event: gr.EventData, request: gr.Request) -> None:
        """The editor's Cancel (index -1) and per-branch × buttons; the run's stream shows the outcome."""
        cancel_from_page(runner.registry, event, request)

    tab.editor.stop(cancel, queue=False, api_name="ui_cancel_workflow", api_visibility="private",
                    show_progress="hidden")
    wire_queue_controls(runner.engine, runner.registry, tab.controls, "workflow")


# ---------------------------------------------------------------------------- the API
def wire_workflow_api(runner: WorkflowRunner) -> None:
    """`/run_workflow` (streams status, returns images and grids) and `/cancel_workflow`."""
    with gr.Column(visible=False):
        trigger = gr.Button("api-run-workflow")
        workflow = gr.JSON(label="workflow")
        status = gr.JSON(label="status")
        images = gr.Gallery(label="images", format="png")
        grids = gr.Gallery(label="grids", format="png")

    async def run_workflow(workflow: dict | str, request: gr.Request):
        """Run a workflow (JSON object or text; see the README). Streams (status, images, grids):
        status has run_id, state, done/total and every branch's state, step, total, seed and
        preview (a data URL); images and grids fill in as branches finish.
        Cancel with /cancel_workflow and the run_id."""
        encoder = RunStateEncoder(runner.config.preview_max_px, runner.fps_of)
        gallery = ResultsGallery(runner.fps_of)
        try:
            started, compiled, owner = await runner.start_for(workflow, request)
        except WorkflowError as exc:
            raise user_error(str(exc), "Workflow not run") from None

        def results(view: RunView) -> list:
            return [(gallery.media(b), b.caption) for b in view.branches if b.result]

        finished_seen = -1
        async for view in runner.follow(started, owner, compiled.workflow.to_json()):
            finished = sum(b.result is not None for b in view.branches)
            changed = finished != finished_seen or view.is_final
            finished_seen = finished
            # Data URLs and videos are encoded in a worker thread: the event loop keeps serving.
            yield {
                status: await asyncio.to_thread(encoder.state, view, compiled),
                images: await asyncio.to_thread(results, view) if changed else gr.skip(),
                grids: [(image, f"grid {node_id}") for node_id, image in view.grids.items()] if changed else gr.skip(),
            }

    trigger.click(run_workflow, inputs=workflow, outputs=[status, images, grids], api_name="run_workflow",
                  concurrency_limit=None)

    def cancel_workflow(run_id: str, branch: int = -1, request: gr.Request = None) -> dict:
        """Cancel one of YOUR workflow runs by its run_id (from /run_workflow's status), or only
        its branch number `branch` (-1: the whole run). It stops at the next step boundary."""
        if isinstance(branch, bool) or not isinstance(branch, (int, float)) or branch != int(branch):
            raise user_error(f"branch must be a whole number (-1 for the whole run), got {branch!r:.20}.",
                             "Bad request")
        try:
            return runner.registry.cancel(run_id, session_id_of(request), branch=int(branch))
        except PermissionError as exc:
            raise user_error(str(exc), "Not your run") from None

    gr.api(cancel_workflow, api_name="cancel_workflow", queue=False)


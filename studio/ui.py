"""The studio's Gradio Blocks: a generate panel per session, plus live queue and graph views.

Each builder makes one part of the page and returns its components in a small frozen
dataclass; the `_wire_*` functions connect events. Handlers read their inputs as a
{component: value} dict and yield {component: value} dicts, so no code depends on the
order of a long list of UI values. All sessions share the one `Engine` passed in.
"""

from __future__ import annotations

import contextlib
import html
from dataclasses import dataclass

import gradio as gr

from engine import Completed, Engine, Failed, Progress, Queued
from pipelines.params import MIN_SIZE
from studio.bridge import (
    RANDOM_SEED,
    FormValues,
    Status,
    Update,
    cancel_own_request,
    final_media,
    follow_request,
    preview_image,
    session_id_of,
    settings_caption,
)
from studio.config import StudioOptions
from studio.graph_view import GRAPH_CSS, render_graph
from studio.queue_view import QUEUE_CSS, render_queue, short_id, snapshot_as_dict
from studio.workflow_ui import RunRegistry, WorkflowRunner, build_workflow_tab, wire_workflow_api, wire_workflow_tab

GALLERY_LIMIT = 24

STUDIO_CSS = QUEUE_CSS + GRAPH_CSS + """
.ss-status { font-size: 0.9rem; min-height: 2.6rem; }
.ss-status progress { width: 100%; height: 12px; }
.ss-status .ss-state { font-weight: 700; text-transform: uppercase; letter-spacing: 0.03em; }
.ss-status.ss-failed .ss-state, .ss-status.ss-aborted .ss-state { color: var(--error-text-color, #c00); }
#ss-progress { min-height: 44px; }
#ss-preview img, #ss-result img { width: 100%; height: 100%; object-fit: contain; image-rendering: pixelated; }
#ss-gallery img { image-rendering: pixelated; object-fit: contain !important; }
#ss-gallery .grid-container { grid-template-columns: repeat(auto-fill, minmax(110px, 130px)) !important; }
.ss-unknown { color: var(--error-text-color, #b45309); font-size: 0.85rem; }
"""


# ---------------------------------------------------------------------------- components
@dataclass(frozen=True)
class GenerateForm:
    prompt: gr.Textbox
    negative_prompt: gr.Textbox
    width: gr.Slider
    height: gr.Slider
    steps: gr.Slider
    guidance_scale: gr.Slider
    random_seed: gr.Checkbox
    seed: gr.Number
    unknown_words: gr.Markdown
    generate: gr.Button
    cancel: gr.Button


@dataclass(frozen=True)
class ResultPanel:
    status: gr.HTML
    preview: gr.Image
    media: gr.Image | gr.Video
    gallery: gr.Gallery
    history: gr.State  # this session's results: list of (media, caption)
    progress_slot: gr.HTML  # where Gradio draws the step progress bar (keeps the status readable)
    current_request: gr.State  # id of this tab's latest request, for the Cancel button


@dataclass(frozen=True)
class LiveViews:
    timer: gr.Timer
    graph: gr.HTML
    queue: gr.HTML


@dataclass(frozen=True)
class ApiComponents:
    """Hidden inputs/outputs of the /generate API endpoint (no range clamping: the engine
    validates, so API users get the engine's messages)."""

    trigger: gr.Button
    prompt: gr.Textbox
    negative_prompt: gr.Textbox
    width: gr.Number
    height: gr.Number
    steps: gr.Number
    guidance_scale: gr.Number
    seed: gr.Number
    status: gr.JSON
    preview: gr.Image
    media: gr.Image | gr.Video


# ---------------------------------------------------------------------------- rendering
def render_status(status: Status | None) -> str:
    """The status line with its own step bar (mirrors Gradio's progress bar)."""
    if status is None:
        return '<div class="ss-status">Ready. Enter a prompt and press Generate.</div>'
    parts = [f'<span class="ss-state">{html.escape(status.state)}</span>']
    if status.state == "queued" and status.position:
        parts.append(f"position {status.position} in the queue")
    if status.total:
        parts.append(f"step {status.step}/{status.total}")
    if status.batch_size:
        mates = status.batch_size - 1
        parts.append(f"batch of {status.batch_size}" + (f" (with {mates} other request{'s' * (mates != 1)})" if mates else ""))
    parts.append(f"seed {status.seed}")
    parts.append(f"request <code>{short_id(status.request_id)}</code>")
    message = f"<div>{html.escape(status.message)}</div>" if status.message and status.state != "completed" else ""
    bar = f'<progress value="{status.step}" max="{max(status.total, 1)}"></progress>'
    return (
        f'<div class="ss-status ss-{html.escape(status.state)}" data-state="{html.escape(status.state)}" '
        f'data-step="{status.step}" data-total="{status.total}">'
        + " · ".join(parts) + bar + message + "</div>"
    )


def unknown_words_text(engine: Engine, prompt: str) -> str:
    """'Unknown words: ...' when the pipeline can tell which prompt words it never learned."""
    finder = getattr(engine.pipeline, "unknown_words", None)
    if finder is None or not prompt or not prompt.strip():
        return ""
    words = list(finder(prompt))
    if not words:
        return ""
    listed = ", ".join(f"`{word}`" for word in words)
    return f'<span class="ss-unknown">The model does not know: {listed}</span>'


# ---------------------------------------------------------------------------- builders
def _build_header(engine: Engine, config: StudioOptions) -> None:
    info = engine.info
    gr.Markdown(
        f"## stepstudio · `{info.name}`\n"
        f"{info.family} model, makes {info.output_kind}s. One shared engine in **{engine.mode}** mode "
        f"(up to {engine.max_batch} requests per forward): requests join a running batch at the next "
        "denoise step."
    )


def _build_form(engine: Engine, config: StudioOptions) -> GenerateForm:
    info = engine.info
    defaults = info.defaults
    prompt = gr.Textbox(label="Prompt", lines=2, placeholder="a large red circle on a blue background",
                        elem_id="ss-prompt")
    negative = gr.Textbox(label="Negative prompt", lines=1, visible=info.uses_negative_prompt,
                          value=defaults.negative_prompt or "", elem_id="ss-negative")
    unknown = gr.Markdown("", elem_id="ss-unknown")
    with gr.Row():
        generate = gr.Button("Generate", variant="primary", elem_id="ss-generate")
        cancel = gr.Button("Cancel", variant="stop", elem_id="ss-cancel")
    if defaults.example_prompts:
        gr.Examples(examples=[[p] for p in defaults.example_prompts], inputs=[prompt], label="Example prompts")
    with gr.Accordion("Settings", open=True):
        size_step = max(info.size_multiple, 1)
        size_min = max(MIN_SIZE, size_step)
        with gr.Row():
            max_size = engine.limits.max_size  # the server's cap, resolved for this model
            width = gr.Slider(size_min, max_size, value=min(defaults.width, max_size), step=size_step, label="Width")
            height = gr.Slider(size_min, max_size, value=min(defaults.height, max_size), step=size_step, label="Height")
        with gr.Row():
            max_steps = engine.limits.max_steps
            steps = gr.Slider(1, max_steps, value=min(defaults.num_inference_steps, max_steps), step=1,
                              label="Steps", elem_id="ss-steps")
            guidance = gr.Slider(0.0, 20.0, value=defaults.guidance_scale, step=0.5, label="Guidance scale")
        with gr.Row():
            random_seed = gr.Checkbox(value=True, label="Random seed", elem_id="ss-random-seed")
            seed = gr.Number(value=0, precision=0, minimum=0, label="Seed (the used seed appears here)",
                             elem_id="ss-seed")
    return GenerateForm(prompt, negative, width, height, steps, guidance, random_seed, seed, unknown, generate, cancel)


def _build_results(engine: Engine) -> ResultPanel:
    status = gr.HTML(render_status(None), elem_id="ss-status")
    progress_slot = gr.HTML("", elem_id="ss-progress")
    with gr.Row():
        preview = gr.Image(label="Live preview", format="jpeg", type="pil", interactive=False, height=256,
                           elem_id="ss-preview")
        if engine.info.output_kind == "video":
            media = gr.Video(label="Result", interactive=False, height=256, elem_id="ss-result")
        else:
            media = gr.Image(label="Result", format="png", type="pil", interactive=False, height=256,
                             elem_id="ss-result")
    gallery = gr.Gallery(label="This session's results", columns=6, rows=1, height=190, object_fit="contain",
                         format="png", preview=False, allow_preview=True, elem_id="ss-gallery")
    history = gr.State([])
    return ResultPanel(status, preview, media, gallery, history, progress_slot, gr.State(None))


def _build_live_views(config: StudioOptions) -> LiveViews:
    with gr.Accordion("Pipeline and queue (live, all sessions)", open=True):
        graph = gr.HTML("", elem_id="ss-graph")
        queue = gr.HTML("", elem_id="ss-queue")
    timer = gr.Timer(config.queue_refresh_s)
    return LiveViews(timer, graph, queue)


def _build_api_components(engine: Engine) -> ApiComponents:
    defaults = engine.info.defaults
    with gr.Column(visible=False):
        trigger = gr.Button("api-generate")
        prompt = gr.Textbox(label="prompt")
        negative = gr.Textbox(label="negative_prompt", value=defaults.negative_prompt or "")
        width = gr.Number(label="width", value=defaults.width)
        height = gr.Number(label="height", value=defaults.height)
        steps = gr.Number(label="steps", value=defaults.num_inference_steps)
        guidance = gr.Number(label="guidance_scale", value=defaults.guidance_scale)
        seed = gr.Number(label="seed (-1 = random)", value=RANDOM_SEED)
        status = gr.JSON(label="status")
        preview = gr.Image(label="preview", format="jpeg", type="pil")
        if engine.info.output_kind == "video":
            media = gr.Video(label="video")
        else:
            media = gr.Image(label="image", format="png", type="pil")
    return ApiComponents(trigger, prompt, negative, width, height, steps, guidance, seed, status, preview, media)


# ---------------------------------------------------------------------------- handlers
def _ui_update(update: Update, panel: ResultPanel, form: GenerateForm, config: StudioOptions,
               engine: Engine, progress: gr.Progress, history: list) -> dict:
    """Gradio outputs for one engine event of this session's request."""
    status, event = update.status, update.event
    outputs: dict = {panel.status: render_status(status)}
    if event is None:
        outputs.update({form.seed: status.seed, panel.preview: None, panel.media: None,
                        panel.current_request: status.request_id})
    elif isinstance(event, Queued):
        progress((0, status.total), desc=f"waiting in queue: position {event.position}", unit="steps")
    elif isinstance(event, Progress):
        progress((event.step, event.total), desc="denoising", unit="steps")
        if event.preview is not None:
            outputs[panel.preview] = preview_image(event.preview, config.preview_max_px)
    elif isinstance(event, Completed):
        media = final_media(event, fps=int(engine.info.extras.get("fps", 16)))
        history[:] = ([(media, settings_caption(event))] + history)[:GALLERY_LIMIT]
        outputs.update({panel.media: media, panel.history: history, panel.gallery: list(history)})
    return outputs


def _form_values(values: dict, form: GenerateForm) -> FormValues:
    return FormValues(
        prompt=values[form.prompt],
        negative_prompt=values[form.negative_prompt],
        width=values[form.width],
        height=values[form.height],
        steps=values[form.steps],
        guidance_scale=values[form.guidance_scale],
        seed=RANDOM_SEED if values[form.random_seed] else values[form.seed],
    )


def _wire_generate(engine: Engine, config: StudioOptions, form: GenerateForm, panel: ResultPanel) -> None:
    async def generate(values: dict, request: gr.Request, progress=gr.Progress()):
        history = list(values[panel.history] or [])
        updates = follow_request(engine, _form_values(values, form), session_id_of(request), config.preview_every)
        async with contextlib.aclosing(updates):
            async for update in updates:
                yield _ui_update(update, panel, form, config, engine, progress, history)
                if isinstance(update.event, Failed):
                    raise gr.Error(update.event.message, title="Generation failed")

    def cancel(current_request: str | None, request: gr.Request) -> None:
        """Abort this tab's request; its generator then shows the aborted status and ends."""
        session = session_id_of(request)
        own = {view.request_id for view in engine.snapshot().requests if view.session_id == session}
        if current_request:
            own.add(current_request)  # submitted a moment ago, maybe not in a snapshot yet
        for request_id in own:
            engine.cancel(request_id, session)

    inputs = {form.prompt, form.negative_prompt, form.width, form.height, form.steps, form.guidance_scale,
              form.random_seed, form.seed, panel.history}
    outputs = [panel.status, panel.preview, panel.media, panel.gallery, panel.history, form.seed, panel.progress_slot,
               panel.current_request]
    form.generate.click(
        generate, inputs=inputs, outputs=outputs, concurrency_limit=None, api_name="ui_generate",
        api_visibility="private",
        show_progress="full", show_progress_on=[panel.progress_slot],
    )
    form.prompt.submit(
        generate, inputs=inputs, outputs=outputs, concurrency_limit=None, api_name="ui_generate_on_enter",
        api_visibility="private",
        show_progress="full", show_progress_on=[panel.progress_slot],
    )
    form.cancel.click(cancel, inputs=[panel.current_request], queue=False, api_name="ui_cancel",
                      api_visibility="private")


def _wire_unknown_words(engine: Engine, form: GenerateForm) -> None:
    if getattr(engine.pipeline, "unknown_words", None) is None:
        return
    form.prompt.change(lambda prompt: unknown_words_text(engine, prompt), inputs=form.prompt,
                       outputs=form.unknown_words, queue=False, trigger_mode="always_last",
                       api_name="ui_unknown_words", api_visibility="private", show_progress="hidden")


def _wire_live_views(engine: Engine, config: StudioOptions, views: LiveViews) -> None:
    def refresh(request: gr.Request) -> dict:
        snapshot = engine.snapshot()
        session = session_id_of(request)
        return {
            views.queue: render_queue(snapshot, session, config.show_prompts),
            views.graph: render_graph(snapshot, engine.info, session),
        }

    views.timer.tick(refresh, outputs=[views.queue, views.graph], queue=False, api_name="ui_refresh_views",
                     api_visibility="private", show_progress="hidden")


def _wire_api(engine: Engine, config: StudioOptions, api: ApiComponents) -> None:
    async def generate(prompt: str, negative_prompt: str, width: float, height: float, steps: float,
                       guidance_scale: float, seed: float, request: gr.Request):
        """Generate one image: streams (status, preview, image); status has request_id, state, step,
        total, position, batch_size and seed. Cancel with /cancel and the request_id."""
        form = FormValues(prompt, negative_prompt, width, height, steps, guidance_scale, seed)
        updates = follow_request(engine, form, session_id_of(request), config.preview_every)
        async with contextlib.aclosing(updates):
            async for update in updates:
                event = update.event
                # Every streamed tuple is (status, preview or None, media or None).
                outputs: dict = {api.status: update.status.as_dict(), api.preview: None, api.media: None}
                if isinstance(event, Progress) and event.preview is not None:
                    outputs[api.preview] = preview_image(event.preview, config.preview_max_px)
                elif isinstance(event, Completed):
                    outputs[api.media] = final_media(event, fps=int(engine.info.extras.get("fps", 16)))
                yield outputs
                if isinstance(event, Failed):
                    raise gr.Error(event.message, title="Generation failed")

    api.trigger.click(
        generate,
        inputs=[api.prompt, api.negative_prompt, api.width, api.height, api.steps, api.guidance_scale, api.seed],
        outputs=[api.status, api.preview, api.media],
        api_name="generate",
        concurrency_limit=None,
    )

    def cancel(request_id: str, request: gr.Request) -> dict:
        """Cancel one of YOUR requests by its request_id (from /generate's status); it stops at
        the next step boundary. Other sessions' requests can't be cancelled."""
        return cancel_own_request(engine, request_id, session_id_of(request))

    def queue(request: gr.Request) -> dict:
        """The engine's queue and figures now; your requests have "mine": true and full ids."""
        return snapshot_as_dict(engine.snapshot(), session_id_of(request), config.show_prompts)

    gr.api(cancel, api_name="cancel", queue=False)
    gr.api(queue, api_name="queue", queue=False)


# ---------------------------------------------------------------------------- the page
def build_ui(engine: Engine, config: StudioOptions) -> gr.Blocks:
    """The whole page; every tab gets its own session state, all share `engine`."""
    runner = WorkflowRunner(engine, config, RunRegistry())
    with gr.Blocks(title=f"stepstudio · {engine.info.name}") as demo:
        _build_header(engine, config)
        with gr.Tabs(elem_id="ss-tabs"):
            with gr.Tab("Workflow", id="workflow", elem_id="ss-tab-workflow"):
                workflow_tab = build_workflow_tab(engine, config, runner.registry)
            with gr.Tab("Simple", id="simple", elem_id="ss-tab-simple"):
                with gr.Row():
                    with gr.Column(scale=2):
                        form = _build_form(engine, config)
                    with gr.Column(scale=3):
                        panel = _build_results(engine)
        views = _build_live_views(config)
        api = _build_api_components(engine)
        _wire_generate(engine, config, form, panel)
        _wire_unknown_words(engine, form)
        _wire_live_views(engine, config, views)
        _wire_api(engine, config, api)
        wire_workflow_tab(runner, workflow_tab)
        wire_workflow_api(runner)
    return demo

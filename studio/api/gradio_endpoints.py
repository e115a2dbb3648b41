"""The named gradio_client endpoints for single requests: `/generate`, `/cancel` and `/queue`.

(`/run_workflow` and `/cancel_workflow` live with the editor, in studio/page/workflow_tab.py.)
Hidden components carry the endpoints' inputs and outputs, with no range clamping: the engine
validates, so API callers get the engine's own messages. Finished images are saved like the
page's (studio.outputs), under the caller's session.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from pathlib import Path

import gradio as gr

from engine import Completed, Engine, Failed, Progress
from studio.bridge import (
    RANDOM_SEED,
    FormValues,
    cancel_own_request,
    final_media,
    follow_request,
    preview_image,
    remove_files_older_than,
    session_id_of,
    user_error,
)
from studio.config import StudioOptions
from studio.media import animated_gif, model_fps
from studio.outputs import OutputStore, save_quietly
from studio.page.queue_view import snapshot_as_dict

PREVIEW_DIR = Path(tempfile.gettempdir()) / "stepstudio-previews"


def wire_api_endpoints(engine: Engine, config: StudioOptions, store: OutputStore) -> None:
    image_models = [name for name, info in engine.infos.items() if info.output_kind == "image"]
    video_models = [name for name, info in engine.infos.items() if info.output_kind == "video"]
    if image_models:
        _wire_generate(engine, config, store, image_models[0], "image")
    if video_models:
        _wire_generate(engine, config, store, video_models[0], "video")
    _wire_cancel_and_queue(engine, config)


def _wire_generate(engine: Engine, config: StudioOptions, store: OutputStore, example_model: str, kind: str) -> None:
    """`/generate` (image models) or `/generate_video` (video models): stream (status, preview, media)."""
    defaults = engine.infos[example_model].defaults
    default_model = "" if example_model == engine.models.default else example_model
    with gr.Column(visible=False):
        trigger = gr.Button(f"api-generate-{kind}")
        prompt = gr.Textbox(label="prompt")
        negative = gr.Textbox(label="negative_prompt", value=defaults.negative_prompt or "")
        # precision=0 types them as integers on the API page; the event skips Gradio's
        # preprocessing (which would round 2.5 to 2), so the engine's checks see what was sent.
        width = gr.Number(label="width", value=defaults.width, precision=0)
        height = gr.Number(label="height", value=defaults.height, precision=0)
        steps = gr.Number(label="steps", value=defaults.num_inference_steps, precision=0)
        guidance = gr.Number(label="guidance_scale", value=defaults.guidance_scale)
        seed = gr.Number(label="seed (-1 = random)", value=RANDOM_SEED, precision=0)
        model = gr.Textbox(label="model (empty: the default)", value=default_model)
        inputs = [prompt, negative, width, height, steps, guidance, seed, model]
        if kind == "video":
            inputs.append(gr.Number(label="num_frames (0: the model's default)", value=0, precision=0))
        status = gr.JSON(label="status")
        if kind == "video":
            preview = gr.Image(label="preview (every frame, looping GIF)", type="filepath")
            media = gr.Video(label="video")
        else:
            preview = gr.Image(label="preview", format="jpeg", type="pil")
            media = gr.Image(label="image", format="png", type="pil")

    async def generate(prompt, negative_prompt, width, height, steps, guidance_scale, seed, model, num_frames=None,
                       request: gr.Request = None):
        session = session_id_of(request)
        form = FormValues(prompt, negative_prompt, width, height, steps, guidance_scale, seed, model, num_frames)
        updates = follow_request(engine, form, session, config.preview_every, makes=kind)
        async with contextlib.aclosing(updates):
            async for update in updates:
                event = update.event
                # Every streamed tuple is (status, preview or None, media or None).
                outputs: dict = {status: update.status.as_dict(), preview: None, media: None}
                if isinstance(event, Progress) and event.preview is not None:
                    outputs[preview] = _preview(event.preview, config, update.status.request_id)
                elif isinstance(event, Completed):
                    outputs[media] = final_media(event, fps=model_fps(engine.infos[event.params.model]))
                    await save_quietly(store, event, store.owners.of_caller(session))
                yield outputs
                if isinstance(event, Failed):
                    raise user_error(event.message, "Generation failed")

    generate.__doc__ = (
        f"Generate one {kind}{' (frames: num_frames, 4k+1 for most video models)' if kind == 'video' else ''}: "
        f"streams (status, preview, {kind}); status has request_id, state, step, total, position, batch_size "
        "and seed. Cancel with /cancel and the request_id."
    )
    trigger.click(generate, inputs=inputs, outputs=[status, preview, media],
                  api_name="generate" if kind == "image" else "generate_video", concurrency_limit=None,
                  preprocess=False)


def _preview(preview, config: StudioOptions, request_id: str):
    """An image's preview as a small image; a video's as a looping GIF file (one per request, rewritten)."""
    if not isinstance(preview, (list, tuple)):
        return preview_image(preview, config.preview_max_px)
    PREVIEW_DIR.mkdir(exist_ok=True)
    path = PREVIEW_DIR / f"{request_id}-{time.monotonic_ns()}.gif"
    path.write_bytes(animated_gif(preview, 8, config.preview_max_px))
    remove_files_older_than(PREVIEW_DIR, 600)
    return str(path)


def _wire_cancel_and_queue(engine: Engine, config: StudioOptions) -> None:
    def cancel(request_id: str, request: gr.Request) -> dict:
        """Cancel one of YOUR requests by its request_id (from /generate's status); it stops at
        the next step boundary. Other sessions' requests can't be cancelled."""
        return cancel_own_request(engine, request_id, session_id_of(request))

    def queue(request: gr.Request) -> dict:
        """The engine's queue and figures now; your requests have "mine": true and full ids."""
        return snapshot_as_dict(engine.snapshot(), session_id_of(request), config.show_prompts)

    gr.api(cancel, api_name="cancel", queue=False)
    gr.api(queue, api_name="queue", queue=False)


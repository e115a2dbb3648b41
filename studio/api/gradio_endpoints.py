"""The named gradio_client endpoints for single requests: `/generate` (and `/generate_video`),
`/image_to_image`, `/cancel` and `/queue` (and, from studio.api.queue_endpoints, the caller's own
queue: `/pause_queue`, `/resume_queue`, `/clear_queue`, `/move_request`, `/queue_state`).

(`/run_workflow` and `/cancel_workflow` live with the editor, in studio/page/workflow_tab.py.)
Hidden components carry the endpoints' inputs and outputs, with no range clamping: the engine
validates, so API callers get the engine's own messages. Finished images are saved like the
page's (studio.outputs), under the caller's session.

Each request is followed with studio.tracker (its status dict is the tracker's `Status.as_dict()`);
previews and results are encoded in a worker thread, never on the event loop. `/image_to_image`
streams as `/generate` does, through the same code; its pictures arrive as Gradio file uploads
(gradio_client's `handle_file`), which Gradio has already put in its upload cache (it refuses
paths a client names elsewhere), and are decoded within studio.pictures' limits.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from pathlib import Path
from typing import AsyncIterator

import gradio as gr

from engine import EngineClient
from studio.api.queue_endpoints import wire_queue_endpoints
from studio.pictures import MAX_UPLOAD_BYTES, as_init_image, check_same_size, mask_from_white, open_upload
from studio.config import StudioOptions
from studio.form import RANDOM_SEED, FormValues
from studio.media import animated_gif, final_media, model_fps, preview_image
from studio.outputs import OutputStore
from studio.queue_snapshot import snapshot_as_dict
from studio.server.temp_files import TempFolder
from studio.sessions import cancel_own_request, session_id_of
from studio.store.durable import DurableRequests, finish_image
from studio.store.recovery import ResumeReport
from studio.tracker import COMPLETED, FAILED, RequestTracker, Status
from studio.user_errors import engine_errors_as_gradio, user_error

# A video's preview GIFs: Gradio copies each into its cache, so ours can go after 10 minutes.
PREVIEWS = TempFolder("stepstudio-previews", ttl_s=600)
LORAS_LABEL = 'loras (optional: [{"name": NAME, "scale": 1.0}], adapters loaded for the model)'
STEP_CACHE_LABEL = "step_cache (optional: a step-caching threshold, 0 = off; empty: the model's default)"


def wire_api_endpoints(engine: EngineClient, config: StudioOptions, store: OutputStore,
                       durable: DurableRequests, resumed: ResumeReport | None = None) -> None:
    """`durable`: what follows every accepted request to its end (its result saved even when the
    caller went; resumed after a restart). `resumed`: what a restart ran again (/queue says so)."""
    accept = _acceptor(store, durable)
    image_models = [name for name, info in engine.infos.items() if info.output_kind == "image"]
    video_models = [name for name, info in engine.infos.items() if info.output_kind == "video"]
    if image_models:
        _wire_generate(engine, config, accept, image_models[0], "image")
    if video_models:
        _wire_generate(engine, config, accept, video_models[0], "video")
    takes_images = [name for name in image_models if "init_image" in engine.infos[name].image_inputs]
    if takes_images:
        _wire_image_to_image(engine, config, accept, takes_images[0])
    _wire_cancel_and_queue(engine, config, resumed)
    wire_queue_endpoints(engine)  # /pause_queue, /resume_queue, /clear_queue, /move_request, /queue_state


def _acceptor(store: OutputStore, durable: DurableRequests):
    """Record a submitted request as accepted for its caller's history (the commit off the event
    loop); the future it gives is done once its result is saved (or it ended without one)."""
    async def accept(handle):
        return await durable.accept("image", handle, store.owners.of_caller(handle.session_id), finish_image(store))

    return accept


def _wire_generate(engine: EngineClient, config: StudioOptions, accept, example_model: str, kind: str) -> None:
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
        inputs.append(gr.JSON(label=LORAS_LABEL, value=None))
        inputs.append(gr.Number(label=STEP_CACHE_LABEL, value=None))
        status = gr.JSON(label="status")
        if kind == "video":
            preview = gr.Image(label="preview (every frame, looping GIF)", type="filepath")
            media = gr.Video(label="video")
        else:
            preview = gr.Image(label="preview", format="jpeg", type="pil")
            media = gr.Image(label="image", format="png", type="pil")

    async def generated(form: FormValues, request: gr.Request):
        async for outputs in _streamed(engine, config, accept, form, session_id_of(request), kind,
                                       (status, preview, media)):
            yield outputs

    if kind == "video":
        async def generate(prompt, negative_prompt, width, height, steps, guidance_scale, seed, model, num_frames=None,
                           loras=None, step_cache=None, request: gr.Request = None):
            form = FormValues(prompt, negative_prompt, width, height, steps, guidance_scale, seed, model, num_frames,
                              loras=loras, step_cache=step_cache)
            async for outputs in generated(form, request):
                yield outputs
    else:
        async def generate(prompt, negative_prompt, width, height, steps, guidance_scale, seed, model, loras=None,
                           step_cache=None, request: gr.Request = None):
            form = FormValues(prompt, negative_prompt, width, height, steps, guidance_scale, seed, model, loras=loras,
                              step_cache=step_cache)
            async for outputs in generated(form, request):
                yield outputs

    generate.__doc__ = (
        f"Generate one {kind}{' (frames: num_frames, 4k+1 for most video models)' if kind == 'video' else ''}: "
        f"streams (status, preview, {kind}); status has request_id, state, step, total, position, batch_size "
        "and seed. Cancel with /cancel and the request_id. loras: [{\"name\", \"scale\"}] of adapters loaded for "
        "the model (or <lora:NAME:SCALE> in the prompt)."
    )
    trigger.click(generate, inputs=inputs, outputs=[status, preview, media],
                  api_name="generate" if kind == "image" else "generate_video", concurrency_limit=None,
                  preprocess=False)


def _wire_image_to_image(engine: EngineClient, config: StudioOptions, accept, example_model: str) -> None:
    """`/image_to_image`: a picture (and an optional mask) redrawn after a prompt; streams
    (status, preview, image) as /generate does."""
    defaults = engine.infos[example_model].defaults
    default_model = "" if example_model == engine.models.default else example_model
    with gr.Column(visible=False):
        trigger = gr.Button("api-image-to-image")
        image = gr.Image(label="image", type="filepath")
        prompt = gr.Textbox(label="prompt")
        strength = gr.Number(label="strength (0..1: how much is redrawn)", value=defaults.strength)
        mask = gr.Image(label="mask (optional: white = repaint, black = keep)", type="filepath", value=None)
        negative = gr.Textbox(label="negative_prompt", value=defaults.negative_prompt or "")
        steps = gr.Number(label="steps", value=defaults.num_inference_steps, precision=0)
        guidance = gr.Number(label="guidance_scale", value=defaults.guidance_scale)
        seed = gr.Number(label="seed (-1 = random)", value=RANDOM_SEED, precision=0)
        model = gr.Textbox(label="model (empty: the default)", value=default_model)
        loras = gr.JSON(label=LORAS_LABEL, value=None)
        step_cache = gr.Number(label=STEP_CACHE_LABEL, value=None)
        status = gr.JSON(label="status")
        preview = gr.Image(label="preview", format="jpeg", type="pil")
        result = gr.Image(label="image", format="png", type="pil")

    # mask=None in the signature makes it optional for gradio_client (it has no starting value).
    async def image_to_image(image, prompt, strength, mask=None, negative_prompt=None, steps=None, guidance_scale=None,
                             seed=None, model=None, loras=None, step_cache=None, request: gr.Request = None):
        """Redraw a picture after a prompt (image to image); with a mask only its white part
        (inpainting). The image's size is the request's. Streams (status, preview, image) as
        /generate does; cancel with /cancel and the request_id."""
        session = session_id_of(request)
        form = FormValues(prompt, negative_prompt, None, None, steps, guidance_scale, seed, model, loras=loras,
                          step_cache=step_cache)
        with engine_errors_as_gradio():
            max_side = engine.limits_for(form.model_name(engine)).max_size
            init_image, mask_image = await asyncio.to_thread(_uploaded_pictures, image, mask, max_side)
        form = replace(form, init_image=init_image, strength=strength, mask_image=mask_image)
        async for outputs in _streamed(engine, config, accept, form, session, "image", (status, preview, result)):
            yield outputs

    trigger.click(image_to_image,
                  inputs=[image, prompt, strength, mask, negative, steps, guidance, seed, model, loras, step_cache],
                  outputs=[status, preview, result], api_name="image_to_image", concurrency_limit=None,
                  preprocess=False)


def _uploaded_pictures(image, mask, max_side: int):
    """The decoded init image (RGB) and mask ("L", white = repaint) of an /image_to_image call.
    With preprocess off, each arrives as Gradio's file data (a dict with the cached file's path)."""
    image_path, mask_path = _file_path(image, "image"), _file_path(mask, "mask")
    if image_path is None:
        raise ValueError("image is required: send the picture to start from (gradio_client: handle_file(path)).")
    picture = open_upload(image_path.read_bytes(), "init_image", max_side, MAX_UPLOAD_BYTES)
    if mask_path is None:
        return as_init_image(picture), None
    mask_picture = open_upload(mask_path.read_bytes(), "mask_image", max_side, MAX_UPLOAD_BYTES)
    check_same_size(picture, mask_picture)
    return as_init_image(picture), mask_from_white(mask_picture)


def _file_path(value, name: str) -> Path | None:
    if value is None or value == "":
        return None
    if not isinstance(value, dict) or not isinstance(value.get("path"), str):
        raise ValueError(f"{name} must be a file (gradio_client: handle_file(path)), got {type(value).__name__}.")
    return Path(value["path"])


async def _streamed(engine: EngineClient, config: StudioOptions, accept, form: FormValues, session: str,
                    kind: str, components: tuple) -> AsyncIterator[dict]:
    """One request's outputs as /generate streams them: (status, preview or None, media or None),
    a preview once when a new one came, the image or video once when it is done."""
    status, preview, media = components
    accepted = []

    async def accept_and_keep(handle) -> None:
        accepted.append(await accept(handle))

    updates = follow_request(engine, form, session, config.preview_every, makes=kind, accept=accept_and_keep)
    shown_preview = None
    async with contextlib.aclosing(updates):
        async for now in updates:
            outputs: dict = {status: _status_dict(now), preview: None, media: None}
            if now.preview is not None and now.preview is not shown_preview:
                shown_preview = now.preview
                outputs[preview] = await asyncio.to_thread(_preview, now.preview, config, now.request_id)
            elif now.result is not None:
                fps = model_fps(engine.infos[now.result.params.model])
                outputs[media] = await asyncio.to_thread(final_media, now.result, fps)
                with contextlib.suppress(Exception):  # a failed save is logged; the caller has its result
                    await asyncio.wrap_future(accepted[0])  # saved before it is shown as done
            yield outputs
            if now.state == FAILED:
                raise user_error(now.message, "Generation failed")


def _status_dict(status: Status) -> dict:
    """/generate's status: the tracker's fields, with "done" as a finished request's message."""
    shown = status.as_dict()
    if status.state == COMPLETED:
        shown["message"] = "done"
    return shown


async def follow_request(engine: EngineClient, form: FormValues, session_id: str, preview_every: int,
                         makes: str | None = None, accept=None) -> AsyncIterator[Status]:
    """Submit one request and yield its status as submitted, then after each engine event until
    it ends. `makes`: "image" or "video", when the caller can only take that kind (the model
    must make it). `accept(handle)`: awaited once the engine took it, to record it as accepted (a
    commit, off the event loop): the first status comes after it. If it fails, or the caller goes
    while it waits, the request is cancelled.

    Gradio stops a handler by cancelling its task or closing its generator (a client's
    `job.cancel()`, a closed tab, an error); the tracker then cancels the request. The Cancel
    button and `/cancel` ask the engine instead: the stream ends with an aborted status."""
    with engine_errors_as_gradio():
        params = form.to_params(preview_every, engine)
        kind = engine.infos[params.model].output_kind
        if makes is not None and kind != makes:
            other = "/generate_video" if kind == "video" else "/generate"
            raise ValueError(f"model={params.model!r} makes {kind}s, not {makes}s: use {other} for it.")
        handle = engine.submit(params, session_id=session_id)
        if accept is not None:
            try:
                await accept(handle)
            except BaseException:
                handle.cancel()
                raise
        tracker = RequestTracker(handle)
    async with contextlib.aclosing(tracker.updates()) as updates:  # closing it early cancels the request
        async for status, _ in updates:
            yield status
            if status.is_shutdown:
                raise user_error(f"The server is shutting down: {status.message}. Try again once it is back.",
                                 "Server shutting down")


def _preview(preview, config: StudioOptions, request_id: str):
    """An image's preview as a small image; a video's as a looping GIF file (one per request, rewritten)."""
    if not isinstance(preview, (list, tuple)):
        return preview_image(preview, config.preview_max_px)
    path = PREVIEWS.new_file(".gif", prefix=f"{request_id}-")
    path.write_bytes(animated_gif(preview, 8, config.preview_max_px))
    return str(path)


def _wire_cancel_and_queue(engine: EngineClient, config: StudioOptions, resumed: ResumeReport | None = None) -> None:
    def cancel(request_id: str, request: gr.Request) -> dict:
        """Cancel one of YOUR requests by its request_id (from /generate's status); it stops at
        the next step boundary. Other sessions' requests can't be cancelled."""
        return cancel_own_request(engine, request_id, session_id_of(request))

    def queue(request: gr.Request) -> dict:
        """The engine's queue and figures now; your requests have "mine": true and full ids."""
        return snapshot_as_dict(engine.snapshot(), session_id_of(request), config.show_prompts,
                                resumed=() if resumed is None else resumed.request_ids)

    gr.api(cancel, api_name="cancel", queue=False)
    gr.api(queue, api_name="queue", queue=False)


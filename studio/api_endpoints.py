"""The named gradio_client endpoints for single requests: `/generate`, `/cancel` and `/queue`.

(`/run_workflow` and `/cancel_workflow` live with the editor, in studio/workflow_ui.py.)
Hidden components carry the endpoints' inputs and outputs, with no range clamping: the engine
validates, so API callers get the engine's own messages. Finished images are saved like the
page's (studio.outputs), under the caller's session.
"""

from __future__ import annotations

import contextlib

import gradio as gr

from engine import Completed, Engine, Failed, Progress
from studio.bridge import (
    RANDOM_SEED,
    FormValues,
    cancel_own_request,
    final_media,
    follow_request,
    preview_image,
    session_id_of,
)
from studio.config import StudioOptions
from studio.media import model_fps
from studio.outputs import OutputStore, save_quietly
from studio.queue_view import snapshot_as_dict
from studio.workflow_ui import owner_for


def wire_api_endpoints(engine: Engine, config: StudioOptions, store: OutputStore) -> None:
    defaults = engine.info.defaults
    with gr.Column(visible=False):
        trigger = gr.Button("api-generate")
        prompt = gr.Textbox(label="prompt")
        negative = gr.Textbox(label="negative_prompt", value=defaults.negative_prompt or "")
        # precision=0 types them as integers on the API page; the event skips Gradio's
        # preprocessing (which would round 2.5 to 2), so the engine's checks see what was sent.
        width = gr.Number(label="width", value=defaults.width, precision=0)
        height = gr.Number(label="height", value=defaults.height, precision=0)
        steps = gr.Number(label="steps", value=defaults.num_inference_steps, precision=0)
        guidance = gr.Number(label="guidance_scale", value=defaults.guidance_scale)
        seed = gr.Number(label="seed (-1 = random)", value=RANDOM_SEED, precision=0)
        status = gr.JSON(label="status")
        preview = gr.Image(label="preview", format="jpeg", type="pil")
        media = gr.Video(label="video") if engine.info.output_kind == "video" else gr.Image(
            label="image", format="png", type="pil")
    fps = model_fps(engine.info)

    async def generate(prompt: str, negative_prompt: str, width: int, height: int, steps: int,
                       guidance_scale: float, seed: int, request: gr.Request):
        """Generate one image: streams (status, preview, image); status has request_id, state, step,
        total, position, batch_size and seed. Cancel with /cancel and the request_id."""
        session = session_id_of(request)
        form = FormValues(prompt, negative_prompt, width, height, steps, guidance_scale, seed)
        updates = follow_request(engine, form, session, config.preview_every)
        async with contextlib.aclosing(updates):
            async for update in updates:
                event = update.event
                # Every streamed tuple is (status, preview or None, media or None).
                outputs: dict = {status: update.status.as_dict(), preview: None, media: None}
                if isinstance(event, Progress) and event.preview is not None and not isinstance(event.preview, list):
                    outputs[preview] = preview_image(event.preview, config.preview_max_px)
                elif isinstance(event, Completed):
                    outputs[media] = final_media(event, fps=fps)
                    await save_quietly(store, event, owner_for(None, session))
                yield outputs
                if isinstance(event, Failed):
                    raise gr.Error(event.message, title="Generation failed")

    trigger.click(generate, inputs=[prompt, negative, width, height, steps, guidance, seed],
                  outputs=[status, preview, media], api_name="generate", concurrency_limit=None, preprocess=False)

    def cancel(request_id: str, request: gr.Request) -> dict:
        """Cancel one of YOUR requests by its request_id (from /generate's status); it stops at
        the next step boundary. Other sessions' requests can't be cancelled."""
        return cancel_own_request(engine, request_id, session_id_of(request))

    def queue(request: gr.Request) -> dict:
        """The engine's queue and figures now; your requests have "mine": true and full ids."""
        return snapshot_as_dict(engine.snapshot(), session_id_of(request), config.show_prompts)

    gr.api(cancel, api_name="cancel", queue=False)
    gr.api(queue, api_name="queue", queue=False)


"""The Simple tab: a form on the shared engine, with its own queue.

Every Generate (the button, or Shift+Enter in the prompt; Enter adds a line there, as in
Gradio's other multi-line boxes) is a run of
`batch count` requests (seeds seed, seed+1, ...), made from the form as a small workflow and run
like the editor's (`studio.workflows.run`): Generate while earlier requests run adds the new ones
to the tab's queue, they share forwards with everything else, and the per-session limit still
bounds what is in the engine at once (the rest wait in the tab). The queue list shows one row
and one progress bar per request, with a × to cancel it; the preview shows the newest running
request; results go to the tab's gallery, newest first, and are saved (studio.outputs).

Image to image (A1111's img2img tab, folded into the form): a picture in "Start from a picture"
becomes a Load image node (studio.page.form_workflow) and the strength a Strength node, so the request redraws the picture
(resized to the form's size) instead of starting from noise; strokes painted on it become a
painted Mask node (inpainting: only the painted part is redrawn). The History tab's "Send to
image to image" puts a saved result there.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
from dataclasses import dataclass

import gradio as gr

from engine import EngineClient
from pipelines.lora_request import split_prompt_tags
from pipelines.params import MIN_SIZE
from studio.config import StudioOptions
from studio.media import (
    animated_gif,
    data_url,
    final_media,
    preview_image,
    settings_caption,
)
from studio.page.queue_controls import QueueControls, build_queue_controls, move_from_page, wire_queue_controls
from studio.page.tab_queue import (
    CANCEL_JS,
    TabResults,
    latest_preview,
    render_tab_queue,
)
from studio.page.form_workflow import form_problems, form_workflow, seed_start
from studio.page.workflow_tab import WorkflowRunner, cancel_from_page
from studio.sessions import session_id_of
from studio.user_errors import user_error
from studio.workflows.format import WorkflowError

MAX_BATCH_COUNT = 16
GUIDANCE_RANGE = (0.0, 20.0)  # the guidance slider's range


@dataclass(frozen=True)
class SimpleForm:
    model: gr.Dropdown
    prompt: gr.Textbox
    negative_prompt: gr.Textbox
    size: gr.Dropdown  # shown instead of width and height when the model's card names its sizes
    width: gr.Slider
    height: gr.Slider
    steps: gr.Slider
    guidance_scale: gr.Slider
    scheduler: gr.Dropdown
    frames: gr.Number
    frame_choice: gr.Dropdown  # shown instead of frames when the model's card names its lengths
    batch_count: gr.Slider
    random_seed: gr.Checkbox
    seed: gr.Number
    unknown_words: gr.Markdown
    examples: gr.Dataset  # the picked model's example prompts; a click puts one in the prompt
    generate: gr.Button
    cancel: gr.Button
    picture: gr.ImageMask  # image to image: the picture to start from, and a painted mask
    strength: gr.Slider
    picture_panel: gr.Accordion
    lora: gr.Dropdown  # picking an adapter writes its <lora:NAME:1> tag into the prompt

    def settings_outputs(self) -> list:
        """The fields "use these settings again" fills in, in `settings_update`'s order."""
        return [self.model, self.prompt, self.negative_prompt, self.size, self.width, self.height, self.steps,
                self.guidance_scale, self.scheduler, self.frames, self.frame_choice, self.random_seed, self.seed]


@dataclass(frozen=True)
class SimplePanel:
    queue: gr.HTML
    preview: gr.Image  # an image model's preview
    animation: gr.HTML  # a video model's preview: all frames, looping
    image: gr.Image  # the newest result, when it is an image
    video: gr.Video  # ... or a video
    gallery: gr.Gallery
    controls: QueueControls  # Pause / Resume / Clear of the tab's queue


# ---------------------------------------------------------------------------- building
@dataclass(frozen=True)
class ModelForm:
    """How the form looks for one model: its sizes, steps, defaults and kind of result."""

    size_range: tuple[int, int]  # the sliders' range (a multiple of size_step, within the server's limit)
    size_step: int
    sizes: tuple[str, ...]  # "WxH": the only sizes the model's card allows (a dropdown then replaces the sliders)
    max_steps: int
    width: int
    height: int
    steps: int
    guidance: float
    negative_prompt: str | None
    uses_negative_prompt: bool
    schedulers: tuple[str, ...]
    frames: int | None  # None for an image model
    makes_video: bool
    strength: float = 0.6  # image to image's default strength (the model's)
    loras: tuple[str, ...] = ()  # the LoRA adapters loaded for the model
    example_prompts: tuple[str, ...] = ()  # the model's own card's examples (a video model's are videos)
    frame_counts: tuple[int, ...] = ()  # the only lengths the card allows (a dropdown then replaces Frames)

    @property
    def default_size(self) -> str | None:
        """The card's size closest to the model's default (its first, when none matches)."""
        if not self.sizes:
            return None
        wanted = f"{self.width}x{self.height}"
        return wanted if wanted in self.sizes else self.sizes[0]

    @property
    def default_frame_choice(self) -> str | None:
        """The card's length closest to the model's default, as the Frames dropdown holds it."""
        if not self.frame_counts:
            return None
        return str(min(self.frame_counts, key=lambda count: abs(count - (self.frames or 0))))

    @classmethod
    def of(cls, engine: EngineClient, model: str | None) -> ModelForm:
        info, limits = engine.infos[engine.models.resolve(model)], engine.limits_for(model)
        defaults = info.defaults
        step = max(info.size_multiple, 1)
        size_min = max(MIN_SIZE, step, info.size_range[0] if info.size_range else 0)
        size_max = max(limits.max_size, size_min)
        sizes = tuple(f"{w}x{h}" for w, h in info.supported_sizes)
        video = info.output_kind == "video"
        return cls((size_min, size_max), step, sizes, limits.max_steps, min(defaults.width, size_max),
                   min(defaults.height, size_max), min(defaults.num_inference_steps, limits.max_steps),
                   defaults.guidance_scale, defaults.negative_prompt, info.uses_negative_prompt, tuple(info.schedulers),
                   defaults.num_frames if video else None, video, defaults.strength, tuple(info.loras),
                   tuple(defaults.example_prompts), tuple(info.supported_frame_counts) if video else ())

    def example_samples(self) -> list[list[str]]:
        """The example prompts as the examples' Dataset holds them: one row per prompt."""
        return [[prompt] for prompt in self.example_prompts]

    def updates(self) -> list:
        """gr.update()s for (size, width, height, steps, guidance, negative prompt, scheduler, frames,
        frame choice, preview, animation, image, video, LoRA picker, example prompts) when this model
        is picked."""
        return [
            gr.update(choices=list(self.sizes), value=self.default_size, visible=bool(self.sizes)),
            gr.update(minimum=self.size_range[0], maximum=self.size_range[1], step=self.size_step, value=self.width,
                      visible=not self.sizes),
            gr.update(minimum=self.size_range[0], maximum=self.size_range[1], step=self.size_step, value=self.height,
                      visible=not self.sizes),
            gr.update(maximum=self.max_steps, value=self.steps),
            gr.update(value=self.guidance),
            gr.update(visible=self.uses_negative_prompt, value=self.negative_prompt or ""),
            gr.update(choices=[("model default", "")] + [(s, s) for s in self.schedulers], value="",
                      visible=len(self.schedulers) > 1),
            gr.update(visible=self.makes_video and not self.frame_counts, value=self.frames),
            gr.update(choices=[str(count) for count in self.frame_counts], value=self.default_frame_choice,
                      visible=self.makes_video and bool(self.frame_counts)),
            gr.update(visible=not self.makes_video),
            gr.update(visible=self.makes_video),
            gr.update(visible=not self.makes_video),
            gr.update(visible=self.makes_video),
            gr.update(choices=list(self.loras), value=None, visible=bool(self.loras)),
            gr.update(samples=self.example_samples(), visible=bool(self.example_prompts)),
        ]


def build_simple_tab(engine: EngineClient, config: StudioOptions) -> tuple[SimpleForm, SimplePanel]:
    look = ModelForm.of(engine, None)
    with gr.Row():
        with gr.Column(scale=2):
            names = engine.models.names
            model = gr.Dropdown(list(names), value=names[0], label="Model", visible=len(names) > 1,
                                elem_id="ss-model")
            prompt = gr.Textbox(label="Prompt (Shift+Enter generates, Enter adds a line)", lines=2,
                                placeholder="a large red circle on a blue background", elem_id="ss-prompt")
            negative = gr.Textbox(label="Negative prompt", lines=1, visible=look.uses_negative_prompt,
                                  value=look.negative_prompt or "", elem_id="ss-negative")
            unknown = gr.Markdown("", elem_id="ss-unknown")
            lora = gr.Dropdown(list(look.loras), value=None, label="Add a LoRA (writes <lora:NAME:1> into the prompt; "
                               "change the scale there)", visible=bool(look.loras), elem_id="ss-lora")
            with gr.Row():
                generate = gr.Button("Generate", variant="primary", elem_id="ss-generate")
                cancel = gr.Button("Cancel all", variant="stop", elem_id="ss-cancel")
            # The picked model's own examples only (picking another model swaps them): a Dataset,
            # since gr.Examples' list is fixed once built.
            examples = gr.Dataset(components=[prompt], samples=look.example_samples(), label="Example prompts",
                                  visible=bool(look.example_prompts), elem_id="ss-examples")
            with gr.Accordion("Settings", open=True):
                with gr.Row():
                    # Every served model's card sizes are known to the server; picking a model narrows them.
                    card_sizes = list(dict.fromkeys(size for name in names for size in ModelForm.of(engine, name).sizes))
                    size = gr.Dropdown(card_sizes, value=look.default_size, label="Size (the model's card)",
                                       visible=bool(look.sizes), elem_id="ss-size")
                    width = gr.Slider(*look.size_range, value=look.width, step=look.size_step, label="Width",
                                      visible=not look.sizes, elem_id="ss-width")
                    height = gr.Slider(*look.size_range, value=look.height, step=look.size_step, label="Height",
                                       visible=not look.sizes, elem_id="ss-height")
                with gr.Row():
                    steps = gr.Slider(1, look.max_steps, value=look.steps, step=1, label="Steps", elem_id="ss-steps")
                    guidance = gr.Slider(*GUIDANCE_RANGE, value=look.guidance, step=0.5, label="Guidance scale",
                                         elem_id="ss-guidance")
                with gr.Row():
                    scheduler = gr.Dropdown([("model default", "")] + [(s, s) for s in look.schedulers], value="",
                                            label="Scheduler", visible=len(look.schedulers) > 1, elem_id="ss-scheduler")
                    frames = gr.Number(value=look.frames, precision=0, label="Frames",
                                       visible=look.makes_video and not look.frame_counts, elem_id="ss-frames")
                    card_frames = sorted({count for name in names for count in ModelForm.of(engine, name).frame_counts})
                    frame_choice = gr.Dropdown([str(count) for count in card_frames], value=look.default_frame_choice,
                                               label="Frames (the model's card)", elem_id="ss-frame-choice",
                                               visible=look.makes_video and bool(look.frame_counts))
                    batch_count = gr.Slider(1, min(MAX_BATCH_COUNT, config.max_branches), value=1, step=1,
                                            label="Batch count (seeds seed, seed+1, ...)", elem_id="ss-batch-count")
                with gr.Row():
                    random_seed = gr.Checkbox(value=True, label="Random seed", elem_id="ss-random-seed")
                    seed = gr.Number(value=0, precision=0, minimum=0, label="Seed (the used seed appears here)",
                                     elem_id="ss-seed")
            takes_pictures = any("init_image" in info.image_inputs for info in engine.infos.values())
            with gr.Accordion("Image to image", open=False, visible=takes_pictures, elem_id="ss-img2img") as picture_panel:
                picture = gr.ImageMask(label="Start from a picture (resized to the size above); paint over it to "
                                             "redraw only that part", type="pil", format="png", image_mode="RGB",
                                       sources=("upload", "clipboard"), height=320, elem_id="ss-picture",
                                       brush=gr.Brush(colors=["#ffffff"], color_mode="fixed"))
                strength = gr.Slider(0.0, 1.0, value=look.strength, step=0.05,
                                     label="Strength (0 keeps the picture, 1 redraws it from noise)",
                                     elem_id="ss-strength")
        with gr.Column(scale=3):
            queue = gr.HTML(render_tab_queue([]), js_on_load=CANCEL_JS, elem_id="ss-tab-queue")
            controls = build_queue_controls("ss", engine.pause_state.engine)
            with gr.Row():
                preview = gr.Image(label="Live preview", format="jpeg", type="pil", interactive=False, height=256,
                                   visible=not look.makes_video, elem_id="ss-preview")
                animation = gr.HTML("", label="Live preview", show_label=True, container=True, min_height=256,
                                    visible=look.makes_video, elem_id="ss-animation")
                image = gr.Image(label="Result", format="png", type="pil", interactive=False, height=256,
                                 visible=not look.makes_video, elem_id="ss-result")
                video = gr.Video(label="Result", interactive=False, height=256, visible=look.makes_video,
                                 elem_id="ss-result-video")
            gallery = gr.Gallery(label="This tab's results (newest first)", columns=6, rows=1, height=190,
                                 object_fit="contain", format="png", preview=False, allow_preview=True,
                                 elem_id="ss-gallery")
    form = SimpleForm(model, prompt, negative, size, width, height, steps, guidance, scheduler, frames, frame_choice,
                      batch_count, random_seed, seed, unknown, examples, generate, cancel, picture, strength,
                      picture_panel, lora)
    return form, SimplePanel(queue, preview, animation, image, video, gallery, controls)


def unknown_words_text(engine: EngineClient, model: str | None, prompt: str) -> str:
    """'The model does not know: ...' when the pipeline can tell which prompt words it never learned."""
    finder = getattr(engine.models[model or None], "unknown_words", None)
    if finder is None or not prompt or not prompt.strip():
        return ""
    with contextlib.suppress(ValueError):  # a malformed tag is the engine's to refuse, on Generate
        prompt = split_prompt_tags(prompt)[0]  # <lora:...> tags are no words of the model's
    words = list(finder(prompt))
    if not words:
        return ""
    listed = ", ".join(f"`{html.escape(word)}`" for word in words)
    return f'<span class="ss-unknown">The model does not know: {listed}</span>'


def with_lora_tag(prompt: str, name: str | None) -> tuple[str, None]:
    """The prompt with `<lora:NAME:1>` added (A1111's syntax; the scale is edited in the text), and
    the picker emptied for the next pick."""
    if not name:
        return prompt, None
    tag = f"<lora:{name}:1>"
    return (prompt if tag in (prompt or "") else f"{(prompt or '').rstrip()} {tag}".strip()), None


# ---------------------------------------------------------------------------- wiring
_NOTHING = object()
CHANGED, NONE, ALL = "changed", "none", "all"  # what of a tab's finished results an update sends


def is_new(sent: dict, key: str, value) -> bool:
    """Whether `value` is not what was sent last under `key` (and remember it). By identity: the
    same picture objects come back from update to update until something changes; a tuple is
    compared item by item."""
    last = sent.get(key, _NOTHING)
    sent[key] = value
    if isinstance(value, tuple) and isinstance(last, tuple):
        return len(value) != len(last) or any(a is not b for a, b in zip(value, last))
    return last is not value


def wire_simple_tab(runner: WorkflowRunner, results: TabResults, form: SimpleForm, panel: SimplePanel,
                    browser_token: gr.BrowserState, live) -> None:
    """`live`: the page's LiveViews (its `render(session)` and `components`), redrawn with the updates
    (at most once per refresh period, and in a run's last one)."""
    engine, config = runner.engine, runner.config

    def tab_outputs(session: str, sent: dict, final: bool, finished_part: str) -> dict:
        """The tab's queue rows, live views, preview and results. `sent`: what this update's stream
        sent before (updated here); a preview, result or gallery it already sent is left out, so
        each picture is encoded and sent once. `final`: the last update of a run (the live views
        then come at once, not at their refresh pace). `finished_part`: the gallery and
        newest result when they changed (CHANGED), not at all (NONE: another stream of the tab
        ends later and sends them), or whatever was sent before (ALL: the tab's last stream ends).
        Encodes: call it in a worker thread."""
        runs = runner.registry.runs_of(session)
        previewing = latest_preview(runs)
        preview = None if previewing is None else previewing.preview
        finished = results.of(session)
        outputs = {panel.queue: render_tab_queue(runs), **live.render(session, final=final)}
        if finished_part == ALL:  # sent again even if this stream sent it: others may have sent older ones since
            sent.pop("gallery", None), sent.pop("newest", None)
        if finished_part != NONE and is_new(sent, "gallery", tuple(part for item in finished for part in item)):
            outputs[panel.gallery] = finished
        if preview is not None and is_new(sent, "preview", preview):
            if isinstance(preview, (list, tuple)) and preview:  # a video's frames, looping
                gif = animated_gif(preview, runner.fps_of(previewing.params), config.preview_max_px)
                outputs[panel.animation] = f'<img class="ss-animation" src="{data_url(gif, "image/gif")}" alt="live preview">'
            elif not isinstance(preview, (list, tuple)):
                outputs[panel.preview] = preview_image(preview, config.preview_max_px)
        if finished and finished_part != NONE and is_new(sent, "newest", finished[0][0]):
            newest = finished[0][0]
            outputs[panel.video if isinstance(newest, str) else panel.image] = newest
        return outputs

    async def generate(values: dict, request: gr.Request):
        session = session_id_of(request)
        raw = {name: values[getattr(form, name)] for name in (
            "model", "prompt", "negative_prompt", "size", "width", "height", "steps", "guidance_scale", "scheduler",
            "frames", "frame_choice", "batch_count", "random_seed", "seed", "picture", "strength")}
        look = ModelForm.of(engine, raw["model"] or None)
        if look.frame_counts and raw["frame_choice"]:  # the card's length, not the number field
            raw["frames"] = int(raw["frame_choice"])
        raw["frames"] = raw["frames"] if look.makes_video else None
        if look.sizes and isinstance(raw["size"], str) and "x" in raw["size"]:  # the card's size, not the sliders
            raw["width"], raw["height"] = raw["size"].split("x", 1)
        owner = await runner.page_owner(values[browser_token], session)

        def start():  # encodes and decodes the picture: in a worker thread
            return runner.start(form_workflow(raw, look.uses_negative_prompt, seed_start(raw)), session, owner)

        try:
            run, _ = await asyncio.to_thread(start)
        except WorkflowError as exc:
            raise user_error(form_problems(exc), "Request not accepted") from None
        recorded: set[int] = set()
        sent: dict = {}
        first = True
        results.stream_started(session)
        ended = False
        try:
            async for view in runner.follow(run, owner):
                for branch in view.branches:
                    if branch.result is not None and branch.branch.index not in recorded:
                        recorded.add(branch.branch.index)
                        # A video's MP4 is encoded in a worker thread: the event loop keeps serving.
                        media = await asyncio.to_thread(final_media, branch.result, fps=runner.fps_of(branch.params))
                        results.add(session, (run.sequence, branch.branch.index), media, settings_caption(branch.result))
                finished_part = CHANGED
                if view.is_final:
                    ended = True
                    finished_part = ALL if results.stream_ended(session) else NONE
                outputs = await asyncio.to_thread(tab_outputs, session, sent, view.is_final, finished_part)
                if first:
                    first = False
                    outputs[form.seed] = view.branches[0].params.seed  # written back, so it can be reused
                yield outputs
        finally:
            if not ended:  # the page went away, or the run failed: the tab's other streams go on
                results.stream_ended(session)
        failed = [b for b in view.branches if b.state == "failed"]
        if failed:
            raise user_error(failed[0].message, "Generation failed")

    inputs = {form.model, form.prompt, form.negative_prompt, form.size, form.width, form.height, form.steps,
              form.guidance_scale, form.scheduler, form.frames, form.frame_choice, form.batch_count, form.random_seed,
              form.seed, form.picture, form.strength, browser_token}
    media = [panel.preview, panel.animation, panel.image, panel.video]
    outputs = [panel.queue, *media, panel.gallery, form.seed, *live.components]
    # trigger_mode="multiple": a click while earlier requests run queues more, it is not dropped.
    for event, name in ((form.generate.click, "ui_generate"), (form.prompt.submit, "ui_generate_on_enter")):
        event(generate, inputs=inputs, outputs=outputs, concurrency_limit=None, trigger_mode="multiple",
              api_name=name, api_visibility="private", show_progress="hidden")

    def cancel_all(request: gr.Request) -> None:
        """Cancels at the next step boundary; the rows say "aborted" in their runs' own next updates.
        (An answer drawn now would show them still running, and could reach the page after those.)"""
        runner.registry.cancel_session(session_id_of(request))

    def cancel_one(event: gr.EventData, request: gr.Request) -> None:
        """A row's × (cancel) or ⤒ (move to the front of the tab's queue)."""
        if move_from_page(engine, runner.registry, event, request):
            return
        cancel_from_page(runner.registry, event, request)

    wire_queue_controls(engine, runner.registry, panel.controls, "simple")

    form.cancel.click(cancel_all, queue=False,
                      api_name="ui_cancel", api_visibility="private", show_progress="hidden")
    panel.queue.stop(cancel_one, queue=False, api_name="ui_cancel_one", api_visibility="private",
                     show_progress="hidden")
    form.prompt.change(lambda model, prompt: unknown_words_text(engine, model, prompt), inputs=[form.model, form.prompt],
                       outputs=form.unknown_words, queue=False, trigger_mode="always_last",
                       api_name="ui_unknown_words", api_visibility="private", show_progress="hidden")

    form.lora.input(with_lora_tag, inputs=[form.prompt, form.lora], outputs=[form.prompt, form.lora], queue=False,
                    api_name="ui_add_lora", api_visibility="private", show_progress="hidden")

    form.examples.click(lambda sample: sample[0], inputs=form.examples, outputs=form.prompt, queue=False,
                        api_name="ui_example_prompt", api_visibility="private", show_progress="hidden")

    def pick_model(model: str, prompt: str) -> list:
        return ModelForm.of(engine, model or None).updates() + [unknown_words_text(engine, model, prompt)]

    form.model.change(pick_model, inputs=[form.model, form.prompt],
                      outputs=[form.size, form.width, form.height, form.steps, form.guidance_scale, form.negative_prompt,
                               form.scheduler, form.frames, form.frame_choice, *media, form.lora, form.examples,
                               form.unknown_words],
                      queue=False, api_name="ui_pick_model", api_visibility="private", show_progress="hidden")

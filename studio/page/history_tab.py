"""The History tab: a browser's saved results after any reload, newest first, and their settings.

The browser keeps a token this server signed (`gr.BrowserState`, issued on its first visit);
results are filed under a key derived from it (studio.server.history_owners), so a reload, or a new tab of
the same browser, finds them, and a token the server did not sign lists nothing.
Selecting one shows its `parameters` text; "Use these settings again" fills the Simple tab's
form, "Open its workflow" loads the workflow it came from into the editor. A PNG from anywhere
(ours, or AUTOMATIC1111's) can be opened the same way. A picture goes on to a next stage with
"Send to image to image" (the Simple tab's picture) or "Send to the editor" (a new Load image
node holding it, beside the graph being edited).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
from PIL import Image

from engine import EngineClient
from studio.media import animated_poster
from studio.outputs import (
    OutputStore,
    SavedOutput,
    UnreadablePng,
    parse_infotext,
    png_texts,
)
from studio.page.simple_tab import GUIDANCE_RANGE, ModelForm, SimpleForm
from studio.page.tab_tokens import TabTokens
from studio.server.history_owners import is_legacy_token, legacy_owner_key
from studio.sessions import session_id_of
from studio.user_errors import user_error
from studio.pictures import picture_data_url
from studio.workflows.format import WorkflowError, parse_workflow
from studio.workflows.nodes import NODE_TYPES

SHOWN = 60  # newest results shown
CAPTION_PROMPT_CHARS = 40  # of a prompt, in a result's caption
log = logging.getLogger(__name__)


def fresh_token(store: OutputStore, token: object) -> str:
    """The browser's token when this server signed it, else a new one. A token from before tokens
    were signed (32 random characters) is exchanged once, and its results move with it."""
    if store.owners.verified(token) is not None:
        return token
    fresh = store.owners.issue()
    if is_legacy_token(token):
        store.adopt(legacy_owner_key(token), store.owners.of_browser(fresh))
    return fresh


def _within(value, lowest, highest):
    """A saved value moved into the form's range (a PNG from elsewhere may say anything)."""
    return min(max(value, lowest), highest)


def settings_update(settings: dict, engine: EngineClient) -> list:
    """Form values for SimpleForm.settings_outputs(), from saved settings (missing ones: the
    model's defaults; a model no longer loaded: the default model)."""
    model = settings.get("model") if settings.get("model") in engine.models.names else engine.models.default
    defaults = engine.infos[model].defaults
    card = ModelForm.of(engine, model)  # the form's choices and ranges for this model
    width, height = (_within(settings.get(side, default), *card.size_range)
                     for side, default in (("width", defaults.width), ("height", defaults.height)))
    size = f"{width}x{height}"
    frames = str(settings.get("num_frames"))  # as the card's Frames pick list holds a length
    return [
        model,
        settings.get("prompt", ""),
        settings.get("negative_prompt", defaults.negative_prompt or ""),
        size if size in card.sizes else (card.sizes[0] if card.sizes else None),
        width,
        height,
        _within(settings.get("num_inference_steps", defaults.num_inference_steps), 1, card.max_steps),
        _within(settings.get("guidance_scale", defaults.guidance_scale), *GUIDANCE_RANGE),
        settings.get("scheduler") or "",
        settings.get("num_frames", defaults.num_frames),
        frames if frames in map(str, card.frame_counts) else card.default_frame_choice,
        "seed" not in settings,  # a known seed is reused as it is
        settings.get("seed", 0),
    ]


@dataclass(frozen=True)
class HistoryTab:
    refresh: gr.Button
    gallery: gr.Gallery
    view: gr.Image  # the selected picture or grid, large (a click opens it in the lightbox)
    player: gr.Video  # ... or the selected video, playing
    details: gr.Textbox
    use_settings: gr.Button
    open_workflow: gr.Button
    to_image_to_image: gr.Button
    to_editor: gr.Button
    upload: gr.File
    items: gr.State  # the listed SavedOutputs (as dicts), in gallery order
    selected: gr.State  # {"settings": {...}, "workflow": str | None}


def build_history_tab(store: OutputStore) -> HistoryTab:
    where = f"saved under `{store.folder}`" if store.enabled else "saving is off (--no-save)"
    gr.Markdown(f"Your results, newest first, from this browser ({where}). Select one to see its settings.")
    with gr.Row():
        refresh = gr.Button("Refresh", elem_id="ss-history-refresh", scale=0)
        upload = gr.File(label="Open a PNG with settings", file_types=[".png"], type="filepath", height=80,
                         elem_id="ss-history-upload", scale=1)
    gallery = gr.Gallery(label="History", columns=8, height=300, object_fit="contain", format="png",
                         preview=False, allow_preview=False, elem_id="ss-history")
    with gr.Row():
        view = gr.Image(label="Selected (click to see it full size)", type="filepath", interactive=False, height=320,
                        visible=False, elem_id="ss-history-view", scale=2)
        player = gr.Video(label="Selected video", interactive=False, height=320, autoplay=True, loop=True,
                          visible=False, elem_id="ss-history-video", scale=2)
        details = gr.Textbox(label="Settings (parameters)", lines=3, interactive=False, elem_id="ss-history-details",
                             scale=3)
    with gr.Row():
        use_settings = gr.Button("Use these settings again", variant="primary", elem_id="ss-history-use")
        open_workflow = gr.Button("Open its workflow", visible=False, elem_id="ss-history-workflow")
        to_image_to_image = gr.Button("Send to image to image", elem_id="ss-history-img2img")
        to_editor = gr.Button("Send to the editor (Load image)", elem_id="ss-history-to-editor")
    return HistoryTab(refresh, gallery, view, player, details, use_settings, open_workflow, to_image_to_image,
                      to_editor, upload, gr.State([]), gr.State(None))


def _texts(path: Path | str) -> dict[str, str]:
    try:
        return png_texts(path)
    except UnreadablePng as error:
        raise user_error(str(error), "Not a readable PNG") from None


def gallery_file(item: SavedOutput) -> str:
    """What the gallery shows for a saved result: the picture or grid itself, a video's animated
    poster (studio.media.animated_poster; its first frame if the MP4 can't be read). Files, never
    pictures to encode: Gradio copies a file into its cache under a temporary name and renames it
    there, and a copy that is there already is only touched, so no listing rewrites a file that an
    earlier listing's page is still fetching."""
    if item.kind != "video":
        return item.path
    try:
        return str(animated_poster(item.path))
    except (OSError, RuntimeError, StopIteration) as exc:  # imageio-ffmpeg fails a damaged file with RuntimeError
        log.warning("no animated poster for %s: %s", item.path, exc)
        return item.poster or item.path


def history_caption(settings: dict) -> str:
    """A saved result's caption: what tells it from its siblings first (a workflow branch's swept
    values and seed, a grid's axes), then the start of its prompt."""
    first = settings.get("caption") or f"seed {settings.get('seed', '?')}"
    prompt = settings.get("prompt", "")
    shown = prompt if len(prompt) <= CAPTION_PROMPT_CHARS else prompt[:CAPTION_PROMPT_CHARS - 1] + "…"
    return f"{first} · {shown}" if prompt else first


def with_load_image(workflow_text: object, picture: Image.Image) -> str:
    """The editor's workflow with one more node: a Load image holding `picture`, right of the graph."""
    try:
        workflow = parse_workflow(workflow_text).to_json()
    except WorkflowError:  # an empty or broken editor: start a new graph
        workflow = {"version": 1, "nodes": [], "links": []}
    taken = {node["id"] for node in workflow["nodes"]}
    node_id = next(str(n) for n in range(1, len(taken) + 2) if str(n) not in taken)
    right = max((node["position"][0] for node in workflow["nodes"]), default=-300.0) + 300
    node = NODE_TYPES["load_image"].node(node_id, image=picture_data_url(picture))
    workflow["nodes"].append({**node, "position": [right, 20]})
    return json.dumps(workflow)


def _picture(selected: dict | None) -> Image.Image:
    if not selected or not selected.get("path"):
        raise user_error("Select a result (or open a PNG) first.", "Nothing selected")
    with Image.open(selected["path"]) as image:
        return image.convert("RGB")


def wire_history_tab(engine: EngineClient, store: OutputStore, tab: HistoryTab, page: gr.Tab,
                     browser_token: gr.BrowserState, form: SimpleForm, editor: gr.HTML, tabs: gr.Tabs,
                     demo: gr.Blocks, tab_tokens: TabTokens) -> None:
    """`page` is the tab that holds it: opening it lists what was made since the last listing.
    `tab_tokens`: told the token each tab's load issues."""

    def listing(token: str) -> dict:
        owner = store.owners.of_browser(token)  # None for a token this server did not sign
        items = store.history(owner)[:SHOWN] if owner else []
        return {tab.gallery: [(gallery_file(item), history_caption(item.settings)) for item in items],
                tab.items: [item.__dict__ for item in items]}

    def start(token: str, request: gr.Request) -> dict:
        token = fresh_token(store, token)
        tab_tokens.issued(session_id_of(request), store.owners.of_browser(token))  # for its clicks before it keeps it
        return {browser_token: token, **listing(token)}

    def shown(path: str | None = None, video: str | None = None) -> dict:
        """The large view of the selection: a picture (or grid), or a video's player."""
        return {tab.view: gr.update(value=None if video else path, visible=bool(path) and not video),
                tab.player: gr.update(value=video, visible=bool(video))}

    def select(items: list, event: gr.SelectData) -> dict:
        item = items[event.index] if 0 <= event.index < len(items) else None
        if item is None:
            return {tab.selected: None, tab.details: "", tab.open_workflow: gr.update(visible=False), **shown()}
        texts = _texts(item["poster"] or item["path"])
        video = item["path"] if item["kind"] == "video" else None
        return {tab.selected: {"settings": item["settings"], "workflow": texts.get("workflow"),
                               "path": item["poster"] or item["path"]},
                tab.details: item["parameters"], tab.open_workflow: gr.update(visible=item["has_workflow"]),
                **shown(item["poster"] or item["path"], video)}

    def opened(path: str | None) -> dict:
        if not path:
            return {tab.selected: None, tab.details: "", **shown()}
        texts = _texts(Path(path))
        if "parameters" not in texts:
            raise user_error("This PNG carries no settings (no 'parameters' text).", "No settings found")
        return {tab.selected: {"settings": parse_infotext(texts["parameters"]), "workflow": texts.get("workflow"),
                               "path": path},
                tab.details: texts["parameters"], tab.open_workflow: gr.update(visible="workflow" in texts),
                **shown(path)}

    def use(selected: dict | None) -> list:
        if not selected:
            raise user_error("Select a result (or open a PNG) first.", "Nothing selected")
        return settings_update(selected["settings"], engine) + [gr.Tabs(selected="simple")]

    def open_in_editor(selected: dict | None) -> list:
        if not selected or not selected.get("workflow"):
            raise user_error("This result was not made from a workflow.", "No workflow")
        try:
            parse_workflow(selected["workflow"])  # a PNG from elsewhere may carry anything as 'workflow'
        except WorkflowError as error:
            raise user_error(f"This PNG's workflow can't be opened: {error}", "Not a workflow") from None
        return [gr.update(value=selected["workflow"]), gr.Tabs(selected="workflow")]

    def to_image_to_image(selected: dict | None) -> list:
        return [_picture(selected), gr.Accordion(open=True), gr.Tabs(selected="simple")]

    def to_editor(selected: dict | None, workflow: object) -> list:
        return [gr.update(value=with_load_image(workflow, _picture(selected))), gr.Tabs(selected="workflow")]

    private = {"api_visibility": "private", "show_progress": "hidden"}
    listed = [tab.gallery, tab.items]
    demo.load(start, inputs=browser_token, outputs=[browser_token, *listed], api_name="ui_history_start", **private)
    tab.refresh.click(listing, inputs=browser_token, outputs=listed, api_name="ui_history_refresh", **private)
    page.select(listing, inputs=browser_token, outputs=listed, api_name="ui_history_opened", **private)
    selection = [tab.selected, tab.details, tab.open_workflow, tab.view, tab.player]
    tab.gallery.select(select, inputs=tab.items, outputs=selection, api_name="ui_history_select", **private)
    tab.upload.change(opened, inputs=tab.upload, outputs=selection, api_name="ui_history_open", **private)
    tab.use_settings.click(use, inputs=tab.selected, outputs=[*form.settings_outputs(), tabs],
                           api_name="ui_history_use", **private)
    tab.open_workflow.click(open_in_editor, inputs=tab.selected, outputs=[editor, tabs],
                            api_name="ui_history_workflow", **private)
    tab.to_image_to_image.click(to_image_to_image, inputs=tab.selected, outputs=[form.picture, form.picture_panel, tabs],
                                api_name="ui_history_img2img", **private)
    tab.to_editor.click(to_editor, inputs=[tab.selected, editor], outputs=[editor, tabs],
                        api_name="ui_history_to_editor", **private)

"""The History tab: a browser's saved results after any reload, newest first, and their settings.

The browser keeps a random token (`gr.BrowserState`, made on its first visit); results are saved
under a hash of it (studio.outputs), so a reload, or a new tab of the same browser, finds them.
Selecting one shows its `parameters` text; "Use these settings again" fills the Simple tab's
form, "Open its workflow" loads the workflow it came from into the editor. A PNG from anywhere
(ours, or AUTOMATIC1111's) can be opened the same way.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
from PIL import Image

from engine import Engine
from studio.bridge import user_error
from studio.outputs import OutputStore, SavedOutput, owner_key, parse_infotext, png_texts
from studio.simple_tab import ModelForm, SimpleForm

TOKEN_MIN_CHARS = 16
SHOWN = 60  # newest results shown


def fresh_token(token: object) -> str:
    """The browser's token, or a new random one on its first visit."""
    if isinstance(token, str) and len(token) >= TOKEN_MIN_CHARS:
        return token
    return secrets.token_urlsafe(24)


def settings_update(settings: dict, engine: Engine) -> list:
    """Form values for SimpleForm.settings_outputs(), from saved settings (missing ones: the
    model's defaults; a model no longer loaded: the default model)."""
    model = settings.get("model") if settings.get("model") in engine.models.names else engine.models.default
    defaults = engine.infos[model].defaults
    card_sizes = ModelForm.of(engine, model).sizes  # the size dropdown's choices
    size = f"{settings.get('width', defaults.width)}x{settings.get('height', defaults.height)}"
    return [
        model,
        settings.get("prompt", ""),
        settings.get("negative_prompt", defaults.negative_prompt or ""),
        size if size in card_sizes else (card_sizes[0] if card_sizes else None),
        settings.get("width", defaults.width),
        settings.get("height", defaults.height),
        settings.get("num_inference_steps", defaults.num_inference_steps),
        settings.get("guidance_scale", defaults.guidance_scale),
        settings.get("scheduler") or "",
        settings.get("num_frames", defaults.num_frames),
        "seed" not in settings,  # a known seed is reused as it is
        settings.get("seed", 0),
    ]


@dataclass(frozen=True)
class HistoryTab:
    refresh: gr.Button
    gallery: gr.Gallery
    details: gr.Textbox
    use_settings: gr.Button
    open_workflow: gr.Button
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
    details = gr.Textbox(label="Settings (parameters)", lines=3, interactive=False, elem_id="ss-history-details")
    with gr.Row():
        use_settings = gr.Button("Use these settings again", variant="primary", elem_id="ss-history-use")
        open_workflow = gr.Button("Open its workflow", visible=False, elem_id="ss-history-workflow")
    return HistoryTab(refresh, gallery, details, use_settings, open_workflow, upload, gr.State([]), gr.State(None))


def _thumbnail(item: SavedOutput) -> Image.Image:
    with Image.open(item.poster or item.path) as image:
        return image.convert("RGB")


def wire_history_tab(engine: Engine, store: OutputStore, tab: HistoryTab, page: gr.Tab,
                     browser_token: gr.BrowserState, form: SimpleForm, editor: gr.HTML, tabs: gr.Tabs,
                     demo: gr.Blocks) -> None:
    """`page` is the tab that holds it: opening it lists what was made since the last listing."""

    def listing(token: str) -> dict:
        items = store.history(owner_key(token))[:SHOWN] if isinstance(token, str) and token else []
        captions = [f"{item.settings.get('prompt', '')[:40]} · seed {item.settings.get('seed', '?')}" for item in items]
        return {tab.gallery: [(_thumbnail(item), caption) for item, caption in zip(items, captions)],
                tab.items: [item.__dict__ for item in items]}

    def start(token: str) -> dict:
        token = fresh_token(token)
        return {browser_token: token, **listing(token)}

    def select(items: list, event: gr.SelectData) -> dict:
        item = items[event.index] if 0 <= event.index < len(items) else None
        if item is None:
            return {tab.selected: None, tab.details: "", tab.open_workflow: gr.update(visible=False)}
        texts = png_texts(item["poster"] or item["path"])
        return {tab.selected: {"settings": item["settings"], "workflow": texts.get("workflow")},
                tab.details: item["parameters"], tab.open_workflow: gr.update(visible=item["has_workflow"])}

    def opened(path: str | None) -> dict:
        if not path:
            return {tab.selected: None, tab.details: ""}
        texts = png_texts(Path(path))
        if "parameters" not in texts:
            raise user_error("This PNG carries no settings (no 'parameters' text).", "No settings found")
        return {tab.selected: {"settings": parse_infotext(texts["parameters"]), "workflow": texts.get("workflow")},
                tab.details: texts["parameters"], tab.open_workflow: gr.update(visible="workflow" in texts)}

    def use(selected: dict | None) -> list:
        if not selected:
            raise user_error("Select a result (or open a PNG) first.", "Nothing selected")
        return settings_update(selected["settings"], engine) + [gr.Tabs(selected="simple")]

    def open_in_editor(selected: dict | None) -> list:
        if not selected or not selected.get("workflow"):
            raise user_error("This result was not made from a workflow.", "No workflow")
        workflow = json.loads(selected["workflow"])
        return [gr.update(value=json.dumps(workflow)), gr.Tabs(selected="workflow")]

    private = {"api_visibility": "private", "show_progress": "hidden"}
    listed = [tab.gallery, tab.items]
    demo.load(start, inputs=browser_token, outputs=[browser_token, *listed], api_name="ui_history_start", **private)
    tab.refresh.click(listing, inputs=browser_token, outputs=listed, api_name="ui_history_refresh", **private)
    page.select(listing, inputs=browser_token, outputs=listed, api_name="ui_history_opened", **private)
    tab.gallery.select(select, inputs=tab.items, outputs=[tab.selected, tab.details, tab.open_workflow],
                       api_name="ui_history_select", **private)
    tab.upload.change(opened, inputs=tab.upload, outputs=[tab.selected, tab.details, tab.open_workflow],
                      api_name="ui_history_open", **private)
    tab.use_settings.click(use, inputs=tab.selected, outputs=[*form.settings_outputs(), tabs],
                           api_name="ui_history_use", **private)
    tab.open_workflow.click(open_in_editor, inputs=tab.selected, outputs=[editor, tabs],
                            api_name="ui_history_workflow", **private)

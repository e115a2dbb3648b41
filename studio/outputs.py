"""Results that last: every finished image (or video) saved under an outputs folder, with its settings.

    store = OutputStore(Path("outputs"), model="shapes-flux")
    saved = store.save(completed, owner="3f2a...", workflow=workflow_json)   # -> SavedOutput
    store.history("3f2a...")                                                # newest first

Images are PNGs carrying a `parameters` text chunk in AUTOMATIC1111's format (readable by the
tools that read those) and, when they came from the node editor, a `workflow` chunk with the
workflow JSON (dropping such a PNG onto the editor loads it). Videos are MP4s with a PNG poster
frame beside them that carries the same chunks. Every save appends one line to its owner's
history file, which the History view reads; owner keys come from `studio.server.history_owners` (a
browser's signed token, or an API caller's session, under the server's secret), so a reload finds
its results and nobody can list another caller's.

Layout: <folder>/<YYYY-MM-DD>/<NNNNN>-<seed>.png   (NNNNN counts up within the day; .mp4 and a
                                                   .png poster for a video, <NNNNN>-grid.png for
                                                   a workflow's X/Y grid)
        <folder>/studio.db                         (the history index, with the studio's other durable state)
        <folder>/history/secret.key                (what History tokens are signed with)
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import os
import re
import struct
import threading
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from PIL import Image, PngImagePlugin
from PIL.PngImagePlugin import PngInfo

from engine import Completed, GenerationParams
from pipelines.lora_request import prompt_tags
from pipelines.params import (
    MAX_FRAMES_ABSOLUTE,
    MAX_SEED,
    MAX_SIZE_ABSOLUTE,
    MAX_STEPS_ABSOLUTE,
    MIN_SIZE,
)
from studio.server.history_owners import HistoryOwners, is_owner_key
from studio.store.store import StudioStore

HISTORY_FOLDER = "history"
log = logging.getLogger(__name__)
HISTORY_LIMIT = 200
MAX_GUIDANCE_TEXT = 1000.0  # a CFG scale read from a PNG's text beyond this is left out


# ---------------------------------------------------------------------------- infotext
def infotext(params: GenerationParams, model: str) -> str:
    """AUTOMATIC1111's `parameters` text: prompt (its LoRAs as `<lora:NAME:SCALE>` tags, as A1111
    writes them), `Negative prompt: ...`, then `Key: value` pairs."""
    lines = [f"{params.prompt} {prompt_tags(params.loras)}" if params.loras else params.prompt]
    if params.negative_prompt:
        lines.append(f"Negative prompt: {params.negative_prompt}")
    fields = {
        "Steps": params.num_inference_steps,
        "Sampler": params.scheduler or "default",
        "CFG scale": f"{params.guidance_scale:g}",
        "Seed": params.seed,
        "Size": f"{params.width}x{params.height}",
        "Model": model,
    }
    if params.num_frames and params.num_frames > 1:
        fields["Frames"] = params.num_frames
    if params.init_image is not None:  # image to image: how much was redrawn, and from which picture
        fields["Denoising strength"] = f"{params.strength:g}"
        fields["Init image"] = params.init_image_digest  # "WxH:" + its content's sha256, shortened
        if params.mask_image is not None:
            fields["Mask"] = params.mask_image_digest
    lines.append(", ".join(f"{key}: {_quote(value)}" for key, value in fields.items()))
    return "\n".join(lines)


def _quote(value: object) -> str:
    text = str(value)
    return json.dumps(text) if ("," in text or ":" in text or "\n" in text) else text


_PAIR = re.compile(r'\s*([\w ./-]+):\s*("(?:\\.|[^\\"])+"|[^,]*)(?:,|$)')


def parse_infotext(text: str) -> dict[str, Any]:
    """The settings in a `parameters` text (ours or AUTOMATIC1111's): prompt, negative_prompt,
    num_inference_steps, guidance_scale, seed, width, height, scheduler, num_frames (those present)."""
    lines = text.strip().split("\n")
    last = lines[-1] if lines and _PAIR.match(lines[-1]) and "Steps:" in lines[-1] else ""
    body = lines[:-1] if last else lines
    prompt_lines, negative_lines, in_negative = [], [], False
    for line in body:
        if line.startswith("Negative prompt:"):
            in_negative = True
            line = line[len("Negative prompt:"):].strip()
        (negative_lines if in_negative else prompt_lines).append(line)
    settings: dict[str, Any] = {"prompt": "\n".join(prompt_lines).strip()}
    if in_negative:
        settings["negative_prompt"] = "\n".join(negative_lines).strip()
    pairs = {key.strip(): value.strip() for key, value in _PAIR.findall(last)}
    pairs = {key: json.loads(value) if value.startswith('"') else value for key, value in pairs.items()}
    # A value outside what a request may carry is left out (the form keeps its default): a PNG
    # from elsewhere may say anything, e.g. a seed past 64 bits.
    converters: dict[str, tuple[str, Callable, float, float]] = {
        "Steps": ("num_inference_steps", int, 1, MAX_STEPS_ABSOLUTE),
        "CFG scale": ("guidance_scale", float, -MAX_GUIDANCE_TEXT, MAX_GUIDANCE_TEXT),
        "Seed": ("seed", int, 0, MAX_SEED),
        "Frames": ("num_frames", int, 1, MAX_FRAMES_ABSOLUTE),
    }
    for key, (name, convert, lowest, highest) in converters.items():
        value = _number(pairs.get(key), convert, lowest, highest)
        if value is not None:
            settings[name] = value
    if "Size" in pairs:
        width, _, height = pairs["Size"].partition("x")
        width, height = (_number(side, int, MIN_SIZE, MAX_SIZE_ABSOLUTE) for side in (width, height))
        if width is not None and height is not None:
            settings["width"], settings["height"] = width, height
    if "Sampler" in pairs:
        settings["scheduler"] = None if pairs["Sampler"] == "default" else pairs["Sampler"]
    if "Model" in pairs:
        settings["model"] = pairs["Model"]
    return settings


def _number(text: object, convert: Callable, lowest: float, highest: float) -> int | float | None:
    """`text` as a number in [lowest, highest], else None."""
    if not isinstance(text, str) or len(text) > 32:
        return None
    try:
        value = convert(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and lowest <= value <= highest else None


class UnreadablePng(ValueError):
    """A file offered as a PNG that can't be read: not a PNG, cut short, or text chunks past the limits."""


# What a damaged or hostile file makes Pillow raise (a zTXt chunk that inflates past
# PngImagePlugin.MAX_TEXT_CHUNK raises ValueError; a cut file, OSError, SyntaxError or struct.error).
_PNG_READ_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error, zlib.error, Image.DecompressionBombError)


def png_texts(path: Path | str) -> dict[str, str]:
    """The text chunks before a PNG's pixels (where this studio and AUTOMATIC1111 write `parameters`
    and `workflow`); the pixels are never decoded. Raises UnreadablePng for a file that isn't a PNG,
    is cut short, or has a text larger than Pillow's limit (PngImagePlugin.MAX_TEXT_CHUNK, 1 MB)."""
    try:
        with Image.open(path, formats=["PNG"]) as image:
            return {key: value for key, value in image.info.items() if isinstance(key, str) and isinstance(value, str)}
    except _PNG_READ_ERRORS as exc:
        raise UnreadablePng("This file can't be read as a PNG: it is not one, it is cut short, or a text in it "
                            f"is over {PngImagePlugin.MAX_TEXT_CHUNK / 2**20:g} MiB ({type(exc).__name__}).") from None


# ---------------------------------------------------------------------------- the store
@dataclass(frozen=True)
class SavedOutput:
    path: str  # the image, or the video
    poster: str | None  # a video's first frame (PNG with the same chunks)
    owner: str
    kind: str  # "image" | "video" | "grid" (a workflow run's X/Y grid)
    created: float
    parameters: str  # the infotext
    settings: dict  # parse_infotext(parameters), plus "model"
    has_workflow: bool

    def as_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)


class OutputStore:
    """Saves finished results and lists a browser's history. `folder=None` turns saving off.
    `index`: the studio's durable store, whose history table indexes the files (opened on the
    folder when not given)."""

    def __init__(self, folder: Path | None, model: str, fps: int = 16,
                 write_video: Callable[[Sequence[Image.Image], Path, int], None] | None = None,
                 fps_by_model: Mapping[str, int] | None = None, index: StudioStore | None = None) -> None:
        self.folder = Path(folder) if folder is not None else None
        self.model = model
        self.fps = fps  # a saved video's frames per second, unless its model is in fps_by_model
        self.fps_by_model = dict(fps_by_model or {})
        self._write_video = write_video
        self._lock = threading.Lock()
        self._counter: dict[str, itertools.count] = {}
        self.index = index if index is not None else StudioStore.open(self.folder)
        # Who may list what: owner keys and browser tokens under this folder's secret.
        self.owners = HistoryOwners.in_folder(None if self.folder is None else self.folder / HISTORY_FOLDER)
        if self.folder is not None:
            self.finish_partial_files()

    @property
    def enabled(self) -> bool:
        return self.folder is not None

    def _next_stem(self, day_folder: Path, seed: int | str) -> Path:
        day = day_folder.name
        if day not in self._counter:
            existing = [int(p.name.split("-", 1)[0]) for p in day_folder.glob("*-*.*") if p.name.split("-", 1)[0].isdigit()]
            self._counter[day] = itertools.count(max(existing, default=0) + 1)
        return day_folder / f"{next(self._counter[day]):05d}-{seed}"

    def save(self, completed: Completed, owner: str, workflow: dict | None = None,
             in_same_commit: Callable[[SavedOutput], None] | None = None, caption: str | None = None
             ) -> SavedOutput | None:
        """Write the result and index it; None when saving is off. `owner`: a key from
        `self.owners`. `in_same_commit(saved)`: more store writes that must land with the index row or
        not at all (the accepted request's end: studio.store.store says why). `caption`: what tells
        a workflow branch's result from its siblings' (its swept values, kept in its settings).

        The files are written under `.partial.` names and synced, the index row is committed, then
        they are renamed: a crash at any point leaves no result indexed without its files, and the
        next start finishes or removes what a crash left (`finish_partial_files`)."""
        kind = "video" if completed.is_video else "image"
        return self._save(completed.params, completed.images, kind, owner, workflow, in_same_commit, caption)

    def save_grid(self, grid: Image.Image, params: GenerationParams, owner: str, workflow: dict | None = None,
                  caption: str | None = None) -> SavedOutput | None:
        """A workflow run's X/Y grid, as a PNG (kind "grid") carrying the `parameters` of one of its
        cells (`params`, as AUTOMATIC1111 saves its grids) and the workflow; None when saving is off."""
        return self._save(params, [grid], "grid", owner, workflow, None, caption)

    def _save(self, params: GenerationParams, images: Sequence[Image.Image], kind: str, owner: str,
              workflow: dict | None, in_same_commit: Callable[[SavedOutput], None] | None,
              caption: str | None) -> SavedOutput | None:
        if self.folder is None:
            return None
        if not is_owner_key(owner):
            raise ValueError(f"owner must be an owner key (32 hex digits, from store.owners), got {owner!r:.40}.")
        model = params.model or self.model  # the request's own model, when the engine serves several
        text = infotext(params, model)
        info = PngInfo()
        info.add_text("parameters", text)
        if workflow is not None:
            info.add_text("workflow", json.dumps(workflow, ensure_ascii=False))
        day_folder = self.folder / time.strftime("%Y-%m-%d")
        with self._lock:
            day_folder.mkdir(parents=True, exist_ok=True)
            stem = self._next_stem(day_folder, "grid" if kind == "grid" else params.seed)
            if kind == "video":
                poster = stem.with_suffix(".png")
                _write_synced(poster, lambda file: images[0].convert("RGB").save(file, "PNG", pnginfo=info))
                path = stem.with_suffix(".mp4")
                if self._write_video is None:
                    raise RuntimeError("this OutputStore was made without a video writer")
                self._write_video(images, _partial(path), self.fps_by_model.get(model, self.fps))
                _sync(_partial(path))
            else:
                poster = None
                path = stem.with_suffix(".png")
                _write_synced(path, lambda file: images[0].save(file, "PNG", pnginfo=info))
            settings = dict(parse_infotext(text), model=model, **({"caption": caption} if caption else {}))
            saved = SavedOutput(str(path), str(poster) if poster else None, owner, kind, time.time(), text, settings,
                                workflow is not None)
            with self.index.transaction():
                self.index.add_history(asdict(saved))
                if in_same_commit is not None:
                    in_same_commit(saved)
            for written in (path, poster):
                if written is not None:
                    _partial(written).rename(written)
        return saved

    def finish_partial_files(self) -> int:
        """After a crash: rename the files whose result the index holds, delete the others (their
        request is still accepted and runs again). Returns how many files were renamed."""
        renamed = 0
        for partial in sorted(self.folder.glob(f"*/*{PARTIAL}*")):
            final = partial.with_name(partial.name.replace(PARTIAL, "", 1))
            if self.index.is_indexed(str(final)):
                partial.rename(final)
                renamed += 1
            else:
                partial.unlink()
        if renamed:
            log.info("finished %d saved files a crash had left unrenamed", renamed)
        return renamed

    def history(self, owner: str, limit: int = HISTORY_LIMIT) -> list[SavedOutput]:
        """This owner's saved results whose files still exist, newest first."""
        if self.folder is None or not is_owner_key(owner):
            return []
        found = [SavedOutput(**row) for row in self.index.history(owner, limit * 2)]
        return [item for item in found if Path(item.path).exists()][:limit]

    def name_of(self, item: SavedOutput) -> str:
        """A saved result's picture by name: its path in the outputs folder ("2026-12-02/00001-7.png";
        a video's poster frame), what a workflow's Load image may give instead of a data URL."""
        return Path(item.poster or item.path).relative_to(self.folder).as_posix()

    def saved_picture(self, owner: str, name: str) -> bytes:
        """The bytes of one of `owner`'s saved pictures by its name (`name_of`). ValueError for any
        other name: another caller's results are not found by guessing their names."""
        for item in self.history(owner):
            if self.name_of(item) == name:
                return Path(item.poster or item.path).read_bytes()
        raise ValueError(f"{name!r:.80} is not one of your saved results: name one from your History "
                         "(e.g. 2026-12-02/00001-7.png), or send the picture as a data URL.")

    def adopt(self, old_owner: str, new_owner: str) -> None:
        """File `old_owner`'s results under `new_owner` (a browser moving to a signed token)."""
        if self.folder is None or not (is_owner_key(old_owner) and is_owner_key(new_owner)):
            return
        self.index.adopt(old_owner, new_owner)


PARTIAL = ".partial"  # in the name of a saved file until its index row is committed


def _partial(path: Path) -> Path:
    return path.with_name(f"{path.stem}{PARTIAL}{path.suffix}")


def _write_synced(path: Path, write: Callable) -> None:
    """Write `path`'s partial file and sync it to disk (it is indexed next)."""
    with open(_partial(path), "wb") as file:
        write(file)
        file.flush()
        os.fsync(file.fileno())


def _sync(path: Path) -> None:
    with open(path, "rb") as file:
        os.fsync(file.fileno())


async def save_quietly(store: OutputStore | None, completed: Completed, owner: str, workflow: dict | None = None,
                       in_same_commit: Callable[[SavedOutput], None] | None = None, caption: str | None = None) -> None:
    """Save off the event loop; a failed write (a full disk) is logged, never fails the request."""
    if store is None or not store.enabled:
        return
    try:
        await asyncio.to_thread(store.save, completed, owner, workflow, in_same_commit, caption)
    except OSError as exc:
        log.warning("could not save an output: %s", exc)

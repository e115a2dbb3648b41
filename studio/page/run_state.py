"""A workflow run's state as JSON, in two forms.

- `RunStateEncoder.state`: everything, every time (what `/run_workflow` callers get): each branch's
  latest preview and its result as data URLs, and each grid as a data URL.
- `EditorRunState.update`: what the node editor needs to draw the same page, sending each picture
  once. Every update has every branch's state row (a few numbers and words; Gradio's streaming
  sends only the fields that changed), a branch's preview only in the update where it is new (a
  small data URL), and results and grids as the URLs of files written once to Gradio's cache (the
  browser fetches each once). The editor's JavaScript keeps the last preview of each branch
  (`mergeRun` in web/node_editor.js), so the page shows what it did when every update carried
  every picture.

Both encode images (JPEG, PNG, GIF): call them in a worker thread (`asyncio.to_thread`), never on
the event loop. One encoder serves one run's stream, one call at a time.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Callable

from PIL import Image

from engine import GenerationParams
from studio.media import animated_gif, data_url, preview_image
from studio.server.temp_files import TempFolder
from studio.tracker import FINAL_STATES
from studio.workflows.compiler import CompiledWorkflow
from studio.workflows.format import WorkflowError
from studio.workflows.run_views import BranchView, RunView

FILE_ROUTE = "gradio_api/file="  # relative to the page, like the editor's own scripts
RUN_FILES_FOLDER = "stepstudio-runs"  # in Gradio's cache folder


def path_of(file_url: str) -> str:
    """The file behind a URL that RunFiles made."""
    if not file_url.startswith(FILE_ROUTE):
        raise ValueError(f"not a run file's URL: {file_url[:60]!r}")
    return file_url[len(FILE_ROUTE):]


def encode_image(image: Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format=fmt, **({"quality": 85} if fmt == "JPEG" else {}))
    return buffer.getvalue()


def media_data_url(media, fmt: str, max_px: int | None = None, fps: int = 8) -> str:
    """`media`: a PIL image (shrunk to at most `max_px`), or a video's frames (a GIF at `fps`,
    whatever `fmt` says)."""
    if isinstance(media, (list, tuple)):
        return data_url(animated_gif(media, fps, max_px), "image/gif")
    image = preview_image(media, max_px) if max_px else media
    return data_url(encode_image(image, fmt), f"image/{fmt.lower()}")


def result_media(progress: BranchView):
    """A finished branch's picture, or a video's frames; None before it finished."""
    if progress.result is None:
        return None
    return progress.result.images if progress.result.is_video else progress.result.images[0]


def branch_row(progress: BranchView) -> dict:
    """A branch's state without pictures."""
    params = progress.params
    return {
        "index": progress.branch.index,
        "sampler": progress.branch.sampler,
        "label": progress.branch.label,
        "axes": {axis.input: axis.label for axis in progress.branch.axes},
        "state": progress.state,
        "step": progress.step,
        "total": progress.total,
        "position": progress.position,
        "paused": progress.paused,  # while queued: "session" (the tab's queue is paused) or "engine"
        "batch_size": progress.batch_size,
        "seed": params.seed,
        "prompt": params.prompt,
        "guidance_scale": params.guidance_scale,
        "num_inference_steps": params.num_inference_steps,
        "size": f"{params.width}x{params.height}",
        "parent": progress.branch.parent,  # the branch of an earlier stage whose image it starts from
        "strength": params.strength if params.init_image is not None else None,
        "request_id": progress.request_id,
        "message": progress.message,
    }


def run_summary(view: RunView, compiled: CompiledWorkflow, serial: int) -> dict:
    """The run's totals and each node's state."""
    return {
        "serial": serial,  # always a new value, so the browser's watch fires
        "run_id": view.run_id,
        "state": view.state,
        "done": view.done,  # branches that ended, however they ended
        "total": view.total,
        # How they ended, for the run bar: "1/4 branches" read as one finished when one was aborted.
        "ended": {state: sum(b.state == state for b in view.branches) for state in FINAL_STATES},
        "steps_done": sum(b.step for b in view.branches),
        "total_steps": sum(b.total for b in view.branches),
        "nodes": {
            node_id: {"state": node.state, "done": node.done, "total": node.total,
                      "branches": list(compiled.node_branches.get(node_id, ()))}
            for node_id, node in view.nodes.items()
        },
    }


def invalid_state(error: WorkflowError) -> dict:
    return {"serial": id(error), "state": "invalid", "problems": error.as_dicts()}


class _EncodedOnce:
    """Each picture (a PIL image, or a video's frames) encoded once: the run's views share the
    same objects from step to step, so identity says what is new."""

    def __init__(self) -> None:
        self._done: dict[int, tuple[object, str]] = {}

    def get(self, media, encode: Callable[[object], str]) -> str:
        cached = self._done.get(id(media))
        if cached is not None and cached[0] is media:
            return cached[1]
        encoded = encode(media)
        self._done[id(media)] = (media, encoded)  # holding `media` keeps its id from being reused
        return encoded


class RunStateEncoder:
    """RunView -> the whole state as JSON (API callers). Images become data URLs, each encoded
    once: previews as small JPEGs, results and grids as PNGs, and a video's frames (its preview,
    or its result) as a looping GIF."""

    def __init__(self, preview_max_px: int, fps_of: Callable[[GenerationParams], int]) -> None:
        self.preview_max_px = preview_max_px
        self.fps_of = fps_of  # a video's frames per second: its own model's
        self._encoded = _EncodedOnce()
        self._serial = itertools.count()

    def _url(self, media, fmt: str, max_px: int | None = None, fps: int = 8) -> str | None:
        if media is None:
            return None
        return self._encoded.get(media, lambda media: media_data_url(media, fmt, max_px, fps))

    def preview_url(self, progress: BranchView) -> str | None:
        return self._url(progress.preview, "JPEG", self.preview_max_px, self.fps_of(progress.params))

    def branch(self, progress: BranchView) -> dict:
        video = progress.result is not None and progress.result.is_video
        return {
            **branch_row(progress),
            "preview": self.preview_url(progress),
            "image": self._url(result_media(progress), "PNG", self.preview_max_px if video else None,
                               self.fps_of(progress.params)),
        }

    def state(self, view: RunView, compiled: CompiledWorkflow) -> dict:
        return {
            **run_summary(view, compiled, next(self._serial)),
            "branches": [self.branch(b) for b in view.branches],
            "grids": {node_id: self._url(image, "PNG") for node_id, image in view.grids.items()},
        }


class RunFiles:
    """Finished pictures as files in a TempFolder inside Gradio's cache folder, which Gradio serves
    at FILE_ROUTE; the studio's sweeper deletes them after the folder's time to live."""

    def __init__(self, folder: TempFolder) -> None:
        self.folder = folder

    def write(self, data: bytes, suffix: str) -> str:
        """Write `data` to a new file; returns its URL."""
        path = self.folder.new_file(suffix)
        path.write_bytes(data)
        return FILE_ROUTE + str(path.resolve())


class EditorRunState:
    """RunView -> the node editor's update: state rows for every branch, a preview only when it
    is new, results and grids as file URLs (see the module's docstring)."""

    def __init__(self, preview_max_px: int, fps_of: Callable[[GenerationParams], int], files: RunFiles) -> None:
        self.preview_max_px = preview_max_px
        self.fps_of = fps_of  # a video's frames per second: its own model's
        self.files = files
        self._file_urls = _EncodedOnce()
        self._sent_previews: dict[int, object] = {}  # branch index -> the preview last sent
        self._serial = itertools.count()

    def _file(self, media, fps: int, max_px: int) -> str | None:
        """A result (PNG; a video's frames as a GIF of at most `max_px`) or a grid, as a file URL."""
        if media is None:
            return None

        def write(media) -> str:
            if isinstance(media, (list, tuple)):
                return self.files.write(animated_gif(media, fps, max_px), ".gif")
            return self.files.write(encode_image(media, "PNG"), ".png")

        return self._file_urls.get(media, write)

    def branch(self, progress: BranchView) -> dict:
        row = branch_row(progress)
        index = progress.branch.index
        if progress.preview is not None and self._sent_previews.get(index) is not progress.preview:
            self._sent_previews[index] = progress.preview  # only the latest is kept
            row["preview"] = media_data_url(progress.preview, "JPEG", self.preview_max_px,
                                            self.fps_of(progress.params))
        row["image"] = self._file(result_media(progress), self.fps_of(progress.params),
                                  self.preview_max_px)
        return row

    def update(self, view: RunView, compiled: CompiledWorkflow) -> dict:
        return {
            **run_summary(view, compiled, next(self._serial)),
            "branches": [self.branch(b) for b in view.branches],
            "grids": {node_id: self._file(image, 0, 0) for node_id, image in view.grids.items()},
        }

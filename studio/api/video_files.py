"""The files a finished video job offers for download, as OpenAI's Videos API names them:

    video         the MP4 (H.264, yuv420p: what browsers play), written by studio.media.write_mp4
    thumbnail     the poster frame (the first frame), WEBP
    spritesheet   every frame in a grid, row by row, JPEG

All three are made once, when the job finishes, and kept as files in the job store's folder
(`<outputs>/video-jobs/`, or a temp folder with --no-save) until the job goes.
"""

from __future__ import annotations

import io
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from PIL import Image

from studio.media import write_mp4

VARIANTS = ("video", "thumbnail", "spritesheet")
MEDIA_TYPES = {"video": "video/mp4", "thumbnail": "image/webp", "spritesheet": "image/jpeg"}
SUFFIXES = {"video": "mp4", "thumbnail": "webp", "spritesheet": "jpg"}


PARTIAL = ".partial"  # in a download's file name until its job's end is committed


@dataclass(frozen=True)
class VideoFiles:
    """A finished job's downloads on disk (studio.api.video_jobs keeps the folder)."""

    paths: dict  # variant -> the file's path
    size_bytes: int

    def variant(self, name: str) -> bytes:
        return Path(self.paths[name]).read_bytes()

    def as_record(self) -> dict:
        return {"paths": dict(self.paths), "size_bytes": self.size_bytes}

    @classmethod
    def from_record(cls, record: dict) -> "VideoFiles":
        return cls(dict(record["paths"]), int(record["size_bytes"]))

    def exist(self) -> bool:
        return all(Path(path).is_file() for path in self.paths.values())

    def commit(self) -> None:
        """Give the files their final names (after the job's end is committed)."""
        for path in self.paths.values():
            partial_name(Path(path)).rename(path)

    def remove(self) -> None:
        for path in self.paths.values():
            for each in (Path(path), partial_name(Path(path))):
                each.unlink(missing_ok=True)


def partial_name(path: Path) -> Path:
    return path.with_name(f"{path.stem}{PARTIAL}{path.suffix}")


def encode_video_files(frames: Sequence[Image.Image], fps: int, folder: Path, job_id: str) -> VideoFiles:
    """The three downloads of one video, written under their partial names in `folder` and synced
    (blocking: call it off the event loop). `commit()` them once the job's end is recorded."""
    if not frames:
        raise ValueError("a video needs at least one frame.")
    folder.mkdir(parents=True, exist_ok=True)
    paths = {variant: str(folder / f"{job_id}.{SUFFIXES[variant]}") for variant in VARIANTS}
    contents = {"video": _mp4_bytes(frames, fps), "thumbnail": _image_bytes(frames[0], "WEBP"),
                "spritesheet": _image_bytes(spritesheet(frames), "JPEG")}
    for variant, content in contents.items():
        with open(partial_name(Path(paths[variant])), "wb") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
    return VideoFiles(paths, sum(map(len, contents.values())))


def spritesheet(frames: Sequence[Image.Image]) -> Image.Image:
    """Every frame in a near-square grid, left to right, then top to bottom."""
    width, height = frames[0].size
    columns = math.ceil(math.sqrt(len(frames)))
    rows = math.ceil(len(frames) / columns)
    sheet = Image.new("RGB", (columns * width, rows * height))
    for index, frame in enumerate(frames):
        sheet.paste(frame.convert("RGB"), ((index % columns) * width, (index // columns) * height))
    return sheet


def _mp4_bytes(frames: Sequence[Image.Image], fps: int) -> bytes:
    # ffmpeg writes to a path; its bytes are then written with the other downloads.
    handle, path = tempfile.mkstemp(prefix="stepstudio-video-", suffix=".mp4")
    os.close(handle)
    try:
        write_mp4(frames, path, fps)
        with open(path, "rb") as written:
            return written.read()
    finally:
        os.unlink(path)


def _image_bytes(image: Image.Image, format: str) -> bytes:
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format=format, quality=90)
    return buffer.getvalue()

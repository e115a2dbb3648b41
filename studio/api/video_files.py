"""The files a finished video job offers for download, as OpenAI's Videos API names them:

    video         the MP4 (H.264, yuv420p: what browsers play), written by studio.media.write_mp4
    thumbnail     the poster frame (the first frame), WEBP
    spritesheet   every frame in a grid, row by row, JPEG

All three are made once, when the job finishes, and kept in memory with the job.
"""

from __future__ import annotations

import io
import math
import os
import tempfile
from dataclasses import dataclass
from typing import Sequence

from PIL import Image

from studio.media import write_mp4

VARIANTS = ("video", "thumbnail", "spritesheet")
MEDIA_TYPES = {"video": "video/mp4", "thumbnail": "image/webp", "spritesheet": "image/jpeg"}
SUFFIXES = {"video": "mp4", "thumbnail": "webp", "spritesheet": "jpg"}


@dataclass(frozen=True)
class VideoFiles:
    mp4: bytes
    thumbnail: bytes
    spritesheet: bytes

    @property
    def size_bytes(self) -> int:
        return len(self.mp4) + len(self.thumbnail) + len(self.spritesheet)

    def variant(self, name: str) -> bytes:
        return {"video": self.mp4, "thumbnail": self.thumbnail, "spritesheet": self.spritesheet}[name]


def encode_video_files(frames: Sequence[Image.Image], fps: int) -> VideoFiles:
    """The three downloads of one video (blocking: call it off the event loop)."""
    if not frames:
        raise ValueError("a video needs at least one frame.")
    return VideoFiles(_mp4_bytes(frames, fps), _image_bytes(frames[0], "WEBP"), _image_bytes(spritesheet(frames), "JPEG"))


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
    # ffmpeg writes to a path; the bytes then live with the job and the file goes at once.
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

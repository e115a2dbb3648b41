"""Media files the studio writes: MP4 videos (H.264, yuv420p: what browsers play) via imageio-ffmpeg."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image

DEFAULT_FPS = 16


def model_fps(info) -> int:
    """Frames per second of a model's videos: its stepstudio.json `fps`, else DEFAULT_FPS."""
    fps = getattr(info.defaults, "fps", None) or info.extras.get("fps")
    return int(fps) if fps else DEFAULT_FPS


def write_mp4(frames: Sequence[Image.Image], path: Path | str, fps: int = 16) -> Path:
    """Encode RGB frames as an H.264 MP4 in yuv420p (odd sizes are padded by the encoder's macro block)."""
    import imageio_ffmpeg

    if not frames:
        raise ValueError("a video needs at least one frame.")
    first = frames[0].convert("RGB")
    writer = imageio_ffmpeg.write_frames(str(path), first.size, fps=fps, codec="libx264", pix_fmt_out="yuv420p",
                                         macro_block_size=2, quality=7, ffmpeg_log_level="error")
    writer.send(None)
    for frame in frames:
        writer.send(np.ascontiguousarray(np.asarray(frame.convert("RGB"))))
    writer.close()
    return Path(path)


def animated_gif(frames: Sequence[Image.Image], fps: int = 8, max_px: int | None = None) -> bytes:
    """The frames as a looping GIF (a video's live preview), each shrunk to at most `max_px`."""
    import io

    if not frames:
        raise ValueError("an animation needs at least one frame.")
    shown = []
    for frame in frames:
        frame = frame.convert("RGB")
        if max_px and max(frame.size) > max_px:
            frame = frame.copy()
            frame.thumbnail((max_px, max_px))
        shown.append(frame)
    buffer = io.BytesIO()
    shown[0].save(buffer, format="GIF", save_all=True, append_images=shown[1:], loop=0,
                  duration=max(20, round(1000 / max(fps, 1))), disposal=1)
    return buffer.getvalue()


def data_url(data: bytes, mime: str) -> str:
    import base64

    return f"data:{mime};base64," + base64.b64encode(data).decode()

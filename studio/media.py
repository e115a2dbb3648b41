"""Media files the studio writes: MP4 videos (H.264, yuv420p: what browsers play) via imageio-ffmpeg."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image


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

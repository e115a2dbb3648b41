"""Media the studio sends: previews, finished images and videos (MP4, H.264 yuv420p: what
browsers play, via imageio-ffmpeg), looping GIFs and data URLs.

Everything here encodes or resizes: call it from a worker thread (`asyncio.to_thread`) in async
handlers, never on the event loop.
"""

from __future__ import annotations

import base64
import io
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
from PIL import Image

from studio.server.temp_files import TempFolder

if TYPE_CHECKING:
    from engine import Completed

DEFAULT_FPS = 16
POSTER_MAX_PX = 256  # a video's animated poster in History
VIDEO_FILE_TTL_S = 600  # Gradio copies a returned file into its own cache; ours can go soon after
VIDEOS = TempFolder("stepstudio-videos", ttl_s=VIDEO_FILE_TTL_S)  # the MP4s written for Gradio to send


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


def read_mp4(path: Path | str) -> tuple[list[Image.Image], float]:
    """An MP4's frames (RGB) and its frames per second, read back with imageio-ffmpeg."""
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24")
    meta = next(reader)
    size = meta["size"]
    frames = [Image.frombytes("RGB", size, bytes(frame)) for frame in reader]
    return frames, float(meta["fps"])


def animated_poster(video: Path | str, max_px: int = POSTER_MAX_PX) -> Path:
    """A saved video as a looping GIF beside it (`<name>.gif`, every frame at the video's own fps,
    shrunk to at most `max_px`): what History shows for it. Made once, written under a temporary
    name and renamed into place, so a poster being sent is never rewritten under its reader."""
    video = Path(video)
    poster = video.with_suffix(".gif")
    if poster.exists() and poster.stat().st_mtime >= video.stat().st_mtime:
        return poster
    frames, fps = read_mp4(video)
    staging = poster.with_name(f".{poster.name}.{os.getpid()}.{threading.get_ident()}")
    staging.write_bytes(animated_gif(frames, round(fps), max_px))
    os.replace(staging, poster)
    return poster


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def preview_image(image: Image.Image, max_px: int) -> Image.Image:
    """A small preview to send: shrunk to at most `max_px` (the page enlarges small ones)."""
    if max(image.size) <= max_px:
        return image
    scaled = image.copy()
    scaled.thumbnail((max_px, max_px))
    return scaled


def frames_to_video(frames: Sequence[Image.Image], fps: int = DEFAULT_FPS) -> str:
    """Write frames to a new mp4 file in VIDEOS and return its path (the files there go after
    VIDEO_FILE_TTL_S: Gradio sends its own copy)."""
    return str(write_mp4(frames, VIDEOS.new_file(".mp4"), fps))


def final_media(completed: "Completed", fps: int = DEFAULT_FPS) -> Image.Image | str:
    """The image, or the path of the video, of a finished request."""
    if completed.is_video:
        return frames_to_video(completed.images, fps=fps)
    return completed.images[0]


def settings_caption(completed: "Completed") -> str:
    """One line under a finished result: its prompt (shortened) and the settings that made it."""
    params = completed.params
    prompt = params.prompt if len(params.prompt) <= 60 else params.prompt[:57] + "..."
    return (
        f"{prompt} | seed {completed.seed} | {params.num_inference_steps} steps | "
        f"{params.width}x{params.height} | guidance {params.guidance_scale:g}"
    )

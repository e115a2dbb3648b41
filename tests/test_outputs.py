"""Results that last: saved files, their AUTOMATIC1111-style parameters, per-browser history."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import imageio_ffmpeg
import numpy as np
import pytest
from PIL import Image

from engine import Completed, GenerationParams, Timings
from studio.media import write_mp4
from studio.outputs import OutputStore, infotext, parse_infotext, png_texts
from studio.server.history_owners import HistoryOwners

PARAMS = GenerationParams(prompt="a red circle, left", negative_prompt="blurry: bad", width=64, height=48,
                          num_inference_steps=20, guidance_scale=3.5, seed=1234, num_frames=1, scheduler="euler")


OWNERS = HistoryOwners(b"a test secret, 32 bytes long...")


def owner_key(session_id: str) -> str:
    return OWNERS.of_caller(session_id)


def completed(params: GenerationParams = PARAMS, frames: int = 1) -> Completed:
    images = tuple(Image.new("RGB", (params.width, params.height), (10 * i, 100, 200)) for i in range(frames))
    return Completed(images=images, seed=params.seed, params=params, timings=Timings(0.0, 0.1, 0.2),
                     is_video=frames > 1)


def test_infotext_is_automatic1111s_format_and_round_trips():
    text = infotext(PARAMS, "shapes-flux")
    assert text == ('a red circle, left\nNegative prompt: blurry: bad\n'
                    'Steps: 20, Sampler: euler, CFG scale: 3.5, Seed: 1234, Size: 64x48, Model: shapes-flux')
    assert parse_infotext(text) == {"prompt": "a red circle, left", "negative_prompt": "blurry: bad",
                                    "num_inference_steps": 20, "guidance_scale": 3.5, "seed": 1234,
                                    "width": 64, "height": 48, "scheduler": "euler", "model": "shapes-flux"}


def test_an_image_to_image_text_names_the_strength_and_the_source_picture():
    picture = Image.new("RGB", (64, 48), (200, 30, 30))
    mask = Image.new("L", (64, 48), 255)
    edit = replace(PARAMS, init_image=picture, strength=0.7, mask_image=mask)
    last = infotext(edit, "shapes-flux").splitlines()[-1]
    assert last.endswith(f'Denoising strength: 0.7, Init image: "{edit.init_image_digest}", '
                         f'Mask: "{edit.mask_image_digest}"')
    assert edit.init_image_digest.startswith("64x48:") and edit.init_image_digest != edit.mask_image_digest
    assert "Denoising strength" not in infotext(PARAMS, "shapes-flux")  # text to image: none
    assert parse_infotext(infotext(edit, "shapes-flux")) == parse_infotext(infotext(PARAMS, "shapes-flux"))


def test_an_automatic1111_text_with_quoted_values_and_extra_keys_parses():
    text = ('a castle\non a hill\nSteps: 30, Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 7, Seed: 42, '
            'Size: 512x768, Model hash: abc123, Lora hashes: "a: 1, b: 2", Version: v1.10.1')
    settings = parse_infotext(text)
    assert settings == {"prompt": "a castle\non a hill", "num_inference_steps": 30, "guidance_scale": 7.0,
                        "seed": 42, "width": 512, "height": 768, "scheduler": "DPM++ 2M"}  # no Model key: none
    assert parse_infotext("just a prompt") == {"prompt": "just a prompt"}


def test_saved_png_carries_parameters_and_workflow(tmp_path):
    store = OutputStore(tmp_path, model="shapes-flux")
    owner = owner_key("browser-token-123456")
    workflow = {"version": 1, "nodes": [{"id": "1", "type": "prompt", "values": {"text": "a red circle, left"}}],
                "links": []}
    saved = store.save(completed(), owner, workflow)
    assert saved.path.endswith("00001-1234.png") and saved.kind == "image" and saved.has_workflow
    texts = png_texts(saved.path)
    assert texts["parameters"] == infotext(PARAMS, "shapes-flux")
    assert json.loads(texts["workflow"]) == workflow
    with Image.open(saved.path) as image:
        assert image.size == (64, 48) and image.getpixel((0, 0)) == (0, 100, 200)
    second = store.save(completed(), owner)
    assert second.path.endswith("00002-1234.png") and "workflow" not in png_texts(second.path)
    # A new store on the same folder (a restarted server) keeps counting.
    assert OutputStore(tmp_path, model="m").save(completed(), owner).path.endswith("00003-1234.png")


def test_history_is_per_owner_newest_first_and_skips_deleted_files(tmp_path):
    store = OutputStore(tmp_path, model="m")
    mine, theirs = owner_key("mine-token-0123456789"), owner_key("theirs-token-0123456789")
    first = store.save(completed(), mine)
    time.sleep(0.01)
    second = store.save(completed(GenerationParams(**{**PARAMS.__dict__, "seed": 7})), mine)
    store.save(completed(), theirs)
    assert [item.path for item in store.history(mine)] == [second.path, first.path]
    assert store.history(mine)[0].settings["seed"] == 7 and store.history(mine)[0].settings["model"] == "m"
    assert len(store.history(theirs)) == 1
    assert store.history("../../etc/passwd") == [] and store.history(owner_key("nobody-0123456789")) == []
    (tmp_path / first.path).unlink()
    assert [item.path for item in store.history(mine)] == [second.path]
    with pytest.raises(ValueError, match="owner must be an owner key"):
        store.save(completed(), "../escape")


def test_a_video_is_an_mp4_with_a_poster_that_carries_the_settings(tmp_path):
    store = OutputStore(tmp_path, model="shapes-wan", fps=8, write_video=write_mp4)
    params = GenerationParams(**{**PARAMS.__dict__, "num_frames": 9})
    saved = store.save(completed(params, frames=9), owner_key("video-token-0123456789"))
    assert saved.kind == "video" and saved.path.endswith(".mp4") and saved.poster.endswith(".png")
    assert "Frames: 9" in png_texts(saved.poster)["parameters"]
    reader = imageio_ffmpeg.read_frames(saved.path)
    meta = next(reader)
    frames = [np.frombuffer(frame, np.uint8) for frame in reader]
    assert (meta["size"], meta["fps"], meta["codec"], len(frames)) == ((64, 48), 8.0, "h264", 9)
    assert meta["pix_fmt"].startswith("yuv420p")


def test_a_video_is_saved_at_its_own_models_fps_not_the_default_models(tmp_path):
    store = OutputStore(tmp_path, model="shapes-flux", fps=16, write_video=write_mp4, fps_by_model={"shapes-wan": 8})
    params = GenerationParams(**{**PARAMS.__dict__, "num_frames": 9, "model": "shapes-wan"})
    saved = store.save(completed(params, frames=9), owner_key("video-caller"))
    meta = next(imageio_ffmpeg.read_frames(saved.path))
    assert meta["fps"] == 8.0 and meta["duration"] == pytest.approx(9 / 8, abs=0.01)  # 9 frames at 8 fps


def test_saving_off_writes_nothing(tmp_path):
    store = OutputStore(None, model="m")
    assert not store.enabled and store.save(completed(), owner_key("x" * 20)) is None
    assert store.history(owner_key("x" * 20)) == []


def test_the_command_line_chooses_the_folder_or_turns_saving_off(tmp_path):
    import app

    parse = lambda *argv: app.config_from_args(app.build_parser().parse_args(list(argv)))  # noqa: E731
    assert parse().outputs == "outputs"
    assert parse("--outputs", str(tmp_path)).outputs == str(tmp_path)
    assert parse("--outputs", str(tmp_path), "--no-save").outputs is None

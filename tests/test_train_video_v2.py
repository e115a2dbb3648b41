"""tools/train_video_v2.py end to end on a handful of clips: the fine-tuning run starts from
shapes-wan, trains on both canvases, survives a rerun (it resumes and finds itself done), and its
export is a WanPipeline folder serving both canvases."""

import json
from pathlib import Path

import numpy as np
import torch

from tools import train_video_v2
from tools.moving_shapes_world import V2_CANVASES, render, training_specs
from tools.train_video import to_video_tensor

SHAPES_WAN = Path(__file__).resolve().parents[1] / "assets" / "shapes-wan"


def test_a_two_step_run_exports_a_folder_of_both_canvases(tmp_path, capsys):
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    vae = train_video_v2.load_vae(SHAPES_WAN)
    specs = training_specs()[:4]
    for canvas in V2_CANVASES:  # a few clips instead of the latents stage's 1,872 per canvas
        with torch.no_grad():
            posterior = vae.encode(to_video_tensor([render(s, np.random.default_rng(i), canvas)
                                                    for i, s in enumerate(specs)])).latent_dist
        torch.save({"mean": posterior.mean.half(), "logvar": posterior.logvar.half(), "scene": torch.arange(4)},
                   train_video_v2.latents_path(work, canvas))
    common = ["--work-dir", str(work), "--threads", "1", "--init-from", str(SHAPES_WAN)]
    run = ["--stage", "transformer", "--steps", "2", "--max-minutes", "0", "--batch", "2", "--image-batch", "2",
           "--warmup", "1"]
    train_video_v2.main(run + common)
    train_video_v2.main(run + common)
    assert "transformer: already trained" in capsys.readouterr().out
    saved = torch.load(work / "transformer.pt", weights_only=False)
    assert saved["state"]["step"] == 2 and saved["state"]["done"]
    train_video_v2.main(["--stage", "export", "--out", str(out)] + common)
    card = json.loads((out / "stepstudio.json").read_text())
    assert card["sizes"] == ["64x64", "96x64"] and card["frame_counts"] == [9, 13] and card["step_cache"] == 0.1
    assert card["training"]["steps"] == 2 and card["training"]["canvases"] == ["64x64x9", "96x64x13"]
    assert (out / "vae" / "config.json").read_bytes() == (SHAPES_WAN / "vae" / "config.json").read_bytes()
    assert not (out / "README.md").exists()  # shapes-wan's card is not copied as v2's

    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(out, use_safetensors=True)
    pipe.set_progress_bar_config(disable=True)
    frames = pipe("a red circle moving left on a blue background", negative_prompt="", height=64, width=96,
                  num_frames=13, num_inference_steps=2, max_sequence_length=16, output_type="np",
                  generator=torch.Generator().manual_seed(0)).frames
    assert frames.shape == (1, 13, 64, 96, 3)

"""The video trainer's transformer stage, on a few random latents: it runs, checkpoints and records
what the export's model card reads; and the one-frame image batches rest on a property of the
causal VAE that the shipped model must have."""

from pathlib import Path

import numpy as np
import pytest
import torch

from tools.moving_shapes_world import render, training_specs
from tools.train_video import main, to_video_tensor, transformer_runs
from tools.video_components import LATENT_CHANNELS

MODEL_DIR = Path(__file__).resolve().parents[1] / "assets" / "shapes-wan"


def write_random_latents(work_dir: Path, clips: int) -> None:
    shape = (clips, LATENT_CHANNELS, 5, 16, 16)
    torch.save({"mean": torch.randn(shape).half(), "logvar": torch.full(shape, -4.0).half(),
                "scene": torch.arange(clips) % len(training_specs()),
                "latents_mean": [0.0] * LATENT_CHANNELS, "latents_std": [1.0] * LATENT_CHANNELS},
               work_dir / "latents.pt")


def test_transformer_stage_with_image_batches_trains_and_records_them(tmp_path):
    write_random_latents(tmp_path, clips=6)
    main(["--stage", "transformer", "--work-dir", str(tmp_path), "--run-name", "tiny", "--steps", "3",
          "--batch", "2", "--image-batch", "3", "--warmup", "1", "--seed", "5"])
    saved = torch.load(tmp_path / "tiny.pt", weights_only=False)
    assert saved["state"]["step"] == 3 and saved["state"]["done"] is True
    assert np.isfinite(saved["state"]["loss_avg"]) and saved["state"]["loss_avg"] > 0
    assert len(saved["state"]["fractions"]) == 3
    assert all(torch.isfinite(value).all() for value in saved["ema"].values())
    [run] = transformer_runs(saved)
    assert (run["run"], run["steps"], run["batch"], run["image_batch"], run["patch_size"]) == ("tiny", 3, 2, 3, 2)


def test_runs_repeat_from_their_seed_and_image_batches_change_the_weights(tmp_path):
    write_random_latents(tmp_path, clips=6)
    for name, image_batch in (("first", 2), ("again", 2), ("clips-only", 0)):
        main(["--stage", "transformer", "--work-dir", str(tmp_path), "--run-name", name, "--steps", "2",
              "--batch", "2", "--image-batch", str(image_batch), "--warmup", "1", "--seed", "9"])
    first, again, clips_only = (torch.load(tmp_path / f"{name}.pt", weights_only=False)["model"]
                                for name in ("first", "again", "clips-only"))
    assert all(torch.equal(first[key], again[key]) for key in first)
    assert not all(torch.equal(first[key], clips_only[key]) for key in first)


@pytest.mark.skipif(not (MODEL_DIR / "model_index.json").is_file(), reason="assets/shapes-wan not exported yet")
def test_first_latent_frame_of_a_clip_is_its_first_frame_encoded_alone():
    """Why --image-batch may take latent frame 0 of an encoded clip as a one-frame video: the
    causal VAE encodes frame 0 before, and without, the frames after it."""
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan.from_pretrained(MODEL_DIR / "vae", use_safetensors=True).eval()
    rng = np.random.default_rng(3)
    clips = [render(spec, rng) for spec in training_specs()[:3]]
    with torch.no_grad():
        whole = vae.encode(to_video_tensor(clips)).latent_dist.mean
        alone = vae.encode(to_video_tensor([clip[:1] for clip in clips])).latent_dist.mean
    assert tuple(whole.shape) == (3, LATENT_CHANNELS, 5, 16, 16) and tuple(alone.shape) == (3, LATENT_CHANNELS, 1, 16, 16)
    assert torch.equal(whole[:, :, :1], alone)
    assert not torch.equal(whole[:, :, 1:2], alone)  # later latent frames do depend on later frames

"""The shipped built-in video model: the stock WanPipeline loads it offline and makes 9-frame clips."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tools.evaluate_video import evaluate_videos, evaluation_prompts, generate, load_pipeline
from tools.moving_shapes_world import (
    MotionSpec,
    is_held_out,
    parse_caption,
    render,
    vocabulary,
)
from tools.train_video import to_video_tensor

MODEL_DIR = Path(__file__).resolve().parents[1] / "assets" / "shapes-wan"
pytestmark = pytest.mark.skipif(not (MODEL_DIR / "model_index.json").is_file(), reason="assets/shapes-wan not exported yet")

REQUIRED_DEFAULTS = {
    "height": int,
    "width": int,
    "num_frames": int,
    "fps": int,
    "max_sequence_length": int,
    "num_inference_steps": int,
    "guidance_scale": float,
    "negative_prompt": str,
    "example_prompts": list,
    "vocabulary": list,
    "preview_rgb_factors": list,
    "preview_rgb_bias": list,
}
# Held-out prompts (never seen in training), one per direction and shape.
PROMPTS = [
    "a red circle moving right on an orange background",
    "a black triangle moving left on a yellow background",
    "a blue square moving up on a yellow background",
    "a purple circle moving down on a yellow background",
]


@pytest.fixture(scope="module")
def defaults():
    return json.loads((MODEL_DIR / "stepstudio.json").read_text())


@pytest.fixture(scope="module")
def pipe():
    return load_pipeline(MODEL_DIR)


def test_folder_holds_safetensors_weights_only_within_40_mib():
    assert list(MODEL_DIR.rglob("*.bin")) == [] and list(MODEL_DIR.rglob("*.pt")) == []
    for component in ("transformer", "vae", "text_encoder"):
        assert list((MODEL_DIR / component).glob("*.safetensors")), component
    total = sum(path.stat().st_size for path in MODEL_DIR.rglob("*") if path.is_file())
    assert total <= 40 * 2**20, f"checkpoint folder is {total / 2**20:.1f} MiB"


def test_stepstudio_json_has_the_serving_defaults(defaults):
    from pipelines.studio_config import read_studio_config

    for field, kind in REQUIRED_DEFAULTS.items():
        assert isinstance(defaults[field], kind), (field, defaults.get(field))
    assert (defaults["height"], defaults["width"], defaults["num_frames"]) == (64, 64, 9)
    assert defaults["num_frames"] % 2 == 1 and defaults["max_sequence_length"] == 16
    assert defaults["negative_prompt"] == "" and 1.0 <= defaults["guidance_scale"] <= 8.0
    assert 1 <= defaults["num_inference_steps"] <= 50 and defaults["fps"] == 8
    assert len(defaults["example_prompts"]) == 8
    assert all(is_held_out(parse_caption(prompt)) for prompt in defaults["example_prompts"])
    assert defaults["vocabulary"] == sorted(vocabulary())
    assert len(defaults["preview_rgb_factors"]) == 16 and all(len(row) == 3 for row in defaults["preview_rgb_factors"])
    assert len(defaults["preview_rgb_bias"]) == 3
    studio = read_studio_config(MODEL_DIR)  # the studio's own reader accepts it
    assert studio.num_frames == 9 and studio.unknown_words("a red circle moving left on a blue background") == []


def test_components_are_the_stock_wan_classes_with_matching_scale_factors(pipe):
    assert type(pipe).__name__ == "WanPipeline"
    assert type(pipe.transformer).__name__ == "WanTransformer3DModel"
    assert type(pipe.vae).__name__ == "AutoencoderKLWan"
    assert type(pipe.text_encoder).__name__ == "UMT5EncoderModel" and not pipe.text_encoder.training
    assert type(pipe.tokenizer).__name__ == "T5Tokenizer"
    assert (pipe.vae_scale_factor_temporal, pipe.vae_scale_factor_spatial) == (2, 4)
    assert len(pipe.vae.config.latents_mean) == len(pipe.vae.config.latents_std) == pipe.vae.config.z_dim == 16
    with torch.no_grad():
        latents = pipe.vae.encode(to_video_tensor([render(MotionSpec("red", "circle", "blue", "left"))])).latent_dist.mean
    assert tuple(latents.shape) == (1, 16, 5, 16, 16)


def test_two_step_generation_returns_nine_frames_of_64x64(pipe):
    result = pipe(
        prompt="a red circle moving left on a blue background",
        negative_prompt="",
        height=64,
        width=64,
        num_frames=9,
        num_inference_steps=2,
        guidance_scale=4.0,
        max_sequence_length=16,
        generator=torch.Generator().manual_seed(0),
        output_type="np",
    )
    frames = result.frames
    assert frames.shape == (1, 9, 64, 64, 3) and frames.dtype == np.float32
    assert 0.0 <= frames.min() and frames.max() <= 1.0 and frames.std() > 0.01


def test_preview_projection_of_clean_latents_looks_like_the_clip(pipe, defaults):
    clip = render(MotionSpec(color="red", shape="square", background="blue", direction="right"))
    with torch.no_grad():
        latents = pipe.vae.encode(to_video_tensor([clip])).latent_dist.mean
    mean = torch.tensor(pipe.vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(pipe.vae.config.latents_std).view(1, -1, 1, 1, 1)
    normalized = (latents - mean) / std
    factors = torch.tensor(defaults["preview_rgb_factors"])
    preview = torch.einsum("bcthw,cr->bthwr", normalized, factors) + torch.tensor(defaults["preview_rgb_bias"])
    # Latent frame 0 holds frame 0 alone: the square's centre is at x = 20 px -> latent column 5.
    # (The one linear map fits this first, single-frame latent less well: red barely shows in it,
    # but the blue background clearly gives way to the square.)
    first, last = preview[0, 0], preview[0, -1]
    assert first[8, 5, 2] < 0.2 and first[8, 12, 2] > 0.6, first[8, :, 2]
    # The last latent frame holds frames 7-8: the square has moved right, to x = 44 px -> column 11.
    assert last[8, 11, 0] > 0.6 and last[8, 3, 0] < 0.4, last[8, :, 0]
    assert last[8, 3, 2] > 0.6 and last[8, 11, 2] < 0.3, last[8, :, 2]


def test_generation_with_shipped_defaults_follows_held_out_prompts(pipe, defaults):
    assert all(is_held_out(parse_caption(prompt)) for prompt in PROMPTS)
    clips = generate(
        pipe, PROMPTS, defaults, defaults["num_inference_steps"], defaults["guidance_scale"], seed=0, batch=len(PROMPTS)
    )
    assert all(clip.shape == (9, 64, 64, 3) for clip in clips)
    scores = evaluate_videos(list(zip(PROMPTS, clips)))
    # Colour, background and motion are learned; shape is right in about nine clips of ten (too few
    # prompts here to assert it; docs/models.md: evaluation).
    for attribute in ("color", "background", "direction"):
        assert scores[attribute] >= 0.75, scores


@pytest.mark.slow
def test_the_documented_scores_on_every_held_out_prompt_twice(pipe, defaults):
    """docs/models.md: `python -m tools.evaluate_video --repeats 2` (the 48 held-out prompts, two
    clips each, the serving defaults, seed 1234, batches of 16): colour, background and direction
    1.00, shape 0.89, the bar being 0.85."""
    torch.set_num_threads(2)
    prompts = evaluation_prompts("held-out", 2)
    assert len(prompts) == 96
    clips = generate(pipe, prompts, defaults, defaults["num_inference_steps"], defaults["guidance_scale"], seed=1234,
                     batch=16)
    scores = evaluate_videos(list(zip(prompts, clips)))
    assert (scores["color"], scores["background"], scores["direction"]) == (1.0, 1.0, 1.0), scores
    assert round(scores["shape"], 2) == 0.89 and scores["shape"] >= 0.85, scores

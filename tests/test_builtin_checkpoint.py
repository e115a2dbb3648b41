"""The shipped built-in model: loads with the stock FluxPipeline and follows prompts."""

import json
from pathlib import Path

import pytest
import torch

from tools.evaluate_builtin import evaluate_images, generate
from tools.shapes_world import parse_caption, vocabulary

MODEL_DIR = Path(__file__).resolve().parents[1] / "assets" / "shapes-flux"
REQUIRED_DEFAULTS = {
    "height": int,
    "width": int,
    "max_sequence_length": int,
    "num_inference_steps": int,
    "guidance_scale": float,
    "negative_prompt": str,
    "example_prompts": list,
    "vocabulary": list,
    "preview_rgb_factors": list,
    "preview_rgb_bias": list,
}
# Fixed prompts covering every shape, size and position.
PROMPTS = [
    "a large red circle on a blue background, left",
    "a small yellow square on a black background, top",
    "a large white triangle on a green background, center",
    "a small blue circle on an orange background, bottom",
    "a large purple square on a white background, right",
    "a small black triangle on a yellow background, center",
]


@pytest.fixture(scope="module")
def defaults():
    return json.loads((MODEL_DIR / "stepstudio.json").read_text())


@pytest.fixture(scope="module")
def pipe():
    from diffusers import FluxPipeline

    pipeline = FluxPipeline.from_pretrained(MODEL_DIR, use_safetensors=True)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def test_folder_holds_safetensors_weights_only():
    assert list(MODEL_DIR.rglob("*.bin")) == [] and list(MODEL_DIR.rglob("*.pt")) == []
    for component in ("transformer", "vae", "text_encoder", "text_encoder_2"):
        assert list((MODEL_DIR / component).glob("*.safetensors")), component
    total = sum(path.stat().st_size for path in MODEL_DIR.rglob("*") if path.is_file())
    assert total < 40 * 2**20, f"checkpoint folder is {total / 2**20:.1f} MiB"


def test_stepstudio_json_has_the_serving_defaults(defaults):
    for field, kind in REQUIRED_DEFAULTS.items():
        assert isinstance(defaults[field], kind), (field, defaults.get(field))
    assert (defaults["height"], defaults["width"], defaults["max_sequence_length"]) == (64, 64, 16)
    assert defaults["num_inference_steps"] == 20 and defaults["negative_prompt"] == ""
    assert 1.0 <= defaults["guidance_scale"] <= 8.0
    assert len(defaults["example_prompts"]) == 8
    for prompt in defaults["example_prompts"]:
        parse_caption(prompt)
    assert defaults["vocabulary"] == sorted(vocabulary())
    factors = defaults["preview_rgb_factors"]
    assert len(factors) == 16 and all(len(row) == 3 for row in factors)
    assert len(defaults["preview_rgb_bias"]) == 3


def test_components_are_the_stock_flux_classes(pipe):
    assert type(pipe.transformer).__name__ == "FluxTransformer2DModel"
    assert type(pipe.vae).__name__ == "AutoencoderKL"
    assert pipe.scheduler.config.use_dynamic_shifting
    assert not pipe.text_encoder.training and not pipe.text_encoder_2.training
    assert pipe.text_encoder.config.eos_token_id != 2


def test_preview_projection_of_clean_latents_looks_like_the_image(pipe, defaults):
    from tools.shapes_world import ShapeSpec, render
    from tools.train_builtin import to_tensor

    image = render(ShapeSpec(shape="square", color="red", size="large", position="center", background="blue"))
    with torch.no_grad():
        latent = pipe.vae.encode(to_tensor([image])).latent_dist.mean
    normalized = (latent - pipe.vae.config.shift_factor) * pipe.vae.config.scaling_factor
    factors = torch.tensor(defaults["preview_rgb_factors"])
    preview = torch.einsum("bchw,cr->bhwr", normalized, factors) + torch.tensor(defaults["preview_rgb_bias"])
    middle, corner = preview[0, 8, 8], preview[0, 0, 0]
    assert middle[0] > 0.6 and middle[2] < 0.4, middle  # red shape in the middle
    assert corner[2] > 0.6 and corner[0] < 0.4, corner  # blue background in the corner


def test_generation_with_shipped_defaults_follows_the_prompts(pipe, defaults):
    torch.set_num_threads(2)
    images = generate(
        pipe, PROMPTS, defaults, defaults["num_inference_steps"], defaults["guidance_scale"], seed=0, batch=len(PROMPTS)
    )
    assert all(image.size == (64, 64) for image in images)
    scores = evaluate_images(list(zip(PROMPTS, images)))
    for attribute in ("color", "background", "position", "size"):
        assert scores[attribute] >= 5 / 6, scores
    assert sum(scores.values()) / len(scores) >= 0.8, scores

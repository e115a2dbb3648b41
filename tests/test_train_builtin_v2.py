"""shapes-flux v2's trainer starts from v1: the text encoders keep v1's meaning of every word
both vocabularies hold (token ids move once words are added), the transformer is v1's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tools.builtin_components import build_clip_tokenizer, build_t5_tokenizer, build_transformer
from tools.shapes_world_v2 import vocabulary
from tools.train_builtin import TextModels, tokenize_all
from tools.train_builtin_v2 import initialize_from, latent_normalization

V1 = Path(__file__).resolve().parent.parent / "assets" / "shapes-flux"


@pytest.fixture(scope="module")
def v1_pipeline():
    from diffusers import FluxPipeline

    return FluxPipeline.from_pretrained(V1)


@pytest.fixture(scope="module")
def v2_from_v1():
    words = vocabulary()
    clip_tokenizer, t5_tokenizer = build_clip_tokenizer(words), build_t5_tokenizer(words)
    torch.manual_seed(0)
    transformer, text_models = build_transformer(), TextModels(clip_tokenizer, t5_tokenizer)
    initialize_from(V1, transformer, text_models, clip_tokenizer, t5_tokenizer)
    return transformer, text_models, clip_tokenizer, t5_tokenizer


@torch.no_grad()
def test_v1_captions_encode_exactly_as_in_v1(v1_pipeline, v2_from_v1):
    _, text_models, clip_tokenizer, t5_tokenizer = v2_from_v1
    texts = ["a large red circle on a blue background, left", "a small white triangle on a black background, top"]
    new_clip, new_t5 = tokenize_all(texts, clip_tokenizer, t5_tokenizer)
    old_clip, old_t5 = tokenize_all(texts, v1_pipeline.tokenizer, v1_pipeline.tokenizer_2)
    assert not torch.equal(new_clip, old_clip)  # the ids did move
    pooled, sequence = text_models(new_clip, new_t5)
    assert torch.equal(pooled, v1_pipeline.text_encoder(old_clip).pooler_output)
    assert torch.equal(sequence, v1_pipeline.text_encoder_2(old_t5)[0])


@torch.no_grad()
def test_the_transformer_is_v1s_and_new_words_are_fresh(v1_pipeline, v2_from_v1):
    transformer, text_models, clip_tokenizer, _ = v2_from_v1
    old = v1_pipeline.transformer.state_dict()
    assert all(torch.equal(value, old[name]) for name, value in transformer.state_dict().items())
    new_rows = text_models.clip.get_input_embeddings().weight
    old_rows = v1_pipeline.text_encoder.get_input_embeddings().weight
    for word in ("the</w>", "shape</w>"):
        assert word not in v1_pipeline.tokenizer.get_vocab()
        row = new_rows[clip_tokenizer.get_vocab()[word]]
        assert not any(torch.equal(row, old_row) for old_row in old_rows)


def test_a_vae_from_a_model_folder_keeps_its_normalization(v1_pipeline):
    from tools.builtin_components import build_vae

    assert latent_normalization(v1_pipeline.vae, 0.5, 2.0) == (0.0081, 0.8977)
    assert latent_normalization(build_vae(), 0.5, 2.0) == (0.5, 2.0)  # one trained here: what was measured


def test_recoloured_rows_start_from_the_other_colour_and_target_the_captions():
    import numpy as np

    from tools.shapes_world_v2 import random_caption, random_scene, recolored
    from tools.recolor_rows import recolor_sources

    rng = np.random.default_rng(0)
    scene = random_scene(rng, 64, 64)
    other = recolored(scene, rng)
    assert other.color not in (scene.color, scene.background) and other.cx == scene.cx and other.side == scene.side
    assert all(scene.color in random_caption(scene, rng, drop=1.0, name_color=True) for _ in range(5))

    class Encoder:  # a VAE stand-in whose latents are the picture's mean colour, per channel
        def encode(self, pictures):
            mean = pictures.mean(dim=(2, 3), keepdim=True).expand(-1, -1, 8, 8)
            return type("Out", (), {"latent_dist": type("Dist", (), {"mean": torch.cat([mean, mean[:, :1]], 1)})})()

    x0, sigma = torch.zeros(3, 16, 16), torch.full((3,), 0.2)
    generator = torch.Generator().manual_seed(0)
    source, noised = recolor_sources([1], [scene, scene, scene], x0, sigma, Encoder(), 0.0, 1.0, rng, generator)
    assert torch.equal(source[[0, 2]], x0[[0, 2]]) and torch.equal(noised[[0, 2]], sigma[[0, 2]])
    assert not torch.equal(source[1], x0[1]) and 0.35 <= float(noised[1]) <= 0.95

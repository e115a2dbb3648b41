"""shapes-flux v2's trainer starts from v1: the text encoders keep v1's meaning of every word
both vocabularies hold (token ids move once words are added), the transformer is v1's; a run may
grow the transformer (--blocks) and its export is a deeper model the stock pipeline loads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tools.builtin_components import build_clip_tokenizer, build_t5_tokenizer, build_transformer
from tools.shapes_world_v2 import CANVAS_SIDES, random_scene, render, vocabulary
from tools.train_builtin import TextModels, to_tensor, tokenize_all
from tools.train_builtin_v2 import (SMALL_AREA, WIDE_ASPECT, canvas_picker, export, initialize_from,
                                     latent_normalization, load_vae, parse_args, train_transformer)

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


def test_a_grown_run_trains_and_exports_a_deeper_transformer_the_stock_pipeline_loads(tmp_path):
    """--blocks 3 5 from v1's folder (2 + 4 blocks): two steps on two canvases, then the export."""
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    args = parse_args(["--work-dir", str(work), "--out", str(out), "--vae-from", str(V1), "--init-from", str(V1),
                       "--blocks", "3", "5", "--steps", "2", "--max-minutes", "0", "--batch", "2", "--warmup", "1"])
    # The latents stage encodes 121 canvases; three scenes on two canvases suffice here.
    vae, rng, buckets = load_vae(args), np.random.default_rng(0), {}
    for width, height in ((48, 48), (96, 64)):
        scenes = [random_scene(rng, width, height) for _ in range(3)]
        with torch.no_grad():
            posterior = vae.encode(to_tensor([render(s) for s in scenes])).latent_dist
        buckets[(width, height)] = {"mean": posterior.mean.half(), "logvar": posterior.logvar.half(),
                                    "scenes": [(s.shape, s.color, s.background, s.side, s.cx, s.cy) for s in scenes]}
    torch.save({"buckets": buckets, "shift": 0.0081, "scale": 0.8977}, work / "latents.pt")
    train_transformer(args)
    saved = torch.load(work / "transformer.pt", weights_only=False)
    assert saved["state"]["step"] == 2 and saved["blocks"] == (3, 5)
    export(args)
    card = json.loads((out / "stepstudio.json").read_text())
    assert card["training"]["blocks"] == [3, 5] and card["training"]["transformer_steps"] == 2

    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(out, use_safetensors=True)
    assert (pipe.transformer.config.num_layers, pipe.transformer.config.num_single_layers) == (3, 5)
    image = pipe("a red circle", width=96, height=64, num_inference_steps=2, max_sequence_length=16,
                 output_type="np", generator=torch.Generator().manual_seed(0)).images
    assert image.shape == (1, 64, 96, 3)


def picks(wide_rate: float, small_rate: float, count: int = 400) -> list[tuple[int, int]]:
    canvases = [(width, height) for width in CANVAS_SIDES for height in CANVAS_SIDES]
    pick = canvas_picker(canvases, wide_rate, small_rate, np.random.default_rng(0), torch.Generator().manual_seed(0))
    return [pick() for _ in range(count)]


def test_the_canvas_rates_draw_their_share_from_their_canvases():
    uniform = picks(0.0, 0.0)
    generator = torch.Generator().manual_seed(0)
    assert uniform == [(CANVAS_SIDES[i // 11], CANVAS_SIDES[i % 11])  # the plain draw, untouched by the rates
                       for i in (int(torch.randint(121, (1,), generator=generator)) for _ in range(400))]
    assert sum(w * h <= SMALL_AREA for w, h in uniform) < 100  # 15 of 121 canvases: ~50 of 400

    assert all(w * h <= SMALL_AREA for w, h in picks(0.0, 1.0))
    assert sorted(set(picks(0.0, 1.0))) == [(48, 48), (48, 56), (48, 64), (48, 72), (48, 80), (56, 48), (56, 56),
                                            (56, 64), (56, 72), (64, 48), (64, 56), (64, 64), (72, 48), (72, 56),
                                            (80, 48)]
    assert all(max(c) >= WIDE_ASPECT * min(c) for c in picks(1.0, 0.0))
    mixed = picks(0.3, 0.3)
    small_share = sum(w * h <= SMALL_AREA for w, h in mixed) / len(mixed)
    wide_share = sum(max(w, h) >= WIDE_ASPECT * min(w, h) for w, h in mixed) / len(mixed)
    assert 0.3 < small_share < 0.5 and 0.45 < wide_share < 0.75  # each pool's share plus its part of the rest

"""The built-in model's "outline" LoRA adapter (assets/loras/shapes-flux/outline.safetensors):
it loads for the built-in model and is found at server start; through stepstudio's engine it
turns held-out prompts into outlines (and only with it); the evaluator's outline detector on
synthetic renders; and tools/train_lora.py's smoke run writes a file stepstudio loads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open

from pipelines.loader import BUILTIN_MODEL_DIR, load_pipeline
from pipelines.lora_files import BUILTIN_LORA_DIR, adapter_files
from pipelines.lora_request import LoraUse
from tools.evaluate_builtin import evaluate_images, is_outlined, measure, outline_rate, stepstudio_images
from tools.shapes_world import (
    PALETTE,
    SHAPES,
    SIZES,
    ShapeSpec,
    caption,
    random_spec,
    render,
    render_outline,
)
from tools.train_lora import held_out_specs, training_specs

ADAPTER = BUILTIN_LORA_DIR / "shapes-flux" / "outline.safetensors"
SEED = 900  # request i uses SEED + i; the evaluator's own runs use 1234 + i


def _held_out_prompts() -> list[str]:
    """6 scenes the adapter never saw in training: the first held-out one of every shape and size."""
    specs = held_out_specs()
    return [caption(next(s for s in specs if (s.shape, s.size) == (shape, size))) for shape in SHAPES for size in SIZES]


PROMPTS = _held_out_prompts()


# ----------------------------------------------------------------------------- the shipped file


def test_the_shipped_adapter_is_small_and_in_the_peft_format():
    assert ADAPTER.is_file()
    assert ADAPTER.stat().st_size < 400_000
    with safe_open(str(ADAPTER), "pt") as file:
        keys = list(file.keys())
        metadata = file.metadata()
    assert keys and all(k.startswith("transformer.") and (".lora_A." in k or ".lora_B." in k) for k in keys)
    assert "lora_adapter_metadata" in metadata  # its LoraConfig: r, lora_alpha, target_modules


def test_the_held_out_prompts_were_not_trained_on():
    trained = {caption(spec) for spec in training_specs()}
    assert len(trained) == 1680 - 120
    assert not set(PROMPTS) & trained and len(set(PROMPTS)) == 6


@pytest.fixture(scope="module")
def pipeline():
    pipe = load_pipeline("builtin")
    pipe.load_lora("outline", ADAPTER)
    return pipe


def test_the_adapter_loads_for_the_builtin_model_and_is_found_at_server_start(pipeline):
    assert pipeline.info.name == "shapes-flux" == Path(BUILTIN_MODEL_DIR).name
    assert "outline" in pipeline.info.loras
    adapter = pipeline.loras.adapters["outline"]
    assert 4 <= adapter.rank <= 16
    assert all(name.startswith("transformer.") for name in adapter.modules)
    assert adapter_files("shapes-flux", True, (), (BUILTIN_LORA_DIR,)) == {"outline": ADAPTER}


@pytest.fixture(scope="module")
def images(pipeline):
    """Every held-out prompt twice, all 12 requests co-batched in one engine: without the adapter,
    and with it at scale 1 (half named in GenerationParams.loras, half as an A1111 prompt tag)."""
    prompts = PROMPTS + [p if i % 2 else f"{p} <lora:outline:1>" for i, p in enumerate(PROMPTS)]
    loras = [()] * len(PROMPTS) + [() if i % 2 == 0 else (LoraUse("outline", 1.0),) for i in range(len(PROMPTS))]
    made = stepstudio_images(BUILTIN_MODEL_DIR, prompts, SEED, loras, max_batch=12, pipeline=pipeline)
    return {"without": made[: len(PROMPTS)], "with": made[len(PROMPTS):]}


def test_with_the_adapter_held_out_prompts_come_out_as_outlines(images):
    verdicts = [is_outlined(image) for image in images["with"]]
    # Measured here: 6 of 6 (also with noise seeds 700 and 1500); 94% on the 120 held-out prompts.
    assert sum(verdicts) >= 5, verdicts


def test_without_the_adapter_none_is_an_outline(images):
    assert [is_outlined(image) for image in images["without"]] == [False] * len(PROMPTS)


def test_with_the_adapter_the_other_attributes_still_follow_the_prompt(images):
    scores = evaluate_images(list(zip(PROMPTS, images["with"])))
    assert scores["color"] == scores["background"] == 1.0, scores
    assert min(scores["shape"], scores["position"], scores["size"]) >= 5 / 6, scores  # measured: 1.0
    plain = evaluate_images(list(zip(PROMPTS, images["without"])))
    assert all(value == 1.0 for value in plain.values()), plain


# ----------------------------------------------------------------------------- the outline detector


def test_outline_detector_on_synthetic_renders():
    rng = np.random.default_rng(3)
    specs = [random_spec(rng) for _ in range(120)]
    filled = [render(spec, rng) for spec in specs]
    outlines = [render_outline(spec, rng) for spec in specs]
    assert outline_rate(filled) == 0.0
    assert outline_rate(outlines) == 1.0
    # Outlines are scored like filled shapes on every other attribute (the shape by its filled mask).
    scores = evaluate_images([(caption(spec), image) for spec, image in zip(specs, outlines)])
    assert all(value >= 0.98 for value in scores.values()), scores
    # Thinner outlines too (the detector's centre lies inside the hole of every shape up to the
    # adapter's 4 px; beyond ~4.5 px the smallest triangle's hole gets too small to tell).
    for thickness in (2.5, 3.0):
        assert all(is_outlined(render_outline(spec, rng, thickness)) for spec in specs[:40])


def test_outline_detector_edge_cases():
    blank = Image.new("RGB", (64, 64), PALETTE["red"])
    assert not is_outlined(blank) and measure(blank).outlined is None
    spec = ShapeSpec(shape="triangle", color="white", size="small", position="left", background="black")
    assert is_outlined(render_outline(spec)) and not is_outlined(render(spec))
    # The inside painted another colour than the background is not an outline of this scene.
    pixels = np.asarray(render_outline(ShapeSpec("square", "blue", "large", "center", "yellow"))).copy()
    pixels[20:44, 20:44] = PALETTE["red"]
    assert not is_outlined(Image.fromarray(pixels))


def test_outline_renders_survive_the_vae_round_trip():
    """The ceiling the adapter can reach: the frozen VAE's reconstructions still read as outlines."""
    from diffusers import AutoencoderKL

    from tools.train_builtin import to_tensor

    vae = AutoencoderKL.from_pretrained(Path(BUILTIN_MODEL_DIR) / "vae").eval()
    rng = np.random.default_rng(4)
    specs = [random_spec(rng) for _ in range(24)]
    with torch.no_grad():
        decoded = vae.decode(vae.encode(to_tensor([render_outline(s, rng) for s in specs])).latent_dist.mean).sample
    array = ((decoded.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).numpy()
    round_trip = [Image.fromarray(a) for a in array]
    assert outline_rate(round_trip) == 1.0
    assert all(v == 1.0 for v in evaluate_images([(caption(s), i) for s, i in zip(specs, round_trip)]).values())


# ----------------------------------------------------------------------------- the trainer


def test_train_lora_smoke_run_writes_a_file_stepstudio_loads(tmp_path):
    pytest.importorskip("peft", reason="tools/train_lora.py adds the adapter with PEFT (pip install -e '.[test]')")
    from tools.train_lora import main

    threads = torch.get_num_threads()
    argv = ["--steps", "3", "--max-scenes", "8", "--renders-per-scene", "1", "--batch", "4", "--rank", "4",
            "--threads", "1", "--log-every", "1000"]
    try:
        first = main(argv + ["--out", str(tmp_path / "a" / "x.safetensors")])
        second = main(argv + ["--out", str(tmp_path / "b" / "x.safetensors")])
    finally:
        torch.set_num_threads(threads)  # main sets the process's thread count
    assert first["steps"] == second["steps"] == 3
    with safe_open(str(tmp_path / "a" / "x.safetensors"), "pt") as a, safe_open(str(tmp_path / "b" / "x.safetensors"), "pt") as b:
        assert sorted(a.keys()) == sorted(b.keys())
        assert all(torch.equal(a.get_tensor(k), b.get_tensor(k)) for k in a.keys())  # deterministic
    pipe = load_pipeline("builtin")
    pipe.load_lora("x", tmp_path / "a" / "x.safetensors")
    adapter = pipe.loras.adapters["x"]
    assert adapter.rank == 4 and pipe.info.loras == ("x",)
    assert any(name.endswith(".attn.to_q") for name in adapter.modules)
    assert {name.rsplit(".", 1)[-1] for name in adapter.modules} >= {"to_q", "to_k", "to_v", "proj_mlp"}


def test_train_lora_v2_smoke_run_writes_a_file_the_v2_model_loads(tmp_path):
    pytest.importorskip("peft", reason="tools/train_lora_v2.py adds the adapter with PEFT (pip install -e '.[test]')")
    from tools.train_lora_v2 import main

    threads = torch.get_num_threads()
    argv = ["--steps", "2", "--per-canvas", "2", "--canvases", "3", "--batch", "2", "--rank", "4", "--threads", "1",
            "--log-every", "1000", "--switch-sigma", "0.6"]  # the bent path's data too (filled and ring latents)
    try:
        first = main(argv + ["--out", str(tmp_path / "a" / "x.safetensors")])
        second = main(argv + ["--out", str(tmp_path / "b" / "x.safetensors")])
    finally:
        torch.set_num_threads(threads)
    assert first["steps"] == second["steps"] == 2
    with safe_open(str(tmp_path / "a" / "x.safetensors"), "pt") as a, safe_open(str(tmp_path / "b" / "x.safetensors"), "pt") as b:
        assert sorted(a.keys()) == sorted(b.keys()) and all(torch.equal(a.get_tensor(k), b.get_tensor(k)) for k in a.keys())
    # --init continues from a file: one step at learning rate 0 writes the file it started from back
    # (B is non-zero there, so an adapter started from zero would not match); another rank is refused.
    with safe_open(str(tmp_path / "a" / "x.safetensors"), "pt") as a:
        started = {key: a.get_tensor(key) for key in a.keys()}
    assert any(key.endswith("lora_B.weight") and value.abs().max() > 0 for key, value in started.items())
    frozen = argv[:1] + ["1"] + argv[2:] + ["--lr", "0", "--init", str(tmp_path / "a" / "x.safetensors")]
    try:
        main(frozen + ["--out", str(tmp_path / "c" / "x.safetensors")])
        with pytest.raises(SystemExit, match="its layers differ"):
            main([*frozen, "--rank", "8", "--out", str(tmp_path / "d" / "x.safetensors")])
    finally:
        torch.set_num_threads(threads)
    with safe_open(str(tmp_path / "c" / "x.safetensors"), "pt") as c:
        assert sorted(c.keys()) == sorted(started) and all(torch.equal(c.get_tensor(k), started[k]) for k in started)
    from pipelines.loader import BUILTIN_V2_MODEL_DIR
    from tools.evaluate_v2 import canvas_cases, engine_for, outline_table, text_cases

    engine = engine_for(BUILTIN_V2_MODEL_DIR, 0.0, tmp_path / "a" / "x.safetensors")  # loaded as "outline"
    try:
        assert engine.pipeline.loras.adapters["outline"].rank == 4
        cases = canvas_cases(1, 4321)[:2]
        plain = text_cases(engine, cases, 4321)
        table = outline_table(engine, cases, 4321, plain)["by_canvas"]
    finally:
        engine.close()
    assert list(table) == [label for label, _, _ in cases]
    assert all(rates["without"] == 0.0 and 0.0 <= rates["with"] <= 1.0 for rates in table.values())


def test_coupled_outlines_pair_the_v2_models_own_noise_with_outlines_of_what_it_drew(tmp_path):
    """tools/train_lora_v2.py --coupled: each kept row is stored noise, the caption the model drew
    from it, and an outline picture; a smoke run on them writes an adapter."""
    pytest.importorskip("peft", reason="tools/train_lora_v2.py adds the adapter with PEFT (pip install -e '.[test]')")
    import argparse

    from pipelines.loader import BUILTIN_V2_MODEL_DIR
    from tools.evaluate_v2 import measure as measure_v2
    from tools.train_builtin import pack_latents
    from tools.train_lora import frozen_pipeline
    from tools.train_lora_v2 import couple_outlines, main

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pipe, _, _ = frozen_pipeline(argparse.Namespace(model=BUILTIN_V2_MODEL_DIR, seed=0))
        buckets = couple_outlines(pipe, 4, 0, [(64, 64), (96, 64)], guidance=3.0)
        assert buckets  # at least one canvas kept a picture (64x64 keeps 3 of 4 with today's weights)
        for (width, height), bucket in buckets.items():
            assert 1 <= len(bucket["texts"]) == len(bucket["noise"]) == len(bucket["mean"]) <= 4
            assert bucket["noise"].shape[1:] == pack_latents(bucket["mean"]).shape[1:]
            with torch.no_grad():
                decoded = pipe.image_processor.postprocess(pipe.vae.decode(bucket["mean"]).sample)
            assert all(image.size == (width, height) and measure_v2(image).outlined is True for image in decoded)
        summary = main(["--coupled", "2", "--canvases", "2", "--steps", "2", "--batch", "2", "--rank", "4",
                        "--threads", "1", "--log-every", "1000", "--out", str(tmp_path / "x.safetensors")])
    finally:
        torch.set_num_threads(threads)
    assert summary["steps"] == 2
    with safe_open(str(tmp_path / "x.safetensors"), "pt") as adapter:
        assert any(key.endswith("lora_A.weight") for key in adapter.keys())


def test_whole_layers_trains_the_target_matrices_and_writes_their_change_as_an_adapter_of_the_rank_asked(tmp_path):
    """tools/train_lora_v2.py --whole-layers: the target layers trained whole, their change cut to
    --rank; the file holds that rank for every target layer and the v2 model loads it."""
    pytest.importorskip("peft", reason="tools/train_lora_v2.py adds the adapter with PEFT (pip install -e '.[test]')")
    from tools.train_lora_v2 import main

    threads = torch.get_num_threads()
    try:
        summary = main(["--whole-layers", "--lr", "1e-3", "--steps", "2", "--per-canvas", "2", "--canvases", "3",
                        "--batch", "2", "--rank", "6", "--threads", "1", "--log-every", "1000",
                        "--out", str(tmp_path / "x.safetensors")])
    finally:
        torch.set_num_threads(threads)
    assert summary["steps"] == 2
    with safe_open(str(tmp_path / "x.safetensors"), "pt") as adapter:
        a_keys = [key for key in adapter.keys() if key.endswith("lora_A.weight")]
        assert len(a_keys) == 81  # every target layer of the 4 + 8 block transformer
        assert all(adapter.get_tensor(key).shape[0] == 6 for key in a_keys)
        assert any(adapter.get_tensor(key).abs().max() > 0 for key in a_keys)  # two steps did change the weights
    from pipelines.loader import BUILTIN_V2_MODEL_DIR, load_pipeline

    pipe = load_pipeline(str(BUILTIN_V2_MODEL_DIR))
    pipe.load_lora("outline", tmp_path / "x.safetensors")
    assert pipe.loras.adapters["outline"].rank == 6 and len(pipe.loras.adapters["outline"].modules) == 81
    with pytest.raises(SystemExit):
        main(["--whole-layers", "--rank", "6", "--alpha", "3", "--out", str(tmp_path / "y.safetensors")])


def test_thicker_rings_grow_with_the_shape_never_under_4px_and_still_read_as_outlines():
    """tools/train_lora_v2.py --thickness-share: the ring a share of the shape's side (at least v1's
    4 px); the evaluator's outline check still reads every such render as an outline."""
    import numpy as np

    from tools.evaluate_v2 import measure as measure_v2
    from tools.shapes_world import PALETTE
    from tools.shapes_world_v2 import random_scene, render_outline
    from tools.train_lora_v2 import ring_thickness

    assert ring_thickness(20.0, 0.0) == ring_thickness(80.0, 0.0) == ring_thickness(20.0, 0.143) == 4.0
    assert ring_thickness(84.0, 0.143) == pytest.approx(12.0, abs=0.02)
    rng = np.random.default_rng(3)
    scenes = [random_scene(rng, width, height) for width, height in ((48, 48), (64, 64), (128, 128), (128, 72))
              for _ in range(10)]
    assert all(measure_v2(render_outline(scene, ring_thickness(scene.side, 0.143))).outlined is True for scene in scenes)
    big = max(scenes, key=lambda scene: scene.side)

    def ring_pixels(share: float) -> int:
        pixels = np.asarray(render_outline(big, ring_thickness(big.side, share))).astype(int)
        return int((np.abs(pixels - np.array(PALETTE[big.background])).sum(axis=-1) > 60).sum())

    assert ring_pixels(0.143) > 1.5 * ring_pixels(0.0)  # the same shape's ring covers more of the canvas


def test_canvas_picks_the_canvases_trained_on_and_refuses_ones_outside_the_open_world():
    from tools.train_lora_v2 import parse_args

    assert parse_args(["--canvas", "64x64", "96x64"]).canvas == [(64, 64), (96, 64)]
    assert parse_args([]).canvas is None  # all 121
    for bad in ("65x64", "64", "64x200"):
        with pytest.raises(SystemExit):
            parse_args(["--canvas", bad])


def test_the_switched_path_is_the_base_models_above_the_switch_and_ends_on_the_ring_below_it():
    from tools.train_lora_v2 import parse_args, switched_path

    generator = torch.Generator().manual_seed(0)
    filled, ring, noise = (torch.randn(5, 16, 8, generator=generator) for _ in range(3))
    sigma = torch.tensor([0.9, 0.6, 0.599, 0.3, 0.0])
    x_t, target = switched_path(filled, ring, noise, sigma, 0.6)
    # Above (and at) the switch: the base model's own training path and target.
    for row in (0, 1):
        assert torch.allclose(x_t[row], (1 - sigma[row]) * filled[row] + sigma[row] * noise[row])
        assert torch.equal(target[row], noise[row] - filled[row])
    # Below: a straight line from the noisy filled scene at the switch down to the ring.
    at_switch = 0.4 * filled + 0.6 * noise
    assert torch.allclose(x_t[4], ring[4])
    assert torch.allclose(x_t[3], ring[3] + 0.5 * (at_switch[3] - ring[3]))
    assert torch.allclose(x_t[2] - 0.599 * target[2], ring[2], atol=1e-5)  # an Euler step to 0 lands on the ring
    assert torch.allclose(x_t[2], at_switch[2], atol=0.01)  # continuous at the switch (the gap: 0.2% of ring to noise)
    assert parse_args(["--switch-sigma", "0.6"]).switch_sigma == 0.6
    for bad in (["--switch-sigma", "1.0"], ["--switch-sigma", "0.5", "--coupled", "4"],
                ["--whole-layers", "--init", "x.safetensors"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_layout_settling_reports_every_other_step_and_the_last_prediction_is_the_finished_picture():
    from diffusers import FluxPipeline

    from pipelines.loader import BUILTIN_V2_MODEL_DIR
    from tools.layout_settling import settling

    pipe = FluxPipeline.from_pretrained(BUILTIN_V2_MODEL_DIR)
    pipe.set_progress_bar_config(disable=True)
    rows = settling(pipe, 48, 48, pictures=3, seed=5, steps=6, guidance=3.0)
    assert [row["step"] for row in rows] == [0, 2, 4]
    assert rows[0]["sigma"] == 1.0 and rows[0]["sigma"] > rows[1]["sigma"] > rows[2]["sigma"] > 0
    assert all(0.0 <= row["within_4px"] <= row["within_8px"] <= 1.0 for row in rows)
    assert rows[-1]["within_4px"] == 1.0  # two steps from the end the shape is where it ends

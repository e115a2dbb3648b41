"""Packed FLUX forwards: requests of different sizes (and, in the transformer, prompt lengths) in ONE
forward, each exactly as its solo run. The stock FluxPipeline.__call__ stays the reference."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from diffusers import FluxPipeline, FluxTransformer2DModel
from diffusers.utils import logging as diffusers_logging

from engine import Engine
from pipelines.flux import FluxStepPipeline
from pipelines.flux_packed import FLUX, FluxRow, packed_forward
from pipelines.packing import Packing
from tests.pipeline_parity import (
    SIZE,
    Run,
    assert_close,
    assert_same,
    assert_step_outputs_match,
    finished,
    request,
    tiny_family,
)
from tests.protocol_driver import drive
from tests.tiny_checkpoints import T5_LENGTH, build_tiny_flux, build_tiny_flux_dev

diffusers_logging.set_verbosity_error()
diffusers_logging.disable_progress_bar()


def flux_arguments(p):
    if p.guidance_scale > 1 and p.negative_prompt is not None:
        return {"true_cfg_scale": p.guidance_scale, "negative_prompt": p.negative_prompt, "max_sequence_length": T5_LENGTH}
    return {"max_sequence_length": T5_LENGTH}


@pytest.fixture(scope="module")
def schnell(tmp_path_factory):
    return tiny_family(tmp_path_factory.mktemp("packed-flux") / "model", build_tiny_flux, FluxPipeline, flux_arguments)


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    arguments = lambda p: {"guidance_scale": p.guidance_scale, "max_sequence_length": T5_LENGTH}  # noqa: E731
    return tiny_family(tmp_path_factory.mktemp("packed-flux-dev") / "model", build_tiny_flux_dev, FluxPipeline, arguments)


class PackedForwards:
    """Counts the packed forwards FLUX pipelines run and their rows."""

    def __init__(self, monkeypatch) -> None:
        self.rows: list[int] = []

        def counting(model, rows, *args, **kwargs):
            self.rows.append(len(rows))
            return packed_forward(model, rows, *args, **kwargs)

        monkeypatch.setattr(FluxStepPipeline, "packed_model", replace(FLUX, forward=counting))


# ---------------------------------------------------------------------------- the transformer alone
def _row(model: FluxTransformer2DModel, generator, height_tokens: int, width_tokens: int, text_tokens: int,
         guidance: float | None = None) -> FluxRow:
    config = model.config
    ids = torch.zeros(height_tokens, width_tokens, 3)
    ids[..., 1] += torch.arange(height_tokens)[:, None]
    ids[..., 2] += torch.arange(width_tokens)[None, :]
    tokens = height_tokens * width_tokens
    return FluxRow(
        latents=torch.randn(1, tokens, config.in_channels, generator=generator),
        timestep=torch.rand((), generator=generator),
        pooled=torch.randn(1, config.pooled_projection_dim, generator=generator),
        embeds=torch.randn(1, text_tokens, config.joint_attention_dim, generator=generator),
        text_ids=torch.zeros(text_tokens, 3),
        image_ids=ids.reshape(-1, 3),
        guidance=guidance,
    )


def _solo(model, row: FluxRow) -> torch.Tensor:
    guidance = None if row.guidance is None else torch.tensor([row.guidance])
    return model(hidden_states=row.latents, timestep=row.timestep[None], guidance=guidance,
                 pooled_projections=row.pooled, encoder_hidden_states=row.embeds, txt_ids=row.text_ids,
                 img_ids=row.image_ids, return_dict=False)[0]


@pytest.mark.parametrize("family", ["schnell", "dev"])
@torch.no_grad()
def test_packed_forward_gives_every_row_its_solo_forward(family, request):
    model = request.getfixturevalue(family).pipeline.denoiser
    generator = torch.Generator().manual_seed(0)
    guidance = 3.5 if family == "dev" else None
    # Sizes, aspect ratios and prompt lengths all differ; two rows have the same joint length (one
    # attention call for both), one row is a single token.
    shapes = [(8, 8, T5_LENGTH), (4, 12, 5), (12, 4, T5_LENGTH), (8, 8, T5_LENGTH), (1, 1, 3), (6, 10, 9)]
    rows = [_row(model, generator, *shape, guidance=guidance) for shape in shapes]
    packed = packed_forward(model, rows)
    assert [tuple(p.shape) for p in packed] == [(1, h * w, model.config.in_channels) for h, w, _ in shapes]
    for row, prediction in zip(rows, packed):
        assert_close(prediction, _solo(model, row), "packed row")


@torch.no_grad()
def test_packed_rows_of_one_shape_equal_the_stacked_forward_exactly(schnell):
    model = schnell.pipeline.denoiser
    generator = torch.Generator().manual_seed(1)
    rows = [_row(model, generator, 8, 8, T5_LENGTH) for _ in range(3)]
    stacked = model(hidden_states=torch.cat([r.latents for r in rows]), timestep=torch.stack([r.timestep for r in rows]),
                    pooled_projections=torch.cat([r.pooled for r in rows]),
                    encoder_hidden_states=torch.cat([r.embeds for r in rows]), txt_ids=rows[0].text_ids,
                    img_ids=rows[0].image_ids, return_dict=False)[0]
    assert torch.equal(torch.cat(packed_forward(model, rows)), stacked)


@torch.no_grad()
def test_changing_one_row_moves_no_other_row(schnell):
    model = schnell.pipeline.denoiser
    generator = torch.Generator().manual_seed(2)
    a, b = _row(model, generator, 8, 8, T5_LENGTH), _row(model, generator, 4, 12, 7)
    changed_b = FluxRow(**{**b.__dict__, "latents": b.latents * -3.0, "timestep": torch.tensor(0.9)})
    first, second = packed_forward(model, [a, b]), packed_forward(model, [a, changed_b])
    assert torch.equal(first[0], second[0])
    assert not torch.allclose(first[1], second[1])


def test_packing_lays_each_rows_text_before_its_image():
    packing = Packing([2, 3], [4, 1], "cpu")
    assert packing.joint_row.tolist() == [0] * 6 + [1] * 4
    assert packing.text_in_joint.tolist() == [0, 1, 6, 7, 8]
    assert packing.image_in_joint.tolist() == [2, 3, 4, 5, 9]
    text, image = torch.arange(5.0)[:, None], 10 + torch.arange(5.0)[:, None]
    joint = packing.join(text, image)
    assert joint.flatten().tolist() == [0, 1, 10, 11, 12, 13, 2, 3, 4, 14]
    assert [t.flatten().tolist() for t in packing.split(joint)] == [[0, 1, 2, 3, 4], [10, 11, 12, 13, 14]]
    assert packing.tokens("image", [1]).tolist() == [4] and packing.select([1]).image_lengths == (1,)


# ---------------------------------------------------------------------------- the step protocol and the engine
def test_staggered_requests_of_different_sizes_share_forwards_and_match_the_stock_pipeline(schnell, monkeypatch):
    flux = schnell.pipeline
    packed = PackedForwards(monkeypatch)
    requests = [
        (0, request("a red circle", seed=1, num_inference_steps=6)),  # 32x32
        (1, request("a blue square on the left", seed=2, num_inference_steps=3, width=48, height=16)),  # 3:1, ends first
        (2, request("a green triangle", seed=3, num_inference_steps=4, width=16, height=40, guidance_scale=3.0,
                    negative_prompt="blurry")),  # true CFG: its negative row is a segment like any other
    ]
    states = drive(flux, requests)
    # Step 0: one row alone (stacked). Steps 1-3 pack the different sizes (the CFG request brings
    # two rows); once the small one ends, the rest still differ in size and stay packed.
    assert packed.rows == [2, 4, 4, 3, 3]
    for (_, p), state in zip(requests, states):
        assert_step_outputs_match(schnell, state, p)


def test_guidance_embedded_requests_of_different_sizes_match_the_stock_pipeline(dev, monkeypatch):
    packed = PackedForwards(monkeypatch)
    requests = [(0, request("a red circle", seed=4, num_inference_steps=3, guidance_scale=3.5)),
                (0, request("a blue square", seed=5, num_inference_steps=3, guidance_scale=7.0, width=24, height=40))]
    states = drive(dev.pipeline, requests)
    assert packed.rows == [2, 2, 2]
    for (_, p), state in zip(requests, states):
        assert_step_outputs_match(dev, state, p)


@pytest.mark.parametrize("mode", ["step", "request"])
def test_engine_runs_three_sizes_in_one_forward_in_both_modes(schnell, monkeypatch, mode):
    flux = schnell.pipeline
    packed = PackedForwards(monkeypatch)
    sizes = [(SIZE, SIZE), (48, 24), (24, 48)]
    params = [request(f"shape {i}", seed=10 + i, num_inference_steps=4, width=w, height=h) for i, (w, h) in enumerate(sizes)]
    run = Run(flux)
    run.engine = Engine(flux, mode=mode, max_batch_requests=8)
    handles = [run.submit(p) for p in params]
    with run:
        results = [finished(run, handle) for handle in handles]
    assert run.forward_sizes == [3] * 4 and packed.rows == [3] * 4
    for p, ours in zip(params, results):
        assert ours[1].shape == (p.height, p.width, 3)
        assert_same(ours, schnell.reference(p))


def test_transposed_sizes_with_as_many_tokens_each_keep_their_own_grid(schnell, monkeypatch):
    # 48x24 and 24x48: packed latents of one shape ([1, tokens, C]), image ids of two grids. They
    # run packed (a stacked forward takes one img_ids for every row) and each equals its stock run.
    packed = PackedForwards(monkeypatch)
    params = [request("a wide one", seed=31, num_inference_steps=3, width=48, height=24),
              request("a tall one", seed=32, num_inference_steps=3, width=24, height=48)]
    run = Run(schnell.pipeline)
    run.engine = Engine(schnell.pipeline, mode="step", max_batch_requests=8)
    handles = [run.submit(p) for p in params]
    with run:
        results = [finished(run, handle) for handle in handles]
    assert run.forward_sizes == [2] * 3 and packed.rows == [2] * 3
    for p, ours in zip(params, results):
        assert_same(ours, schnell.reference(p))


def test_a_request_that_ends_early_leaves_its_batch_mate_exact(schnell):
    flux = schnell.pipeline
    long, short = request("long", seed=21, num_inference_steps=6), request("short", seed=22, num_inference_steps=2, width=16)
    [alone] = drive(flux, [(0, long)])
    together, _ = drive(flux, [(0, long), (0, short)])
    assert_close(together.latents, alone.latents, "latents of the request that ran on")


# ---------------------------------------------------------------------------- per-row features on packed rows
@pytest.fixture(scope="module")
def builtin():
    from pipelines.loader import load_pipeline
    from pipelines.lora_files import BUILTIN_LORA_DIR

    pipeline = load_pipeline("builtin")
    pipeline.load_lora("outline", BUILTIN_LORA_DIR / "shapes-flux" / "outline.safetensors")
    return pipeline


def test_step_caching_and_adapters_decide_per_request_on_packed_rows(builtin, monkeypatch):
    """Each request of a packed forward skips the steps it skips alone and gets its own adapter's
    deltas: the built-in model, true CFG, step caching at 0.3 on some rows, the outline adapter on
    others, four sizes."""
    from engine import GenerationParams
    from pipelines.lora_request import LoraUse

    outline = (LoraUse("outline", 1.0),)
    prompt = "a large red circle on a blue background, left"
    requests = [
        GenerationParams(prompt=prompt, seed=1, num_inference_steps=8, step_cache=0.3),
        GenerationParams(prompt=prompt, seed=2, num_inference_steps=8, step_cache=0.3, loras=outline, width=96, height=48),
        GenerationParams(prompt=prompt, seed=3, num_inference_steps=6, step_cache=0.0, loras=outline, width=48, height=112),
        GenerationParams(prompt=prompt, seed=4, num_inference_steps=8, step_cache=0.3, width=128, height=128),
    ]
    alone = [drive(builtin, [(0, p)])[0] for p in requests]
    packed = PackedForwards(monkeypatch)
    together = drive(builtin, [(0, p) for p in requests])
    assert packed.rows == [8] * 6 + [6] * 2  # every request's two CFG rows, in one forward per step
    assert [len(s.skipped_steps) for s in alone][2] == 0 and sum(len(s.skipped_steps) for s in alone) > 0
    for one, shared in zip(alone, together):
        assert shared.skipped_steps == one.skipped_steps
        assert_close(shared.latents, one.latents, "latents packed against alone")


def test_rows_of_equal_lengths_in_two_runs_attend_on_views_as_when_gathered(monkeypatch):
    # The CFG layout of requests sorted by shape: [neg A, neg B, pos A, pos B], so each length's
    # rows lie in two runs. Both ways give every row its own attention, and equal each other.
    from pipelines import packing as packing_module

    lengths = [5, 7, 5, 7]
    generator = torch.Generator().manual_seed(3)
    query, key, value = (torch.randn(sum(lengths), 2, 8, generator=generator) for _ in range(3))
    solo = torch.cat([torch.nn.functional.scaled_dot_product_attention(*(t.transpose(0, 1) for t in parts)).transpose(0, 1)
                      for parts in zip(query.split(lengths), key.split(lengths), value.split(lengths))])
    outputs = {}
    for runs in (2, 0):  # 0: every group gathered
        monkeypatch.setattr(packing_module, "MAX_VIEW_RUNS", runs)
        outputs[runs] = packing_module.segment_attention(query, key, value, lengths, lengths)
        assert_close(outputs[runs], solo, f"attention with MAX_VIEW_RUNS={runs}")
    assert torch.equal(outputs[2], outputs[0])


def test_a_layout_in_shape_order_answers_in_batch_order():
    from types import SimpleNamespace

    from pipelines.cfg import CfgLayout

    def state(name, size, cfg):
        conditioning = SimpleNamespace(positive=f"{name}+", negative=f"{name}-" if cfg else None, cfg=cfg, guidance_scale=2.0)
        return SimpleNamespace(name=name, size=size, conditioning=conditioning)

    states = [state("big", 64, True), state("small", 16, False), state("mid", 32, True)]
    layout = CfgLayout.of(states, order_by=lambda s: s.size)
    assert [row.text for row in layout.rows] == ["mid-", "big-", "small+", "mid+", "big+"]
    # one prediction per row, in the layout's row order: negatives 1, 2; positives 10, 20, 30
    guided = layout.combine([torch.tensor(v) for v in (1.0, 2.0, 10.0, 20.0, 30.0)])
    assert [float(g) for g in guided] == [2.0 + 2 * (30 - 2), 10.0, 1.0 + 2 * (20 - 1)]  # big, small, mid

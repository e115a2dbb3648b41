"""SD3StepPipeline against the stock diffusers StableDiffusion3Pipeline, on a tiny random-weight checkpoint."""

from __future__ import annotations

import json

import pytest
from diffusers import StableDiffusion3Pipeline
from diffusers.utils import logging as diffusers_logging

from engine import GenerationParams, Progress
from pipelines.loader import load_pipeline
from pipelines.sd3 import SD3BatchKey, SD3StepPipeline
from tests.pipeline_parity import (
    SIZE,
    ForwardLog,
    Run,
    assert_same,
    assert_step_outputs_match,
    finished,
    request,
    run_joining_together,
    tiny_family,
)
from tests.protocol_driver import drive
from tests.tiny_checkpoints import T5_LENGTH, build_tiny_sd3

diffusers_logging.set_verbosity_error()
diffusers_logging.disable_progress_bar()

STUDIO_CONFIG = {"height": SIZE, "width": SIZE, "max_sequence_length": T5_LENGTH, "num_inference_steps": 4,
                 "guidance_scale": 1.0}


@pytest.fixture(scope="session")
def family(tmp_path_factory):
    """The tiny SD3 checkpoint (16x16 latents, 8x8 patches of 2x2 at 32x32): ours and stock."""
    return tiny_family(
        tmp_path_factory.mktemp("tiny-sd3") / "model",
        build_tiny_sd3,
        StableDiffusion3Pipeline,
        lambda p: {"negative_prompt": p.negative_prompt, "guidance_scale": p.guidance_scale,
                   "max_sequence_length": T5_LENGTH},
        STUDIO_CONFIG,
    )


def test_loads_as_the_sd3_family(family):
    assert isinstance(family.pipeline, SD3StepPipeline)
    info = family.pipeline.info
    assert info.family == "sd3" and info.schedulers == ("flow-match-euler",) and info.uses_negative_prompt
    assert info.size_multiple == 4  # vae_scale_factor 2 x patch size 2
    assert (info.defaults.width, info.defaults.num_inference_steps, info.defaults.guidance_scale) == (SIZE, 4, 1.0)
    assert info.extras["shift"] == "3.0"


def test_engine_batch_of_one_matches_sd3_pipeline(family):
    p = request(seed=7, num_inference_steps=5)
    with Run(family.pipeline) as run:
        ours = finished(run, run.submit(p))
    assert_same(ours, family.reference(p))
    assert run.forwards.rows == [1] * 5


def test_cfg_with_negative_prompt_matches_sd3_pipeline(family):
    p = request(seed=5, num_inference_steps=4, guidance_scale=5.0, negative_prompt="blurry")
    with ForwardLog(family.pipeline) as log:
        [state] = drive(family.pipeline, [(0, p)])
    assert state.conditioning.cfg
    assert log.rows == [2] * 4  # [negative, positive] in one forward, as __call__
    assert_step_outputs_match(family, state, p)


def test_cfg_without_negative_prompt_uses_an_empty_one_like_diffusers(family):
    p = request(seed=6, num_inference_steps=3, guidance_scale=3.0, negative_prompt=None)
    [state] = drive(family.pipeline, [(0, p)])
    assert_step_outputs_match(family, state, p)


def test_cobatched_requests_with_staggered_arrivals_match_their_solo_runs(family):
    requests = [
        (0, request("a red circle", seed=1, num_inference_steps=6)),
        (1, request("a blue square on the left", seed=2, num_inference_steps=3, guidance_scale=4.0, negative_prompt="blurry")),
        (3, request("a green triangle", seed=3, num_inference_steps=4, guidance_scale=2.0)),
    ]
    with ForwardLog(family.pipeline) as log:
        states = drive(family.pipeline, requests)
    assert log.rows == [1, 3, 3, 5, 3, 3, 2]  # CFG requests add their negative rows to the one forward
    for (_, p), state in zip(requests, states):
        assert state.step_index == p.num_inference_steps
        assert_step_outputs_match(family, state, p)


def test_engine_cobatches_mid_run_arrivals_and_matches_sd3_pipeline(family):
    first = request("a red circle", seed=1, num_inference_steps=8, preview_every=2)
    joiners = {  # forward number during which each one is submitted
        1: request("a blue square", seed=2, num_inference_steps=4, guidance_scale=3.0, negative_prompt="blurry"),
        3: request("a green triangle", seed=3, num_inference_steps=4),
    }
    with Run(family.pipeline, arrivals=joiners) as run:
        handle = run.submit(first)
        results = [finished(run, handle)]  # the longest: the others arrived meanwhile
        results += [finished(run, joiner) for joiner in run.handles[1:]]
        previews = [e.preview for e in handle.events(timeout=1) if isinstance(e, Progress) and e.preview is not None]
        joined_batch_sizes = [
            [e.batch_size for e in joiner.events(timeout=1) if isinstance(e, Progress)] for joiner in run.handles[1:]
        ]
    # Joiner 1 runs in forwards 2..5, joiner 3 in forwards 4..7, the first request in 1..8.
    assert joined_batch_sizes == [[2, 2, 3, 3], [3, 3, 2, 2]]
    assert run.forwards.rows == [1, 3, 3, 4, 4, 2, 2, 1]  # joiner 1's negative row rides along
    for p, ours in zip([first, *joiners.values()], results):
        assert_same(ours, family.reference(p))
    grid = SIZE // family.pipeline.vae_scale_factor
    assert len(previews) == 3 and all(p.mode == "RGB" and p.size == (grid, grid) for p in previews)


def test_requests_joining_one_step_share_one_text_encoding_and_match_sd3_pipeline(family, monkeypatch):
    requests = [
        request("a red circle", seed=1, num_inference_steps=3, guidance_scale=4.0, negative_prompt="blurry"),
        request("a blue square", seed=2, num_inference_steps=4, guidance_scale=3.0),  # CFG with "", as diffusers
        request("a green triangle", seed=3, num_inference_steps=3),  # no CFG
    ]
    results, calls, run = run_joining_together(family.pipeline, requests, monkeypatch)
    assert calls == [["a red circle", "blurry", "a blue square", "", "a green triangle"]]
    assert run.forwards.rows == [5, 5, 5, 2]
    for p, ours in zip(requests, results):
        assert_same(ours, family.reference(p))


def test_batch_key_holds_no_size_when_rows_pack(family):
    assert family.pipeline.packs  # images of different sizes run packed (pipelines/sd3_packed.py)
    a = request(seed=1, num_inference_steps=4, guidance_scale=1.0)
    b = request("another prompt", seed=2, num_inference_steps=30, guidance_scale=7.0, negative_prompt="blurry")
    taller = request(height=SIZE * 2)
    assert {family.pipeline.batch_key(p) for p in (a, b, taller)} == {SD3BatchKey(None, None, T5_LENGTH)}


def test_without_packing_the_batch_key_is_the_image_size_only(family, monkeypatch):
    monkeypatch.setitem(family.pipeline.__dict__, "packs", False)
    a = request(seed=1, num_inference_steps=4, guidance_scale=1.0)
    b = request("another prompt", seed=2, num_inference_steps=30, guidance_scale=7.0, negative_prompt="blurry")
    assert family.pipeline.batch_key(a) == family.pipeline.batch_key(b) == SD3BatchKey(SIZE, SIZE, T5_LENGTH)
    assert family.pipeline.batch_key(request(height=SIZE * 2)) != family.pipeline.batch_key(a)


def test_staggered_requests_of_different_sizes_share_packed_forwards_and_match_the_stock_pipeline(family):
    requests = [
        (0, request("a red circle", seed=1, num_inference_steps=4)),
        (1, request("a blue square", seed=2, num_inference_steps=3, width=48, height=16, guidance_scale=3.0)),  # CFG
        (1, request("a green triangle", seed=3, num_inference_steps=2, width=16, height=40)),
    ]
    states = drive(family.pipeline, requests)
    for (_, p), state in zip(requests, states):
        assert_step_outputs_match(family, state, p)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"width": 30}, "width=30 is not allowed: Stable Diffusion 3 needs a multiple of 4"),
        ({"num_frames": 3}, "num_frames=3"),
        ({"scheduler": "euler-a"}, "scheduler='euler-a' is not a noise scheduler this model offers; allowed are: flow-match-euler"),
    ],
)
def test_validate_names_the_field_the_value_and_what_is_allowed(family, change, message):
    fields = dict(prompt="a red circle", width=SIZE, height=SIZE, num_frames=1, num_inference_steps=4,
                  guidance_scale=1.0, seed=1)
    fields.update(change)
    with pytest.raises(ValueError, match=message):
        family.pipeline.validate(GenerationParams(**fields))


def test_corrupt_sd3_folder_is_a_clear_error(tmp_path):
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusion3Pipeline"}))
    with pytest.raises(ValueError, match="could not load .* as a Stable Diffusion 3 checkpoint"):
        load_pipeline(str(tmp_path))


def test_packed_sd35_transformer_gives_every_row_its_solo_forward():
    """SD3.5's layout (its second, image-only attention and q/k norms), packed against solo forwards."""
    import torch
    from diffusers import SD3Transformer2DModel

    from pipelines.sd3_packed import SD3Row, packed_forward
    from tests.pipeline_parity import assert_close

    torch.manual_seed(0)
    model = SD3Transformer2DModel(sample_size=32, patch_size=2, in_channels=4, num_layers=3, attention_head_dim=8,
                                  num_attention_heads=4, caption_projection_dim=32, joint_attention_dim=32,
                                  pooled_projection_dim=16, out_channels=4, dual_attention_layers=(0, 1),
                                  qk_norm="rms_norm").eval()
    generator = torch.Generator().manual_seed(1)
    shapes = [(16, 16, 12), (8, 24, 12), (24, 8, 5), (2, 2, 3)]  # (height, width, text tokens) of the latents
    rows = [SD3Row(torch.randn(1, 4, h, w, generator=generator), torch.tensor(float(250 * i + 3)),
                   torch.randn(1, n, 32, generator=generator), torch.randn(1, 16, generator=generator))
            for i, (h, w, n) in enumerate(shapes)]
    with torch.no_grad():
        packed = packed_forward(model, rows)
        for row, prediction in zip(rows, packed):
            solo = model(hidden_states=row.latents, timestep=row.timestep[None], encoder_hidden_states=row.embeds,
                         pooled_projections=row.pooled, return_dict=False)[0]
            assert_close(prediction, solo, "packed SD3.5 row")

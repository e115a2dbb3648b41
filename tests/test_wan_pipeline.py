"""The Wan step pipeline reproduces diffusers' WanPipeline, Wan 2.1-style (one transformer, flow
UniPC) and Wan 2.2-style (two experts switched at boundary_ratio, flow-match Euler), alone and
co-batched, on tiny random-weight checkpoints (tests/tiny_checkpoints.py)."""

from __future__ import annotations

import json
import shutil
import types

import pytest
import torch
from diffusers import WanPipeline

from engine import Engine, GenerationParams, Progress
from pipelines.loader import LoadOptions, load_pipeline
from pipelines.studio_config import StudioConfig
from pipelines.wan import WanBatchKey, WanStepPipeline
from pipelines.wan_vae import WAN_LATENTS_MEAN, wan_vae_projection
from tests.pipeline_parity import (
    SIZE,
    Reference,
    Run,
    assert_close,
    assert_same,
    finished,
    request,
    run_joining_together,
    tiny_family,
)
from tests.protocol_driver import drive
from tests.tiny_checkpoints import T5_LENGTH, build_tiny_wan, build_tiny_wan22

FRAMES = 9  # 3 latent frames of 8x8 at 32x32
STUDIO_CONFIG = {"height": SIZE, "width": SIZE, "num_frames": FRAMES, "fps": 8, "num_inference_steps": 4,
                 "guidance_scale": 1.0, "max_sequence_length": T5_LENGTH}
BUILDERS = {"wan2.1": build_tiny_wan, "wan2.2": build_tiny_wan22}


def video(prompt: str = "a red circle moving left", **fields) -> GenerationParams:
    return request(prompt, **{"num_frames": FRAMES, **fields})


def stock_wan(folder) -> WanPipeline:
    return WanPipeline.from_pretrained(folder, use_safetensors=True)


def wan_arguments(p: GenerationParams) -> dict:
    return {"negative_prompt": p.negative_prompt, "guidance_scale": p.guidance_scale, "max_sequence_length": T5_LENGTH}


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def wan(request, tmp_path_factory):
    """Each tiny checkpoint: ours and stock."""
    folder = tmp_path_factory.mktemp(request.param) / "model"
    return tiny_family(folder, BUILDERS[request.param], stock_wan, wan_arguments, STUDIO_CONFIG, frames=True)


# ---------------------------------------------------------------------------- loading, limits, key
def test_loads_as_a_video_family_with_stepstudio_defaults(wan):
    pipeline = wan.pipeline
    assert isinstance(pipeline, WanStepPipeline)
    info = pipeline.info
    assert (info.family, info.output_kind, info.size_multiple) == ("wan", "video", 16)
    defaults = info.defaults
    assert (defaults.width, defaults.height, defaults.num_frames, defaults.fps) == (SIZE, SIZE, FRAMES, 8)
    assert info.extras["frames"] == "4k+1"
    assert len(pipeline.denoisers) == (2 if pipeline.boundary_timestep else 1)
    assert info.schedulers == (("flow-match-euler",) if pipeline.boundary_timestep else ("unipc",))


def test_without_stepstudio_json_wan_pipeline_defaults_apply(tmp_path):
    defaults = load_pipeline(str(build_tiny_wan(tmp_path / "plain"))).info.defaults
    assert (defaults.width, defaults.height, defaults.num_frames, defaults.fps) == (832, 480, 81, 16)
    assert (defaults.num_inference_steps, defaults.guidance_scale) == (50, 5.0)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"num_frames": 10}, r"num_frames=10 is not allowed: Wan needs 4k\+1 frames \(1, 5, 9, 13, \.\.\.; e\.g\. 9 or 13\)"),
        ({"num_frames": 2}, r"num_frames=2 is not allowed: Wan needs 4k\+1 frames .*e\.g\. 1 or 5"),
        ({"width": 40}, r"width=40 is not allowed: Wan needs a multiple of 16 \(e\.g\. 32 or 48\)"),
        ({"scheduler": "ddim"}, r"scheduler='ddim' is not a noise scheduler this model offers"),
    ],
)
def test_model_limits_are_checked_at_submission(wan, overrides, message):
    with pytest.raises(ValueError, match=message):
        Engine(wan.pipeline).submit(video(**overrides))


def test_every_shape_shares_a_batch_key_when_rows_pack(wan):
    key = wan.pipeline.batch_key
    assert wan.pipeline.packs  # videos of different shapes run packed (pipelines/wan_packed.py)
    others = [video(prompt="x", seed=9, num_inference_steps=30, guidance_scale=6.0, negative_prompt="blurry"),
              video(num_frames=13), video(width=48)]
    assert {key(p) for p in [video(), *others]} == {WanBatchKey(num_frames=None, height=None, width=None)}


def test_without_packing_the_batch_key_is_the_latent_shape(wan, monkeypatch):
    monkeypatch.setitem(wan.pipeline.__dict__, "packs", False)
    key = wan.pipeline.batch_key
    base = video()
    assert key(base) == WanBatchKey(num_frames=FRAMES, height=SIZE, width=SIZE)
    assert key(base) == key(video(prompt="x", seed=9, num_inference_steps=30, guidance_scale=6.0,
                                       negative_prompt="blurry"))
    assert key(base) != key(video(num_frames=13))
    assert key(base) != key(video(width=48))


def test_preview_factors_are_the_published_ones_for_the_wan_vae_else_fitted(wan):
    assert wan.pipeline.preview_projection.source == "fitted"  # the tiny VAE's statistics are its own
    released = types.SimpleNamespace(config=types.SimpleNamespace(
        z_dim=16, latents_mean=list(WAN_LATENTS_MEAN), latents_std=[1.0] * 16))
    assert wan_vae_projection(released, StudioConfig(), vae_scale_factor=8).source == "wan-2.1-vae"


def test_experts_keep_their_float32_modules_in_a_half_precision_load(tmp_path):
    pipeline = load_pipeline(str(build_tiny_wan22(tmp_path / "bf16")), LoadOptions(dtype="bf16"))
    for expert in pipeline.denoisers:
        assert expert.dtype == torch.bfloat16
        assert expert.condition_embedder.time_embedder.linear_1.weight.dtype == torch.float32  # as diffusers keeps it
        assert expert.blocks[0].ffn.net[0].proj.weight.dtype == torch.bfloat16


# ---------------------------------------------------------------------------- parity
@pytest.mark.parametrize("guidance_scale, negative_prompt", [(1.0, None), (4.0, "blurry")])
def test_one_request_matches_wan_pipeline(wan, guidance_scale, negative_prompt):
    pipeline, reference = wan.pipeline, wan.reference
    params = video(guidance_scale=guidance_scale, negative_prompt=negative_prompt, seed=3, preview_every=1)
    with Run(pipeline) as run:
        handle = run.submit(params)
        ours = finished(run, handle)
        final = handle.result(timeout=1)
    assert final.is_video and len(final.images) == FRAMES and final.images[0].size == (SIZE, SIZE)
    assert_same(ours, reference(params))
    rows = 2 if guidance_scale > 1 else 1  # CFG rows share the forward
    assert [sum(r for _, r in step) for step in run.forwards.steps] == [rows] * 4
    # Previews: every latent frame of the predicted x0, one pixel per latent cell.
    previews = [e.preview for e in handle.events(timeout=1) if isinstance(e, Progress) and e.preview is not None]
    assert len(previews) == 3
    assert all(len(frames) == 3 and {f.size for f in frames} == {(8, 8)} for frames in previews)


def test_co_batched_requests_with_different_steps_and_guidance_match_each_run_alone(wan):
    pipeline, reference = wan.pipeline, wan.reference
    first = video(prompt="a red circle moving left", seed=11, num_inference_steps=6)
    second = video(prompt="a blue square moving up", seed=22, num_inference_steps=4, guidance_scale=4.0,
                        negative_prompt="blurry")
    with Run(pipeline, arrivals={2: second}) as run:  # `second` joins after two steps of `first`
        results = [finished(run, run.submit(first))]
        results.append(finished(run, run.handles[1]))
    assert run.forward_sizes == [1, 1, 2, 2, 2, 2]
    if pipeline.boundary_timestep is None:
        assert run.forwards.rows == [1, 1, 3, 3, 3, 3]  # one forward per step
    else:
        # (expert, rows): `transformer` (0) above the boundary, `transformer_2` (1) below. In step 3
        # `first` is already below it and `second` (at its first step) above: two forwards,
        # one per expert, in that one denoise_step; both requests then share the low-noise one.
        assert run.forwards.steps == [[(0, 1)], [(0, 1)], [(1, 1), (0, 2)], [(1, 3)], [(1, 3)], [(1, 3)]]
    for params, ours in zip((first, second), results):
        assert_same(ours, reference(params))


def test_requests_joining_one_step_share_one_text_encoding(wan, monkeypatch):
    pipeline, reference = wan.pipeline, wan.reference
    requests = [
        video(prompt="a red circle moving left", seed=4, guidance_scale=3.0),  # CFG with "", as diffusers
        video(prompt="a green triangle moving down", seed=5, num_inference_steps=3),
    ]
    results, calls, run = run_joining_together(pipeline, requests, monkeypatch)
    assert calls == [["a red circle moving left", "", "a green triangle moving down"]]
    assert [sum(r for _, r in step) for step in run.forwards.steps] == [3, 3, 3, 2]
    for params, ours in zip(requests, results):
        assert_same(ours, reference(params))


def test_per_patch_timesteps_match_wan_pipeline(tmp_path):
    """expand_timesteps (Wan 2.2 TI2V): a timestep per latent patch instead of per row."""
    folder = build_tiny_wan(tmp_path / "ti2v", studio_config=STUDIO_CONFIG)
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, "expand_timesteps": True}))
    pipeline = load_pipeline(str(folder))
    assert pipeline.pipe.config.expand_timesteps
    reference = Reference(stock_wan(folder), wan_arguments, frames=True)
    requests = [(0, video(width=48, guidance_scale=3.0)), (1, video(width=48, seed=2, num_inference_steps=3))]
    for (_, params), state in zip(requests, drive(pipeline, requests)):
        assert_close(state.latents, reference(params, "np")[0], "final latents")


def test_a_folder_of_another_wan_kind_is_a_clear_error(tmp_path):
    folder = build_tiny_wan(tmp_path / "half")
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, "boundary_ratio": 0.9}))
    with pytest.raises(ValueError, match=r"boundary_ratio=0.9 with transformer_2=NoneType; Wan 2.2 checkpoints have both"):
        load_pipeline(str(folder))
    (folder / "model_index.json").write_text(json.dumps(index))
    (folder / "transformer" / "diffusion_pytorch_model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="could not load .*half as a Wan checkpoint"):
        load_pipeline(str(folder))
    shutil.rmtree(folder / "transformer")
    with pytest.raises(ValueError, match="could not load .*half as a Wan checkpoint"):
        load_pipeline(str(folder))

"""Packed Wan forwards: videos of different sizes and frame counts (and, in the transformer, prompt
lengths) in ONE forward, each exactly as its solo run; the stock WanPipeline.__call__ stays the
reference. Wan 2.1 (one transformer) and Wan 2.2 (two experts: each expert packs its own rows)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from diffusers.utils import logging as diffusers_logging

import pipelines.wan_packed as wan_packed
from pipelines.wan import WanStepPipeline
from pipelines.wan_packed import WanRow, packed_forward
from tests.pipeline_parity import assert_close, request, tiny_family
from tests.protocol_driver import drive
from tests.test_wan_pipeline import BUILDERS, STUDIO_CONFIG, stock_wan, wan_arguments

diffusers_logging.set_verbosity_error()
diffusers_logging.disable_progress_bar()


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def wan(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"packed-{request.param}") / "model"
    return tiny_family(folder, BUILDERS[request.param], stock_wan, wan_arguments, STUDIO_CONFIG, frames=True)


@torch.no_grad()
def test_packed_forward_gives_every_video_its_solo_forward(wan):
    model = wan.pipeline.denoiser
    generator = torch.Generator().manual_seed(0)
    channels, text_dim = model.config.in_channels, model.config.text_dim
    # (latent frames, height, width, text tokens): shapes, frame counts and prompt lengths all differ;
    # one row is a single frame of a single patch.
    shapes = [(3, 8, 8, 12), (5, 4, 8, 12), (1, 8, 6, 5), (3, 8, 8, 7), (1, 2, 2, 3)]
    rows = [WanRow(torch.randn(1, channels, f, h, w, generator=generator), torch.tensor(float(100 * i + 17)),
                   torch.randn(1, length, text_dim, generator=generator)) for i, (f, h, w, length) in enumerate(shapes)]
    for row, prediction in zip(rows, packed_forward(model, rows)):
        solo = model(hidden_states=row.latents, timestep=row.timestep[None], encoder_hidden_states=row.text,
                     return_dict=False)[0]
        assert_close(prediction, solo, "packed video")


def test_staggered_videos_of_different_shapes_match_the_stock_pipeline(wan, monkeypatch):
    rows: list[int] = []

    def counting(model, model_rows, *args, **kwargs):
        rows.append(len(model_rows))
        return packed_forward(model, model_rows, *args, **kwargs)

    monkeypatch.setattr(WanStepPipeline, "packed_model", replace(wan_packed.WAN, forward=counting))
    requests = [
        (0, request("a red circle moving left", seed=1, num_inference_steps=4, num_frames=9)),
        (1, request("a blue square moving up", seed=2, num_inference_steps=3, num_frames=5, width=48, height=16)),
        (1, request("a green triangle", seed=3, num_inference_steps=3, num_frames=13, width=16, height=32,
                    guidance_scale=3.0, negative_prompt="blurry")),  # CFG: its negative row is a segment too
    ]
    states = drive(wan.pipeline, requests)
    # Steps 1-3: every request's rows (the CFG one brings two) in one packed forward; with two experts,
    # the rows on the low-noise side of the boundary at step 1 (one row alone: stacked) are split off.
    assert rows == ([4, 4, 4] if wan.pipeline.low_noise_expert is None else [3, 4, 4])
    for (_, p), state in zip(requests, states):
        assert_close(state.latents, wan.reference(p, "np")[0], "final latents")

"""SD3StepPipeline against the stock diffusers StableDiffusion3Pipeline, on a tiny random-weight checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from diffusers import StableDiffusion3Pipeline
from diffusers.utils import logging as diffusers_logging

from engine import Completed, Engine, GenerationParams, Progress
from pipelines.loader import load_pipeline
from pipelines.sd3 import SD3BatchKey, SD3StepPipeline
from tests.pipeline_parity import run_joining_together
from tests.protocol_driver import SubmitDuringForward, drive, max_abs_diff
from tests.tiny_models import T5_LENGTH, build_tiny_sd3

diffusers_logging.set_verbosity_error()
diffusers_logging.disable_progress_bar()

SIZE = 32  # pixels; 16x16 latents, 8x8 patches of 2x2
STUDIO_CONFIG = {"height": SIZE, "width": SIZE, "max_sequence_length": T5_LENGTH, "num_inference_steps": 4,
                 "guidance_scale": 1.0}
FLOAT_TOLERANCE = 1e-5


@pytest.fixture(scope="session")
def tiny_sd3_checkpoint(tmp_path_factory):
    return build_tiny_sd3(tmp_path_factory.mktemp("tiny-sd3") / "model", studio_config=STUDIO_CONFIG)


@pytest.fixture(scope="session")
def sd3(tiny_sd3_checkpoint):
    return load_pipeline(str(tiny_sd3_checkpoint))


@pytest.fixture(scope="session")
def reference(tiny_sd3_checkpoint):
    return StableDiffusion3Pipeline.from_pretrained(tiny_sd3_checkpoint, use_safetensors=True)


def make_params(prompt="a red circle", seed=1, steps=4, guidance=1.0, negative=None, **extra) -> GenerationParams:
    fields = dict(width=SIZE, height=SIZE, num_frames=1)
    fields.update(extra)
    return GenerationParams(
        prompt=prompt, negative_prompt=negative, num_inference_steps=steps, guidance_scale=guidance, seed=seed, **fields
    )


def stock_output(reference_pipe, p: GenerationParams, output_type: str):
    """What diffusers' own StableDiffusion3Pipeline.__call__ makes for the same request."""
    return reference_pipe(
        p.prompt,
        negative_prompt=p.negative_prompt,
        height=p.height,
        width=p.width,
        num_inference_steps=p.num_inference_steps,
        guidance_scale=p.guidance_scale,
        max_sequence_length=T5_LENGTH,
        generator=torch.Generator("cpu").manual_seed(p.seed),
        output_type=output_type,
    ).images


def test_loads_as_the_sd3_family(sd3):
    assert isinstance(sd3, SD3StepPipeline)
    info = sd3.info
    assert info.family == "sd3" and info.schedulers == ("flow-match-euler",) and info.uses_negative_prompt
    assert info.size_multiple == 4  # vae_scale_factor 2 x patch size 2
    assert (info.defaults.width, info.defaults.num_inference_steps, info.defaults.guidance_scale) == (SIZE, 4, 1.0)
    assert info.extras["shift"] == "3.0"


def test_engine_batch_of_one_matches_sd3_pipeline(sd3, reference):
    p = make_params(seed=7, steps=5)
    engine = Engine(sd3, mode="step", max_batch=8).start()
    try:
        final = engine.submit(p, session_id="a").result(timeout=60)
    finally:
        engine.close()
    assert isinstance(final, Completed)
    assert np.array_equal(np.asarray(final.images[0]), np.asarray(stock_output(reference, p, "pil")[0]))


def test_cfg_with_negative_prompt_matches_sd3_pipeline(sd3, reference):
    p = make_params(seed=5, steps=4, guidance=5.0, negative="blurry")
    [state] = drive(sd3, [(0, p)])
    assert state.conditioning.cfg
    assert max_abs_diff(sd3.decode(state, "np"), stock_output(reference, p, "np")) <= FLOAT_TOLERANCE
    assert max_abs_diff(state.latents, stock_output(reference, p, "latent")) <= FLOAT_TOLERANCE


def test_cfg_without_negative_prompt_uses_an_empty_one_like_diffusers(sd3, reference):
    p = make_params(seed=6, steps=3, guidance=3.0, negative=None)
    [state] = drive(sd3, [(0, p)])
    assert max_abs_diff(sd3.decode(state, "np"), stock_output(reference, p, "np")) <= FLOAT_TOLERANCE


def test_cobatched_requests_with_staggered_arrivals_match_their_solo_runs(sd3, reference):
    requests = [
        (0, make_params("a red circle", seed=1, steps=6)),
        (1, make_params("a blue square on the left", seed=2, steps=3, guidance=4.0, negative="blurry")),
        (3, make_params("a green triangle", seed=3, steps=4, guidance=2.0)),
    ]
    states = drive(sd3, requests)
    for (_, p), state in zip(requests, states):
        assert state.step_index == p.num_inference_steps
        assert max_abs_diff(sd3.decode(state, "np"), stock_output(reference, p, "np")) <= FLOAT_TOLERANCE


def test_engine_cobatches_mid_run_arrivals_and_matches_sd3_pipeline(sd3, reference):
    first = make_params("a red circle", seed=1, steps=8, preview_every=2)
    joiners = {  # forward number during which each one is submitted
        1: make_params("a blue square", seed=2, steps=4, guidance=3.0, negative="blurry"),
        3: make_params("a green triangle", seed=3, steps=4),
    }
    planned = SubmitDuringForward(sd3, joiners)
    engine = planned.engine = Engine(planned, mode="step", max_batch=8).start()
    try:
        handle = engine.submit(first, session_id="a")
        results = [(first, handle.result(timeout=60))]
        results += [(joiners[k], h.result(timeout=60)) for k, h in planned.handles.items()]
        previews = [e.preview for e in handle.events(timeout=1) if isinstance(e, Progress) and e.preview is not None]
        joined_batch_sizes = {
            k: [e.batch_size for e in h.events(timeout=1) if isinstance(e, Progress)] for k, h in planned.handles.items()
        }
    finally:
        engine.close()
    # Joiner 1 runs in forwards 2..5, joiner 3 in forwards 4..7, the first request in 1..8.
    assert joined_batch_sizes == {1: [2, 2, 3, 3], 3: [3, 3, 2, 2]}
    for p, final in results:
        assert isinstance(final, Completed)
        # Batched and single forwards differ by float rounding (<= 1e-6): at most one uint8 level.
        assert max_abs_diff(np.asarray(final.images[0]), np.asarray(stock_output(reference, p, "pil")[0])) <= 1
    grid = SIZE // sd3.vae_scale_factor
    assert len(previews) == 3 and all(p.mode == "RGB" and p.size == (grid, grid) for p in previews)


def test_requests_joining_one_step_share_one_text_encoding_and_match_sd3_pipeline(sd3, reference, monkeypatch):
    requests = [
        make_params("a red circle", seed=1, steps=3, guidance=4.0, negative="blurry"),
        make_params("a blue square", seed=2, steps=4, guidance=3.0),  # CFG with "", as diffusers
        make_params("a green triangle", seed=3, steps=3),  # no CFG
    ]
    results, calls = run_joining_together(sd3, requests, monkeypatch)
    assert calls == [["a red circle", "blurry", "a blue square", "", "a green triangle"]]
    for p, (_, image) in zip(requests, results):
        assert max_abs_diff(image, np.asarray(stock_output(reference, p, "pil")[0])) <= 1


def test_batch_key_is_the_image_size_only(sd3):
    a = make_params(seed=1, steps=4, guidance=1.0)
    b = make_params("another prompt", seed=2, steps=30, guidance=7.0, negative="blurry")
    assert sd3.batch_key(a) == sd3.batch_key(b) == SD3BatchKey(SIZE, SIZE, T5_LENGTH)
    assert sd3.batch_key(make_params(height=SIZE * 2)) != sd3.batch_key(a)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"width": 30}, "width=30 is not allowed: SD3 needs a multiple of 4"),
        ({"num_frames": 3}, "num_frames=3"),
        ({"scheduler": "euler-a"}, "scheduler='euler-a' is not a noise scheduler this model offers; allowed are: flow-match-euler"),
    ],
)
def test_validate_names_the_field_the_value_and_what_is_allowed(sd3, change, message):
    fields = dict(prompt="a red circle", width=SIZE, height=SIZE, num_frames=1, num_inference_steps=4,
                  guidance_scale=1.0, seed=1)
    fields.update(change)
    with pytest.raises(ValueError, match=message):
        sd3.validate(GenerationParams(**fields))


def test_corrupt_sd3_folder_is_a_clear_error(tmp_path):
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusion3Pipeline"}))
    with pytest.raises(ValueError, match="could not load .* as a Stable Diffusion 3 checkpoint"):
        load_pipeline(str(tmp_path))

"""FluxStepPipeline against the stock diffusers FluxPipeline, on tiny random-weight checkpoints.

Parity is checked twice: through the engine (decoded uint8 images) and through the step
protocol driven by hand (float outputs, and exact arrivals).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from diffusers import FluxPipeline
from diffusers.utils import logging as diffusers_logging

from engine import Engine, GenerationParams, Progress
from pipelines.flux import FluxBatchKey, FluxStepPipeline
from pipelines.interface import StepPipeline
from pipelines.latent_preview import fit_projection, projection_for
from pipelines.loader import load_pipeline
from pipelines.studio_config import StudioConfig
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
from tests.tiny_checkpoints import T5_LENGTH, build_tiny_flux, build_tiny_flux_dev

diffusers_logging.set_verbosity_error()
diffusers_logging.disable_progress_bar()

STUDIO_CONFIG = {
    "height": SIZE,
    "width": SIZE,
    "max_sequence_length": T5_LENGTH,
    "num_inference_steps": 4,
    "guidance_scale": 1.0,
    "negative_prompt": "",
    "example_prompts": ["a red circle"],
}


def flux_arguments(p: GenerationParams) -> dict:
    """FluxPipeline.__call__'s guidance for our one guidance_scale (see pipelines/flux.py)."""
    if p.guidance_scale > 1 and p.negative_prompt is not None:
        return {"true_cfg_scale": p.guidance_scale, "negative_prompt": p.negative_prompt, "max_sequence_length": T5_LENGTH}
    return {"max_sequence_length": T5_LENGTH}


# ---------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def schnell(tmp_path_factory):
    """A schnell-style tiny FLUX (no guidance embedding) with a stepstudio.json: ours and stock."""
    folder = tmp_path_factory.mktemp("tiny-flux") / "model"
    return tiny_family(folder, build_tiny_flux, FluxPipeline, flux_arguments, STUDIO_CONFIG)


@pytest.fixture(scope="session")
def dev(tmp_path_factory):
    """A dev-style tiny FLUX (guidance embedding), without stepstudio.json: ours and stock."""
    folder = tmp_path_factory.mktemp("tiny-flux-dev") / "model"
    arguments = lambda p: {"guidance_scale": p.guidance_scale, "max_sequence_length": T5_LENGTH}  # noqa: E731
    return tiny_family(folder, build_tiny_flux_dev, FluxPipeline, arguments)


@pytest.fixture(scope="session")
def flux(schnell):
    return schnell.pipeline


@pytest.fixture(scope="session")
def flux_dev(dev):
    return dev.pipeline


# ---------------------------------------------------------------------------- parity
def test_engine_batch_of_one_matches_flux_pipeline(flux, schnell):
    p = request(seed=7, num_inference_steps=5)
    with Run(flux) as run:
        ours = finished(run, run.submit(p))
    assert ours[1].shape == (SIZE, SIZE, 3)
    assert_same(ours, schnell.reference(p))
    assert run.forwards.rows == [1] * 5


def test_step_protocol_matches_flux_pipeline_output_tensor(flux, schnell):
    p = request(seed=11, num_inference_steps=6)
    [state] = drive(flux, [(0, p)])
    assert_step_outputs_match(schnell, state, p)


def test_cobatched_requests_with_staggered_arrivals_match_their_solo_runs(flux, schnell):
    requests = [
        (0, request("a red circle", seed=1, num_inference_steps=6)),
        (2, request("a blue square on the left", seed=2, num_inference_steps=3)),
        (3, request("a green triangle", seed=3, num_inference_steps=5, guidance_scale=3.0, negative_prompt="blurry")),  # true CFG row
    ]
    with ForwardLog(flux) as log:
        states = drive(flux, requests)
    # One forward per step; the CFG request adds its negative row to it.
    assert log.rows == [1, 1, 2, 4, 4, 3, 2, 2]
    for (_, p), state in zip(requests, states):
        assert state.step_index == p.num_inference_steps
        assert_step_outputs_match(schnell, state, p)


def test_engine_cobatches_mid_run_arrivals_and_matches_flux_pipeline(flux, schnell):
    first = request("a red circle", seed=1, num_inference_steps=8)
    joiners = {  # forward number during which each one is submitted
        1: request("a blue square on the left", seed=2, num_inference_steps=4),
        3: request("a green triangle", seed=3, num_inference_steps=5, guidance_scale=3.0, negative_prompt="blurry"),
    }
    with Run(flux, arrivals=joiners) as run:
        results = [finished(run, run.submit(first))]  # the longest: the others arrived meanwhile
        results += [finished(run, handle) for handle in run.handles[1:]]
        joined_batch_sizes = [
            [e.batch_size for e in handle.events(timeout=1) if isinstance(e, Progress)] for handle in run.handles[1:]
        ]
    # Joiner 1 runs in forwards 2..5, joiner 3 in forwards 4..8, the first request in 1..8.
    assert joined_batch_sizes == [[2, 2, 3, 3], [3, 3, 2, 2, 2]]
    assert run.forwards.rows == [1, 2, 2, 4, 4, 3, 3, 3]  # joiner 3's negative row rides along
    for p, ours in zip([first, *joiners.values()], results):
        assert_same(ours, schnell.reference(p))


def test_requests_joining_one_step_share_one_text_encoding_and_match_flux_pipeline(flux, schnell, monkeypatch):
    requests = [
        request("a red circle", seed=1, num_inference_steps=3, guidance_scale=3.0, negative_prompt="blurry"),  # true CFG
        request("a blue square", seed=2, num_inference_steps=4),
        request("a red circle", seed=3, num_inference_steps=3, guidance_scale=2.0, negative_prompt="blurry"),
    ]
    results, calls, run = run_joining_together(flux, requests, monkeypatch)
    assert calls == [["a red circle", "blurry", "a blue square"]]  # each distinct text once
    assert run.forwards.rows == [5, 5, 5, 1]  # three requests (two with CFG) in one forward
    # Each cached entry owns its memory (one text's rows), not a view into the batch.
    for text in calls[0]:
        embeds, pooled, _ = flux.prompt_cache.encode(text)
        for tensor in (embeds, pooled):
            assert tensor.shape[0] == 1
            assert tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
    for p, ours in zip(requests, results):
        assert_same(ours, schnell.reference(p))
    # A repeated text comes from the cache: no text encoding at all.
    _, again, _ = run_joining_together(
        flux, [request("a blue square", seed=4, num_inference_steps=2)], monkeypatch, keep_cache=True
    )
    assert again == []


def test_true_cfg_with_negative_prompt_matches_flux_pipeline(flux, schnell):
    p = request("a red circle", seed=5, num_inference_steps=4, guidance_scale=4.0, negative_prompt="blurry")
    [state] = drive(flux, [(0, p)])
    assert state.conditioning.cfg
    assert_step_outputs_match(schnell, state, p)
    no_cfg = request("a red circle", seed=5, num_inference_steps=4, guidance_scale=1.0, negative_prompt="blurry")
    [plain] = drive(flux, [(0, no_cfg)])
    assert not plain.conditioning.cfg
    assert (plain.latents - state.latents).abs().max().item() > 1e-3  # CFG really changed the result


def test_guidance_embedding_model_matches_flux_pipeline_with_per_row_scales(flux_dev, dev):
    assert flux_dev.guidance_embeds and not flux_dev.info.uses_negative_prompt
    requests = [
        (0, request("a red circle", seed=1, num_inference_steps=4, guidance_scale=3.5)),
        (1, request("a blue square", seed=2, num_inference_steps=3, guidance_scale=7.0)),
    ]
    with ForwardLog(flux_dev) as log:
        states = drive(flux_dev, requests)
    assert log.rows == [1, 2, 2, 2]
    for (_, p), state in zip(requests, states):
        assert_step_outputs_match(dev, state, p)


def test_requests_share_a_batch_key_across_steps_seeds_prompts_guidance_and_sizes(flux):
    # Rows of different sizes run packed (pipelines/flux_packed.py), so the key holds no size.
    assert flux.packs
    a = request("a red circle", seed=1, num_inference_steps=4, guidance_scale=1.0)
    b = request("a blue square", seed=9, num_inference_steps=20, guidance_scale=5.0, negative_prompt="blurry")
    wider = request(width=SIZE * 2)
    assert flux.batch_key(a) == flux.batch_key(b) == flux.batch_key(wider) == FluxBatchKey(None, None, T5_LENGTH)


def test_without_packing_only_requests_of_one_size_share_a_key(flux, monkeypatch):
    monkeypatch.setitem(flux.__dict__, "packs", False)  # as with another attention backend
    a, wider = request(seed=1), request(seed=2, width=SIZE * 2)
    assert flux.batch_key(a) == FluxBatchKey(SIZE, SIZE, T5_LENGTH)
    assert flux.batch_key(wider) == FluxBatchKey(SIZE, SIZE * 2, T5_LENGTH) != flux.batch_key(a)


# ---------------------------------------------------------------------------- preview
def test_engine_previews_are_small_rgb_images_on_the_latent_grid(flux):
    engine = Engine(flux, mode="step", max_batch_requests=8).start()
    try:
        handle = engine.submit(request(seed=3, num_inference_steps=4, preview_every=1), session_id="a")
        previews = [e.preview for e in handle.events(timeout=60) if isinstance(e, Progress) and e.preview is not None]
    finally:
        engine.close()
    latent_grid = SIZE // flux.vae_scale_factor
    assert len(previews) == 3  # every step but the last, which is decoded instead
    for preview in previews:
        assert preview.mode == "RGB" and preview.size == (latent_grid, latent_grid)
    assert not np.array_equal(np.asarray(previews[0]), np.asarray(previews[-1]))


class PatchColourVae(torch.nn.Module):
    """A stand-in VAE whose encoder is linear in each patch's mean colour (3 -> 4 channels),
    so a correct least-squares fit must recover the colours almost exactly."""

    def __init__(self, scale: int = 2) -> None:
        super().__init__()
        self.scale = scale
        self.mix = torch.nn.Conv2d(3, 4, kernel_size=1)
        with torch.no_grad():
            mix = torch.tensor([[1.0, 0.5, 0.0], [0.0, 1.0, -0.5], [0.3, 0.0, 1.0], [1.0, 1.0, 1.0]])
            self.mix.weight.copy_(mix[..., None, None])
            self.mix.bias.copy_(torch.tensor([0.1, -0.2, 0.0, 0.3]))
        self.config = type("Config", (), {"latent_channels": 4, "scaling_factor": 1.5, "shift_factor": 0.1})()

    def encode(self, images):
        mean = self.mix(torch.nn.functional.avg_pool2d(images, self.scale))
        return type("Encoded", (), {"latent_dist": type("Dist", (), {"mean": mean})()})()


def test_fitted_preview_projection_recovers_colours_from_latents():
    vae = PatchColourVae()
    projection = fit_projection(vae, vae_scale_factor=2)
    assert projection.source == "fitted" and projection.factors.shape == (4, 3)
    ramp = torch.linspace(-1, 1, SIZE)
    across, down = ramp[None, :].expand(SIZE, SIZE), ramp[:, None].expand(SIZE, SIZE)
    image = torch.stack([across, down, -across])
    with torch.no_grad():
        normalized = (vae.encode(image[None]).latent_dist.mean - 0.1) * 1.5
    preview = np.asarray(projection.render(normalized[0]), dtype=np.float64) / 255.0
    target = torch.nn.functional.avg_pool2d((image[None] + 1) / 2, 2)[0].permute(1, 2, 0).numpy()
    assert preview.shape == target.shape == (SIZE // 2, SIZE // 2, 3)
    assert np.abs(preview - target).max() <= 1 / 255 + 1e-6  # uint8 rounding only


def test_a_random_vae_gets_a_fitted_preview_projection(flux):
    assert flux.preview_projection.source == "fitted" and flux.info.extras["preview"] == "fitted"


def test_the_released_flux_vae_gets_its_published_preview_factors():
    vae = PatchColourVae()
    vae.config = type("Config", (), {"latent_channels": 16, "scaling_factor": 0.3611, "shift_factor": 0.1159})()
    projection = projection_for(vae, StudioConfig(), vae_scale_factor=8)
    assert projection.source == "flux-vae" and projection.factors.shape == (16, 3)
    # Zero latents (the VAE's mean colour) preview as a mid grey, as on the real model.
    assert np.asarray(projection.render(torch.zeros(16, 4, 4))).mean() == pytest.approx(117, abs=10)


def test_preview_factors_from_stepstudio_json_are_used(flux):
    studio = StudioConfig(preview_rgb_factors=((0.0, 0.0, 0.0),) * 4, preview_rgb_bias=(1.0, 0.0, 0.0))
    red = FluxStepPipeline(flux.pipe, flux.device, "red", studio)
    assert red.info.extras["preview"] == "stepstudio.json"
    [state] = drive(red, [(0, request(num_inference_steps=2, preview_every=1))])
    assert np.unique(np.asarray(red.preview(state)).reshape(-1, 3), axis=0).tolist() == [[255, 0, 0]]


# ---------------------------------------------------------------------------- defaults, words, validation
def test_stepstudio_json_sets_serving_defaults(flux):
    defaults = flux.info.defaults
    assert (defaults.width, defaults.height, defaults.num_inference_steps) == (SIZE, SIZE, 4)
    assert defaults.guidance_scale == 1.0 and defaults.negative_prompt == ""
    assert defaults.example_prompts == ("a red circle",)
    assert flux.max_sequence_length == T5_LENGTH
    assert flux.info.family == "flux" and flux.info.schedulers == ("flow-match-euler",)
    assert flux.info.size_multiple == 4 and flux.info.uses_negative_prompt
    assert isinstance(flux, StepPipeline)


def test_without_stepstudio_json_real_flux_defaults_apply(flux_dev):
    defaults = flux_dev.info.defaults
    assert (defaults.num_inference_steps, defaults.guidance_scale) == (28, 3.5)  # FLUX.1-dev's
    assert defaults.width == defaults.height == 128 * flux_dev.vae_scale_factor  # FluxPipeline's default size
    assert flux_dev.max_sequence_length == T5_LENGTH  # capped by what the tokenizer holds


def test_vocabulary_lowercases_prompts_and_reports_unknown_words(flux):
    studio = StudioConfig(vocabulary=frozenset({"a", "red", "circle", "blue", "square"}))
    worded = FluxStepPipeline(flux.pipe, flux.device, "worded", studio)
    unknown = worded.unknown_words("A Red circle, purple hexagon and a purple star")
    assert unknown == ["purple", "hexagon", "and", "star"]
    assert worded.unknown_words("a RED circle") == []
    assert set(worded.info.extras["vocabulary"].split()) == set(studio.vocabulary)
    upper, lower = drive(
        worded, [(0, request("A RED Circle", seed=4, num_inference_steps=2)), (0, request("a red circle", seed=4, num_inference_steps=2))]
    )
    assert torch.equal(upper.latents, lower.latents)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"width": 30}, "width=30 is not allowed: FLUX needs a multiple of 4"),
        ({"height": 34}, "height=34 is not allowed: FLUX needs a multiple of 4"),
        ({"num_frames": 2}, "num_frames=2"),
        ({"scheduler": "ddim"}, "scheduler='ddim' is not a noise scheduler this model offers; allowed are: flow-match-euler"),
    ],
)
def test_validate_names_the_field_the_value_and_what_is_allowed(flux, change, message):
    fields = dict(prompt="a red circle", width=SIZE, height=SIZE, num_frames=1, num_inference_steps=4,
                  guidance_scale=1.0, seed=1)
    fields.update(change)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        flux.validate(GenerationParams(**fields))
    engine = Engine(flux)  # the engine refuses it at submit time, before queuing
    with pytest.raises(ValueError, match="not allowed|not a noise scheduler"):
        engine.submit(GenerationParams(**fields))


# ---------------------------------------------------------------------------- loading errors
def test_unsupported_model_class_is_a_clear_error(tmp_path):
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "KandinskyPipeline"}))
    with pytest.raises(ValueError, match="'KandinskyPipeline' is not supported.*FluxPipeline"):
        load_pipeline(str(tmp_path))


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="neither an existing folder nor a hub id"):
        load_pipeline(str(tmp_path / "no" / "such" / "model"))


def test_folder_without_model_index_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no model_index.json"):
        load_pipeline(str(tmp_path))


def test_corrupt_weights_are_a_clear_error(schnell, tmp_path):
    broken = shutil.copytree(schnell.folder, tmp_path / "broken")
    (broken / "transformer" / "diffusion_pytorch_model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="could not load .*broken as a FLUX checkpoint"):
        load_pipeline(str(broken))


def test_missing_component_is_a_clear_error(schnell, tmp_path):
    broken = shutil.copytree(schnell.folder, tmp_path / "partial")
    shutil.rmtree(broken / "vae")
    with pytest.raises(ValueError, match="could not load .*partial as a FLUX checkpoint"):
        load_pipeline(str(broken))


def test_the_engine_counts_a_cfg_request_as_two_rows_and_a_guidance_embedding_one_as_one(tmp_path):
    from pipelines.loader import load_pipeline
    from tests.tiny_checkpoints import build_tiny_flux, build_tiny_flux_dev

    schnell = load_pipeline(str(build_tiny_flux(tmp_path / "schnell")))
    dev = load_pipeline(str(build_tiny_flux_dev(tmp_path / "dev")))
    cfg = GenerationParams(prompt="a red circle", negative_prompt="", guidance_scale=3.0, width=32, height=32,
                           num_inference_steps=4, num_frames=1, seed=0)
    tokens = (32 // schnell.info.size_multiple) ** 2  # one token per size_multiple pixels along each side
    assert schnell.forward_size(cfg) == (2, tokens)
    assert schnell.forward_size(GenerationParams(**{**cfg.__dict__, "guidance_scale": 1.0})) == (1, tokens)
    assert dev.forward_size(cfg) == (1, tokens)  # guidance is embedded: no negative row

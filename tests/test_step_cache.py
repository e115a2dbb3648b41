"""Per-row step caching (pipelines/step_cache.py) on the built-in models, through the engine.

What must hold: with nothing skipped the cached path is bit-for-bit the uncached forward; with a
threshold of 0 nothing of the cache runs at all; with caching on, a request skips the same steps
and makes the same pixels (within float noise) alone or co-batched with others (other prompts,
thresholds, step counts, adapters, a request joining mid-way), in step mode and in request mode;
both rows of a CFG request skip together; and the engine counts the skips.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from PIL import Image

from engine import Completed, Engine, GenerationParams, ServingLimits
from pipelines.errors import ParamError
from pipelines.interface import Batch, ModelDefaults, RequestState, resolve_defaults
from pipelines.loader import load_pipeline
from pipelines.lora_files import BUILTIN_LORA_DIR
from pipelines.lora_request import LoraUse
from pipelines.step_cache import DEFAULT_RULE, RowStepCache
from tools.moving_shapes_world import caption as video_caption
from tools.moving_shapes_world import held_out_specs
from tools.shapes_world import example_prompts

PROMPTS = example_prompts(4, seed=31)
VIDEO_PROMPTS = [video_caption(spec) for spec in held_out_specs()[:3]]
THRESHOLD = 0.2  # the built-in image model skips about half its steps at this threshold (docs/benchmarks.md)
PIXEL_TOLERANCE = 2  # of 255: float noise of another batch composition, through the VAE


@pytest.fixture(scope="module")
def image():
    pipeline = load_pipeline("builtin")
    pipeline.load_lora("outline", BUILTIN_LORA_DIR / "shapes-flux" / "outline.safetensors")
    return pipeline


@pytest.fixture(scope="module")
def video():
    return load_pipeline("builtin-video")


def request(prompt: str, seed: int, step_cache: float = THRESHOLD, **fields) -> GenerationParams:
    return GenerationParams(prompt=prompt, seed=seed, step_cache=step_cache, **fields)


def run(pipeline, requests: list[GenerationParams], mode: str = "step", max_batch: int = 8,
        join_after: dict[int, int] | None = None) -> list[Completed]:
    """Each request to one engine, all submitted before it starts, except those in `join_after`
    (request index -> the forward after which it is submitted: it joins mid-way)."""
    join_after = join_after or {}
    limits = ServingLimits(max_queue=64, max_per_session=64)
    engine = Engine(pipeline, mode=mode, max_batch_requests=max_batch, limits=limits)
    handles = {i: engine.submit(p, session_id=f"s{i}") for i, p in enumerate(requests) if i not in join_after}
    joined = {index: threading.Event() for index in join_after}
    forwards = []
    denoise_step = pipeline.denoise_step

    def counting(batch):
        output = denoise_step(batch)
        forwards.append(len(batch))
        for index, after in join_after.items():
            if len(forwards) == after:
                handles[index] = engine.submit(requests[index], session_id=f"s{index}")
                joined[index].set()
        return output

    pipeline.denoise_step = counting
    try:
        engine.start()
        for index, event in joined.items():
            assert event.wait(600), f"request {index} never joined"
        finals = [handles[i].result(timeout=600) for i in range(len(requests))]
    finally:
        del pipeline.denoise_step
        engine.close()
    for final in finals:
        assert isinstance(final, Completed), final
    return finals


def pixels(final: Completed) -> np.ndarray:
    return np.stack([np.asarray(frame, np.int16) for frame in final.images])


def assert_same_request(alone: Completed, together: Completed) -> None:
    assert together.skipped_steps == alone.skipped_steps
    assert np.abs(pixels(together) - pixels(alone)).max() <= PIXEL_TOLERANCE


def denoised(pipeline, params: list[GenerationParams]) -> list[RequestState]:
    """The step protocol by hand: every request in every forward until all are denoised."""
    engine = Engine(pipeline)  # parameter resolution only; never started
    states = []
    for i, p in enumerate(params):
        state = RequestState(request_id=str(i), params=engine.prepare_params(p))
        pipeline.prepare_encode(state)
        states.append(state)
    while not all(s.is_denoised for s in states):
        live = tuple(s for s in states if not s.is_denoised)
        for state, prediction in zip(live, pipeline.denoise_step(Batch(live))):
            pipeline.step_scheduler(state, prediction)
    return states


# ----------------------------------------------------------------------------- off, and nothing skipped
def test_a_threshold_of_zero_runs_no_cache_code(image, monkeypatch):
    entered = []
    applied = RowStepCache.applied
    monkeypatch.setattr(RowStepCache, "applied", lambda *args: entered.append(1) or applied(*args))
    states = denoised(image, [request(p, 5 + i, step_cache=0) for i, p in enumerate(PROMPTS[:2])])
    assert entered == [] and all(s.skipped_steps == [] and s.extra.step_cache is None for s in states)
    denoised(image, [request(PROMPTS[0], 5)])
    assert entered  # the same spy sees a cached forward


@pytest.mark.parametrize("rule", ["first-block", "teacache"])
def test_caching_that_skips_nothing_is_bit_for_bit_the_uncached_forward(image, rule):
    """A threshold no change stays under: every row computes, through the cache's own block loop
    (gathered, run, scattered), and the latents equal the uncached ones exactly."""
    image.step_cache.rule = rule
    try:
        params = [request(p, 7 + i, num_inference_steps=6, step_cache=0) for i, p in enumerate(PROMPTS)]
        off = denoised(image, params)
        on = denoised(image, [GenerationParams(**{**p.__dict__, "step_cache": 1e-9}) for p in params])
    finally:
        image.step_cache.rule = DEFAULT_RULE
    assert all(s.skipped_steps == [] for s in on)
    for a, b in zip(off, on):
        assert torch.equal(a.latents, b.latents)


# ----------------------------------------------------------------------------- alone = co-batched
@pytest.mark.parametrize("rule", ["first-block", "teacache"])
def test_a_cached_request_skips_the_same_steps_and_makes_the_same_image_alone_or_co_batched(image, rule):
    image.step_cache.rule = rule
    try:
        mine = request(PROMPTS[0], 11)
        alone = run(image, [mine])[0]
        others = [
            request(PROMPTS[1], 12, step_cache=0.1),
            request(PROMPTS[2], 13, step_cache=0),  # uncached: always computes
            request(PROMPTS[3], 14, step_cache=0.4, num_inference_steps=12),
            request(PROMPTS[1], 15, step_cache=0.3, guidance_scale=1.0),  # no CFG: one row
            request(PROMPTS[2], 16, step_cache=0.2),  # joins after 6 forwards
        ]
        together = run(image, [mine] + others, join_after={5: 6})
        others_alone = [run(image, [params])[0] for params in others]
    finally:
        image.step_cache.rule = DEFAULT_RULE
    assert 3 <= len(alone.skipped_steps) <= 17, alone.skipped_steps  # it does skip, and not everything
    assert_same_request(alone, together[0])
    for final_alone, final in zip(others_alone, together[1:]):
        assert_same_request(final_alone, final)


def test_step_mode_and_request_mode_make_the_same_skips_and_pixels(image):
    """Step mode: the fourth request joins when the 12-step one leaves, beside the others mid-run;
    request mode: it waits for the first three to finish and runs alone."""
    requests = [request(p, 21 + i, step_cache=(0.1, 0.2, 0.3, 0.2)[i], num_inference_steps=(20, 12, 20, 20)[i])
                for i, p in enumerate(PROMPTS)]
    step = run(image, requests, mode="step", max_batch=3)
    whole = run(image, requests, mode="request", max_batch=3)
    assert any(final.skipped_steps for final in step)
    for a, b in zip(step, whole):
        assert_same_request(a, b)


def test_both_rows_of_a_cfg_request_skip_together_and_the_engine_counts_them(image):
    engine = Engine(image, max_batch_requests=8)
    handles = [engine.submit(request(PROMPTS[0], 31), session_id="a"),                        # CFG: 2 rows
               engine.submit(request(PROMPTS[1], 32, guidance_scale=1.0), session_id="b")]   # 1 row
    engine.start()
    try:
        finals = [h.result(timeout=600) for h in handles]
        stats = engine.snapshot().stats
        metrics = engine.metrics.registry
    finally:
        engine.close()
    cfg, plain = (len(f.skipped_steps) for f in finals)
    assert cfg and plain
    assert stats.rows_skipped == 2 * cfg + plain
    assert stats.rows_computed == 2 * (20 - cfg) + (20 - plain)
    assert metrics.get_sample_value("stepstudio_rows_skipped_total") == stats.rows_skipped
    assert metrics.get_sample_value("stepstudio_rows_computed_total") == stats.rows_computed
    assert metrics.get_sample_value("stepstudio_forward_rows_skipped_sum") == stats.rows_skipped


def test_lora_rows_keep_their_own_adapters_when_other_rows_skip(image):
    """The rows that compute are gathered: each keeps its own adapter deltas, and an uncached row
    next to a skipping LoRA row gets none of its deltas."""
    outlined = request(PROMPTS[0], 41, loras=(LoraUse("outline", 1.0),))
    plain = request(PROMPTS[1], 42, step_cache=0)
    half = request(PROMPTS[2], 43, step_cache=0.3, loras=(LoraUse("outline", 0.5),))
    alone = [run(image, [p])[0] for p in (outlined, plain, half)]
    together = run(image, [outlined, plain, half])
    assert alone[0].skipped_steps and alone[2].skipped_steps
    for a, b in zip(alone, together):
        assert_same_request(a, b)


# ----------------------------------------------------------------------------- the video model
@pytest.mark.parametrize("rule", ["first-block", "teacache"])
def test_video_requests_skip_the_same_steps_alone_or_co_batched(video, rule):
    video.step_cache.rule = rule
    try:
        requests = [request(p, 51 + i, step_cache=(0.4, 0.3, 0)[i], num_inference_steps=10)
                    for i, p in enumerate(VIDEO_PROMPTS)]
        alone = [run(video, [p])[0] for p in requests]
        together = run(video, requests)
    finally:
        video.step_cache.rule = DEFAULT_RULE
    assert alone[0].skipped_steps and not alone[2].skipped_steps
    for a, b in zip(alone, together):
        assert_same_request(a, b)


# ----------------------------------------------------------------------------- refused values
@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan"), "0.1", True])
def test_a_bad_threshold_is_refused_naming_the_field(value):
    with pytest.raises(ParamError, match="step_cache") as error:
        GenerationParams(prompt="a red circle", step_cache=value)
    assert error.value.field == "step_cache"


def test_a_model_without_step_caching_refuses_a_threshold_but_takes_zero():
    engine = Engine(load_pipeline("toy"))
    with pytest.raises(ParamError, match="does not cache steps") as error:
        engine.prepare_params(GenerationParams(prompt="a red circle", step_cache=0.1))
    assert error.value.field == "step_cache"
    assert engine.prepare_params(GenerationParams(prompt="a red circle", step_cache=0)).step_cache == 0


def test_the_models_default_threshold_is_for_requests_from_noise_a_picture_asks_for_its_own():
    defaults = ModelDefaults(64, 64, 20, 3.0, step_cache=0.1)
    picture = Image.new("RGB", (64, 64), (40, 80, 200))
    assert resolve_defaults(GenerationParams(prompt="a circle"), defaults).step_cache == 0.1
    assert resolve_defaults(GenerationParams(prompt="a circle", init_image=picture), defaults).step_cache == 0.0
    asked = GenerationParams(prompt="a circle", init_image=picture, step_cache=0.3)
    assert resolve_defaults(asked, defaults).step_cache == 0.3
    assert resolve_defaults(GenerationParams(prompt="a circle", step_cache=0.0), defaults).step_cache == 0.0

"""Memory plans on the CPU (pipelines/memory_plan.py, memory_placement.py, component_placement.py):
each plan's latents against resident's after every step, alone and co-batched; the engine moving
each offloaded component once per encode or decode group, with requests joining every step.

On the CPU the device is host memory, so a plan saves nothing here: what is checked is that the
plans compute the same thing and move what they should, when they should (the trips are counted
even where a trip copies nothing). The memory itself is the GPU check's (benchmarks/gpu_plans.py).
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from engine import Completed, Engine, GenerationParams, Started
from pipelines.interface import Batch, RequestState, resolve_defaults
from pipelines.loader import LoadOptions, load_models, load_pipeline
from pipelines.memory_placement import FP8_STORAGE

STEPS = 4
# fp8 (e4m3) keeps 3 mantissa bits: the built-in model's latents differ from resident's by at most
# this relative RMS at any step (measured 0.015-0.054 over 4 steps on three prompts, text encoders
# in float8 too).
FP8_RELATIVE_TOLERANCE = 0.1


def _params(prompt: str, seed: int, **extra) -> GenerationParams:
    return GenerationParams(prompt=prompt, seed=seed, num_inference_steps=STEPS, **extra)


def _latents_per_step(pipeline, params: list[GenerationParams]) -> list[list[torch.Tensor]]:
    """Each request's latents after every step, the requests co-batched in every forward."""
    states = []
    for index, request in enumerate(params):
        state = RequestState(request_id=str(index), params=resolve_defaults(request, pipeline.info.defaults))
        pipeline.prepare_encode(state)
        states.append(state)
    history = [[] for _ in states]
    for _ in range(STEPS):
        predictions = pipeline.denoise_step(Batch(tuple(states)))
        for index, (state, prediction) in enumerate(zip(states, predictions)):
            pipeline.step_scheduler(state, prediction)
            history[index].append(state.latents.clone())
    return history


@pytest.fixture(scope="module")
def resident():
    return load_pipeline("builtin", LoadOptions(memory="resident"))


@pytest.fixture(scope="module")
def requests():
    return [_params("a small red circle on a blue background, top left", 1),  # the built-in model's prompt form
            _params("a small green triangle on a white background, center", 2),
            _params("a large yellow square on a black background, bottom", 3)]


def test_offload_keeps_text_encoders_and_vae_in_host_memory_and_computes_the_same_latents(resident, requests):
    offloaded = load_pipeline("builtin", LoadOptions(memory="offload"))
    assert offloaded.memory_plan == "offload" and offloaded.placement.offloaded == ("text_encoders", "vae")
    for alone in requests:
        assert [torch.equal(a, b) for a, b in zip(_latents_per_step(offloaded, [alone])[0],
                                                  _latents_per_step(resident, [alone])[0])] == [True] * STEPS
    together = _latents_per_step(offloaded, requests)
    expected = _latents_per_step(resident, requests)
    assert all(torch.equal(a, b) for got, want in zip(together, expected) for a, b in zip(got, want))
    # Outside an engine stage every use is its own trip: one per prompt encoded (each once: the
    # prompt cache has them for the co-batched run).
    assert offloaded.placement.moves["text_encoders"] == len(requests)


def test_fp8_stores_the_denoiser_in_float8_and_stays_close_to_resident(resident, requests):
    fp8 = load_pipeline("builtin", LoadOptions(memory="fp8"))
    linear = fp8.denoiser.transformer_blocks[0].attn.to_q  # norms and embedders keep the serving dtype
    assert linear.weight.dtype == FP8_STORAGE and fp8.dtype == torch.float32 and fp8.denoiser.dtype == torch.float32
    got, want = _latents_per_step(fp8, requests), _latents_per_step(resident, requests)
    worst = max(((a - b).norm() / b.norm()).item() for g, w in zip(got, want) for a, b in zip(g, w))
    assert 0 < worst < FP8_RELATIVE_TOLERANCE, worst  # float8 changes something, and not much


def test_lowvram_adds_block_offloading_to_fp8_and_computes_exactly_what_fp8_does(requests):
    fp8 = load_pipeline("builtin", LoadOptions(memory="fp8"))
    lowvram = load_pipeline("builtin", LoadOptions(memory="lowvram"))
    block = lowvram.denoiser.transformer_blocks[0]
    assert "group_offloading" in getattr(block, "_diffusers_hook").hooks  # diffusers' block-level hook
    got, want = _latents_per_step(lowvram, requests), _latents_per_step(fp8, requests)
    assert all(torch.equal(a, b) for g, w in zip(got, want) for a, b in zip(g, w))


def test_every_plans_picture_through_the_engine(resident):
    """The engine's images under each plan against resident's: equal for offload, close for fp8.
    The requests are queued before the engine starts, so under every plan they share the same
    forwards (forwards of other batch sizes may sum in another order: not bitwise equal)."""
    pictures = {}
    for plan in ("resident", "offload", "fp8"):
        (pipeline,) = load_models(("builtin",), LoadOptions(memory=plan))
        with contextlib.closing(Engine(pipeline)) as engine:
            handles = [engine.submit(_params(f"a small red circle on a blue background, {where}", seed))
                       for seed, where in enumerate(("top left", "center", "bottom"))]
            engine.start()
            pictures[plan] = [torch.from_numpy(np.asarray(h.result(timeout=120).images[0], dtype=np.float32))
                              for h in handles]
    assert all(torch.equal(a, b) for a, b in zip(pictures["offload"], pictures["resident"]))
    fp8_change = max((a - b).abs().mean().item() for a, b in zip(pictures["fp8"], pictures["resident"]))
    assert 0 < fp8_change < 2.0, fp8_change  # levels of 255, on average over the picture


def test_the_engine_moves_each_offloaded_component_once_per_encode_or_decode_group():
    """Three requests join at once (one encode group, one decode group), then requests join a
    running one at steps of their own: the text encoders move once per step that has joiners, the
    VAE once per step that has finished requests; never once per request. The decodes run one
    by one (batched_decodes=False: three VAE calls in the group, as requests of different sizes
    make): the stage keeps the VAE on the device for all of them."""
    (pipeline,) = load_models(("builtin",), LoadOptions(memory="offload"))
    moves = pipeline.placement.moves
    with contextlib.closing(Engine(pipeline, batched_decodes=False).start()) as engine:
        engine.pause_engine()
        together = [engine.submit(_params(f"a blue square, {seed}", seed)) for seed in range(3)]
        engine.resume_engine()
        assert all(isinstance(handle.result(timeout=120), Completed) for handle in together)
        assert (moves["text_encoders"], moves["vae"]) == (1, 1)  # three encodes, three decodes

        first = engine.submit(GenerationParams(prompt="a long one", seed=9, num_inference_steps=10 * STEPS))
        next(event for event in first.events(timeout=120) if getattr(event, "step", None) == 1)
        joiners = []
        for index in range(3):  # each joins at its own step, after the one before it started
            joiners.append(engine.submit(_params(f"a joiner, {index}", index)))
            next(event for event in joiners[-1].events(timeout=120) if isinstance(event, Started))
        assert all(isinstance(handle.result(timeout=120), Completed) for handle in joiners + [first])
    # The long one and each joiner encode at their own steps; each joiner (STEPS steps, started at
    # its own step) and the long one (10 x STEPS) finish at their own steps.
    assert moves["text_encoders"] == 1 + 1 + len(joiners)
    assert moves["vae"] == 1 + 1 + len(joiners)

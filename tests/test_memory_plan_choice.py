"""`--memory auto`'s choice for given free-memory figures (pipelines/memory_plan.choose_plan).

The model is FLUX.1-dev as `--memory auto` reads it (its transformer, CLIP-L, T5-XXL and VAE built
on the meta device from their released configs: benchmarks/memory_table.py), at the engine's
default limit of 16 rows of 4096 tokens; then exact arithmetic on round figures.
"""

from __future__ import annotations

import pytest

from benchmarks.memory_table import FAMILIES, engine_tokens, model_bytes
from pipelines.memory_plan import GIB, ModelBytes, PlanDoesNotFit, choose_plan, usable

FLUX = FAMILIES[0]
ONE = FLUX.tokens_per_request  # 4096 tokens: one 1024x1024 request


@pytest.fixture(scope="module")
def flux() -> ModelBytes:
    return model_bytes(FLUX)


def test_flux_dev_is_read_as_its_released_sizes(flux):
    # 11.9B transformer parameters in bf16; CLIP-L and T5-XXL's encoder; the 16-channel VAE.
    assert round(flux.denoiser / GIB, 1) == 22.2 and round(flux.text_encoders / GIB, 1) == 9.1
    assert round(flux.vae / GIB, 2) == 0.16
    # float8 halves the castable layers only: the AdaLN "norm" linears, embeddings and T5's `wo` stay.
    assert round(flux.denoiser_fp8 / GIB, 1) == 14.1 and round(flux.text_encoders_fp8 / GIB, 1) == 5.6


@pytest.mark.parametrize("card_free_gib, plan, lowered", [
    (79.4, "resident", False),  # an 80 GB card: everything on it, the whole batch
    (40.0, "resident", True),  # resident at a smaller batch beats moving 9 GiB of T5 per encode
    (23.4, "fp8", True),  # a 24 GB card: FLUX in float8, a batch a little under the default
    (15.4, "lowvram", False),  # 16 GB: the float8 denoiser does not fit whole, its blocks stream
    (11.4, "lowvram", False),
    (7.4, "lowvram", True),  # 8 GB: fits, with fewer requests a forward
])
def test_auto_picks_the_fastest_plan_that_fits(flux, card_free_gib, plan, lowered):
    free = int(card_free_gib * GIB)
    choice = choose_plan(flux, free, engine_tokens(FLUX), ONE)
    assert (choice.plan, choice.lowered) == (plan, lowered)
    assert choice.needed <= usable(free) and choice.max_tokens >= ONE
    assert choice.needed == flux.peak(plan, choice.max_tokens)
    if lowered:  # the most tokens that fit: one more request's worth would not
        assert flux.peak(plan, choice.max_tokens + ONE) > usable(free)


def test_a_card_too_small_for_any_plan_is_told_what_the_smallest_needs(flux):
    with pytest.raises(PlanDoesNotFit, match=r"no memory plan fits this model in 4\.0 GiB of free device memory "
                                             r"\(3\.5 GiB usable\): the smallest, --memory lowvram, needs 6\.7 GiB"):
        choose_plan(flux, 4 * GIB, engine_tokens(FLUX), ONE)


def test_a_plan_asked_for_that_does_not_fit_names_one_that_does(flux):
    with pytest.raises(PlanDoesNotFit, match=r"--memory resident needs 31\.9 GiB of device memory for one request, "
                                             r"and 23\.4 GiB is free \(21\.5 GiB usable\): --memory fp8 fits\."):
        choose_plan(flux, int(23.4 * GIB), engine_tokens(FLUX), ONE, plan="resident")
    asked = choose_plan(flux, int(23.4 * GIB), engine_tokens(FLUX), ONE, plan="lowvram")  # fits: taken as asked
    assert (asked.plan, asked.lowered) == ("lowvram", False)


def test_the_arithmetic_on_round_figures():
    sizes = ModelBytes(denoiser=10 * GIB, denoiser_fp8=6 * GIB, largest_block_fp8=GIB // 4,
                       denoiser_outside_blocks_fp8=GIB // 2, text_encoders=4 * GIB, text_encoders_fp8=2 * GIB,
                       vae=GIB // 2, activation_per_token=GIB // 1024)  # 1 MiB a token
    # resident: 14.5 GiB of weights + the forward's 1 MiB x tokens
    assert sizes.peak("resident", 2048) == 14 * GIB + GIB // 2 + 2 * GIB
    # offload: the denoiser, + the largest of a forward and an encode group (text encoders + VAE)
    assert sizes.peak("offload", 1024) == 10 * GIB + 4 * GIB + GIB // 2
    assert sizes.peak("offload", 8192) == 10 * GIB + 8 * GIB
    # fp8: the float8 denoiser, + its encode group in float8
    assert sizes.peak("fp8", 1024) == 6 * GIB + 2 * GIB + GIB // 2
    # lowvram: what is outside the blocks, two blocks in flight
    assert sizes.weights_on_device("lowvram") == GIB
    free = 20 * GIB  # 18.4 GiB usable (8% kept)
    room = usable(free)
    assert room == free - int(free * 0.08)
    choice = choose_plan(sizes, free, max_tokens=8192, min_tokens=512)
    # resident holds (18.4 - 14.5) GiB / 1 MiB = 3993 tokens: fewer than half of 8192; offload holds 8192.
    assert (choice.plan, choice.max_tokens, choice.lowered) == ("offload", 8192, False)
    tight = choose_plan(sizes, 12 * GIB, max_tokens=8192, min_tokens=512)
    assert (tight.plan, tight.max_tokens) == ("fp8", (usable(12 * GIB) - 6 * GIB) // (GIB // 1024))
    with pytest.raises(ValueError, match="--memory 'gguf' is not one of auto, resident, offload, fp8, lowvram"):
        choose_plan(sizes, free, 8192, 512, plan="gguf")

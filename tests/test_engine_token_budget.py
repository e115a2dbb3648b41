"""The scheduler budgets tokens, not rows: with a model whose forwards pack rows of any size, one
large request and several small ones share a forward up to the token budget; a request larger
than the budget runs alone, never refused and never starved."""

import pytest

from engine import Completed, Engine, ServingLimits
from pipelines.toy import ToyPipeline
from tests.engine_helpers import engine_started_after, params, pixels, running_engine

LIMITS = ServingLimits(max_size=128)


def solo_pixels(p):
    with running_engine(ToyPipeline(packs=True), max_batch_requests=1, limits=LIMITS) as engine:
        return pixels(engine.submit(p).result(timeout=30))


def test_requests_of_three_sizes_share_every_forward():
    pipeline = ToyPipeline(packs=True)
    # 144 + 64 + 36 tokens: the largest is no outlier (not over twice the others together).
    submissions = [(params(size=96, steps=4, prompt="large"), "a"), (params(size=64, steps=4, prompt="mid"), "b"),
                   (params(size=48, steps=4, prompt="small"), "c")]
    with engine_started_after(submissions, pipeline, limits=LIMITS) as (engine, handles):
        results = [h.result(timeout=30) for h in handles]
        # The default budget: 8 requests of the model's default size (64x64: 64 tokens a row), two rows each.
        assert engine.token_budgets == {"toy": 8 * 2 * 64}
    assert pipeline.forward_log == [tuple(h.request_id for h in handles)] * 4
    for (p, _), final in zip(submissions, results):  # nobody's pixels moved by its batch-mates
        assert (pixels(final) == solo_pixels(p)).all()


def test_a_forward_holds_requests_up_to_the_token_budget():
    pipeline = ToyPipeline(packs=True)
    # 100 + 64 tokens fit a budget of 164; the third request (64) waits for room.
    submissions = [(params(size=80, steps=2, prompt="large"), "a"), (params(size=64, steps=4, prompt="one"), "b"),
                   (params(size=64, steps=2, prompt="two"), "c")]
    with engine_started_after(submissions, pipeline, limits=LIMITS, max_batch_tokens=164) as (_, (large, one, two)):
        assert all(isinstance(h.result(timeout=30), Completed) for h in (large, one, two))
    both = (large.request_id, one.request_id)
    later = (one.request_id, two.request_id)
    assert pipeline.forward_log == [both, both, later, later]


def test_a_request_larger_than_the_budget_runs_alone_and_is_not_passed_over():
    pipeline = ToyPipeline(packs=True)
    # Budget 128 tokens: the 128x128 request (256) fits no forward with anyone; it waits for the
    # running small one to finish, runs alone, and the small request behind it waits its turn.
    submissions = [(params(size=64, steps=2, prompt="first"), "a"), (params(size=128, steps=2, prompt="huge"), "b"),
                   (params(size=64, steps=2, prompt="after"), "c")]
    with engine_started_after(submissions, pipeline, limits=LIMITS, max_batch_tokens=128) as (_, (first, huge, after)):
        assert all(isinstance(h.result(timeout=30), Completed) for h in (first, huge, after))
    assert pipeline.forward_log == [(first.request_id,)] * 2 + [(huge.request_id,)] * 2 + [(after.request_id,)] * 2


def test_a_large_request_beside_one_small_one_sits_out_until_the_small_one_is_done():
    pipeline = ToyPipeline(packs=True)
    # 256 tokens beside 16: together the small one would step at the large one's pace.
    submissions = [(params(size=128, steps=3, prompt="large"), "a"), (params(size=32, steps=4, prompt="small"), "b")]
    with engine_started_after(submissions, pipeline, limits=LIMITS) as (_, (large, small)):
        results = [h.result(timeout=30) for h in (large, small)]
    assert pipeline.forward_log == [(small.request_id,)] * 4 + [(large.request_id,)] * 3
    for (p, _), final in zip(submissions, results):
        assert (pixels(final) == solo_pixels(p)).all()


def test_an_outlier_sits_out_at_most_four_of_its_own_steps_of_work_so_it_never_starves():
    pipeline = ToyPipeline(packs=True)
    # 64 tokens beside 16: it sits out until 16 forwards of the small one (4 x 64 tokens) ran
    # without it, then runs one step with it, and so on.
    submissions = [(params(size=64, steps=2, prompt="large"), "a"), (params(size=32, steps=40, prompt="small"), "b")]
    with engine_started_after(submissions, pipeline, limits=LIMITS) as (_, (large, small)):
        assert all(isinstance(h.result(timeout=30), Completed) for h in (large, small))
    alone, both = (small.request_id,), (large.request_id, small.request_id)
    assert pipeline.forward_log == ([alone] * 16 + [both]) * 2 + [alone] * 6


def test_a_model_that_cannot_pack_keeps_its_sizes_apart_under_any_budget():
    pipeline = ToyPipeline()  # batch key (width, height): sizes take turns
    submissions = [(params(size=64, steps=2, prompt="a"), "a"), (params(size=32, steps=2, prompt="b"), "b")]
    with engine_started_after(submissions, pipeline, max_batch_tokens=10_000) as (_, handles):
        assert all(isinstance(h.result(timeout=30), Completed) for h in handles)
    assert all(len(forward) == 1 for forward in pipeline.forward_log)


@pytest.mark.parametrize("value", [0, -5, True, 2.5])
def test_a_bad_budget_is_refused_naming_it(value):
    with pytest.raises(ValueError, match="max_batch_tokens"):
        Engine(ToyPipeline(), max_batch_tokens=value)

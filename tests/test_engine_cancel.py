"""Cancel takes effect at the next step boundary, frees the state, and only the owner may do it."""

import numpy as np
import pytest

from engine import Aborted, Completed, Engine
from pipelines.toy import ToyPipeline
from tests.engine_helpers import params, pixels, solo_pixels


def test_cancel_running_request_stops_its_forwards_and_skips_decode():
    pipeline = ToyPipeline()
    victim = {}

    def cancel_during_forward_3(index, batch):
        if index == 3:
            assert victim["handle"].request_id in batch.request_ids
            victim["handle"].cancel()

    pipeline.on_forward = cancel_during_forward_3
    survivor_params = params(seed=4, steps=8, prompt="survivor")
    engine = Engine(pipeline, max_batch_requests=4)
    victim["handle"] = engine.submit(params(seed=3, steps=8, prompt="victim"), session_id="v")
    survivor = engine.submit(survivor_params, session_id="s")
    engine.start()
    try:
        final = victim["handle"].result(timeout=30)
        survivor_final = survivor.result(timeout=30)
        assert engine.states_in_memory == 0
        assert engine.snapshot().stats.finished == {"aborted": 1, "completed": 1}
    finally:
        engine.close()
    victim_id = victim["handle"].request_id
    assert isinstance(final, Aborted) and (final.reason, final.cause) == ("cancelled by the user", "cancelled")
    # Forward 3 was already running when cancel came; none after it carries the victim.
    assert [i for i, f in enumerate(pipeline.forward_log) if victim_id in f] == [0, 1, 2, 3]
    assert [len(f) for f in pipeline.forward_log] == [2] * 4 + [1] * 4
    assert victim_id not in pipeline.decoded
    assert np.array_equal(pixels(survivor_final), solo_pixels(survivor_params))


def test_cancel_while_waiting_never_encodes_it():
    pipeline = ToyPipeline()
    waiting = {}

    def cancel_queued(index, batch):
        if index == 1:
            waiting["handle"].cancel()

    pipeline.on_forward = cancel_queued
    engine = Engine(pipeline, max_batch_requests=1)
    running = engine.submit(params(seed=1, steps=4), session_id="a")
    waiting["handle"] = engine.submit(params(seed=2, steps=4), session_id="b")
    engine.start()
    try:
        assert isinstance(waiting["handle"].result(timeout=30), Aborted)
        assert isinstance(running.result(timeout=30), Completed)
    finally:
        engine.close()
    assert pipeline.encoded == [running.request_id]
    assert all(waiting["handle"].request_id not in f for f in pipeline.forward_log)


def test_another_session_cannot_cancel():
    engine = Engine(ToyPipeline())  # not started yet: the request is surely in flight
    handle = engine.submit(params(steps=5), session_id="owner")
    with pytest.raises(PermissionError, match="belongs to another session"):
        engine.cancel(handle.request_id, session_id="intruder")
    engine.start()
    try:
        assert isinstance(handle.result(timeout=30), Completed)
        # Unknown or finished requests: nothing to cancel.
        assert engine.cancel(handle.request_id, session_id="owner") is False
        assert engine.cancel("no-such-id", session_id="owner") is False
    finally:
        engine.close()


def test_admin_may_cancel_any_request():
    pipeline = ToyPipeline()
    pipeline.on_forward = lambda index, batch: index == 1 and engine.cancel(batch.request_ids[0], admin=True)
    engine = Engine(pipeline)
    handle = engine.submit(params(steps=6), session_id="someone")
    engine.start()
    try:
        final = handle.result(timeout=30)
    finally:
        engine.close()
    assert isinstance(final, Aborted)
    assert len(pipeline.forward_log) == 2


def test_a_cancel_during_a_forward_is_applied_before_that_steps_decodes():
    pipeline = ToyPipeline()
    handles = {}
    seen_at_decode = {}

    def cancel_during_last_forward_of_short(index, batch):
        if index == 2:  # the short request's third and last step
            handles["long"].cancel()

    decode = pipeline.post_decode

    def recording_decode(state):
        seen_at_decode[state.request_id] = handles["long"].last_event
        return decode(state)

    pipeline.on_forward = cancel_during_last_forward_of_short
    pipeline.post_decode = recording_decode
    engine = Engine(pipeline, max_batch_requests=4)
    # Both are queued before the engine thread starts, so both join its first step.
    handles["long"] = engine.submit(params(seed=1, steps=8, prompt="long"), session_id="l")
    handles["short"] = engine.submit(params(seed=2, steps=3, prompt="short"), session_id="s")
    engine.start()
    try:
        assert isinstance(handles["short"].result(timeout=30), Completed)
        assert isinstance(handles["long"].result(timeout=30), Aborted)
        assert engine.states_in_memory == 0
    finally:
        engine.close()
    # The short request's VAE decode ran after the cancel had freed the long one's slot.
    assert isinstance(seen_at_decode[handles["short"].request_id], Aborted)
    assert pipeline.decoded == [handles["short"].request_id]
    assert [len(f) for f in pipeline.forward_log] == [2, 2, 2]


def test_a_request_cancelled_during_its_last_forward_is_not_decoded():
    pipeline = ToyPipeline()
    engine = Engine(pipeline)
    handle = engine.submit(params(steps=4), session_id="a")  # queued before the thread starts
    pipeline.on_forward = lambda index, batch: index == 3 and handle.cancel()
    engine.start()
    try:
        final = handle.result(timeout=30)
        assert engine.states_in_memory == 0
        assert engine.snapshot().stats.finished == {"aborted": 1}
    finally:
        engine.close()
    assert isinstance(final, Aborted) and "cancelled" in final.reason
    assert len(pipeline.forward_log) == 4 and pipeline.decoded == []

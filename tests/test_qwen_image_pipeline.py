"""The Qwen-Image step pipeline reproduces diffusers' QwenImagePipeline.

A tiny random-weight checkpoint (tests/tiny_checkpoints.py) is loaded through
`pipelines.loader.load_pipeline` into our engine and as the plain diffusers pipeline. Our
true CFG runs the positive and negative prompts (of different token counts, padded and
masked) in ONE forward with every other request; `__call__` runs two unpadded forwards.
"""

from __future__ import annotations

import pytest
from diffusers import QwenImagePipeline

from engine import Engine, Progress
from pipelines.qwen_image import QwenImageStepPipeline
from tests.pipeline_parity import (
    Run,
    assert_same,
    finished,
    request,
    run_joining_together,
    tiny_family,
)
from tests.tiny_checkpoints import build_tiny_qwen_image


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """The tiny Qwen-Image checkpoint: ours and stock (guidance_scale is its true_cfg_scale)."""
    return tiny_family(
        tmp_path_factory.mktemp("tiny-qwen-image") / "model",
        build_tiny_qwen_image,
        QwenImagePipeline,
        lambda p: {"negative_prompt": p.negative_prompt, "true_cfg_scale": p.guidance_scale},
    )


def test_loader_picks_qwen_image_with_true_cfg_defaults(qwen):
    assert isinstance(qwen.pipeline, QwenImageStepPipeline)
    info = qwen.pipeline.info
    assert info.schedulers == ("flow-match-euler",)
    assert info.size_multiple == 8  # tiny VAE factor 4 x 2x2 latent patches
    assert info.defaults.negative_prompt == " " and info.defaults.guidance_scale == 4.0  # CFG on by default


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"scheduler": "euler"}, r"scheduler='euler' is not a noise scheduler.*allowed are: flow-match-euler"),
        ({"width": 36}, r"width=36 is not allowed: .* needs a multiple of 8"),
        ({"num_frames": 3}, r"num_frames=3 is not allowed: .* use 1"),
    ],
)
def test_model_limits_are_checked_at_submission(qwen, overrides, message):
    with pytest.raises(ValueError, match=message):
        Engine(qwen.pipeline).submit(request(**overrides))


def test_cfg_needs_a_negative_prompt_and_a_scale_above_one(qwen):
    uses_cfg = qwen.pipeline._uses_cfg
    assert uses_cfg(request(guidance_scale=4.0, negative_prompt=" "))
    assert not uses_cfg(request(guidance_scale=4.0, negative_prompt=None))
    assert not uses_cfg(request(guidance_scale=1.0, negative_prompt=" "))
    # CFG is per row (pipelines/cfg.py): requests with and without it share a forward.
    key = qwen.pipeline.batch_key
    with_cfg = key(request(guidance_scale=4.0, negative_prompt=" "))
    assert with_cfg == key(request(guidance_scale=7.0, negative_prompt="blurry", prompt="x", seed=9))
    assert with_cfg == key(request(guidance_scale=1.0, negative_prompt=None))
    assert with_cfg == key(request(guidance_scale=4.0, negative_prompt=" ", width=40))  # sizes pack too


@pytest.mark.parametrize(
    "guidance_scale, negative_prompt",
    [(1.0, None), (4.0, " "), (4.0, "blurry, dark and of low quality")],
)
def test_one_request_matches_diffusers(qwen, guidance_scale, negative_prompt):
    params = request(guidance_scale=guidance_scale, negative_prompt=negative_prompt, seed=3, preview_every=2)
    with Run(qwen.pipeline) as run:
        handle = run.submit(params)
        ours = finished(run, handle)
    assert_same(ours, qwen.reference(params))
    # CFG rows are in the same forward, not a second one
    assert run.forwards.rows == [2 if params.negative_prompt else 1] * 4
    previews = [e.preview for e in handle.events(timeout=5) if isinstance(e, Progress) and e.preview is not None]
    assert [p.size for p in previews] == [(8, 8)]  # after step 2 of 4; one pixel per latent cell


@pytest.fixture
def stacked(qwen, monkeypatch):
    """The forward without packing (another attention backend would do this): prompts of different
    lengths are padded and masked in one stacked forward."""
    monkeypatch.setitem(qwen.pipeline.__dict__, "packs", False)
    return qwen


def test_co_batched_requests_match_each_run_alone(stacked):
    qwen = stacked
    first = request(prompt="a red circle", seed=11, num_inference_steps=6, guidance_scale=1.0)  # no CFG
    second = request(prompt="two small green birds on a branch", seed=22, num_inference_steps=3,
                         guidance_scale=6.5, negative_prompt="blurry")
    third = request(prompt="a blue square", seed=33, num_inference_steps=4, guidance_scale=2.0,
                        negative_prompt="dark, grainy, washed out colours")
    # `second` joins after two steps of `first`, `third` after the next one.
    with Run(qwen.pipeline, arrivals={2: second, 3: third}) as run:
        finished(run, run.submit(first))  # the longest: the others arrived meanwhile
        results = [finished(run, handle) for handle in run.handles]
    assert run.forward_sizes[:4] == [1, 1, 2, 3], run.forward_sizes
    # One forward per step: a request without CFG next to two with it (their negatives first).
    assert run.forwards.rows == [1, 1, 3, 5, 5, 3, 2], run.forwards.steps
    for params, ours in zip((first, second, third), results):
        assert_same(ours, qwen.reference(params))


def test_requests_joining_one_step_share_one_text_encoding(stacked, monkeypatch):
    qwen = stacked
    # Texts of different token counts: the batched encoding pads them; each keeps its own length.
    requests = [
        request(prompt="a red circle", seed=4, guidance_scale=4.0, negative_prompt=" "),
        request(prompt="two small green birds on a branch", seed=5, guidance_scale=3.0, negative_prompt=" "),
    ]
    results, calls, run = run_joining_together(qwen.pipeline, requests, monkeypatch)
    assert calls == [["a red circle", " ", "two small green birds on a branch"]]
    assert run.forwards.rows == [4] * 4
    lengths = [qwen.pipeline.prompt_cache.encode(text).shape[1] for text in calls[0]]
    assert len(set(lengths)) == 3  # three different token counts came out of one padded call
    for params, ours in zip(requests, results):
        assert_same(ours, qwen.reference(params))


def test_prompts_of_different_lengths_and_sizes_run_packed_and_match_diffusers(qwen, monkeypatch):
    """Packed (pipelines/qwen_image_packed.py): each row keeps exactly its own text tokens, no
    padding, no mask; staggered requests of three sizes with CFG."""
    from dataclasses import replace

    from pipelines.qwen_image_packed import QWEN_IMAGE, packed_forward
    from tests.pipeline_parity import assert_step_outputs_match
    from tests.protocol_driver import drive

    assert qwen.pipeline.packs and qwen.pipeline.batch_key(request()) == qwen.pipeline.batch_key(request(width=48))
    rows: list[int] = []

    def counting(model, model_rows, *args, **kwargs):
        rows.append(len(model_rows))
        return packed_forward(model, model_rows, *args, **kwargs)

    monkeypatch.setattr(QwenImageStepPipeline, "packed_model", replace(QWEN_IMAGE, forward=counting))
    requests = [
        (0, request(prompt="a red circle", seed=11, num_inference_steps=4, guidance_scale=1.0)),
        (1, request(prompt="two small green birds on a branch", seed=22, num_inference_steps=3, width=48, height=16,
                    guidance_scale=6.5, negative_prompt="blurry")),
        (2, request(prompt="a blue square", seed=33, num_inference_steps=2, width=16, height=40, guidance_scale=2.0,
                    negative_prompt="dark, grainy, washed out colours")),
    ]
    states = drive(qwen.pipeline, requests)
    assert rows == [3, 5, 5]  # steps 1-3; the two CFG requests bring their negative rows
    for (_, params), state in zip(requests, states):
        assert_step_outputs_match(qwen, state, params)


def test_transposed_sizes_with_as_many_tokens_each_keep_their_own_grid(qwen, monkeypatch):
    """48x16 and 16x48 pack to latents of one shape: they run packed, each with its own rotary grid."""
    from dataclasses import replace

    from pipelines.qwen_image_packed import QWEN_IMAGE, packed_forward
    from tests.pipeline_parity import assert_step_outputs_match
    from tests.protocol_driver import drive

    rows: list[int] = []

    def counting(model, model_rows, *args, **kwargs):
        rows.append(len(model_rows))
        return packed_forward(model, model_rows, *args, **kwargs)

    monkeypatch.setattr(QwenImageStepPipeline, "packed_model", replace(QWEN_IMAGE, forward=counting))
    requests = [(0, request(prompt="a red circle", seed=41, num_inference_steps=2, width=48, height=16, guidance_scale=1.0)),
                (0, request(prompt="a red circle", seed=42, num_inference_steps=2, width=16, height=48, guidance_scale=1.0))]
    states = drive(qwen.pipeline, requests)
    assert rows == [2, 2]
    for (_, params), state in zip(requests, states):
        assert_step_outputs_match(qwen, state, params)

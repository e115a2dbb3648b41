"""LoRA adapters per row of a shared forward, against diffusers' own `load_lora_weights` +
`set_adapters` + `__call__`, on the tiny FLUX, SD3 and SDXL checkpoints with tiny random
adapters: one request with one adapter, scales, two adapters on one row, CFG rows, and rows
with different adapters (and none) co-batched in ONE forward, each equal to its own solo run."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from diffusers import FluxPipeline, StableDiffusion3Pipeline, StableDiffusionPipeline, StableDiffusionXLPipeline
from diffusers.utils import logging as diffusers_logging

from pipelines.loader import load_pipeline
from pipelines.lora_request import LoraUse
from tests.pipeline_parity import ForwardLog, Reference, assert_close, request
from tests.protocol_driver import drive
from tests.test_flux_pipeline import STUDIO_CONFIG as FLUX_CONFIG, flux_arguments
from tests.test_sd3_pipeline import STUDIO_CONFIG as SD3_CONFIG
from tests.tiny_checkpoints import T5_LENGTH, build_tiny_flux, build_tiny_sd, build_tiny_sd3, build_tiny_sdxl
from tests.tiny_loras import build_kohya_lora, build_tiny_lora

pytest.importorskip("peft", reason="the diffusers reference loads adapters through PEFT (pip install -e '.[test]')")

diffusers_logging.set_verbosity_error()
diffusers_logging.disable_progress_bar()


def _cfg_arguments(p) -> dict:
    return {"negative_prompt": p.negative_prompt, "guidance_scale": p.guidance_scale}


FAMILIES = {
    "flux": (build_tiny_flux, FluxPipeline, flux_arguments, FLUX_CONFIG),
    "sd3": (build_tiny_sd3, StableDiffusion3Pipeline,
            lambda p: {**_cfg_arguments(p), "max_sequence_length": T5_LENGTH}, SD3_CONFIG),
    "sdxl": (build_tiny_sdxl, StableDiffusionXLPipeline, _cfg_arguments, None),
}
# A request of each family that runs classifier-free guidance (two rows per request).
CFG = {"flux": {"guidance_scale": 3.0, "negative_prompt": "blurry"}, "sd3": {"guidance_scale": 4.0},
       "sdxl": {"guidance_scale": 5.0, "negative_prompt": "blurry"}}


@dataclass
class LoraFamily:
    name: str
    pipeline: object  # ours, adapters "a" and "b" loaded
    reference: Reference  # diffusers, the same adapters loaded with load_lora_weights

    def expected(self, params):
        """diffusers' final latents for `params`, its adapters set with set_adapters (none: disabled)."""
        pipe = self.reference.pipe
        if params.loras:
            pipe.enable_lora()
            pipe.set_adapters([use.name for use in params.loras], [use.scale for use in params.loras])
        else:
            pipe.disable_lora()
        return self.reference(params, "np")[0]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory) -> LoraFamily:
    build, stock_class, arguments, config = FAMILIES[request.param]
    root = tmp_path_factory.mktemp(f"lora-{request.param}")
    folder = build(root / "model", studio_config=config)
    stock = stock_class.from_pretrained(folder, use_safetensors=True)
    files = {"a": build_tiny_lora(stock, root / "a", seed=1),
             "b": build_tiny_lora(stock, root / "b", seed=2, rank=2, alpha=1.0, targets=("to_q", "to_v"))}
    ours = load_pipeline(str(folder))
    for name, file in files.items():
        ours.load_lora(name, file)
        stock.load_lora_weights(str(file), adapter_name=name)
    return LoraFamily(request.param, ours, Reference(stock, arguments))


def run_alone(family: LoraFamily, params):
    [state] = drive(family.pipeline, [(0, params)])
    return state.latents


def test_the_adapters_are_listed_and_change_the_image(family):
    assert family.pipeline.info.loras == ("a", "b")
    base = run_alone(family, request(seed=3))
    with_a = run_alone(family, request(seed=3, loras=(LoraUse("a"),)))
    assert (with_a - base).abs().max() > 0.05  # a real change, far above the parity tolerance


@pytest.mark.parametrize("loras", [(LoraUse("a"),), (LoraUse("a", 0.5),), (LoraUse("a", 1.0), LoraUse("b", -0.7))],
                         ids=["a", "a-at-0.5", "a-and-b"])
def test_one_request_matches_diffusers_load_lora_weights(family, loras):
    params = request(seed=4, loras=loras)
    assert_close(run_alone(family, params), family.expected(params), "final latents")


def test_both_cfg_rows_run_the_adapter_as_diffusers_does(family):
    params = request(seed=5, loras=(LoraUse("a", 0.8),), **CFG[family.name])
    assert_close(run_alone(family, params), family.expected(params), "final latents")


def test_rows_with_different_adapters_share_one_forward_and_each_equals_its_solo_run(family):
    requests = [
        request("a red circle", seed=6, loras=(LoraUse("a"),)),
        request("a blue square", seed=7, loras=(LoraUse("b", 0.5), LoraUse("a", -0.3))),
        request("a green circle", seed=8),  # no adapter: the base model
        request("a red square", seed=9, loras=(LoraUse("a", 0.5),), **CFG[family.name]),
    ]
    with ForwardLog(family.pipeline) as log:
        states = drive(family.pipeline, [(0, p) for p in requests])
    assert log.rows == [len(requests) + 1] * 4  # every step: ONE forward with every row (+1: the CFG row)
    for state, params in zip(states, requests):
        assert_close(state.latents, run_alone(family, params), f"co-batched vs solo ({params.prompt})")
        assert_close(state.latents, family.expected(params), f"co-batched vs diffusers ({params.prompt})")


def test_kohya_format_is_read_through_diffusers_converter(tmp_path):
    folder = build_tiny_sd(tmp_path / "model")
    stock = StableDiffusionPipeline.from_pretrained(folder, use_safetensors=True, safety_checker=None)
    file = build_kohya_lora(stock.unet, tmp_path / "kohya.safetensors", seed=3, rank=2, alpha=1.0)
    ours = load_pipeline(str(folder))
    ours.load_lora("kohya", file)
    stock.load_lora_weights(str(file), adapter_name="kohya")
    params = request(seed=2, loras=(LoraUse("kohya", 0.7),), guidance_scale=1.0)
    stock.set_adapters(["kohya"], [0.7])
    reference = Reference(stock, _cfg_arguments)
    assert_close(run_alone(LoraFamily("sd", ours, reference), params), reference(params, "np")[0], "final latents")


def test_co_batched_rows_use_no_more_forwards_than_without_adapters(family):
    """The adapter set is not in the batch key: the engine's key ignores it."""
    plain, adapted = request(seed=1), request(seed=1, loras=(LoraUse("b", 2.0),))
    assert family.pipeline.batch_key(plain) == family.pipeline.batch_key(adapted)

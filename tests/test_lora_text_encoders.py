"""LoRA adapters that change the text encoders (CLIP), as diffusers' `load_lora_weights` adapts
them on FLUX, SD3, SDXL and Stable Diffusion: parity with diffusers, prompts of different
adapter sets encoded in ONE batched text-encoder call, each row with its own adapters, and the
prompt cache keyed by the adapters that change a text encoder (and only those)."""

from __future__ import annotations

import pytest
import torch
from diffusers import FluxPipeline, StableDiffusion3Pipeline, StableDiffusionPipeline, StableDiffusionXLPipeline
from diffusers.utils import logging as diffusers_logging

from pipelines.loader import load_pipeline
from pipelines.lora_request import LoraUse
from tests.pipeline_parity import Reference, assert_close, request
from tests.protocol_driver import drive, max_abs_diff
from tests.test_flux_pipeline import STUDIO_CONFIG as FLUX_CONFIG, flux_arguments
from tests.test_lora_parity import CFG, LoraFamily, _cfg_arguments, run_alone
from tests.test_sd3_pipeline import STUDIO_CONFIG as SD3_CONFIG
from tests.tiny_checkpoints import T5_LENGTH, build_tiny_flux, build_tiny_sd, build_tiny_sd3, build_tiny_sdxl
from tests.tiny_loras import build_kohya_lora, build_tiny_lora

pytest.importorskip("peft", reason="the diffusers reference loads adapters through PEFT (pip install -e '.[test]')")

diffusers_logging.set_verbosity_error()
diffusers_logging.disable_progress_bar()

# Each family's CLIP encoders, as its diffusers loader adapts them (T5 never).
FAMILIES = {
    "flux": (build_tiny_flux, FluxPipeline, flux_arguments, FLUX_CONFIG, ("text_encoder",)),
    "sd3": (build_tiny_sd3, StableDiffusion3Pipeline,
            lambda p: {**_cfg_arguments(p), "max_sequence_length": T5_LENGTH}, SD3_CONFIG,
            ("text_encoder", "text_encoder_2")),
    "sdxl": (build_tiny_sdxl, StableDiffusionXLPipeline, _cfg_arguments, None, ("text_encoder", "text_encoder_2")),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory) -> LoraFamily:
    """Ours and diffusers with adapter "t" (denoiser and text encoders) and "d" (denoiser only)."""
    build, stock_class, arguments, config, encoders = FAMILIES[request.param]
    root = tmp_path_factory.mktemp(f"lora-te-{request.param}")
    folder = build(root / "model", studio_config=config)
    stock = stock_class.from_pretrained(folder, use_safetensors=True)
    files = {"t": build_tiny_lora(stock, root / "t", seed=11, text_encoders=encoders),
             "d": build_tiny_lora(stock, root / "d", seed=12, rank=2, targets=("to_q", "to_v"))}
    ours = load_pipeline(str(folder))
    for name, file in files.items():
        ours.load_lora(name, file)
        stock.load_lora_weights(str(file), adapter_name=name)
    return LoraFamily(request.param, ours, Reference(stock, arguments))


def test_the_adapter_changes_the_prompt_embeddings(family):
    pipeline = family.pipeline
    assert pipeline.loras.adapters["t"].changes_text_encoder
    assert not pipeline.loras.adapters["d"].changes_text_encoder
    plain, adapted = pipeline.prompt_cache.encode_many(pipeline._texts(request("a red circle")) +
                                                       pipeline._texts(request("a red circle", loras=(LoraUse("t"),))))
    assert max_abs_diff(_embeds(plain), _embeds(adapted)) > 0.01  # the text encoder really ran the adapter


# (Two adapters with CFG are left out: diffusers adds their deltas one after the other, ours in one
# stacked matmul, and a tiny random SDXL's CFG at 5 amplifies that rounding past the tolerance.)
@pytest.mark.parametrize("loras, cfg", [((LoraUse("t", 0.7),), False), ((LoraUse("t"),), True),
                                        ((LoraUse("t"), LoraUse("d", -0.5)), False)],
                         ids=["t-at-0.7", "t-with-cfg", "t-and-d"])
def test_one_request_matches_diffusers_load_lora_weights(family, loras, cfg):
    params = request(seed=4, loras=loras, **(CFG[family.name] if cfg else {}))
    assert_close(run_alone(family, params), family.expected(params), "final latents")


def test_texts_of_different_adapter_sets_are_encoded_in_one_call_each_with_its_own(family):
    pipeline, cache = family.pipeline, family.pipeline.prompt_cache
    cache.clear()
    requests = [
        request("a blue square", seed=6, loras=(LoraUse("t"),)),
        request("a blue square", seed=7, loras=(LoraUse("t", 0.5),)),
        request("a blue square", seed=8, loras=(LoraUse("d"),)),  # the denoiser only: the plain text's entry
        request("a blue square", seed=9),
    ]
    calls_before, misses_before = cache.batched_calls, cache.misses
    pipeline.encode_prompts(requests)  # what the engine does for requests joining one step
    assert cache.batched_calls - calls_before == 1
    assert cache.misses - misses_before == 3  # t at 1, t at 0.5, and the plain text shared by "d" and none
    assert len(cache) == 3
    states = drive(pipeline, [(0, p) for p in requests])
    assert cache.misses - misses_before == 3  # the requests found every text cached
    for state, params in zip(states, requests):
        cache.clear()  # solo: the text encoded alone
        assert_close(state.latents, run_alone(family, params), f"batched vs solo ({params.loras})")


def test_kohya_text_encoder_weights_are_read_through_diffusers_converter(tmp_path):
    folder = build_tiny_sd(tmp_path / "model")
    stock = StableDiffusionPipeline.from_pretrained(folder, use_safetensors=True, safety_checker=None)
    file = build_kohya_lora(stock.unet, tmp_path / "kohya.safetensors", seed=3, rank=2, alpha=1.0,
                            text_encoder=stock.text_encoder)
    ours = load_pipeline(str(folder))
    ours.load_lora("kohya", file)
    assert ours.loras.adapters["kohya"].changes_text_encoder
    stock.load_lora_weights(str(file), adapter_name="kohya")
    stock.set_adapters(["kohya"], [0.7])
    params = request(seed=2, loras=(LoraUse("kohya", 0.7),), guidance_scale=1.0)
    reference = Reference(stock, _cfg_arguments)
    assert_close(run_alone(LoraFamily("sd", ours, reference), params), reference(params, "np")[0], "final latents")


def _embeds(entry) -> torch.Tensor:
    """Every tensor of a cache entry, flat (FLUX's CLIP shows in its pooled output only)."""
    return torch.cat([tensor.flatten().float() for tensor in entry]) if isinstance(entry, tuple) else entry.flatten()

"""`--denoiser-file`: the built-in model's transformer from a GGUF file (tools/quantize_denoiser.py
writes it, diffusers' GGUFQuantizationConfig loads it), alone and under the memory plans, and the
clear refusals of a file that does not fit."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("gguf", reason="the gguf package is not installed (pip install -e '.[gguf]')")

from engine import Engine, GenerationParams  # noqa: E402
from pipelines.loader import BUILTIN_MODEL_DIR, LoadOptions, load_pipeline  # noqa: E402
from pipelines.memory_placement import module_bytes  # noqa: E402
from tests.test_memory_plans import _latents_per_step, _params  # noqa: E402
from tools.quantize_denoiser import write_gguf  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ("a small green triangle on a white background, center", "a large yellow square on a black background, bottom")


@pytest.fixture(scope="module")
def q8_file(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gguf") / "shapes-flux-Q8_0.gguf"
    completed = subprocess.run([sys.executable, "-m", "tools.quantize_denoiser", "--model", str(BUILTIN_MODEL_DIR),
                                "--type", "Q8_0", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                               timeout=300)
    assert completed.returncode == 0, completed.stderr
    assert "tensors by type {'Q8_0': 60, 'F32': 76}" in completed.stdout
    return out


@pytest.fixture(scope="module")
def resident():
    return load_pipeline("builtin")


def _picture(pipeline, prompt: str, seed: int) -> np.ndarray:
    with contextlib.closing(Engine(pipeline).start()) as engine:
        result = engine.submit(GenerationParams(prompt=prompt, seed=seed)).result(timeout=120)
    return np.asarray(result.images[0], dtype=np.float32)


def test_a_q8_file_serves_the_model_in_a_third_of_the_bytes_and_draws_the_same_pictures(q8_file, resident):
    quantized = load_pipeline("builtin", LoadOptions(denoiser_file=str(q8_file)))
    layer = quantized.denoiser.transformer_blocks[0].attn.to_q
    assert (type(layer).__name__, type(layer.weight).__name__) == ("GGUFLinear", "GGUFParameter")
    assert quantized.dtype == torch.float32  # computed in the serving dtype
    assert module_bytes(quantized.denoiser) < module_bytes(resident.denoiser) / 3
    requests = [_params(prompt, seed) for seed, prompt in enumerate(PROMPTS)]
    got, want = _latents_per_step(quantized, requests), _latents_per_step(resident, requests)
    worst = max(((a - b).norm() / b.norm()).item() for g, w in zip(got, want) for a, b in zip(g, w))
    assert 0 < worst < 0.01, worst  # Q8_0: 8 bits a weight, a scale per 32
    for seed, prompt in enumerate(PROMPTS):
        assert np.abs(_picture(quantized, prompt, seed) - _picture(resident, prompt, seed)).mean() < 0.5


@pytest.mark.parametrize("plan", ["offload", "lowvram"])
def test_a_quantized_denoiser_under_the_memory_plans_stays_as_the_file_has_it(q8_file, plan):
    planned = load_pipeline("builtin", LoadOptions(denoiser_file=str(q8_file), memory=plan))
    plain = load_pipeline("builtin", LoadOptions(denoiser_file=str(q8_file)))
    assert type(planned.denoiser.transformer_blocks[0].attn.to_q.weight).__name__ == "GGUFParameter"
    requests = [_params(PROMPTS[0], 1)]
    got, want = _latents_per_step(planned, requests)[0], _latents_per_step(plain, requests)[0]
    if plan == "offload":
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    else:  # lowvram's text encoders store float8
        assert max(((a - b).norm() / b.norm()).item() for a, b in zip(got, want)) < 0.1


def test_files_that_do_not_fit_are_refused_naming_what_is_supported(tmp_path):
    other_kind = tmp_path / "transformer.safetensors"
    other_kind.write_bytes(b"")
    with pytest.raises(ValueError, match=r"--denoiser-file transformer\.safetensors: \.safetensors files are not "
                                         r"supported; the kinds that are: \.gguf \(GGUF\)\."):
        load_pipeline("builtin", LoadOptions(denoiser_file=str(other_kind)))
    with pytest.raises(ValueError, match=r"--denoiser-file .*missing\.gguf: no such file\."):
        load_pipeline("builtin", LoadOptions(denoiser_file=str(tmp_path / "missing.gguf")))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match=r"--denoiser-file junk\.gguf is not a readable GGUF file"):
        load_pipeline("builtin", LoadOptions(denoiser_file=str(junk)))
    partial = tmp_path / "partial.gguf"  # another model's file: half of the tensors
    state = load_pipeline("builtin").denoiser.state_dict()
    write_gguf(dict(list(state.items())[: len(state) // 2]), partial)
    with pytest.raises(ValueError, match=r"could not load partial\.gguf as the transformer \(FluxTransformer2DModel\) "
                                         r"of shapes-flux .* The file must be this model's transformer\."):
        load_pipeline("builtin", LoadOptions(denoiser_file=str(partial)))


def test_a_quantization_type_diffusers_cannot_dequantize_is_refused_with_the_types_it_can(tmp_path):
    import gguf

    path = tmp_path / "iq2.gguf"
    writer = gguf.GGUFWriter(str(path), arch="stepstudio")
    _, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.IQ2_XXS]
    writer.add_tensor("transformer_blocks.0.attn.to_q.weight", np.zeros((8, size), dtype=np.uint8),  # 8 rows of one block
                      raw_dtype=gguf.GGMLQuantizationType.IQ2_XXS)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=r"iq2\.gguf holds IQ2_XXS tensors, which diffusers can't dequantize; the "
                                         r"quantization types it can: .*Q4_K.*Q8_0"):
        load_pipeline("builtin", LoadOptions(denoiser_file=str(path)))

"""What a request says about LoRA adapters, and what a server loads: the `loras` field's checks,
A1111's `<lora:NAME:SCALE>` prompt tags, adapter files checked against their model, `--lora`
and adapter folders, and the engine co-batching requests with different adapters."""

from __future__ import annotations

import pytest
import torch
from diffusers import FluxPipeline, StableDiffusion3Pipeline
from diffusers.utils import logging as diffusers_logging
from safetensors.torch import load_file, save_file

import app
from engine import Completed, Engine, GenerationParams
from pipelines.errors import ParamError
from pipelines.loader import LoadOptions, load_models, load_pipeline
from pipelines.lora_adapters import LoraFileError
from pipelines.lora_files import LoraOption, adapter_files
from pipelines.lora_request import MAX_LORAS_PER_REQUEST, LoraUse, loras_from_json, prompt_tags, split_prompt_tags
from studio.outputs import infotext
from tests.pipeline_parity import Run, request
from tests.test_flux_pipeline import STUDIO_CONFIG as FLUX_CONFIG
from tests.test_sd3_pipeline import STUDIO_CONFIG as SD3_CONFIG
from tests.tiny_checkpoints import build_tiny_flux, build_tiny_sd3
from tests.tiny_loras import build_tiny_lora

diffusers_logging.set_verbosity_error()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny FLUX folder, two adapters for it and one for a tiny SD3."""
    root = tmp_path_factory.mktemp("lora-requests")
    flux = build_tiny_flux(root / "flux", studio_config=FLUX_CONFIG)
    sd3 = build_tiny_sd3(root / "sd3", studio_config=SD3_CONFIG)
    stock = FluxPipeline.from_pretrained(flux, use_safetensors=True)
    files = {
        "ink": build_tiny_lora(stock, root / "ink", seed=1),
        "glow": build_tiny_lora(stock, root / "glow", seed=2, rank=2),
        "sd3-only": build_tiny_lora(StableDiffusion3Pipeline.from_pretrained(sd3, use_safetensors=True),
                                    root / "sd3-lora", seed=3),
    }
    return root, flux, files


# ---------------------------------------------------------------------------- the request field
@pytest.mark.parametrize("value, message", [
    ((LoraUse("a"),) * 2, "LoRA a is named more than once"),
    (tuple(LoraUse(f"l{i}") for i in range(MAX_LORAS_PER_REQUEST + 1)), "5 LoRAs (l0, l1, l2, l3, l4) are too many"),
    ([LoraUse("a")], "loras must be a tuple of LoraUse, got list"),
])
def test_the_loras_field_names_what_is_wrong(value, message):
    with pytest.raises(ParamError, match=message.replace("(", r"\(").replace(")", r"\)")) as error:
        GenerationParams(prompt="a red circle", loras=value)
    assert error.value.field == "loras"


@pytest.mark.parametrize("name, scale, message", [
    ("outline", 4.5, "LoRA 'outline' has scale 4.5: allowed is -4..4"),
    ("outline", float("nan"), "has scale nan"),
    ("outline", True, "must be a number"),
    ("../etc", 1.0, "is not a LoRA name"),
    ("", 1.0, "is not a LoRA name"),
])
def test_a_lora_use_checks_its_name_and_scale(name, scale, message):
    with pytest.raises(ParamError, match=message):
        LoraUse(name, scale)


def test_api_loras_are_name_and_scale_objects():
    assert loras_from_json([{"name": "a", "scale": 0.5}, {"name": "b"}]) == (LoraUse("a", 0.5), LoraUse("b", 1.0))
    assert loras_from_json(None) == ()
    with pytest.raises(ParamError, match='each LoRA must be {"name": NAME, "scale": NUMBER}'):
        loras_from_json([{"name": "a", "weight": 1}])


# ---------------------------------------------------------------------------- prompt tags
@pytest.mark.parametrize("prompt, text, loras", [
    ("a red circle <lora:outline:0.8>", "a red circle", (LoraUse("outline", 0.8),)),
    ("<lora:outline> a red circle, <LORA:thick:-1>", "a red circle", (LoraUse("outline"), LoraUse("thick", -1.0))),
    ("a red circle", "a red circle", ()),
    ("a <lora:outline:1> red circle", "a red circle", (LoraUse("outline"),)),
])
def test_a1111_prompt_tags_become_loras_and_leave_the_text(prompt, text, loras):
    assert split_prompt_tags(prompt) == (text, loras)


def test_prompt_tags_errors_are_clear():
    with pytest.raises(ParamError, match="the scale must be a number"):
        split_prompt_tags("a red circle <lora:outline:strong>")
    with pytest.raises(ParamError, match="the prompt holds only LoRA tags"):
        GenerationParams(prompt="<lora:outline:1>").with_prompt_loras()
    with pytest.raises(ParamError, match="named more than once"):
        GenerationParams(prompt="a circle <lora:a:1>", loras=(LoraUse("a", 0.5),)).with_prompt_loras()


def test_saved_parameters_write_the_adapters_as_a1111_tags():
    params = request("a red circle", loras=(LoraUse("outline", 1.0), LoraUse("thick", 0.5)))
    assert prompt_tags(params.loras) == "<lora:outline:1> <lora:thick:0.5>"
    assert infotext(params, "shapes-flux").split("\n")[0] == "a red circle <lora:outline:1> <lora:thick:0.5>"


# ---------------------------------------------------------------------------- adapter files
def test_an_adapter_for_another_model_names_the_first_missing_module(tiny):
    _, flux, files = tiny
    pipeline = load_pipeline(str(flux))
    # The tiny SD3 has two joint blocks, the tiny FLUX one: block 1 is what FLUX lacks.
    with pytest.raises(LoraFileError, match=r"LoRA 'x' changes transformer\.transformer_blocks\.1\.attn\.to_\w+, "
                                            r"which this model does not have: was it trained for another model\?"):
        pipeline.load_lora("x", files["sd3-only"])
    assert pipeline.info.loras == ()


def test_adapter_files_that_cannot_be_served_are_refused_with_the_reason(tiny, tmp_path):
    _, flux, files = tiny
    pipeline = load_pipeline(str(flux))
    tensors = load_file(str(files["ink"]))
    cases = {
        # FLUX's CLIP takes adapters (as diffusers' loader adapts it); its T5 does not.
        "t5": ({**tensors, "text_encoder_2.encoder.block.0.layer.0.SelfAttention.q.lora_A.weight": torch.zeros(4, 32)},
               r"changes 'text_encoder_2' .*: adapters of this model may change transformer, text_encoder only"),
        "dora": ({**tensors, "transformer.transformer_blocks.0.attn.to_q.lora_magnitude_vector": torch.ones(32)},
                 "is a DoRA adapter"),
        "half": ({k: v for k, v in tensors.items() if not k.endswith("to_q.lora_B.weight")}, "has no lora_B weight"),
        "shape": ({k: (v[:, :-1].contiguous() if k.endswith("to_q.lora_A.weight") else v) for k, v in tensors.items()},
                  r"does not fit transformer\..*to_q"),
    }
    for name, (state, message) in cases.items():
        path = tmp_path / f"{name}.safetensors"
        save_file(state, str(path))
        with pytest.raises(LoraFileError, match=message):
            pipeline.load_lora(name, path)
    pickle = tmp_path / "old.bin"
    pickle.write_bytes(b"not read")
    with pytest.raises(LoraFileError, match="not a .safetensors file"):
        pipeline.load_lora("old", pickle)
    with pytest.raises(LoraFileError, match="is not a file"):
        pipeline.load_lora("gone", tmp_path / "gone.safetensors")
    pipeline.load_lora("ink", files["ink"])
    with pytest.raises(ValueError, match="a LoRA named 'ink' is already loaded"):
        pipeline.load_lora("ink", files["glow"])
    assert pipeline.info.loras == ("ink",)


# ---------------------------------------------------------------------------- what a server loads
def test_lora_options_parse_and_name_their_model():
    assert LoraOption.parse("outline=/a/b.safetensors") == LoraOption("outline", "/a/b.safetensors", None)
    assert LoraOption.parse("shapes-flux:outline=b.safetensors") == LoraOption("outline", "b.safetensors", "shapes-flux")
    for bad in ("outline", "=x.safetensors", ":a=b", "bad name=x"):
        with pytest.raises(ValueError, match="--lora"):
            LoraOption.parse(bad)


def test_adapter_folders_hold_one_subfolder_per_model(tiny, tmp_path):
    _, _, files = tiny
    (tmp_path / "flux").mkdir()
    (tmp_path / "flux" / "ink.safetensors").write_bytes(files["ink"].read_bytes())
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "glow.safetensors").write_bytes(files["glow"].read_bytes())
    assert adapter_files("flux", True, (), (tmp_path,)) == {"ink": tmp_path / "flux" / "ink.safetensors"}
    both = adapter_files("flux", True, (LoraOption("glow", str(files["glow"])),), (tmp_path,))
    assert sorted(both) == ["glow", "ink"]
    assert adapter_files("flux", False, (LoraOption("glow", str(files["glow"])),), (tmp_path,)) == {
        "ink": tmp_path / "flux" / "ink.safetensors"}  # NAME=PATH is the first model's
    with pytest.raises(ValueError, match="LoRA 'ink' of flux is given twice"):
        adapter_files("flux", True, (LoraOption("ink", str(files["glow"])),), (tmp_path,))


def test_load_models_serves_each_models_adapters_and_checks_the_model_names(tiny, tmp_path):
    root, flux, files = tiny
    (tmp_path / "flux").mkdir()
    (tmp_path / "flux" / "glow.safetensors").write_bytes(files["glow"].read_bytes())
    options = LoadOptions(loras=(LoraOption("ink", str(files["ink"]), "flux"),), lora_folders=(str(tmp_path),))
    [pipeline] = load_models((str(flux),), options)
    assert pipeline.info.loras == ("glow", "ink")
    with pytest.raises(ValueError, match="no model named 'nope' is loaded; the loaded models are: flux"):
        load_models((str(flux),), LoadOptions(loras=(LoraOption("ink", str(files["ink"]), "nope"),), lora_folders=()))
    with pytest.raises(ValueError, match=r"toy takes no LoRA adapters \(ink given\)"):
        load_models(("toy",), LoadOptions(loras=(LoraOption("ink", str(files["ink"])),), lora_folders=()))


def test_the_command_line_loads_adapters_and_a_bad_one_exits_with_status_2(tiny, tmp_path, capsys):
    _, flux, files = tiny
    config = app.config_from_args(app.build_parser().parse_args(
        ["--model", str(flux), "--lora", f"ink={files['ink']}", "--loras", str(tmp_path)]))
    [pipeline] = app.load_models(config)
    assert pipeline.info.loras == ("ink",)
    with pytest.raises(SystemExit) as exited:
        # --no-save: the studio opens the store before the model, and the repository's outputs/
        # belongs to no test (another test's studio could hold it).
        app.main(["--model", str(flux), "--lora", f"x={files['sd3-only']}", "--port", "0", "--no-save"])
    assert exited.value.code == 2
    assert "LoRA 'x' changes transformer." in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        app.main(["--model", str(flux), "--lora", "no-equals-sign"])
    assert exited.value.code == 2


# ---------------------------------------------------------------------------- through the engine
def test_the_engine_refuses_an_unknown_adapter_and_moves_prompt_tags_into_loras(tiny):
    _, flux, files = tiny
    pipeline = load_pipeline(str(flux))
    pipeline.load_lora("ink", files["ink"])
    engine = Engine(pipeline)
    prepared = engine.prepare_params(request("a red circle <lora:ink:0.5>"))
    assert (prepared.prompt, prepared.loras) == ("a red circle", (LoraUse("ink", 0.5),))
    with pytest.raises(ParamError, match=r"LoRA 'glow' is not loaded for flux; the loaded ones are: ink") as error:
        engine.prepare_params(request("a red circle", loras=(LoraUse("glow"),)))
    assert error.value.field == "loras"
    with pytest.raises(ParamError, match="none is loaded for it"):
        Engine(load_pipeline("toy")).prepare_params(GenerationParams(prompt="x <lora:ink:1>"))


def test_requests_with_different_adapters_share_every_engine_forward(tiny):
    _, flux, files = tiny
    pipeline = load_pipeline(str(flux))
    for name in ("ink", "glow"):
        pipeline.load_lora(name, files[name])
    asks = [request("a red circle", seed=1, loras=(LoraUse("ink"),)),
            request("a red circle <lora:glow:0.5>", seed=1),
            request("a red circle", seed=1)]
    run = Run(pipeline)
    handles = [run.submit(p) for p in asks]  # before the engine starts: they join its first step
    with run:
        finals = [h.result(timeout=120) for h in handles]
    assert all(isinstance(f, Completed) for f in finals)
    assert run.forward_sizes == [3, 3, 3, 3]  # 4 steps, each ONE forward of all three
    assert run.forwards.rows == [3, 3, 3, 3]
    latents = [run.final_latents[h.request_id] for h in handles]
    assert (latents[0] - latents[2]).abs().max() > 0.05 and (latents[1] - latents[2]).abs().max() > 0.05
    assert handles[1].params.loras == (LoraUse("glow", 0.5),)


def test_compile_leaves_folder_adapters_out_and_refuses_lora_options(tiny, tmp_path, caplog):
    _, flux, files = tiny
    (tmp_path / "flux").mkdir()
    (tmp_path / "flux" / "ink.safetensors").write_bytes(files["ink"].read_bytes())
    options = LoadOptions(compile_denoiser=True, lora_folders=(str(tmp_path),))
    with caplog.at_level("WARNING"):
        [pipeline] = load_models((str(flux),), options)
    assert pipeline.info.loras == () and "--compile: the LoRA adapters ink of flux are not served" in caplog.text
    with pytest.raises(ValueError, match="--compile does not serve LoRA adapters yet"):
        load_models((str(flux),), LoadOptions(compile_denoiser=True, lora_folders=(),
                                              loras=(LoraOption("glow", str(files["glow"])),)))

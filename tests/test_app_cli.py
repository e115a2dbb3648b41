"""The command line becomes StudioOptions and LoadOptions as documented in `python app.py --help`,
and `python app.py` refuses what it can't use with exit status 2."""

import subprocess
import sys
from pathlib import Path

import pytest

import app
from engine import Engine, GenerationParams
from studio.config import StudioOptions
from studio.app import for_engine, http_api_config
from tests.studio_helpers import START_TIMEOUT_S

ROOT = Path(__file__).resolve().parent.parent


def options(*argv: str) -> StudioOptions:
    return app.config_from_args(app.build_parser().parse_args(list(argv)))


def test_prompt_cache_size_reaches_the_loaded_pipeline():
    config = options("--model", "toy", "--prompt-cache", "0", "--max-batch", "4")
    assert (config.prompt_cache, config.max_batch) == (0, 4)
    assert app.load_model(config).prompt_cache.capacity == 0
    assert app.load_model(options("--model", "toy", "--prompt-cache", "5")).prompt_cache.capacity == 5


def test_a_negative_prompt_cache_size_is_a_clear_error():
    with pytest.raises(ValueError, match="prompt_cache must be an integer >= 0"):
        options("--prompt-cache", "-2")


def test_step_cache_reaches_the_loaded_models_defaults(caplog):
    config = options("--model", "builtin", "--step-cache", "0.25")
    assert config.step_cache == 0.25
    assert app.load_model(config).info.defaults.step_cache == 0.25
    assert app.load_model(options("--model", "builtin", "--step-cache", "0")).info.defaults.step_cache == 0
    toy = app.load_model(options("--model", "toy", "--step-cache", "0.25"))  # it does not cache steps: served without
    assert toy.info.defaults.step_cache == 0 and "toy does not cache steps" in caplog.text


def test_a_step_cache_outside_0_to_1_is_a_clear_error():
    for value in ("-0.1", "1.5", "nan"):
        with pytest.raises(ValueError, match=r"step_cache=.* is not allowed: use a threshold in 0..1 \(0 = off"):
            options("--step-cache", value)


def test_max_batch_requests_is_the_same_option_as_max_batch():
    assert options("--max-batch-requests", "3").max_batch == 3


def test_the_default_max_size_is_the_loaded_models_size():
    config = options("--model", "toy")
    engine = Engine(app.load_model(config), limits=config.limits)
    assert (config.max_size, engine.limits.max_size, for_engine(config, engine).max_size) == (None, 64, 64)
    with pytest.raises(ValueError, match="width=128 is above this server's limit of 64 pixels"):
        engine.prepare_params(GenerationParams(prompt="x", width=128, height=128))
    assert Engine(app.load_model(config), limits=options("--max-size", "256").limits).limits.max_size == 256


def test_api_keys_come_from_the_options_a_file_and_auth(tmp_path):
    keys_file = tmp_path / "keys"
    keys_file.write_text("# callers\ncarol:sk-carol\n\n")
    config = options("--api-key", "alice:sk-alice", "--api-key", "bob:sk:with:colons",
                     "--api-keys-file", str(keys_file), "--auth", "me:secret")
    assert dict(http_api_config(config).api_keys) == {
        "alice": "sk-alice", "bob": "sk:with:colons", "carol": "sk-carol", "me": "secret",
    }
    assert dict(http_api_config(options()).api_keys) == {}  # no keys: the HTTP API is open


def test_a_bad_api_key_option_never_echoes_the_key():
    with pytest.raises(ValueError, match="api_key must be NAME:KEY") as bad:
        options("--api-key", "no-colon-sk-secret")
    assert "sk-secret" not in str(bad.value)
    with pytest.raises(ValueError, match="two API keys share a name"):
        options("--api-key", "a:k1", "--api-key", "a:k2")


def test_model_may_be_given_more_than_once_and_the_first_is_the_default():
    config = options("--model", "toy", "--model", "toy")
    assert config.models == ("toy", "toy") and config.model == "toy"
    engine = Engine(app.load_models(config), limits=config.limits)
    assert engine.models.names == ("toy", "toy-2") and engine.models.default == "toy"


def test_without_model_the_built_in_models_are_served(monkeypatch, tmp_path):
    import pipelines.loader as loader

    monkeypatch.setattr(loader, "BUILTIN_VIDEO_MODEL_DIR", tmp_path / "no-video-yet")
    assert options().models == ("builtin",)
    (tmp_path / "video").mkdir()
    (tmp_path / "video" / "model_index.json").write_text("{}")
    monkeypatch.setattr(loader, "BUILTIN_VIDEO_MODEL_DIR", tmp_path / "video")
    assert options().models == ("builtin", "builtin-video")


def test_bad_options_and_a_model_that_cannot_be_loaded_exit_with_status_2():
    """docs/configuration.md: "`python app.py` exits with status ... 2 for bad options, a busy port or a
    model that can't be loaded" (the busy port: tests/test_reliability_app.py)."""
    commands = {"bad option": ["--bad-option"], "unloadable model": ["--model", "/nonexistent", "--port", "0", "--no-save"],
                "bad step cache": ["--step-cache", "2"],
                "GPU plan on the CPU": ["--memory", "fp8", "--port", "0", "--no-save"],
                "denoiser file of another kind": ["--denoiser-file", "flux1-dev.safetensors", "--port", "0", "--no-save"]}
    # Both at once: the second takes the time of the studio's imports before it tries the model.
    processes = {name: subprocess.Popen([sys.executable, "app.py", *args], cwd=ROOT, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
                 for name, args in commands.items()}
    errors = {}
    for name, process in processes.items():
        _, stderr = process.communicate(timeout=START_TIMEOUT_S)  # it exits once its imports are done
        assert process.returncode == 2, (name, stderr[-2000:])
        assert "Traceback" not in stderr, stderr
        errors[name] = stderr.strip().splitlines()[-1]
    assert errors["bad option"] == "python app.py: error: unrecognized arguments: --bad-option"
    assert errors["unloadable model"].startswith("python app.py: error: ")
    assert "'/nonexistent'" in errors["unloadable model"]
    assert errors["bad step cache"] == ("python app.py: error: step_cache=2.0 is not allowed: use a threshold in 0..1 "
                                        "(0 = off; higher skips more steps, e.g. 0.1).")
    assert errors["GPU plan on the CPU"] == (
        "python app.py: error: --memory fp8 is for a GPU's memory: on cpu every component is in host memory already. "
        "Leave --memory out (auto keeps everything resident there).")
    assert errors["denoiser file of another kind"] == (
        "python app.py: error: --denoiser-file flux1-dev.safetensors: .safetensors files are not supported; the kinds "
        "that are: .gguf (GGUF).")

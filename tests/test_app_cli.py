"""The command line becomes StudioOptions and LoadOptions as documented in `python app.py --help`."""

import pytest

import app
from studio.config import StudioOptions


def options(*argv: str) -> StudioOptions:
    return app.config_from_args(app.build_parser().parse_args(list(argv)))


def test_defaults_serve_the_builtin_model_in_step_mode_with_a_prompt_cache():
    config = options()
    assert (config.model, config.mode, config.max_batch, config.prompt_cache) == ("builtin", "step", 8, 32)


def test_prompt_cache_size_reaches_the_loaded_pipeline():
    config = options("--model", "toy", "--prompt-cache", "0", "--max-batch", "4")
    assert (config.prompt_cache, config.max_batch) == (0, 4)
    assert app.load_model(config).prompt_cache.capacity == 0
    assert app.load_model(options("--model", "toy", "--prompt-cache", "5")).prompt_cache.capacity == 5


def test_a_negative_prompt_cache_size_is_a_clear_error():
    with pytest.raises(ValueError, match="prompt_cache must be an integer >= 0"):
        options("--prompt-cache", "-2")

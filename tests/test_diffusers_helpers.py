"""The diffusers helpers the pipelines rely on are there, with the parameters we pass, in the
diffusers versions pyproject.toml allows (pipelines/diffusers_api.py lists them)."""

from __future__ import annotations

import re
from pathlib import Path

import diffusers
import pytest
import tomllib
from packaging.requirements import Requirement

from pipelines.diffusers_api import RELIED_ON, check_relied_on, problems
from pipelines.loader import FAMILIES, family_class

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


@pytest.mark.parametrize("helper", RELIED_ON, ids=lambda helper: helper.name)
def test_each_relied_on_helper_exists_with_our_parameters(helper):
    owner = getattr(diffusers, helper.owner)
    assert problems(owner) == [], f"{helper.name} changed in diffusers {diffusers.__version__}"


def test_every_family_checks_its_own_helpers_and_each_is_listed():
    owners = {helper.owner for helper in RELIED_ON}
    assert owners == set(FAMILIES)  # every family's diffusers pipeline is listed, nothing else
    for class_name in FAMILIES:
        assert family_class(class_name).diffusers_class is getattr(diffusers, class_name)


def test_a_missing_or_changed_helper_is_a_loud_error_that_names_it():
    class FluxPipeline:  # a diffusers without _unpack_latents, whose prepare_latents renamed a parameter
        def prepare_latents(self, batch_size, channels, height, width, dtype, device, generator):
            pass

        def encode_prompt(self, prompt, prompt_2=None, device=None, max_sequence_length=512):
            pass

    with pytest.raises(RuntimeError) as error:
        check_relied_on(FluxPipeline)
    message = str(error.value)
    assert "FluxPipeline._unpack_latents is gone" in message
    assert "FluxPipeline.prepare_latents has no parameter num_channels_latents" in message
    assert "encode_prompt" not in message
    assert f"diffusers {diffusers.__version__} changed" in message


def test_the_installed_diffusers_is_one_pyproject_allows():
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    [pin] = [Requirement(d) for d in dependencies if re.match(r"diffusers\b", d)]
    assert pin.specifier, "pyproject.toml must pin diffusers to the versions pipelines/diffusers_api.py was checked on"
    assert diffusers.__version__ in pin.specifier, f"diffusers {diffusers.__version__} is outside {pin}"

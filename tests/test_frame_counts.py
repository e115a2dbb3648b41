"""A video model's card may name the only frame counts it makes (stepstudio.json's `frame_counts`):
the engine refuses the others, naming the ones it makes (the served model: tests/test_video_v2_checkpoint.py)."""

from __future__ import annotations

import json

import pytest

from pipelines.errors import ParamError
from pipelines.params import GenerationParams
from pipelines.studio_config import read_studio_config
from pipelines.validation import check_supported_size


def params(frames: int) -> GenerationParams:
    return GenerationParams(prompt="a red circle moving left on a blue background", width=64, height=64,
                            num_frames=frames)


def test_frame_counts_are_read_from_stepstudio_json(tmp_path):
    (tmp_path / "stepstudio.json").write_text(json.dumps({"frame_counts": [9, 13]}))
    assert read_studio_config(tmp_path).frame_counts == (9, 13)
    (tmp_path / "stepstudio.json").write_text(json.dumps({"num_frames": 9}))
    assert read_studio_config(tmp_path).frame_counts == ()  # any count the VAE takes


@pytest.mark.parametrize("value", [[0], [9, "13"], [True], [9.0]])
def test_bad_frame_counts_in_stepstudio_json_are_refused(tmp_path, value):
    (tmp_path / "stepstudio.json").write_text(json.dumps({"frame_counts": value}))
    with pytest.raises(ValueError, match="frame_counts must be a list of positive whole numbers"):
        read_studio_config(tmp_path)


def test_a_frame_count_outside_the_card_is_refused_naming_the_allowed_ones():
    for frames in (9, 13):
        check_supported_size(params(frames), "shapes-wan-v2", (), frame_counts=(9, 13))
    with pytest.raises(ParamError, match=r"num_frames=17 is not a length shapes-wan-v2 makes: allowed are 9, 13\.") as error:
        check_supported_size(params(17), "shapes-wan-v2", (), frame_counts=(9, 13))
    assert error.value.field == "num_frames"
    with pytest.raises(ParamError, match="allowed is 9"):
        check_supported_size(params(13), "shapes-wan", (), frame_counts=(9,))
    check_supported_size(params(17), "any-wan", ())  # no card list: any count

"""--admin-key, --admin-key-file and --start-paused: parsed, checked, and what a studio started
paused does (nothing runs until the operator resumes it; its page says so)."""

from __future__ import annotations

import httpx
import pytest

import app
from pipelines.toy import ToyPipeline
from studio.config import StudioOptions
from tests.studio_helpers import live_studio


def test_the_options_are_parsed_and_an_admin_key_must_be_its_own(tmp_path):
    key_file = tmp_path / "admin.key"
    key_file.write_text("# the operator's key\nkey-operator\n")
    args = app.build_parser().parse_args(["--model", "toy", "--admin-key-file", str(key_file), "--start-paused"])
    config = app.config_from_args(args)
    assert (config.admin_key, config.start_paused) == ("key-operator", True)
    assert app.config_from_args(app.build_parser().parse_args(["--model", "toy"])).admin_key is None
    with pytest.raises(ValueError, match="also an HTTP API key"):
        StudioOptions(model="toy", api_keys=(("alice", "same"),), admin_key="same")
    with pytest.raises(ValueError, match="non-empty"):
        StudioOptions(model="toy", admin_key="  ")


def test_pause_expiry_is_an_option_and_reaches_the_engines_limits():
    def parsed(*argv):
        return app.config_from_args(app.build_parser().parse_args(["--model", "toy", *argv]))

    assert (parsed().pause_expiry_s, parsed().limits.pause_expiry_s) == (3600.0, 3600.0)
    assert parsed("--pause-expiry", "90").limits.pause_expiry_s == 90.0
    assert parsed("--pause-expiry", "0").limits.pause_expiry_s is None  # only a resume ends a pause
    with pytest.raises(ValueError, match=r"pause_expiry_s=-5.0 is not allowed: use a positive number of seconds"):
        parsed("--pause-expiry", "-5")


def test_a_studio_started_paused_runs_nothing_until_the_operator_resumes_it():
    pipeline = ToyPipeline()
    with live_studio(pipeline, start_paused=True, admin_key="key-operator") as (server, engine):
        assert engine.pause_state.engine
        page = httpx.get(server.url + "config", timeout=60).text
        assert "The studio started paused by its operator (--start-paused, or paused before a restart)" in page
        operator = {"Authorization": "Bearer key-operator"}
        queue = httpx.get(server.url + "v1/admin/queue", headers=operator, timeout=60).json()
        assert queue["engine_paused"] is True
        handle = engine.submit(app_params(), session_id="someone")
        assert next(handle.events(timeout=30)).paused == "engine" and pipeline.forward_log == []
        resumed = httpx.post(server.url + "v1/admin/resume", headers=operator, timeout=60).json()
        assert resumed["engine_paused"] is False
        assert type(handle.result(timeout=30)).__name__ == "Completed"


def app_params():
    from tests.engine_helpers import params

    return params(steps=2)

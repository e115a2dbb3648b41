"""Who may list saved results: History tokens signed by the server, API callers' results under keys
nobody can name from outside, and crafted PNGs opened in the History tab."""

from __future__ import annotations

import asyncio
import io
import json
import os
import stat
from types import SimpleNamespace

import httpx
import pytest
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from benchmarks.stress_callers import crafted_pngs
from engine import Completed, GenerationParams, Timings
from pipelines.toy import ToyPipeline
from studio.outputs import OutputStore, UnreadablePng, parse_infotext, png_texts
from studio.page.simple_tab import GUIDANCE_RANGE, ModelForm
from studio.page.tab_tokens import TabTokens
from studio.page.workflow_tab import WorkflowRunner
from studio.server.history_owners import SECRET_FILE, HistoryOwners, legacy_owner_key
from studio.sessions import session_id_of
from tests.studio_helpers import connect, live_studio

SECRET = b"a test secret that is 32 bytes.."


def completed(prompt: str = "a red circle", seed: int = 3) -> Completed:
    params = GenerationParams(prompt=prompt, width=8, height=8, num_inference_steps=2, guidance_scale=1.0,
                              seed=seed, num_frames=1)
    return Completed(images=(Image.new("RGB", (8, 8), (200, 10, 10)),), seed=seed, params=params,
                     timings=Timings(0.0, 0.1, 0.2))


# ---------------------------------------------------------------------------- the keys alone
def forged_tokens(owners: HistoryOwners, caller: str) -> dict[str, object]:
    """Every kind of token a stranger could send for `caller`'s results."""
    signed = owners.issue()
    nonce, _, signature = signed.partition(".")
    return {
        "empty": "",
        "the caller's session as the old key's text": "session\0" + caller,
        "the caller's session": caller,
        "the caller's owner key": owners.of_caller(caller),
        "an unsigned random token": "x" * 32,
        "a legacy token's form": "A" * 32,
        "a signed token's nonce alone": nonce,
        # The first character changed (to one it is not: a nonce may itself start with "y").
        "a tampered nonce": ("y" if nonce[0] != "y" else "z") + nonce[1:] + "." + signature,
        "a signature moved to another nonce": "z" * 32 + "." + signature,
        "another server's signature": HistoryOwners(b"another server's secret........").issue(),
        "a dot alone": ".",
        "a huge token": signed + "a" * 100_000,
        "a number": 12345678901234567890,
        "a list": [signed],
        "an object": {"token": signed},
        "null": None,
    }


def test_only_tokens_this_server_signed_name_a_browser():
    owners = HistoryOwners(SECRET)
    token = owners.issue()
    assert owners.verified(token) == token and len(owners.of_browser(token)) == 32
    assert owners.of_browser(owners.issue()) != owners.of_browser(token)  # a new browser, a new key
    for kind, forged in forged_tokens(owners, "http:key:alice").items():
        assert owners.verified(forged) is None, kind
        assert owners.of_browser(forged) is None, kind
        # A page with a forged token (and no token issued to its tab) files its results under its
        # own session, never anyone else's.
        runner = SimpleNamespace(outputs=SimpleNamespace(owners=owners), tab_tokens=TabTokens(wait_s=0.01))
        assert asyncio.run(WorkflowRunner.page_owner(runner, forged, "ui:mine")) == owners.of_caller("ui:mine"), kind


def test_caller_and_browser_keys_are_apart_and_need_the_secret():
    owners, other = HistoryOwners(SECRET), HistoryOwners(b"another server's secret........")
    assert owners.of_caller("http:key:alice") != other.of_caller("http:key:alice")
    assert owners.of_caller("http:key:alice") != legacy_owner_key("session\0http:key:alice")
    assert owners.of_caller("a") != owners.of_caller("b")
    token = owners.issue()
    assert owners.of_browser(token) not in {owners.of_caller(token), owners.of_caller(token.partition(".")[0])}


def test_the_secret_is_made_once_kept_private_and_survives_a_restart(tmp_path):
    first = HistoryOwners.in_folder(tmp_path / "history")
    token = first.issue()
    path = tmp_path / "history" / SECRET_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(path.read_bytes()) == 32
    again = HistoryOwners.in_folder(tmp_path / "history")  # the next start
    assert again.of_browser(token) == first.of_browser(token)
    assert again.browser_state_secret == first.browser_state_secret
    assert sorted(p.name for p in (tmp_path / "history").iterdir()) == [SECRET_FILE]  # no draft left behind
    path.write_bytes(b"short")
    with pytest.raises(ValueError, match=r"secret.key holds 5 bytes, not a secret: remove it"):
        HistoryOwners.in_folder(tmp_path / "history")


def test_saving_off_gets_a_secret_of_its_own_each_start():
    assert HistoryOwners.in_folder(None).of_caller("a") != HistoryOwners.in_folder(None).of_caller("a")


# ---------------------------------------------------------------------------- crafted PNGs
def png_with_texts(texts: dict[str, str] | None = None) -> bytes:
    info = PngInfo()
    for key, value in (texts or {}).items():
        info.add_text(key, value)
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, "PNG", pnginfo=info)
    return buffer.getvalue()


@pytest.mark.parametrize("name", list(crafted_pngs()))
def test_a_png_that_cannot_be_read_is_one_clear_error(tmp_path, name):
    path = tmp_path / "crafted.png"
    path.write_bytes(crafted_pngs()[name])
    with pytest.raises(UnreadablePng, match=r"^This file can't be read as a PNG: it is not one, it is cut short, "
                                            r"or a text in it is over 1 MiB \("):
        png_texts(path)


def test_settings_outside_what_a_request_may_carry_are_left_out():
    text = ("a prompt\nSteps: 99999, Sampler: euler, CFG scale: nan, Seed: 99999999999999999999999999, "
            "Size: 99999x64, Frames: -3")
    assert parse_infotext(text) == {"prompt": "a prompt", "scheduler": "euler"}
    edge = "p\nSteps: 1000, CFG scale: -7.5, Seed: 9223372036854775807, Size: 8x8192, Frames: 1024"
    assert parse_infotext(edge) == {"prompt": "p", "num_inference_steps": 1000, "guidance_scale": -7.5,
                                    "seed": 2**63 - 1, "width": 8, "height": 8192, "num_frames": 1024}
    assert "seed" not in parse_infotext("p\nSteps: 3, Seed: 9223372036854775808")  # one past the engine's range


# ---------------------------------------------------------------------------- through the studio
class Page:
    """The page's private History events, called as a browser (or a stranger) calls them: by fn_index
    through Gradio's queue, with whatever token it chooses."""

    def __init__(self, url: str, session_hash: str = "history-probe") -> None:
        self.http = httpx.Client(base_url=url, timeout=60)
        config = self.http.get("config").json()
        self.fn_index = {dep["api_name"]: index for index, dep in enumerate(config["dependencies"])
                         if dep.get("api_name")}
        self.session_hash = session_hash

    def call(self, api_name: str, data: list) -> dict:
        joined = self.http.post("gradio_api/queue/join", json={
            "data": data, "fn_index": self.fn_index[api_name], "session_hash": self.session_hash,
            "event_data": None, "trigger_id": None})
        assert joined.status_code == 200, joined.text
        with self.http.stream("GET", "gradio_api/queue/data", params={"session_hash": self.session_hash}) as stream:
            for line in stream.iter_lines():
                if not line.startswith("data:"):
                    continue
                message = json.loads(line[5:])
                if message.get("msg") == "process_completed":
                    return message["output"]
        raise AssertionError(f"{api_name}: the stream ended without an answer")

    def listed(self, token: object) -> list:
        output = self.call("ui_history_refresh", [token])
        assert "error" not in output or output["error"] is None, output
        return output["data"][0]

    def started(self, token: object) -> tuple[object, list]:
        output = self.call("ui_history_start", [token])
        assert "error" not in output or output["error"] is None, output
        return output["data"][0], output["data"][1]


def test_no_token_a_page_can_send_lists_an_api_callers_results(tmp_path):
    outputs = tmp_path / "outputs"
    with live_studio(ToyPipeline(), outputs=outputs) as (server, _):
        caller = connect(server.url)
        status, *_ = caller.predict("an api caller's secret", "", 8, 8, 2, 1.0, 5, api_name="/generate")
        assert status["state"] == "completed"
        (api_result,) = OutputStore(outputs, model="toy").index.history(
            HistoryOwners.in_folder(outputs / "history").of_caller(
                session_id_of(SimpleNamespace(session_hash=caller.session_hash, username=None))), 10)
        page = Page(server.url)
        # A browser's own token, issued by the server, lists that browser's results.
        mine, listed = page.started("")
        assert listed == [] and HistoryOwners.in_folder(outputs / "history").verified(mine) == mine
        OutputStore(outputs, model="toy").save(completed("my own result"), HistoryOwners.in_folder(
            outputs / "history").of_browser(mine))
        (item,) = page.listed(mine)
        assert item["caption"] == "seed 3 · my own result"  # a result saved without a workflow's caption

        owners = HistoryOwners.in_folder(outputs / "history")
        # The caller's true engine session (a stranger can't compute it, but may learn or guess
        # others: an HTTP caller's is "http:key:NAME" or "http:host:ADDRESS").
        true_session = session_id_of(SimpleNamespace(session_hash=caller.session_hash, username=None))
        sessions = {true_session, caller.session_hash, "http:host:127.0.0.1", "http:key:alice"}
        for session in sessions:
            for kind, forged in forged_tokens(owners, session).items():
                assert page.listed(forged) == [], (session, kind)
                fresh, listed = page.started(forged)
                assert listed == [] and fresh != forged and owners.verified(fresh) == fresh, (session, kind)
        assert api_result["owner"] == owners.of_caller(true_session)  # filed under the caller's key
        assert api_result["parameters"].startswith("an api caller's secret")


def test_a_browser_token_from_before_signing_is_exchanged_and_keeps_its_results(tmp_path):
    outputs = tmp_path / "outputs"
    old_token = "Q" * 16 + "r" * 16  # what browsers kept before: token_urlsafe(24)
    OutputStore(outputs, model="toy").save(completed("made before the upgrade"), legacy_owner_key(old_token))
    with live_studio(ToyPipeline(), outputs=outputs) as (server, _):
        page = Page(server.url)
        assert page.listed(old_token) == []  # an unsigned token lists nothing by itself
        fresh, listed = page.started(old_token)
        assert fresh != old_token and [item["caption"] for item in listed] == ["seed 3 · made before the upgrade"]
        assert [item["caption"] for item in page.listed(fresh)] == ["seed 3 · made before the upgrade"]
        assert page.started(old_token)[1] == []  # exchanged once: the old token holds nothing now


def test_a_browser_keeps_its_results_across_a_restart(tmp_path):
    outputs = tmp_path / "outputs"
    with live_studio(ToyPipeline(), outputs=outputs) as (server, _):
        token, _ = Page(server.url).started("")
    OutputStore(outputs, model="toy").save(completed("kept across a restart"),
                                           HistoryOwners.in_folder(outputs / "history").of_browser(token))
    with live_studio(ToyPipeline(), outputs=outputs) as (server, _):  # the next start, same folder
        page = Page(server.url)
        assert page.started(token)[0] == token
        assert [item["caption"] for item in page.listed(token)] == ["seed 3 · kept across a restart"]


def test_crafted_pngs_in_the_history_tab_get_a_message_and_no_traceback(tmp_path, capfd):
    outputs = tmp_path / "outputs"
    files = {name: tmp_path / f"crafted-{index}.png" for index, name in enumerate(crafted_pngs())}
    for name, path in files.items():
        path.write_bytes(crafted_pngs()[name])
    huge_seed = tmp_path / "huge-seed.png"
    huge_seed.write_bytes(png_with_texts({"parameters": "a huge seed\nSteps: 500, Seed: 99999999999999999999999999, "
                                              "Size: 8192x8, CFG scale: 50"}))
    number_workflow = tmp_path / "number-workflow.png"
    number_workflow.write_bytes(png_with_texts({"parameters": "p\nSteps: 3", "workflow": "5"}))
    deep_workflow = tmp_path / "deep-workflow.png"
    deep_workflow.write_bytes(png_with_texts({"parameters": "p\nSteps: 3", "workflow": "[" * 100_000 + "]" * 100_000}))
    with live_studio(ToyPipeline(), outputs=outputs) as (server, engine):
        form = ModelForm.of(engine, None)
        page = Page(server.url)
        for name, path in files.items():
            output = page.call("ui_history_open", [_file(page, path)])
            assert output["error"].replace("&#x27;", "'").startswith("This file can't be read as a PNG: "), (name, output)

        opened = page.call("ui_history_open", [_file(page, huge_seed)])
        assert opened.get("error") is None and opened["data"][1] == png_texts(huge_seed)["parameters"]
        # The opened settings live in the session's state on the server; filling the form with them
        # keeps every value in the form's range (the seed past 64 bits was left out: random again).
        used = page.call("ui_history_use", [None])
        assert used.get("error") is None, used
        model, prompt, _, _, width, height, steps, guidance, _, _, frame_choice, random_seed, seed = used["data"][:13]
        assert frame_choice is None  # the toy model names no frame counts
        assert (prompt, width, height, steps, guidance, random_seed, seed) == (
            "a huge seed", form.size_range[1], form.size_range[0], form.max_steps, GUIDANCE_RANGE[1], True, 0)
        for path, expected in ((number_workflow, "got int"), (deep_workflow, "levels deep")):
            assert page.call("ui_history_open", [_file(page, path)]).get("error") is None
            opened = page.call("ui_history_workflow", [None])
            assert opened["error"].replace("&#x27;", "'").startswith("This PNG's workflow can't be opened: "), opened
            assert expected in opened["error"], opened
    log = capfd.readouterr()
    assert "Traceback" not in log.out + log.err


def _file(page: Page, path) -> dict:
    """An uploaded file as the page sends it to an event."""
    with open(path, "rb") as file:
        answer = page.http.post("gradio_api/upload", files={"files": (os.path.basename(path), file, "image/png")})
    assert answer.status_code == 200, answer.text
    return {"path": answer.json()[0], "meta": {"_type": "gradio.FileData"}}

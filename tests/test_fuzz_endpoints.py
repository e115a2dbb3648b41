"""Fuzz every endpoint with bad input (hypothesis, 705 cases in all): each one must get a clear
client error, a 4xx with a message (OpenAI's shape on /v1) or a gr.Error, never a 5xx, a hang
or a silent success, and the studio must serve a good request afterwards. Gradio's own door is
fuzzed too: bodies nested past the depth limit, bad session hashes, forged History tokens,
crafted PNGs opened in the History tab and workflows past the byte limit sent as objects."""

from __future__ import annotations

import json
import random
import re

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.stress_callers import Endpoints, crafted_png
from engine import Engine
from pipelines.toy import ToyPipeline
from studio.api.http_routes import ImageGenerationRequest
from studio.config import StudioOptions
from studio.app import build_app
from studio.server.serving import StudioServer
from studio.server.guards import MAX_JSON_DEPTH
from studio.workflows.format import MAX_WORKFLOW_BYTES
from tests.test_history_owners import png_with_texts

SETTINGS = dict(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
TALLY: dict[str, int] = {}  # bad inputs tried, per fuzz test
FUZZ_TESTS = ("generations", "content types", "v1 routes", "models and files", "gradio generate", "gradio cancel",
              "deep bodies", "session hashes", "history tokens", "pngs", "big workflows")
ENOUGH = 705  # bad inputs in all: the max_examples below, added up


def _assert_enough_inputs_were_tried() -> None:
    """Every bad input was tried, when every fuzz test ran (a -k subset tries fewer)."""
    assert set(TALLY) <= set(FUZZ_TESTS), TALLY
    if set(TALLY) == set(FUZZ_TESTS):
        assert sum(TALLY.values()) == ENOUGH, TALLY


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    outputs = tmp_path_factory.mktemp("outputs")  # results are saved: a forged token has something to find
    config = StudioOptions(model="toy", port=0, max_steps=50, preview_every=0, outputs=str(outputs))
    engine = Engine(ToyPipeline(), limits=config.limits).start()
    app = build_app(engine, config)
    GENERATE["endpoints"] = Endpoints.of(app.state.demo)
    GENERATE["defaults"] = GENERATE["endpoints"].generate.defaults
    server = StudioServer(app, "127.0.0.1", 0).start()
    with httpx.Client(base_url=server.url, timeout=30) as http:
        yield http, engine
    server.stop()
    engine.close()
    _assert_enough_inputs_were_tried()


def _count(name: str) -> None:
    TALLY[name] = TALLY.get(name, 0) + 1


def _assert_openai_4xx(response: httpx.Response) -> None:
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], error


# ---------------------------------------------------------------------------- bad generation bodies
def _not_valid_size(text: str) -> bool:
    match = re.fullmatch(r"(\d{1,5})x(\d{1,5})", text)
    if text == "auto" or match is None:
        return text != "auto"
    width, height = (int(v) for v in match.groups())
    return not (8 <= width <= 64 and 8 <= height <= 64 and width % 8 == 0 and height % 8 == 0)


_JUNK = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=False), st.lists(st.integers(), max_size=3),
                  st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
BAD_FIELDS = {
    "prompt": st.one_of(st.just(""), st.text(" \t\n", min_size=1, max_size=5), st.text(min_size=2001, max_size=2100),
                        st.integers(), _JUNK.filter(lambda v: v is not None)),
    "n": st.one_of(st.integers(max_value=0), st.integers(min_value=9), st.text(max_size=3), st.floats(), st.booleans()),
    "size": st.one_of(st.text(max_size=12).filter(_not_valid_size), st.integers(), st.booleans()),
    "num_inference_steps": st.one_of(st.integers(max_value=0), st.integers(min_value=51), st.floats(),
                                     st.text(max_size=3), st.booleans()),
    "guidance_scale": st.one_of(st.floats(max_value=-0.001), st.floats(min_value=100.001), st.text(max_size=3),
                                st.booleans()),
    "seed": st.one_of(st.integers(max_value=-1), st.integers(min_value=2**63), st.floats(), st.text(max_size=3)),
    "response_format": st.text(max_size=10).filter(lambda v: v not in ("b64_json", "url")),
    "model": st.text(min_size=1, max_size=20).filter(lambda v: v != "toy"),
    "negative_prompt": st.one_of(st.text(min_size=2001, max_size=2050), st.integers(), st.booleans()),
    "output_format": st.text(max_size=5).filter(lambda v: v != "png"),
}
_bad_field = st.sampled_from(sorted(BAD_FIELDS)).flatmap(lambda name: st.tuples(st.just(name), BAD_FIELDS[name]))
_unknown_field = st.text(min_size=1, max_size=12).filter(lambda k: k not in ImageGenerationRequest.model_fields)
BAD_BODIES = st.one_of(
    _bad_field.map(lambda item: json.dumps({"prompt": "a red circle", item[0]: item[1]}).encode()),
    st.tuples(_unknown_field, _JUNK).map(lambda item: json.dumps({"prompt": "a cat", item[0]: item[1]}).encode()),
    st.binary(max_size=40).filter(lambda b: not b.strip().startswith(b"{")),  # not JSON, or not an object
    _JUNK.map(lambda v: json.dumps(v).encode()),  # JSON, not an object
)


@settings(max_examples=240, **SETTINGS)
@given(body=BAD_BODIES)
def test_bad_generation_bodies_get_an_openai_4xx(studio, body):
    http, engine = studio
    response = http.post("/v1/images/generations", content=body, headers={"content-type": "application/json"})
    _assert_openai_4xx(response)
    _count("generations")


@settings(max_examples=30, **SETTINGS)
@given(content_type=st.sampled_from(["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                     "text/html", ""]), body=st.binary(max_size=30))
def test_bodies_that_are_not_json_are_refused(studio, content_type, body):
    http, _ = studio
    headers = {"content-type": content_type} if content_type else {}
    response = http.post("/v1/images/generations", content=body, headers=headers)
    _assert_openai_4xx(response)
    assert response.status_code == 415
    _count("content types")


# ---------------------------------------------------------------------------- other /v1 routes
_segment = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="/?#%"),
                   min_size=1, max_size=12)


@settings(max_examples=70, **SETTINGS)
@given(method=st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE"]),
       path=st.lists(_segment, min_size=1, max_size=3).map("/".join))
def test_unknown_v1_routes_get_an_openai_4xx(studio, method, path):
    http, _ = studio
    if path in ("models", "models/toy", "openapi.json", "images/generations") or path.startswith("images/files/"):
        path = "x/" + path  # only unknown routes here
    response = http.request(method, f"/v1/{path}", content=b"{}" if method != "GET" else None,
                            headers={"content-type": "application/json"})
    _assert_openai_4xx(response)
    _count("v1 routes")


@settings(max_examples=30, **SETTINGS)
@given(name=_segment)
def test_unknown_models_and_image_files_get_404(studio, name):
    http, _ = studio
    for path in (f"/v1/models/{name}x", f"/v1/images/files/{name}"):
        response = http.get(path)
        _assert_openai_4xx(response)
        assert response.status_code == 404
    _count("models and files")


# ---------------------------------------------------------------------------- the Gradio API
GOOD_FORM = ["a red circle", "", 64, 64, 4, 1.0, -1]
BAD_FORM_VALUES = {
    0: st.one_of(st.just(""), st.text(" ", min_size=1, max_size=3), st.text(min_size=2001, max_size=2010)),
    2: st.one_of(st.integers(max_value=7), st.integers(min_value=65), st.integers(9, 63).filter(lambda v: v % 8),
                 st.text(min_size=1, max_size=3).filter(lambda v: not v.strip().lstrip("+-").replace(".", "").isdigit()),
                 st.floats(0.1, 63.9).filter(lambda v: not v.is_integer()), st.booleans(), st.lists(st.integers(), min_size=1)),
    4: st.one_of(st.integers(max_value=0), st.integers(min_value=51), st.floats(0.1, 40).filter(lambda v: not v.is_integer()),
                 st.booleans()),
    5: st.one_of(st.floats(max_value=-0.01), st.floats(min_value=100.01, max_value=1e30), st.just("NaN"), st.booleans()),
    6: st.one_of(st.floats(0.5, 1e6).filter(lambda v: not v.is_integer()), st.integers(min_value=2**63),
                 st.dictionaries(st.text(max_size=2), st.integers(), min_size=1, max_size=1)),
}
BAD_FORMS = st.one_of(  # ("form", prompt ... seed with one bad value) or ("count", values too few / too many)
    st.sampled_from(sorted(BAD_FORM_VALUES)).flatmap(lambda index: BAD_FORM_VALUES[index].map(
        lambda value: ("form", [*GOOD_FORM[:index], value, *GOOD_FORM[index + 1:]]))),
    # Leaving out the last inputs (loras and step_cache, which have defaults) is a valid call: three or more too few.
    st.integers(-8, -3).map(lambda delta: ("count", delta)),
    st.integers(1, 2).map(lambda delta: ("count", delta)),
)
GENERATE: dict = {}  # /generate's inputs' defaults, read from the served page (later inputs: the model)


def _call_data(kind: str, value) -> list:
    defaults = GENERATE["defaults"]
    if kind == "form":
        return value + list(defaults[len(value):])
    return [1] * max(0, len(defaults) + value)


def _gradio_error_message(http: httpx.Client, data: list) -> str:
    """Call /generate through Gradio's call API; the gr.Error message it answers with."""
    # Python's json writes NaN and Infinity, and Gradio's reader takes them: so may a caller.
    posted = http.post("gradio_api/call/generate", content=json.dumps({"data": data}),
                       headers={"content-type": "application/json"})
    if posted.status_code != 200:
        assert 400 <= posted.status_code < 500, posted.text[:300]
        return posted.json()["error"]
    events = http.get(f"gradio_api/call/generate/{posted.json()['event_id']}").text
    assert events.startswith("event: error"), events[:300]
    payload = json.loads(events.partition("data:")[2].strip().splitlines()[0])
    return payload["error"]


@settings(max_examples=90, **SETTINGS)
@given(form=BAD_FORMS)
def test_bad_generate_calls_get_a_gradio_error_with_a_message(studio, form):
    http, engine = studio
    message = _gradio_error_message(http, _call_data(*form))
    assert isinstance(message, str) and len(message) > 10, message
    assert ("values in 'data'" in message) == (form[0] == "count"), message  # the bad field, not the count
    _count("gradio generate")


@settings(max_examples=40, **SETTINGS)
@given(value=st.one_of(st.integers(), st.floats(), st.booleans(), st.none(),
                       st.lists(st.text(max_size=3), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)),
       extra=st.booleans())
def test_bad_cancel_calls_get_a_clear_400(studio, value, extra):
    http, _ = studio
    data = [value, value] if extra else [value]
    response = http.post("gradio_api/run/cancel", content=json.dumps({"data": data, "session_hash": "fuzz"}),
                         headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text[:300]
    assert len(response.json()["error"]) > 10
    _count("gradio cancel")


# ---------------------------------------------------------------------------- Gradio's door
def _assert_gradio_4xx(response: httpx.Response) -> None:
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    assert len(response.json()["error"]) > 10, response.text[:300]


def _nested(depth: int, opener: str) -> str:
    closer = "]" if opener == "[" else "}"
    return opener * depth + "1" + closer * depth


@settings(max_examples=40, **SETTINGS)
@given(depth=st.integers(MAX_JSON_DEPTH + 1, 20_000), opener=st.sampled_from(["[", '{"a":']),
       path=st.sampled_from(["gradio_api/queue/join", "gradio_api/run/generate", "gradio_api/call/generate",
                             "gradio_api/cancel"]))
def test_bodies_nested_past_the_limit_get_a_4xx(studio, depth, opener, path):
    http, _ = studio
    body = f'{{"data": {_nested(depth, opener)}, "fn_index": 0, "session_hash": "fuzz-deep"}}'
    response = http.post(path, content=body, headers={"content-type": "application/json"})
    _assert_gradio_4xx(response)
    assert f"at most {MAX_JSON_DEPTH}" in response.json()["error"], response.text[:300]
    _count("deep bodies")


BAD_SESSION_HASHES = st.one_of(
    st.just(""), st.none(), st.integers(), st.floats(), st.booleans(), st.lists(st.integers(), max_size=2),
    st.text(alphabet="abc123", min_size=129, max_size=300),
    st.text(min_size=1, max_size=8).filter(lambda text: any(not (c.isascii() and (c.isalnum() or c in "-_.:"))
                                                            for c in text)),
)


@settings(max_examples=40, **SETTINGS)
@given(session=BAD_SESSION_HASHES, stream=st.booleans())
def test_bad_session_hashes_get_a_4xx(studio, session, stream):
    http, _ = studio
    if stream and isinstance(session, str):
        response = http.get("gradio_api/queue/data", params={"session_hash": session})
    else:
        response = http.post("gradio_api/queue/join", json={"data": list(GENERATE["defaults"]), "fn_index":
                                                             GENERATE["endpoints"].generate.fn_index,
                                                             "session_hash": session})
    _assert_gradio_4xx(response)
    assert "session_hash" in response.json()["error"]
    _count("session hashes")


def _queue_call(http: httpx.Client, endpoint, data: list, session: str) -> dict:
    """A page's call through Gradio's queue: the completion message (a broken stream fails)."""
    joined = http.post("gradio_api/queue/join", json={"data": data, "fn_index": endpoint.fn_index,
                                                      "session_hash": session})
    assert joined.status_code == 200, joined.text[:300]
    with http.stream("GET", "gradio_api/queue/data", params={"session_hash": session}) as stream:
        for line in stream.iter_lines():
            if line.startswith("data:") and json.loads(line[5:]).get("msg") == "process_completed":
                return json.loads(line[5:])
    raise AssertionError("the event stream ended without an answer")


FORGED_TOKENS = st.one_of(
    st.sampled_from(["session\0http:host:127.0.0.1", "http:host:127.0.0.1", "session\0http:key:alice", ""]),
    st.text(max_size=60), st.text(alphabet="ABCxyz019_-", min_size=32, max_size=32),
    st.builds(lambda nonce, signature: f"{nonce}.{signature}", st.text(alphabet="abc019_-", min_size=1, max_size=40),
              st.text(alphabet="abc019_-", max_size=50)),
    st.integers(), st.none(), st.lists(st.text(max_size=3), max_size=2),
)


@settings(max_examples=60, **SETTINGS)
@given(token=FORGED_TOKENS)
def test_a_forged_history_token_lists_nothing(studio, token):
    http, _ = studio
    if not TALLY.get("history tokens"):  # an API caller's result is saved first: there is something to find
        for session in ("fuzz-caller", "http:host:127.0.0.1"):
            done = _queue_call(http, GENERATE["endpoints"].generate, GOOD_FORM + list(GENERATE["defaults"][7:]), session)
            assert done["success"], done
    done = _queue_call(http, GENERATE["endpoints"].history_refresh, [token], "fuzz-history")
    assert done["success"] and done["output"]["data"][0] == [], done
    _count("history tokens")


@settings(max_examples=45, **SETTINGS)
@given(seed=st.integers(0, 2**32), cut=st.integers(0, 200), kind=st.sampled_from(["crafted", "cut", "huge seed"]))
def test_a_crafted_png_gets_a_message_or_its_settings_in_range(studio, seed, cut, kind):
    """A hostile file is refused with a message; a PNG whose texts say anything opens."""
    http, _ = studio
    if kind == "crafted":
        _, content = crafted_png(random.Random(seed))
    else:
        parameters = f"p\nSteps: {seed}, Seed: {seed}{'9' * (cut % 30)}, Size: {cut}x{seed % 9000}"
        content = png_with_texts({"parameters": parameters})
        content = content[:cut] if kind == "cut" else content
    uploaded = http.post("gradio_api/upload", files={"files": ("fuzz.png", content, "image/png")})
    assert uploaded.status_code == 200, uploaded.text[:300]
    file = {"path": uploaded.json()[0], "meta": {"_type": "gradio.FileData"}}
    done = _queue_call(http, GENERATE["endpoints"].history_open, [file], "fuzz-png")
    if kind == "huge seed":
        assert done["success"] and done["output"]["data"][1] == parameters, done
    elif done["success"]:
        assert kind == "cut", done  # cut after its texts: they are read
    else:
        error = done["output"]["error"]
        assert "read as a PNG" in error or (kind == "cut" and "carries no settings" in error), done
    _count("pngs")


@settings(max_examples=20, **SETTINGS)
@given(extra=st.integers(1, 3 << 20), where=st.sampled_from(["field", "node value"]))
def test_a_workflow_object_past_the_limit_is_refused(studio, extra, where):
    http, _ = studio
    text = "x" * (MAX_WORKFLOW_BYTES + extra)
    workflow = {"version": 1, "nodes": [{"id": "1", "type": "prompt", "values": {"text": "a red circle"}}],
                "links": []}
    if where == "field":
        workflow["padding"] = text
    else:
        workflow["nodes"][0]["values"]["text"] = text
    posted = http.post("gradio_api/call/run_workflow", json={"data": [workflow]})
    assert posted.status_code == 200, posted.text[:300]
    events = http.get(f"gradio_api/call/run_workflow/{posted.json()['event_id']}").text
    assert events.startswith("event: error"), events[:300]
    message = json.loads(events.partition("data:")[2].strip().splitlines()[0])["error"]
    assert f"at most {MAX_WORKFLOW_BYTES}" in message, message
    _count("big workflows")


def test_the_studio_still_serves_after_the_fuzzing(studio):
    http, engine = studio
    ok = http.post("/v1/images/generations", json={"prompt": "still here", "num_inference_steps": 2})
    assert ok.status_code == 200
    assert engine.is_alive and engine.requests_in_flight == 0 and engine.states_in_memory == 0
    _assert_enough_inputs_were_tried()

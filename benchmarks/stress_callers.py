"""The stress run's callers (benchmarks/stress.py): each kind of call, sent as a client would
send it, and what its answer means (an Outcome). Hostile callers at Gradio's door are here too,
and the crafted PNGs and forged tokens they send (tests/test_fuzz_endpoints.py and
tests/test_history_owners.py use them as well)."""

from __future__ import annotations

import json
import random
import re
import socket
import time
from dataclasses import dataclass

CALL_TIMEOUT_S = 60.0
FAULTS = ("[fail:prepare_encode]", "[fail:denoise_step]", "[fail:step_scheduler]", "[fail:post_decode]", "[nan]")
HOSTILE = (  # (field, value) for the gradio form; the HTTP API gets the same as a size or steps
    ("width", 4096), ("width", 63), ("height", 100_000), ("steps", 0), ("steps", 5000), ("width", "abc"),
)


@dataclass
class Outcome:
    kind: str
    via: str  # "http" | "gradio"
    answer: str  # "completed", "rejected", "failed", "aborted", "disconnected", "listed nothing", "hang", "wrong"
    detail: str = ""
    seconds: float = 0.0



@dataclass(frozen=True)
class Endpoint:
    fn_index: int
    defaults: tuple  # one value per input, as the page would send it


@dataclass(frozen=True)
class Endpoints:
    generate: Endpoint
    history_refresh: Endpoint  # the History tab's listing (a private event a page calls by fn_index)
    history_open: Endpoint  # the History tab's "Open a PNG"

    @classmethod
    def of(cls, demo) -> "Endpoints":
        def endpoint(api_name: str) -> Endpoint:
            """An event's fn_index and its inputs' default values (a raw call sends one per input)."""
            index, fn = next((i, fn) for i, fn in demo.fns.items() if fn.api_name == api_name)
            return Endpoint(index, tuple(getattr(block, "value", None) for block in fn.inputs))

        return cls(endpoint("generate"), endpoint("ui_history_refresh"), endpoint("ui_history_open"))


# ---------------------------------------------------------------------------- what an answer means
@dataclass(frozen=True)
class Asked:
    """What a call asked for that decides its one right answer."""

    n: int = 1  # images asked for
    fault: str | None = None  # the fault injected (one of FAULTS)
    hostile: str | None = None  # the form field sent out of bounds (a HOSTILE field)


# Where each hostile field is refused: the HTTP error's `param`, the start of the page's message.
HOSTILE_PARAM = {"width": "size", "height": "size", "steps": "num_inference_steps"}
HOSTILE_NAME = {"width": "width", "height": "height", "steps": "num_inference_steps"}


def fault_message(fault: str) -> str:
    """What the engine's Failed says for an injected fault (in the HTTP error and the gr.Error)."""
    if fault == "[nan]":
        return "latents became NaN or infinite"
    return f"injected failure in {fault.removeprefix('[fail:').removesuffix(']')} for this prompt"


def http_answer(response, asked: Asked) -> str:
    """Only what the API promises counts: OpenAI's error JSON, one image per `n`, a hostile value
    refused under its own field, a fault's 500 generation_failed with the fault's own message.
    Anything else is "wrong": any other 500, an error that is not OpenAI's, hostile input accepted."""
    try:
        payload = response.json()
    except ValueError:
        return "wrong"
    status = response.status_code
    if status == 200:
        data = payload.get("data") if isinstance(payload, dict) else None
        made = isinstance(data, list) and len(data) == asked.n and all(item.get("b64_json") for item in data)
        return "completed" if made and asked.hostile is None and asked.fault is None else "wrong"
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict) or not error.get("message") or not error.get("code"):
        return "wrong"
    if 400 <= status < 500:
        named = asked.hostile is None or error.get("param") == HOSTILE_PARAM[asked.hostile]
        return "rejected" if named else "wrong"
    if status == 503 and error["code"] == "request_aborted":
        return "aborted"
    if (status == 500 and error["code"] == "generation_failed" and asked.fault is not None
            and fault_message(asked.fault) in error["message"]):
        return "failed"
    return "wrong"


def gradio_error_answer(text: str, asked: Asked) -> str:
    """A gr.Error is right for a fault (its own message) and for a hostile value (naming the
    field); for anything else it is "wrong"."""
    if asked.fault is not None:
        return "failed" if fault_message(asked.fault) in text else "wrong"
    if asked.hostile is not None:
        return "rejected" if text.startswith(HOSTILE_NAME[asked.hostile]) else "wrong"
    return "wrong"


def door_answer(status: int) -> str:
    """Gradio's door refuses a malformed call with a 4xx; a 5xx, or taking it, is wrong."""
    return "rejected" if 400 <= status < 500 else "wrong"


# ---------------------------------------------------------------------------- callers
def call_http(url: str, rng: random.Random, kind: str) -> Outcome:
    import httpx

    body: dict = {"prompt": f"stress {rng.random():.6f}", "num_inference_steps": rng.randint(1, 12),
                  "size": rng.choice(["32x32", "64x64"]), "n": rng.choice([1, 1, 1, 2])}
    asked = Asked(n=body["n"])
    if kind == "fault":
        asked = Asked(n=body["n"], fault=rng.choice(FAULTS))
        body["prompt"] += " " + asked.fault
        body["num_inference_steps"] = max(3, body["num_inference_steps"])  # "[nan]" strikes at step 2: every fault fires
    elif kind == "hostile":
        field_, value = rng.choice(HOSTILE)
        asked = Asked(n=body["n"], hostile=field_)
        if field_ == "steps":
            body["num_inference_steps"] = value
        else:
            body["size"] = f"{value}x64" if isinstance(value, int) else str(value)
    response = httpx.post(url + "v1/images/generations", json=body, timeout=CALL_TIMEOUT_S)
    return Outcome(kind, "http", http_answer(response, asked), f"{response.status_code} {response.text[:140]}")


def call_http_disconnect(url: str, rng: random.Random) -> Outcome:
    host, port = re.match(r"http://([^:/]+):(\d+)/", url).groups()
    payload = json.dumps({"prompt": f"leaves {rng.random():.6f}", "num_inference_steps": rng.randint(8, 40)}).encode()
    head = (f"POST /v1/images/generations HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=CALL_TIMEOUT_S) as sock:
        sock.sendall(head + payload)
        time.sleep(rng.uniform(0.0, 0.05))  # hang up somewhere in the middle
    return Outcome("http_disconnect", "http", "disconnected")


def gradio_arguments(rng: random.Random, kind: str) -> tuple[dict, Asked]:
    arguments = dict(prompt=f"page {rng.random():.6f}", negative_prompt="", width=rng.choice([32, 64]),
                     height=64, steps=rng.randint(1, 12), guidance_scale=1.0, seed=-1)
    asked = Asked()
    if kind == "fault":
        asked = Asked(fault=rng.choice(FAULTS))
        arguments["prompt"] += " " + asked.fault
        arguments["steps"] = max(3, arguments["steps"])  # "[nan]" strikes at step 2: every fault fires
    elif kind == "hostile":
        field_, value = rng.choice(HOSTILE)
        asked = Asked(hostile=field_)
        arguments[field_] = value
    elif kind == "gradio_cancel":
        arguments["steps"] = rng.randint(20, 50)
    return arguments, asked


def call_gradio(client, rng: random.Random, kind: str) -> Outcome:
    from gradio_client.exceptions import AppError

    arguments, asked = gradio_arguments(rng, kind)
    job = client.submit(**arguments, api_name="/generate")
    if kind == "gradio_cancel":
        deadline = time.monotonic() + CALL_TIMEOUT_S
        request_id = None
        while request_id is None and not job.done() and time.monotonic() < deadline:
            statuses = [out[0] for out in job.outputs() if isinstance(out[0], dict)]
            request_id = statuses[-1]["request_id"] if statuses else None
            time.sleep(0.005)
        if request_id is not None:
            client.predict(request_id, api_name="/cancel")
    try:
        status, _, image = job.result(timeout=CALL_TIMEOUT_S)
    except AppError as error:
        return Outcome(kind, "gradio", gradio_error_answer(str(error), asked), str(error)[:120])
    except TimeoutError:
        return Outcome(kind, "gradio", "hang")
    if asked.fault is not None or asked.hostile is not None:  # a fault that never fired, hostile input taken
        return Outcome(kind, "gradio", "wrong", f"{status['state']}: {arguments}"[:160])
    answer = {"completed": "completed" if image else "wrong", "aborted": "aborted"}.get(status["state"], "wrong")
    return Outcome(kind, "gradio", answer, f"{status['state']} {image!r:.60}")


def call_gradio_disconnect(url: str, rng: random.Random, endpoint: Endpoint) -> Outcome:
    """A page that joins the queue, reads its event stream for a moment and closes (a closed tab)."""
    import httpx

    session = f"stress-{rng.getrandbits(64):x}"
    form = [f"tab {rng.random():.6f}", "", 64, 64, rng.randint(8, 40), 1.0, -1]  # prompt ... seed
    data = form + list(endpoint.defaults[len(form):])  # any later inputs (the model) at their defaults
    with httpx.Client(base_url=url, timeout=CALL_TIMEOUT_S) as http:
        joined = http.post("gradio_api/queue/join", json={"data": data, "fn_index": endpoint.fn_index,
                                                          "session_hash": session, "event_data": None,
                                                          "trigger_id": None})
        if joined.status_code != 200:
            return Outcome("gradio_disconnect", "gradio", "wrong", joined.text[:120])
        with http.stream("GET", "gradio_api/queue/data", params={"session_hash": session}) as stream:
            for index, _ in enumerate(stream.iter_lines()):
                if index >= rng.randint(1, 6):
                    break  # the tab closes
    return Outcome("gradio_disconnect", "gradio", "disconnected")


# ---------------------------------------------------------------------------- hostile callers at Gradio's door
def queue_call(http, endpoint: Endpoint, data: list, session: str) -> tuple[int, dict | None]:
    """A page's call through Gradio's queue: (the join's status, the completion message or None)."""
    joined = http.post("gradio_api/queue/join", json={"data": data, "fn_index": endpoint.fn_index,
                                                      "session_hash": session, "event_data": None,
                                                      "trigger_id": None})
    if joined.status_code != 200:
        return joined.status_code, None
    with http.stream("GET", "gradio_api/queue/data", params={"session_hash": session}) as stream:
        for line in stream.iter_lines():
            if line.startswith("data:"):
                message = json.loads(line[5:])
                if message.get("msg") == "process_completed":
                    return 200, message
    return 200, None


def forged_tokens(rng: random.Random) -> list[object]:
    """Tokens a stranger could try for an HTTP caller's (predictable) session or anyone's."""
    session = rng.choice(["http:host:127.0.0.1", "http:key:alice"])
    nonce = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789_-") for _ in range(32))
    return ["session\0" + session, session, nonce, nonce + ".c2lnbmF0dXJl", "", "A" * 32]


def crafted_pngs() -> dict[str, bytes]:
    """Files a stranger could offer the History tab as PNGs, by what is wrong with them."""
    import io
    import struct
    import zlib

    from PIL import Image

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, "PNG")
    plain = buffer.getvalue()
    pixels = plain.index(b"IDAT") - 4
    bomb = chunk(b"zTXt", b"parameters\0\0" + zlib.compress(b"a" * (16 << 20), 9))  # 16 MiB of text in 16 KiB
    return {
        "a zTXt bomb": plain[:pixels] + bomb + plain[pixels:],
        "not a PNG": b"GIF89a this is not a png at all",
        "a PNG cut inside its header": plain[:20],
        "a PNG cut inside a chunk": plain[:pixels + 6],
    }


def crafted_png(rng: random.Random) -> tuple[str, bytes]:
    return rng.choice(sorted(crafted_pngs().items()))


def call_door(url: str, client, rng: random.Random, kind: str, endpoints: Endpoints) -> Outcome:
    import httpx

    session = f"door-{rng.getrandbits(64):x}"
    with httpx.Client(base_url=url, timeout=CALL_TIMEOUT_S) as http:
        if kind == "forged_history":
            for token in forged_tokens(rng):
                status, done = queue_call(http, endpoints.history_refresh, [token], session)
                if status != 200 or done is None or not done.get("success"):
                    return Outcome(kind, "gradio", "wrong", f"{status} {str(done)[:100]}")
                if done["output"]["data"][0]:
                    return Outcome(kind, "gradio", "wrong", f"token {token!r:.40} listed {len(done['output']['data'][0])}")
            return Outcome(kind, "gradio", "listed nothing")
        if kind == "deep_json":
            depth = 5000
            body = ('{"data": ' + "[" * depth + "]" * depth + f', "fn_index": {endpoints.generate.fn_index}, '
                    f'"session_hash": "{session}"}}')
            path = rng.choice(["gradio_api/queue/join", "gradio_api/run/generate", "gradio_api/call/generate"])
            answer = http.post(path, content=body, headers={"content-type": "application/json"})
            return Outcome(kind, "gradio", door_answer(answer.status_code), f"{path} {answer.status_code}")
        if kind == "empty_hash":
            data = list(endpoints.generate.defaults)
            answer = http.post("gradio_api/queue/join", json={"data": data, "fn_index": endpoints.generate.fn_index,
                                                              "session_hash": rng.choice(["", None, 7])})
            return Outcome(kind, "gradio", door_answer(answer.status_code), str(answer.status_code))
        if kind == "crafted_png":
            which, content = crafted_png(rng)
            uploaded = http.post("gradio_api/upload", files={"files": ("crafted.png", content, "image/png")})
            if uploaded.status_code != 200:
                return Outcome(kind, "gradio", "wrong", f"upload {uploaded.status_code}")
            file = {"path": uploaded.json()[0], "meta": {"_type": "gradio.FileData"}}
            status, done = queue_call(http, endpoints.history_open, [file], session)
            refused = done is not None and not done.get("success") and "read as a PNG" in str(done["output"].get("error"))
            return Outcome(kind, "gradio", "rejected" if refused else "wrong", f"{which}: {str(done)[:100]}")
    if kind == "big_workflow":
        from gradio_client.exceptions import AppError

        workflow = {"version": 1, "nodes": [{"id": "1", "type": "prompt", "values": {"text": "x" * (2 << 20)}}],
                    "links": []}
        try:
            client.predict(workflow, api_name="/run_workflow")
        except AppError as error:
            return Outcome(kind, "gradio", "rejected" if "bytes" in str(error) else "wrong", str(error)[:120])
        return Outcome(kind, "gradio", "wrong", "a workflow over the byte limit ran")
    if kind == "sibling_cancel":
        arguments = dict(prompt=f"sibling {rng.random():.6f}", negative_prompt="", width=32, height=32,
                         steps=rng.randint(10, 30), guidance_scale=1.0, seed=-1)
        cancelled = client.submit(**{**arguments, "steps": 50}, api_name="/generate")
        sibling = client.submit(**arguments, api_name="/generate")
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while not cancelled.outputs() and not cancelled.done() and time.monotonic() < deadline:
            time.sleep(0.005)
        cancelled.cancel()
        try:
            status = sibling.result(timeout=CALL_TIMEOUT_S)[0]
        except TimeoutError:
            return Outcome(kind, "gradio", "hang", "the sibling of a cancelled job never finished")
        return Outcome(kind, "gradio", "completed" if status["state"] == "completed" else "wrong", status["state"])
    raise ValueError(f"not a door kind: {kind}")

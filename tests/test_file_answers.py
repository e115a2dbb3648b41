"""A file the studio sends (`/gradio_api/file=`) arrives whole or answers cleanly, even when it
changes or goes while it is being sent (studio/server/file_answers.py), and a picture Gradio is
given again is not rewritten under a page still fetching it (server_compat.cache_pictures_without_rewriting).
Real servers, real HTTP; the server's own log (stderr) must hold no traceback."""

from __future__ import annotations

import io
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gradio as gr
import httpx
from gradio import processing_utils
from PIL import Image

from pipelines.toy import ToyPipeline
from studio.media import write_mp4
from studio.outputs import OutputStore
from studio.page.workflow_tab import WEB_DIR
from studio.server import server_compat
from studio.server.history_owners import HistoryOwners
from tests.studio_helpers import live_studio, wait_for
from tests.test_history_owners import Page, completed

BIG_BYTES = 32 * 2**20  # far more than the sockets between server and client hold: the server is mid-file
TRACEBACK_SIGNS = ("Traceback", "LocalProtocolError", "Content-Length", "Exception in ASGI application")


def served_file(name: str, data: bytes) -> Path:
    """A file where Gradio serves files from (its upload folder)."""
    folder = Path(gr.utils.get_upload_folder()) / "stepstudio-file-answers"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(data)
    return path


def no_traceback(capfd) -> None:
    log = capfd.readouterr()
    found = [sign for sign in TRACEBACK_SIGNS if sign in log.out + log.err]
    assert found == [], (log.out + log.err)[-3000:]


def test_a_file_cut_short_and_deleted_while_it_is_sent_arrives_whole(capfd):
    data = os.urandom(BIG_BYTES)
    path = served_file("cut-short.bin", data)
    with live_studio(ToyPipeline()) as (server, _), httpx.Client(timeout=60) as http:
        with http.stream("GET", f"{server.url}gradio_api/file={path}") as answer:
            chunks = answer.iter_raw()
            received = [next(chunks)]  # the answer has started ...
            with open(path, "r+b") as file:  # ... when the file is rewritten in place: cut short
                file.truncate(1000)
            path.unlink()  # and then deleted
            received.extend(chunks)
        assert answer.status_code == 200 and int(answer.headers["content-length"]) == BIG_BYTES
        assert b"".join(received) == data  # the file as it was when it was read
        # A file that is gone before it is asked for: a clean answer before any byte of it.
        gone = http.get(f"{server.url}gradio_api/file={path}")
        assert gone.status_code in (403, 404)
        # The page's own scripts, which Gradio compresses (the body is shorter than the file), and
        # part of a file (a Range request, as a video player asks) come as they are.
        script = WEB_DIR / "lightbox.js"
        compressed = http.get(f"{server.url}gradio_api/file={script}", headers={"Accept-Encoding": "br, gzip"})
        assert compressed.status_code == 200 and compressed.headers["content-encoding"] in ("br", "gzip")
        assert compressed.content == script.read_bytes()
        part = http.get(f"{server.url}gradio_api/file={script}", headers={"Range": "bytes=3-9"})
        assert part.status_code == 206 and part.content == script.read_bytes()[3:10]
    no_traceback(capfd)


def test_the_history_tab_open_during_sweeps_of_temp_files_gets_whole_files_or_clean_answers(tmp_path, capfd):
    """History listed again and again (the tab opened, Refresh), its pictures fetched by four
    readers at once, while the studio's sweeper deletes every cached file older than a second:
    each answer is the listed file, whole, or a clean 403/404 for one swept already."""
    outputs = tmp_path / "outputs"
    with live_studio(ToyPipeline(), outputs, temp_file_ttl_s=1) as (server, _):
        page = Page(server.url)
        token, _ = page.started("")
        store = OutputStore(outputs, model="toy", write_video=write_mp4)
        owner = HistoryOwners.in_folder(outputs / "history").of_browser(token)
        for seed in range(6):
            store.save(completed(f"picture {seed}", seed=seed), owner)
        frames = [Image.new("RGB", (32, 32), (40 * i, 90, 200 - 20 * i)) for i in range(9)]
        video = completed("a video", seed=9)
        store.save(type(video)(images=tuple(frames), seed=9, params=video.params, timings=video.timings), owner)
        answers: dict[str, int] = {}
        lock = threading.Lock()

        def fetch(item: dict) -> None:
            url = item["image"]["url"]
            answer = httpx.get(url, timeout=60)  # a cut answer would raise RemoteProtocolError here
            if answer.status_code == 200:
                assert len(answer.content) == int(answer.headers["content-length"]) > 0, url
                with Image.open(io.BytesIO(answer.content)) as picture:
                    picture.load()  # a whole PNG (or the video's GIF): a cut one fails to decode
            else:
                assert answer.status_code in (403, 404), (answer.status_code, answer.text[:200])
            with lock:
                answers[str(answer.status_code)] = answers.get(str(answer.status_code), 0) + 1

        def a_round() -> bool:
            listed = page.listed(token)
            assert len(listed) == 7
            with ThreadPoolExecutor(4) as readers:
                list(readers.map(fetch, listed * 3))
            return answers.get("200", 0) > 0 and answers.get("403", 0) + answers.get("404", 0) > 0

        # Until a sweep has taken files that a listing handed out (and others came whole).
        wait_for(a_round, timeout_s=120, what="a sweep to delete files the History tab listed")
    no_traceback(capfd)


def test_a_picture_sent_again_is_not_written_again(tmp_path):
    """Gradio names a cached picture by its content's hash; sent again, the file there is only
    touched, never truncated and written again under a page that may be reading it."""
    server_compat.cache_pictures_without_rewriting()
    picture = Image.new("RGB", (16, 16), (10, 200, 30))
    first = Path(processing_utils.save_pil_to_cache(picture, str(tmp_path), format="png"))
    cached = bytearray(first.read_bytes())
    cached[-1] ^= 0xFF  # a mark, same length: a file written again would lose it
    first.write_bytes(bytes(cached))
    os.utime(first, (1, 1))
    again = Path(processing_utils.save_pil_to_cache(picture, str(tmp_path), format="png"))
    assert again == first and first.read_bytes() == bytes(cached)  # left alone ...
    assert first.stat().st_mtime > 1  # ... but touched: the sweeper ages it from now
    other = Path(processing_utils.save_pil_to_cache(Image.new("RGB", (16, 16)), str(tmp_path), format="png"))
    with Image.open(other) as written:
        assert written.size == (16, 16)  # a new picture is written (under a temporary name, then renamed)
    assert sorted(path.name for path in other.parent.iterdir()) == [other.name]  # no staging file left

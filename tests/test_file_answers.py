"""A file the studio sends (`/gradio_api/file=`) arrives whole or answers cleanly, even when it
changes or goes while it is being sent (studio/server/file_answers.py), and a picture Gradio is
given again is not rewritten under a page still fetching it (server_compat.cache_pictures_without_rewriting).
Real servers, real HTTP; the server's own log (stderr) must hold no traceback."""

from __future__ import annotations

import io
import os
import threading
import time
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


def test_a_file_swept_right_after_gradio_found_it_answers_cleanly(monkeypatch, capfd):
    """The sweeper deletes a file between Gradio's check that it exists and Starlette's stat of it
    (the moment is made certain here: the file goes as Gradio's check returns): a clean answer."""
    import gradio.routes

    picture = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(picture, format="PNG")
    path = served_file("swept.png", picture.getvalue())
    checked = gradio.routes.file_fetch

    def then_swept(path_or_url, *args):
        answer = checked(path_or_url, *args)
        Path(path_or_url).unlink(missing_ok=True)
        return answer

    monkeypatch.setattr(gradio.routes, "file_fetch", then_swept)
    with live_studio(ToyPipeline()) as (server, _):
        answer = httpx.get(f"{server.url}gradio_api/file={path}", timeout=60)
    assert answer.status_code in (403, 404), (answer.status_code, answer.text[:200])
    no_traceback(capfd)


def test_the_history_tab_open_during_sweeps_of_temp_files_gets_whole_files_or_clean_answers(tmp_path, capfd):
    """History listed (the tab opened), its pictures fetched again and again by four readers at once
    while the studio's own sweeper (--temp-file-ttl 1) deletes the copies Gradio made for the page:
    each answer is a whole picture, or a clean 403/404 once it is gone; listed again, all come whole."""
    outputs = tmp_path / "outputs"
    with live_studio(ToyPipeline(), outputs, temp_file_ttl_s=1) as (server, _):
        page = Page(server.url)
        token, _ = page.started("")
        store = OutputStore(outputs, model="toy", write_video=write_mp4)
        owner = HistoryOwners.in_folder(outputs / "history").of_browser(token)
        for seed in range(6):
            store.save(completed(f"picture {seed}", seed=seed), owner)
        frames = tuple(Image.new("RGB", (32, 32), (40 * i, 90, 200 - 20 * i)) for i in range(9))
        video = completed("a video", seed=9)
        store.save(type(video)(images=frames, seed=9, params=video.params, timings=video.timings), owner)
        answers: list[int] = []
        lock = threading.Lock()

        def fetch(item: dict) -> int:
            answer = httpx.get(item["image"]["url"], timeout=60)  # a cut answer raises RemoteProtocolError
            if answer.status_code == 200:
                assert len(answer.content) == int(answer.headers["content-length"]) > 0
                with Image.open(io.BytesIO(answer.content)) as picture:
                    picture.load()  # a whole PNG (or the video's GIF): a cut one fails to decode
            else:
                assert answer.status_code in (403, 404), (answer.status_code, answer.text[:200])
            with lock:
                answers.append(answer.status_code)
            return answer.status_code

        listed = page.listed(token)
        assert len(listed) == 7
        copies = [Path(item["image"]["path"]) for item in listed]  # what Gradio copied into its cache
        swept = threading.Event()

        def reader() -> list[int]:
            while not swept.is_set():
                for item in listed:
                    fetch(item)
            return [fetch(item) for item in listed]  # once more, after the sweep

        with ThreadPoolExecutor(4) as readers:
            running = [readers.submit(reader) for _ in range(4)]
            try:
                wait_for(lambda: not any(copy.exists() for copy in copies), timeout_s=60,
                         what="the sweeper to delete every file the listing handed out")
            finally:
                swept.set()
            after = [status for done in running for status in done.result()]
        assert 200 in answers and set(answers) <= {200, 403, 404}
        assert after == [403] * 4 * len(listed)  # after the sweep: gone, said before any byte (Gradio's 403)
        # The tab opened again (or Refresh) lists them again: all whole. The sweeper (TTL 1 s) may
        # take a copy again before a loaded machine fetches it: only a copy listed over 1 s ago.
        for index in range(7):
            for _ in range(5):
                listed_at = time.monotonic()
                status = fetch(page.listed(token)[index])
                if status == 200:
                    break
                assert time.monotonic() - listed_at > 1.0, f"item {index}: {status} within the TTL"
            assert status == 200, f"item {index}: listed 5 times, never whole"
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

"""The Python examples of the README and the docs/ pages run as written against the quick-start
server (`python app.py`, the built-in model), each in a fresh interpreter; only the server's
address is changed, to a free port."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.studio_helpers import wait_until_serving

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# (page, code) for every Python example, in page order.
EXAMPLES = [(page.relative_to(ROOT).as_posix(), code) for page in PAGES
            for code in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)]
QUICK_START_URL = "http://127.0.0.1:7860"


def test_the_pages_have_their_examples():
    """Eight examples, each on the page a reader looks for it: the smallest way in of gradio_client and
    of the HTTP API in the README, the rest next to what they show."""
    where: dict[str, list[str]] = {}
    for page, code in EXAMPLES:
        where.setdefault(page, []).append(code)
    assert len(EXAMPLES) == 8 and len({code for _, code in EXAMPLES}) == 8
    assert [("/generate\"" in code, "images.generate" in code) for code in where["README.md"]] == [(True, False),
                                                                                                  (False, True)]
    assert any("Engine(" in code for code in where["docs/engine.md"])
    assert any("videos.create_and_poll" in code for code in where["docs/http-api.md"])
    assert any("images.edit" in code for code in where["docs/http-api.md"])
    assert any("/generate_video" in code for code in where["docs/studio.md"])
    assert any("/run_workflow" in code for code in where["docs/workflows.md"])
    assert any('"name": "outline"' in code for code in where["docs/loras.md"])


@pytest.fixture(scope="module")
def quick_start_server(tmp_path_factory):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    outputs = tmp_path_factory.mktemp("outputs")
    log = tmp_path_factory.mktemp("quick-start") / "app.log"
    with open(log, "w") as written:
        process = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--outputs", str(outputs)],
                                   cwd=ROOT, stdout=subprocess.DEVNULL, stderr=written)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(process, url, log.read_text)
        yield url
    finally:
        process.terminate()
        process.wait(30)


# Every example together may take this long on a loaded machine; only a hung one reaches it.
EXAMPLES_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def example_runs(quick_start_server, tmp_path_factory):
    """Every example started at once, each in its own interpreter, as several users of one studio
    would run them (their requests share the server's forwards; one after another they took
    twice as long here). Yields index -> (process, its stdout file, its stderr file)."""
    folder = tmp_path_factory.mktemp("examples")
    runs = {}
    for index, (_, code) in enumerate(EXAMPLES):
        out, err = folder / f"{index}.out", folder / f"{index}.err"
        with open(out, "w") as stdout, open(err, "w") as stderr:
            process = subprocess.Popen([sys.executable, "-c", code.replace(QUICK_START_URL, quick_start_server)],
                                       cwd=ROOT, stdout=stdout, stderr=stderr, text=True,
                                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
        runs[index] = (process, out, err)
    try:
        yield runs
    finally:
        for process, _, _ in runs.values():
            if process.poll() is None:
                process.kill()
                process.wait(30)


@pytest.mark.parametrize("index", range(len(EXAMPLES)), ids=[f"{page}-{i}" for i, (page, _) in enumerate(EXAMPLES)])
def test_readme_example_runs(example_runs, index):
    code = EXAMPLES[index][1]
    process, out, err = example_runs[index]
    returncode = process.wait(EXAMPLES_TIMEOUT_S)
    result = subprocess.CompletedProcess(process.args, returncode, out.read_text(), err.read_text())
    assert result.returncode == 0, result.stderr[-3000:]
    last = result.stdout.strip().splitlines()[-1]
    # What each example's comments promise.
    if "images.generate" in code:
        assert last == "[7, 8]"
    elif "videos.create_and_poll" in code:
        assert result.stdout.splitlines()[0] == "completed 1.125 9"
        assert re.fullmatch(r"\['video_[0-9a-f]+'(, '[^']+')*\] True", last), last
        written = [ROOT / "circle.mp4", ROOT / "circle.webp"]
        sizes = [path.stat().st_size if path.is_file() else 0 for path in written]
        for path in written:
            path.unlink(missing_ok=True)  # the example writes into the working directory
        assert min(sizes) > 0, sizes
    elif "/generate_video" in code:
        assert "completed 20 / 20" in result.stdout
        assert last.startswith("completed ") and last.endswith(".mp4") and Path(last.split(" ", 1)[1]).is_file()
    elif "/run_workflow" in code:
        assert last.startswith("completed 9 ")
    elif "/generate" in code:
        assert "completed 20 / 20" in result.stdout
    else:
        assert last.startswith("Completed(")

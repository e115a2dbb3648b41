"""A workflow run's state as JSON: the editor's updates send each picture once, API callers get everything.

Runs a real 2x2 grid on the toy pipeline, then encodes its views as the editor's handler and the
`/run_workflow` handler do.
"""

from __future__ import annotations

import asyncio
import base64
import io
from pathlib import Path

import numpy as np
from PIL import Image

from engine import Engine
from pipelines.toy import ToyPipeline
from studio.page.run_state import FILE_ROUTE, EditorRunState, RunFiles, RunStateEncoder
from studio.server.temp_files import TempFolder
from studio.workflows.compiler import compile_workflow
from studio.workflows.format import parse_workflow
from studio.workflows.limits import ModelLimits, WorkflowLimits
from studio.workflows.run import WorkflowRun

STEPS = 6


def link(source, source_port, target, target_port):
    return {"from": {"node": source, "port": source_port}, "to": {"node": target, "port": target_port}}


GRID_2X2 = {
    "version": 1,
    "nodes": [
        {"id": "p", "type": "prompt", "values": {"text": "a red circle"}},
        {"id": "b", "type": "seed_batch", "values": {"start": 3, "count": 2}},
        {"id": "g", "type": "sweep", "values": {"param": "guidance", "values": "1, 2"}},
        {"id": "t", "type": "steps", "values": {"steps": STEPS}},
        {"id": "s", "type": "sampler", "values": {}},
        {"id": "grid", "type": "grid", "values": {"x": "guidance", "y": "seed"}},
    ],
    "links": [link("p", "prompt", "s", "prompt"), link("b", "seed", "s", "seed"), link("g", "values", "s", "guidance"),
              link("t", "steps", "s", "steps"), link("s", "images", "grid", "images")],
}


def run_views(preview_every: int = 2):
    engine = Engine(ToyPipeline())
    workflow = compile_workflow(parse_workflow(GRID_2X2), WorkflowLimits((ModelLimits(name="toy"),)))
    run = WorkflowRun(engine, workflow, session_id="tab", preview_every=preview_every)

    async def collect():
        views = []
        async for view in run.updates():
            views.append(view)
            if len(views) == 1:
                engine.start()
        return views

    try:
        return asyncio.run(collect()), workflow
    finally:
        engine.close()


def pixels_of_url(url: str, folder) -> np.ndarray:
    if url.startswith("data:"):
        data = base64.b64decode(url.split(",", 1)[1])
    else:
        assert url.startswith(FILE_ROUTE)
        path = url[len(FILE_ROUTE):]
        assert str(folder.path.resolve()) in path
        data = Path(path).read_bytes()
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_the_editor_gets_each_preview_once_and_each_result_as_one_file(tmp_path):
    views, workflow = run_views()
    folder = TempFolder("runs", ttl_s=60, parent=tmp_path)
    states = EditorRunState(preview_max_px=64, fps_of=lambda params: 8, files=RunFiles(folder))
    updates = [states.update(view, workflow) for view in views]

    assert updates[-1]["state"] == "completed" and len(updates[-1]["branches"]) == 4
    assert [u["serial"] for u in updates] == list(range(len(updates)))
    for index in range(4):
        rows = [u["branches"][index] for u in updates]
        # A preview travels in the update where the branch has a new one, and in no other.
        previews_in_views = [v.branches[index].preview for v in views]
        new_preview = [p is not None and (i == 0 or p is not previews_in_views[i - 1])
                       for i, p in enumerate(previews_in_views)]
        assert ["preview" in row for row in rows] == new_preview
        assert 1 <= sum(new_preview) <= STEPS // 2 + 1
        # The result: one file, named in every update from the one where the branch finished.
        images = [row["image"] for row in rows]
        first = next(i for i, v in enumerate(views) if v.branches[index].result is not None)
        assert images[:first] == [None] * first and len(set(images[first:])) == 1
        result = views[-1].branches[index].result.images[0]
        assert np.array_equal(pixels_of_url(images[-1], folder), np.asarray(result.convert("RGB")))
    grid_urls = {u["grids"]["grid"] for u in updates}
    assert all(url.startswith(FILE_ROUTE) for url in grid_urls)
    assert np.array_equal(pixels_of_url(updates[-1]["grids"]["grid"], folder),
                          np.asarray(views[-1].grids["grid"].convert("RGB")))
    # One file per result and per drawing of the grid, no more.
    assert len(list(folder.path.iterdir())) == 4 + len(grid_urls)


def test_api_callers_get_every_picture_in_every_update():
    views, workflow = run_views()
    encoder = RunStateEncoder(preview_max_px=64, fps_of=lambda params: 8)
    states = [encoder.state(view, workflow) for view in views]
    last = states[-1]
    assert all(b["image"].startswith("data:image/png;base64,") for b in last["branches"])
    assert all(b["preview"].startswith("data:image/jpeg;base64,") for b in last["branches"])
    assert last["grids"]["grid"].startswith("data:image/png;base64,")
    for index, branch in enumerate(last["branches"]):
        result = views[-1].branches[index].result.images[0]
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(base64.b64decode(branch["image"].split(",", 1)[1])))
                                         .convert("RGB")), np.asarray(result.convert("RGB")))
    # Once a branch has a preview, every later update carries it.
    for index in range(4):
        seen = False
        for state in states:
            seen = seen or state["branches"][index]["preview"] is not None
            assert (state["branches"][index]["preview"] is not None) == seen

"""The pipeline graph view rendered from real engine snapshots."""

from __future__ import annotations

import re
import time
from dataclasses import replace

from engine import Completed, Engine, GenerationParams, Progress
from pipelines.toy import ToyPipeline
from studio.page.graph_view import build_nodes, render_graph


def _node(svg: str, stage: str) -> str:
    return re.search(rf'<g class="([^"]*)" data-stage="{stage}" data-count="(\d+)">(.*?)</g>', svg).group(0)


def _running_and_waiting_snapshot():
    pipeline = ToyPipeline(step_delay_s=0.02)
    engine = Engine(pipeline, max_batch_requests=1).start()
    mine = engine.submit(GenerationParams(prompt="a red circle", num_inference_steps=100), "me")
    other = engine.submit(GenerationParams(prompt="a blue square", num_inference_steps=4), "you")
    for event in mine.events(timeout=10):
        if isinstance(event, Progress) and event.step >= 3:
            break
    deadline = time.monotonic() + 10
    while not engine.snapshot().waiting:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    snapshot = engine.snapshot()
    mine.cancel()
    other.cancel()
    engine.close()
    return snapshot, pipeline.info


def test_nodes_follow_the_model_stages_with_counts_and_means():
    snapshot, info = _running_and_waiting_snapshot()
    nodes = {node.stage: node for node in build_nodes(snapshot, info, viewer_session="me")}
    assert list(nodes) == list(info.stages)
    assert nodes["prompt"].count == 1 and nodes["denoise"].count == 1
    assert nodes["encode"].count == 0 and nodes["decode"].count == 0
    assert nodes["denoise"].title == "denoise ×100"  # the step count of the request denoising now
    assert nodes["denoise"].mean_s == snapshot.stats.stages.denoise_step_s and nodes["denoise"].mean_s > 0.015
    assert nodes["denoise"].mean_label.endswith("per step")
    mine = next(v for v in snapshot.requests if v.session_id == "me")
    assert nodes["denoise"].viewer_detail == f"you: {mine.step}/100"
    assert nodes["prompt"].viewer_detail is None  # the waiting request is another session's


def test_svg_highlights_only_the_viewers_node():
    snapshot, info = _running_and_waiting_snapshot()
    svg = render_graph(snapshot, info, viewer_session="me")
    assert svg.startswith('<div class="ss-graph"><svg') and svg.count("<rect") == len(info.stages)
    assert "ss-you" in _node(svg, "denoise") and "ss-you" not in _node(svg, "prompt")
    assert 'data-count="1"' in _node(svg, "prompt") and "waiting: 1" in _node(svg, "prompt")
    other = render_graph(snapshot, info, viewer_session="you")
    assert "ss-you" in _node(other, "prompt") and "you: #1" in _node(other, "prompt")
    assert "ss-you" not in _node(other, "denoise")
    assert "a red circle" not in svg  # the graph never shows prompts


def test_idle_engine_draws_every_stage_with_no_highlight_and_media_kind():
    pipeline = ToyPipeline()
    engine = Engine(pipeline)
    svg = render_graph(engine.snapshot(), pipeline.info, viewer_session="me")
    assert "ss-you" not in svg and "ss-busy" not in svg
    assert ">image</text>" in svg and ">text encode</text>" in svg and ">denoise</text>" in svg  # nobody denoising
    video_info = replace(pipeline.info, output_kind="video")
    assert ">video</text>" in render_graph(engine.snapshot(), video_info, viewer_session=None)


def test_the_denoise_title_shows_the_steps_of_the_requests_there():
    snapshot, info = _running_and_waiting_snapshot()
    running = next(v for v in snapshot.requests if v.state == "running")
    two = replace(snapshot, requests=(running, replace(running, request_id="x" * 32, total=20, step=5)))
    assert {n.stage: n.title for n in build_nodes(two, info, None)}["denoise"] == "denoise ×20–100"


def test_several_models_get_a_row_each_with_their_own_counts():
    first, second = ToyPipeline(step_delay_s=0.02), ToyPipeline()
    engine = Engine({"small": first, "video": second}, max_batch_requests=1).start()
    try:
        running = engine.submit(GenerationParams(prompt="a", num_inference_steps=100, model="small"), "me")
        for event in running.events(timeout=10):
            if isinstance(event, Progress):
                break
        done = engine.submit(GenerationParams(prompt="b", num_inference_steps=2, model="video"), "me").result(timeout=30)
        snapshot = engine.snapshot()
        running.cancel()
    finally:
        engine.close()
    assert done.params.model == "video"
    svg = render_graph(snapshot, engine.infos, viewer_session="me")
    assert svg.count("<rect") == 2 * len(first.info.stages)
    assert '>small</text>' in svg and '>video</text>' in svg
    small = {node.stage: node for node in build_nodes(snapshot, first.info, "me", "small")}
    video = {node.stage: node for node in build_nodes(snapshot, second.info, "me", "video")}
    assert (small["denoise"].count, video["denoise"].count) == (1, 0)
    assert (small["media"].count_label, video["media"].count_label) == ("0 made", "1 made")
    assert svg.count('class="ss-model-row"') == 2


def test_each_models_row_shows_that_models_own_stage_times():
    slow, fast = ToyPipeline(step_delay_s=0.03), ToyPipeline()
    engine = Engine({"slow": slow, "fast": fast}).start()
    try:
        final = engine.submit(GenerationParams(prompt="a red circle", num_inference_steps=4, model="slow"), "me").result(30)
        assert isinstance(final, Completed)
        snapshot = engine.snapshot()
    finally:
        engine.close()
    infos = engine.infos
    slow_row = {node.stage: node for node in build_nodes(snapshot, infos["slow"], "me", model="slow")}
    fast_row = {node.stage: node for node in build_nodes(snapshot, infos["fast"], "me", model="fast")}
    # The fast model ran nothing: its row has no times (it showed the slow model's, engine-wide).
    assert [fast_row[stage].mean_s for stage in ("encode", "denoise", "decode")] == [None, None, None]
    assert "fast" not in snapshot.stats.stages_by_model
    own = snapshot.stats.stages_by_model["slow"]
    assert (slow_row["encode"].mean_s, slow_row["denoise"].mean_s, slow_row["decode"].mean_s) == (
        own.encode_s, own.denoise_step_s, own.decode_s)
    assert own.denoise_step_s >= 0.03  # every step of it slept 30 ms in its forward
    svg = render_graph(snapshot, infos, viewer_session="me")
    fast_svg = svg[svg.index('data-model="fast"'):]
    assert "mean" not in fast_svg and "per step" not in fast_svg

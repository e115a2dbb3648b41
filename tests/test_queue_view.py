"""The queue view rendered from real engine snapshots (toy pipeline, two sessions)."""

from __future__ import annotations

import re
import time

import pytest

from engine import Engine, GenerationParams
from pipelines.toy import ToyPipeline
from studio.page.queue_view import format_seconds, render_queue
from studio import queue_actions
from studio.queue_snapshot import HIDDEN_PROMPT, short_id, snapshot_as_dict
from tests.engine_helpers import StepGate
from tests.studio_helpers import wait_for


@pytest.fixture(scope="module")
def live_snapshot():
    """Session 'alice' running (one request per forward), 'bob' waiting behind her: the
    snapshot the engine published just before its third forward."""
    gate = StepGate(2)
    engine = Engine(ToyPipeline(on_forward=gate), max_batch_requests=1)
    alice = engine.submit(GenerationParams(prompt="alice's <b>red</b> circle", num_inference_steps=100), "alice")
    bob = engine.submit(GenerationParams(prompt="bob's secret square", num_inference_steps=5), "bob")
    engine.start()
    gate.wait()
    snapshot = engine.snapshot()
    engine.shutdown()
    gate.release()
    engine.close()
    return snapshot, alice.request_id, bob.request_id


def test_own_request_is_marked_you_and_other_prompts_are_hidden(live_snapshot):
    snapshot, alice_id, bob_id = live_snapshot
    page = render_queue(snapshot, viewer_session="alice")
    alice_row = re.search(rf"<tr class=\"ss-mine\" data-request='{short_id(alice_id)}'>(.*?)</tr>", page).group(1)
    assert "<td>you</td>" in alice_row and "<td>running</td>" in alice_row
    assert "alice&#x27;s &lt;b&gt;red&lt;/b&gt; circle" in alice_row  # own prompt, HTML-escaped
    bob_row = re.search(rf"<tr data-request='{short_id(bob_id)}'>(.*?)</tr>", page).group(1)
    assert "bob's secret square" not in page and HIDDEN_PROMPT in bob_row
    assert "<td>waiting</td>" in bob_row and "<td>1</td>" in bob_row  # queue position 1
    assert "<td>you</td>" not in bob_row


def test_progress_bar_and_step_count_follow_the_snapshot(live_snapshot):
    snapshot, alice_id, _ = live_snapshot
    alice = next(v for v in snapshot.requests if v.request_id == alice_id)
    assert (alice.step, alice.total) == (2, 100)
    page = render_queue(snapshot, viewer_session="alice")
    assert '<span style="width:2%"></span></span>2/100' in page


def test_show_prompts_reveals_every_prompt(live_snapshot):
    snapshot, _, _ = live_snapshot
    page = render_queue(snapshot, viewer_session="alice", show_prompts=True)
    assert "bob&#x27;s secret square" in page and HIDDEN_PROMPT not in page


def test_engine_figures_are_shown(live_snapshot):
    snapshot, _, _ = live_snapshot
    page = render_queue(snapshot, viewer_session=None)
    assert "mode <b>step</b>" in page and "batch now <b>1</b> / 1 requests" in page
    assert "waiting <b>1</b>, running <b>1</b>" in page
    assert "<td>you</td>" not in page  # a viewer with no requests owns none


def test_json_view_has_no_session_ids_and_short_ids_for_others(live_snapshot):
    snapshot, alice_id, bob_id = live_snapshot
    data = snapshot_as_dict(snapshot, viewer_session="bob", show_prompts=False)
    text = repr(data)
    assert "alice" not in text.replace("(hidden)", "")  # neither her session id nor her prompt
    by_id = {r["request_id"]: r for r in data["requests"]}
    assert by_id[bob_id]["mine"] and by_id[bob_id]["prompt"] == "bob's secret square"
    assert by_id[short_id(alice_id)]["prompt"] == HIDDEN_PROMPT and not by_id[short_id(alice_id)]["mine"]
    assert (data["engine"]["mode"], data["engine"]["max_batch_requests"], data["engine"]["max_batch"]) == ("step", 1, 1)


def test_empty_queue_says_so():
    engine = Engine(ToyPipeline())
    page = render_queue(engine.snapshot(), viewer_session="x")
    assert "no requests right now" in page


@pytest.mark.parametrize(("seconds", "text"), [(None, "–"), (0.25, "0.2 s"), (12.4, "12 s"), (125, "2 m 05 s")])
def test_format_seconds(seconds, text):
    assert format_seconds(seconds) == text


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_live_views_are_sent_to_a_tab_only_when_they_changed(monkeypatch):
    """A run's stream sends the views at most once per refresh period (always in its last update),
    the timer leaves the tab alone meanwhile, and nothing unchanged is sent again (but for the
    timer's resend every RESEND_S)."""
    import gradio as gr

    from studio.page import ui

    clock = _Clock()
    monkeypatch.setattr(ui.time, "monotonic", clock)
    gate = StepGate(1)  # a request held in its second step
    engine = Engine(ToyPipeline(on_forward=gate)).start()
    views = ui.LiveViews(gr.Timer(0.5, render=False), gr.HTML(render=False), gr.HTML(render=False), engine,
                         show_prompts=False, refresh_s=0.5)
    skip = gr.skip()
    try:
        first = views.render("tab")
        assert set(first) == {views.queue, views.graph} and "no requests right now" in first[views.queue]
        clock.now += 0.2
        assert views.render("tab") == {}  # a stream sent them 0.2 s ago
        assert views.refresh("tab") == {views.queue: skip, views.graph: skip}
        assert views.render("tab", final=True) == {}  # the last update: computed, but nothing changed
        engine.submit(GenerationParams(prompt="a square", num_inference_steps=3), "tab")
        gate.wait()
        clock.now += 0.6
        changed = views.refresh("tab")
        assert "a square" in changed[views.queue] and "you: 1/3" in changed[views.graph]
        clock.now += 0.6
        assert views.refresh("tab") == {views.queue: skip, views.graph: skip}
        clock.now += ui.RESEND_S
        resent = views.refresh("tab")
        assert "a square" in resent[views.queue] and "<svg" in resent[views.graph]
        views.sent.forget("tab")
        assert set(views.render("tab")) == {views.queue, views.graph}
    finally:
        gate.release()
        engine.close()


def test_a_request_run_again_after_a_restart_says_so_in_the_table_and_in_queue_json(live_snapshot):
    snapshot, alice_id, bob_id = live_snapshot
    page = render_queue(snapshot, viewer_session="alice", resumed={bob_id})
    bob_row = re.search(rf"<tr data-request='{short_id(bob_id)}'>(.*?)</tr>", page).group(1)
    alice_row = re.search(rf"data-request='{short_id(alice_id)}'>(.*?)</tr>", page).group(1)
    assert "<td>waiting · resumed after restart</td>" in bob_row and "<td>running</td>" in alice_row
    listed = snapshot_as_dict(snapshot, "alice", show_prompts=False, resumed={bob_id})["requests"]
    assert {r["request_id"]: r["resumed_after_restart"] for r in listed} == {alice_id: False, short_id(bob_id): True}


def test_batch_mates_of_other_sizes_show_their_sizes_and_one_forward():
    """With a model that packs rows of any size, requests of three sizes share the forward; the view
    lists each one's size and its batch-mates, and the forward's tokens."""
    from engine import ServingLimits

    gate = StepGate(1)
    engine = Engine(ToyPipeline(on_forward=gate, packs=True), limits=ServingLimits(max_size=128))
    handles = [engine.submit(GenerationParams(prompt=f"p{i}", width=w, height=h, num_inference_steps=4), f"s{i}")
               for i, (w, h) in enumerate(((128, 64), (64, 64), (32, 96)))]
    engine.start()
    gate.wait()
    snapshot = engine.snapshot()
    gate.release()
    engine.close()
    views = {v.request_id: v for v in snapshot.requests}
    assert [views[h.request_id].size for h in handles] == ["128x64", "64x64", "32x96"]
    assert [views[h.request_id].tokens for h in handles] == [128, 64, 48]
    assert snapshot.stats.current_batch_size == 3 and snapshot.stats.current_batch_tokens == 240
    page = render_queue(snapshot, viewer_session="s0")
    first = re.search(rf"data-request='{short_id(handles[0].request_id)}'>(.*?)</tr>", page).group(1)
    assert "<td>128x64</td>" in first
    assert f"{short_id(handles[1].request_id)}, {short_id(handles[2].request_id)}" in first
    assert "3</b> / 8 requests, 240 tokens" in page
    as_json = snapshot_as_dict(snapshot, "s1", show_prompts=False)
    assert [r["size"] for r in as_json["requests"]] == ["128x64", "64x64", "32x96"]
    assert as_json["engine"]["current_batch_tokens"] == 240


def test_a_callers_paused_queue_says_when_it_resumes_by_itself():
    engine = Engine(ToyPipeline())
    now = time.time()
    engine.pause_queue("alice", until=now + 100)
    engine.submit(GenerationParams(prompt="waits", num_inference_steps=2), "alice")
    engine.start()
    try:
        state = queue_actions.queue_state(engine, "alice", now=now)
        assert (state["paused"], state["paused_until"], state["pause_ends_in_s"]) == (True, now + 100, 100.0)
        assert state["message"] == ("your queue is paused: your queued requests wait; resume to start them "
                                    "(it resumes by itself in 1 m 40 s)")
        assert queue_actions.queue_state(engine, "bob", now=now)["paused_until"] is None
        snapshot = wait_for(lambda: engine.snapshot() if engine.snapshot().requests else None, what="the request")
    finally:
        engine.close()
    assert snapshot_as_dict(snapshot, "alice", False)["paused"] == {"mine": True, "engine": False, "mine_until": now + 100}
    assert snapshot_as_dict(snapshot, "bob", False)["paused"] == {"mine": False, "engine": False, "mine_until": None}
    page = render_queue(snapshot, viewer_session="alice", wall_now=now + 40)
    assert ('<div class="ss-paused-note">Your queue is paused: your queued requests wait until you resume it '
            "(it resumes by itself in 1 m 00 s).</div>") in page
    assert "ss-paused-note" not in render_queue(snapshot, viewer_session="bob", wall_now=now)

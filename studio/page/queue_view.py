"""The live queue view: every request the engine holds, as an HTML table (the same requests as
JSON for `/queue`: studio.queue_snapshot).

Pure functions of an `EngineSnapshot` and the viewer's session id. Another session's
prompt is shown only when the studio runs with `--show-prompts`, and session ids never
leave the server (a viewer only learns which requests are its own).
"""

from __future__ import annotations

import html
import time
from collections.abc import Container

from engine import EngineSnapshot, RequestView
from studio.queue_actions import pause_end_words
from studio.queue_snapshot import Viewer, format_seconds, is_viewers, short_id, visible_prompt

QUEUE_CSS = """
.ss-queue table { width: 100%; border-collapse: collapse; font-size: 0.85rem; }
.ss-queue th, .ss-queue td { padding: 3px 6px; border-bottom: 1px solid var(--border-color-primary); text-align: left; }
.ss-queue tr.ss-mine td { background: var(--color-accent-soft); font-weight: 600; }
.ss-queue .ss-bar { display: inline-block; width: 80px; height: 8px; background: var(--border-color-primary);
  border-radius: 4px; overflow: hidden; vertical-align: middle; margin-right: 6px; }
.ss-queue .ss-bar > span { display: block; height: 100%; background: var(--color-accent); }
.ss-queue .ss-stats { margin: 4px 0 8px; display: flex; flex-wrap: wrap; gap: 14px; font-size: 0.85rem; }
.ss-queue .ss-empty { opacity: 0.7; font-style: italic; }
.ss-queue .ss-paused-note { padding: 4px 8px; border-radius: 6px; font-weight: 600;
  background: var(--color-accent-soft); margin: 4px 0; }
.ss-queue .ss-prompt { max-width: 18rem; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
"""

PAUSED_WORDS = {"session": "its queue is paused", "engine": "the studio is paused"}
ENGINE_PAUSED_NOTE = "The studio is paused by its operator: nothing new starts; running requests finish."
OWN_PAUSE_NOTE = "Your queue is paused: your queued requests wait until you resume it"

COLUMNS = ("request", "who", "model", "size", "prompt", "state", "progress", "position", "waited", "ETA",
           "shares batch with")


def format_step_time(seconds: float | None) -> str:
    """A denoise step's wall time, the one speed figure every view shows ("57 ms", "1.20 s")."""
    if seconds is None:
        return "–"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.2f} s"


def _progress_cell(view: RequestView) -> str:
    fraction = view.step / view.total if view.total else 0.0
    width = round(100 * min(max(fraction, 0.0), 1.0))
    skipped = f" ({view.skipped} skipped)" if view.skipped else ""  # steps that reused its cached residual
    return f'<span class="ss-bar"><span style="width:{width}%"></span></span>{view.step}/{view.total}{skipped}'


def _batch_cell(view: RequestView, mine_ids: set[str]) -> str:
    if not view.batch_mates:
        return "–"
    names = [short_id(mate) + (" (you)" if mate in mine_ids else "") for mate in view.batch_mates]
    return html.escape(", ".join(names))


RESUMED = " · resumed after restart"


def _row(view: RequestView, viewer_session: Viewer, show_prompts: bool, mine_ids: set[str], now: float,
         resumed: Container[str]) -> str:
    mine = is_viewers(view, viewer_session)
    prompt = visible_prompt(view, viewer_session, show_prompts)
    cells = (
        f"<code>{short_id(view.request_id)}</code>",
        "you" if mine else "–",
        html.escape(view.model or "–"),
        html.escape(view.size or "–"),
        f'<div class="ss-prompt" title="{html.escape(prompt)}">{html.escape(prompt)}</div>',
        view.state + (f" (paused: {PAUSED_WORDS[view.paused]})" if view.paused else "")
        + (RESUMED if view.request_id in resumed else ""),
        _progress_cell(view),
        "–" if view.position is None else str(view.position),
        format_seconds(view.waited_s(now)),
        format_seconds(view.eta_s),
        _batch_cell(view, mine_ids),
    )
    row_class = ' class="ss-mine"' if mine else ""
    return f"<tr{row_class} data-request='{short_id(view.request_id)}'>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def render_stats(snapshot: EngineSnapshot) -> str:
    stats = snapshot.stats
    finished = ", ".join(f"{name} {count}" for name, count in sorted(stats.finished.items())) or "none yet"
    items = (
        f"mode <b>{html.escape(stats.mode)}</b>",
        f"batch now <b>{stats.current_batch_size}</b> / {stats.max_batch_requests} requests"
        + (f", {stats.current_batch_tokens} tokens" if stats.current_batch_tokens else ""),
        f"<b>{format_step_time(stats.stages.denoise_step_s)}</b> per denoise step",
        f"waiting <b>{len(snapshot.waiting)}</b>, running <b>{len(snapshot.running)}</b>",
        f"finished: {html.escape(finished)}",
    )
    rows = stats.rows_computed + stats.rows_skipped
    if stats.rows_skipped:  # step caching saved something
        items += (f"step cache: <b>{stats.rows_skipped / rows:.0%}</b> of rows skipped",)
    return '<div class="ss-stats">' + "".join(f"<span>{item}</span>" for item in items) + "</div>"


def own_pause_note(snapshot: EngineSnapshot, viewer_session: Viewer, wall_now: float) -> str:
    """"Your queue is paused ... (it resumes by itself in 59 m 12 s)" while the viewer's queue is paused
    (of the sessions a tab acts for, the last to end); "" otherwise."""
    sessions = [viewer_session] if isinstance(viewer_session, str) else list(viewer_session or ())
    ends = [snapshot.pauses.ends_at(s) for s in sessions if s in snapshot.pauses.sessions]
    if not ends:
        return ""
    ends_in = None if None in ends else max(0.0, max(ends) - wall_now)
    return (f'<div class="ss-paused-note">{OWN_PAUSE_NOTE}{html.escape(pause_end_words(ends_in))}.</div>')


def render_queue(
    snapshot: EngineSnapshot, viewer_session: Viewer, show_prompts: bool = False, now: float | None = None,
    resumed: Container[str] = (), wall_now: float | None = None,
) -> str:
    """The queue table (HTML) as the viewer may see it. `now`: perf_counter time for waited times;
    `resumed`: the requests run again after a restart (their state says so); `wall_now`: unix
    time, for when the viewer's paused queue resumes by itself."""
    now = time.perf_counter() if now is None else now
    mine_ids = {v.request_id for v in snapshot.requests if is_viewers(v, viewer_session)}
    header = "".join(f"<th>{name}</th>" for name in COLUMNS)
    if snapshot.requests:
        body = "".join(_row(v, viewer_session, show_prompts, mine_ids, now, resumed) for v in snapshot.requests)
    else:
        body = f'<tr><td class="ss-empty" colspan="{len(COLUMNS)}">no requests right now</td></tr>'
    note = f'<div class="ss-paused-note">{ENGINE_PAUSED_NOTE}</div>' if snapshot.pauses.engine else ""
    note += own_pause_note(snapshot, viewer_session, time.time() if wall_now is None else wall_now)
    return (
        '<div class="ss-queue">'
        + note
        + render_stats(snapshot)
        + f"<table><thead><tr>{header}</tr></thead><tbody>{body}</tbody></table></div>"
    )

"""What a viewer may see of the engine's queue, as JSON for the `/queue` endpoint: another
session's prompt only when the studio runs with `--show-prompts`, another session's request ids
shortened, and no session ids at all (a viewer only learns which requests are its own). The
page's queue table (studio.page.queue_view) follows the same rules.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Container

from engine import EngineSnapshot, RequestView

SHORT_ID_LEN = 8
HIDDEN_PROMPT = "(hidden)"

# Who looks: a session, or every session a page's tab acts for (its own and those it adopted after
# a restart, studio.workflows.registry.RunRegistry.sessions_of); None: nobody's requests are theirs.
Viewer = str | Collection[str] | None


def format_seconds(seconds: float | None) -> str:
    """A time span as every view shows it ("4.2 s", "37 s", "59 m 12 s")."""
    if seconds is None:
        return "–"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} m {rest:02d} s"


def is_viewers(view: RequestView, viewer: Viewer) -> bool:
    """Whether the request is the viewer's own."""
    if viewer is None:
        return False
    return view.session_id == viewer if isinstance(viewer, str) else view.session_id in viewer


def short_id(request_id: str) -> str:
    return request_id[:SHORT_ID_LEN]


def visible_prompt(view: RequestView, viewer_session: Viewer, show_prompts: bool) -> str:
    if show_prompts or is_viewers(view, viewer_session):
        return view.prompt
    return HIDDEN_PROMPT


def request_as_dict(view: RequestView, viewer_session: Viewer, show_prompts: bool, now: float,
                    resumed: Container[str] = ()) -> dict:
    """One request for the /queue API (no session ids). `resumed`: the requests run again after a restart."""
    return {
        "request_id": view.request_id if is_viewers(view, viewer_session) else short_id(view.request_id),
        "mine": is_viewers(view, viewer_session),
        "model": view.model,
        "size": view.size,  # batch-mates of other sizes share one forward when the model packs
        "tokens": view.tokens,  # rows x latent tokens it puts in each forward
        "prompt": visible_prompt(view, viewer_session, show_prompts),
        "state": view.state,
        "step": view.step,
        "total": view.total,
        "skipped": view.skipped,  # steps that reused its cached residual (step caching)
        "position": view.position,
        "paused": view.paused,
        "waited_s": round(view.waited_s(now), 3),
        "eta_s": None if view.eta_s is None else round(view.eta_s, 3),
        "batch_mates": [short_id(mate) for mate in view.batch_mates],
        "resumed_after_restart": view.request_id in resumed,  # run again from step 0 after the studio restarted
    }


def snapshot_as_dict(
    snapshot: EngineSnapshot, viewer_session: str | None, show_prompts: bool, now: float | None = None,
    resumed: Container[str] = (),
) -> dict:
    """The whole snapshot for the /queue API: requests plus engine figures."""
    stats = snapshot.stats
    now = time.perf_counter() if now is None else now
    return {
        "requests": [request_as_dict(v, viewer_session, show_prompts, now, resumed) for v in snapshot.requests],
        # Whether the viewer's own queue is paused (and the unix time it ends by itself: None when it is
        # not paused, or only a resume ends it), and whether an operator paused everything.
        "paused": {"mine": viewer_session in snapshot.pauses.sessions, "engine": snapshot.pauses.engine,
                   "mine_until": None if viewer_session is None else snapshot.pauses.ends_at(viewer_session)},
        "engine": {
            "mode": stats.mode,
            "max_batch_requests": stats.max_batch_requests,  # requests per forward (a CFG request has 2 rows)
            "max_batch": stats.max_batch_requests,  # the old name
            "current_batch_size": stats.current_batch_size,
            "current_batch_tokens": stats.current_batch_tokens,
            "steps_per_s": round(stats.steps_per_s, 3),
            "forwards": stats.forwards,
            "forwards_by_batch_size": {str(k): v for k, v in sorted(stats.forwards_by_batch_size.items())},
            # Step caching: model rows that ran every block, and rows that reused a cached residual.
            "rows_computed": stats.rows_computed,
            "rows_skipped": stats.rows_skipped,
            "finished": dict(stats.finished),
            "stages": {
                "encode_s": stats.stages.encode_s,
                "denoise_step_s": stats.stages.denoise_step_s,
                "decode_s": stats.stages.decode_s,
            },
        },
    }

"""The line a returning browser reads at the top of the page after a restart: "The studio
restarted; 3 of your requests were resumed." Each owner (a History owner: the browser, across
reloads) is told once, on its first page load after the restart.

Every page load of that owner also adopts the engine sessions its resumed work runs in (the tabs
that started it are gone), so the tab's queue controls pause, resume and clear that work, and the
live queue marks it "you" (studio.workflows.registry.RunRegistry.adopt); the Simple tab's queue
lists it, its rows moving until it has all ended.

    banner = build_restart_banner()                          # under the page's header
    wire_restart_banner(banner, report, owners, registry, browser_token, demo, tab_queue, refresh_s)
"""

from __future__ import annotations

import threading

import gradio as gr

from studio.page.tab_queue import render_tab_queue
from studio.server.history_owners import HistoryOwners
from studio.sessions import session_id_of
from studio.store.recovery import ResumeReport
from studio.workflows.registry import RunRegistry

RESTART_BANNER_CSS = """
#ss-restart-banner { border-left: 4px solid var(--color-accent, #f97316); padding: 4px 10px;
  background: var(--background-fill-secondary); border-radius: 4px; }
"""


def restart_notice(resumed: int) -> str:
    requests = "1 of your requests was" if resumed == 1 else f"{resumed} of your requests were"
    return (f"**The studio restarted; {requests} resumed.** They run again from the start with the same "
            "seeds; their results join your History as they finish. This tab's queue buttons pause, resume or "
            "clear them.")


class RestartNotices:
    """Who has been told: each owner once."""

    def __init__(self, report: ResumeReport) -> None:
        self.report = report
        self._told: set[str] = set()
        self._lock = threading.Lock()

    def for_owner(self, owner: str | None) -> str | None:
        """The notice for `owner`, the first time it is asked; None after that, or when nothing of
        theirs was resumed."""
        if not owner:
            return None
        with self._lock:
            resumed = self.report.resumed_by_owner.get(owner, 0)
            if not resumed or owner in self._told:
                return None
            self._told.add(owner)
        return restart_notice(resumed)


def build_restart_banner() -> gr.Markdown:
    return gr.Markdown("", visible=False, elem_id="ss-restart-banner")


def wire_restart_banner(banner: gr.Markdown, report: ResumeReport | None, owners: HistoryOwners,
                        registry: RunRegistry, browser_token: gr.BrowserState, demo: gr.Blocks,
                        tab_queue: gr.HTML, refresh_s: float) -> None:
    """`tab_queue`: the Simple tab's queue list, where a tab that adopted resumed work sees it move
    (every `refresh_s` while any of it runs: no stream of the tab's own follows it)."""
    if report is None:
        return
    notices = RestartNotices(report)
    following = gr.Timer(refresh_s, active=False)

    def show(token: str, request: gr.Request) -> dict:
        owner, session = owners.of_browser(token), session_id_of(request)
        if owner:
            registry.adopt(session, report.sessions_by_owner.get(owner, ()))
        adopted = registry.runs_of_adopted(session)
        notice = notices.for_owner(owner)
        return {banner: gr.update(value=notice, visible=True) if notice else gr.update(visible=False),
                tab_queue: render_tab_queue(registry.runs_of(session)) if adopted else gr.skip(),
                following: gr.Timer(active=any(registry.is_live(run) for run in adopted))}

    def follow(request: gr.Request) -> dict:
        session = session_id_of(request)
        running = any(registry.is_live(run) for run in registry.runs_of_adopted(session))
        return {tab_queue: render_tab_queue(registry.runs_of(session)),
                following: gr.skip() if running else gr.Timer(active=False)}  # its last look, then it stops

    demo.load(show, inputs=browser_token, outputs=[banner, tab_queue, following], api_name="ui_restart_banner",
              api_visibility="private", show_progress="hidden")
    following.tick(follow, outputs=[tab_queue, following], queue=False, api_name="ui_follow_resumed",
                   api_visibility="private", show_progress="hidden")

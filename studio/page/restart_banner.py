"""The line a returning browser reads at the top of the page after a restart: "The studio
restarted; 3 of your requests were resumed." Each owner (a History owner: the browser, across
reloads) is told once, on its first page load after the restart.

Every page load of that owner also adopts the engine sessions its resumed work runs in (the tabs
that started it are gone), so the tab's queue controls pause, resume and clear that work, and the
live queue marks it "you" (studio.workflows.registry.RunRegistry.adopt).

    banner = build_restart_banner()                          # under the page's header
    wire_restart_banner(banner, report, owners, registry, browser_token, demo)
"""

from __future__ import annotations

import threading

import gradio as gr

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
                        registry: RunRegistry, browser_token: gr.BrowserState, demo: gr.Blocks) -> None:
    if report is None:
        return
    notices = RestartNotices(report)

    def show(token: str, request: gr.Request) -> dict:
        owner = owners.of_browser(token)
        if owner:
            registry.adopt(session_id_of(request), report.sessions_by_owner.get(owner, ()))
        notice = notices.for_owner(owner)
        return gr.update(value=notice, visible=True) if notice else gr.update(visible=False)

    demo.load(show, inputs=browser_token, outputs=banner, api_name="ui_restart_banner",
              api_visibility="private", show_progress="hidden")

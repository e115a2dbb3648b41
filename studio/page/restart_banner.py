"""The line a returning browser reads at the top of the page after a restart: "The studio
restarted; 3 of your requests were resumed." Each owner (a History owner: the browser, across
reloads) is told once, on its first page load after the restart.

    banner = build_restart_banner()                          # under the page's header
    wire_restart_banner(banner, report, owners, browser_token, demo)
"""

from __future__ import annotations

import threading

import gradio as gr

from studio.server.history_owners import HistoryOwners
from studio.store.recovery import ResumeReport

RESTART_BANNER_CSS = """
#ss-restart-banner { border-left: 4px solid var(--color-accent, #f97316); padding: 4px 10px;
  background: var(--background-fill-secondary); border-radius: 4px; }
"""


def restart_notice(resumed: int) -> str:
    requests = "1 of your requests was" if resumed == 1 else f"{resumed} of your requests were"
    return (f"**The studio restarted; {requests} resumed.** They run again from the start with the same "
            "seeds; their results join your History as they finish.")


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
                        browser_token: gr.BrowserState, demo: gr.Blocks) -> None:
    if report is None:
        return
    notices = RestartNotices(report)

    def show(token: str) -> dict:
        notice = notices.for_owner(owners.of_browser(token))
        return gr.update(value=notice, visible=True) if notice else gr.update(visible=False)

    demo.load(show, inputs=browser_token, outputs=banner, api_name="ui_restart_banner",
              api_visibility="private", show_progress="hidden")

"""A page tab's History owner before its browser has kept its token (studio.page.tab_tokens)."""

import asyncio
import threading

from studio.page.tab_tokens import TabTokens
from studio.server.history_owners import HistoryOwners

OWNERS = HistoryOwners(b"s" * 32)


def test_a_tab_issued_a_token_files_tokenless_requests_under_its_browser():
    tokens = TabTokens()
    browser = OWNERS.of_browser(OWNERS.issue())
    tokens.issued("tab", browser)
    assert asyncio.run(tokens.owner_without_token("tab", OWNERS)) == browser


def test_a_request_sent_before_its_tabs_token_waits_for_it():
    tokens = TabTokens(wait_s=60)
    browser = OWNERS.of_browser(OWNERS.issue())
    waiting = threading.Event()

    async def ask():
        asking = asyncio.ensure_future(tokens.owner_without_token("tab", OWNERS))
        await asyncio.sleep(0)  # it registered its wait before the token is issued below
        waiting.set()
        return await asking

    issuer = threading.Thread(target=lambda: (waiting.wait(), tokens.issued("tab", browser)))
    issuer.start()
    assert asyncio.run(ask()) == browser
    issuer.join()


def test_without_a_token_in_time_the_request_is_the_tabs_alone():
    tokens = TabTokens(wait_s=0.01)
    assert asyncio.run(tokens.owner_without_token("tab", OWNERS)) == OWNERS.of_caller("tab")
    assert tokens._arrivals == {}  # nothing is kept for a tab that never got its token
    # another tab's token is not this one's
    tokens.issued("other tab", OWNERS.of_browser(OWNERS.issue()))
    assert asyncio.run(tokens.owner_without_token("tab", OWNERS)) == OWNERS.of_caller("tab")


def test_only_the_newest_tabs_are_remembered():
    tokens = TabTokens(remembered=2, wait_s=0.01)
    for tab in ("a", "b", "c"):
        tokens.issued(tab, OWNERS.of_browser(OWNERS.issue()))
    assert asyncio.run(tokens.owner_without_token("a", OWNERS)) == OWNERS.of_caller("a")
    assert asyncio.run(tokens.owner_without_token("c", OWNERS)) != OWNERS.of_caller("c")

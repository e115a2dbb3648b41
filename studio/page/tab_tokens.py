"""A tab's History owner before its browser has kept its token.

A browser's first visit gets its History token from the page's load event
(studio.page.history_tab) and keeps it a moment later. A Generate or Run pressed in between
reaches the server without a token; its result would be filed under the tab's engine session
(an API caller's key, studio.server.history_owners) and never listed in that browser's History.
So the server remembers, for this run of the studio, the owner it issued each tab a token for,
and a page request without a token waits for its tab's (it is on its way):

    tokens = TabTokens()
    tokens.issued(session, owners.of_browser(token))      # the tab's load event, when it issues one
    owner = await tokens.owner_without_token(session, owners)   # the browser's owner key

Only the page's own events use this (a tab's session is its own, told to nobody else); an API
caller without a token stays its session's caller.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict

from studio.server.history_owners import HistoryOwners

TABS_REMEMBERED = 4096  # tabs whose issued owner is kept (the oldest forgotten first)
TOKEN_WAIT_S = 30.0  # how long a request waits for its tab's token before it is filed as the tab's alone


class TabTokens:
    def __init__(self, remembered: int = TABS_REMEMBERED, wait_s: float = TOKEN_WAIT_S) -> None:
        self._issued: OrderedDict[str, str] = OrderedDict()  # tab session -> the browser's owner key
        self._arrivals: dict[str, threading.Event] = {}  # tabs whose requests wait for their token
        self._remembered, self._wait_s = remembered, wait_s
        self._lock = threading.Lock()

    def issued(self, session_id: str, owner: str) -> None:
        """The tab's load event issued (or confirmed) the token of the browser whose results are
        filed under `owner`."""
        with self._lock:
            self._issued[session_id] = owner
            self._issued.move_to_end(session_id)
            while len(self._issued) > self._remembered:
                self._issued.popitem(last=False)
            arrival = self._arrivals.pop(session_id, None)
        if arrival is not None:
            arrival.set()

    async def owner_without_token(self, session_id: str, owners: HistoryOwners) -> str:
        """Whose History a page request without a signed token joins: the browser's once its tab
        was issued a token (waiting for it when it has not been yet); the tab's own key when none
        comes in time (the page's load event failed)."""
        with self._lock:
            owner = self._issued.get(session_id)
            if owner is None:
                arrival = self._arrivals.setdefault(session_id, threading.Event())
        if owner is None:
            arrived = await asyncio.to_thread(arrival.wait, self._wait_s)
            with self._lock:
                owner = self._issued.get(session_id)
                if not arrived and self._arrivals.get(session_id) is arrival:
                    del self._arrivals[session_id]
        return owner or owners.of_caller(session_id)

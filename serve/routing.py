"""Which replica a request goes to: the policy, and the bookkeeping it reads (no Ray here).

Policy (`preference_order`): a replica that already runs the request's batch key and has room
for one more in that batch (fewer than `max_batch_requests` of the key) comes first, so the
request joins a forward that runs anyway; among several, the least loaded. Then every other
replica, least loaded first. "Load" is requests in flight on the replica, all keys.

Bookkeeping (`RoutingTable`): the router records each generate call it routes, per replica and
batch key, from the moment it picks a replica (a *reservation*, so requests routed in the same
instant see each other) until Serve reports the call finished. `serve.router.BatchKeyRouter`
drives it from Serve's router callbacks.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

# A reservation Serve never confirmed (the caller gave up before the request was sent) stops
# counting after this long.
RESERVATION_TTL_S = 5.0


@dataclass(frozen=True)
class ReplicaLoad:
    replica: str
    in_flight: int  # requests it serves now, every batch key
    with_key: int  # of those, requests with the batch key being routed


def preference_order(loads: list[ReplicaLoad], max_batch_requests: int) -> list[str]:
    """Replicas in the order to try (see the module docstring)."""
    joinable = [load for load in loads if 0 < load.with_key < max_batch_requests]
    rest = [load for load in loads if not 0 < load.with_key < max_batch_requests]
    # Ties: the fuller batch of this key first, then the replica id (stable choices in tests).
    joinable.sort(key=lambda load: (load.in_flight, -load.with_key, load.replica))
    rest.sort(key=lambda load: (load.in_flight, load.replica))
    return [load.replica for load in joinable + rest]


@dataclass
class _Placement:
    replica: str
    batch_key: str
    confirmed: bool
    at: float


class RoutingTable:
    """Requests in flight per replica and batch key, as the router placed them."""

    def __init__(self) -> None:
        self._placements: dict[str, _Placement] = {}  # Serve's internal request id -> placement

    def reserve(self, request: str, replica: str, batch_key: str, now: float) -> None:
        """The router chose `replica` for `request` (Serve may still send it elsewhere)."""
        self._placements[request] = _Placement(replica, batch_key, False, now)

    def confirm(self, request: str, replica: str, batch_key: str, now: float) -> None:
        """Serve sent `request` to `replica`."""
        self._placements[request] = _Placement(replica, batch_key, True, now)

    def release(self, request: str) -> None:
        self._placements.pop(request, None)

    def forget_replica(self, replica: str) -> None:
        for request in [r for r, p in self._placements.items() if p.replica == replica]:
            del self._placements[request]

    def loads(self, replicas: list[str], batch_key: str, now: float) -> list[ReplicaLoad]:
        self._expire(now)
        in_flight, with_key = Counter(), Counter()
        for placement in self._placements.values():
            in_flight[placement.replica] += 1
            if placement.batch_key == batch_key:
                with_key[placement.replica] += 1
        return [ReplicaLoad(replica, in_flight[replica], with_key[replica]) for replica in replicas]

    def replica_of(self, request: str) -> str | None:
        placement = self._placements.get(request)
        return None if placement is None else placement.replica

    def _expire(self, now: float) -> None:
        stale = [r for r, p in self._placements.items() if not p.confirmed and now - p.at > RESERVATION_TTL_S]
        for request in stale:
            del self._placements[request]

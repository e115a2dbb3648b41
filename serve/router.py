"""The Ray Serve request router of the engine replicas: batch key first, then least loaded.

Serve runs one instance in every process that holds a handle to the replicas (the studio's
facade), on its router loop. For each `generate` call (its `batch_key` keyword is the request's
batch key) it returns the replicas in the order of `serve.routing.preference_order`, one per
rank, so Serve sends the call to the first one that accepts it. Calls without a batch key
(prepare, describe, unknown_words) take Serve's usual least-queue choice among all replicas.
`avoid` (replica ids) steers a retry away from a replica that refused.

Load is what this router placed and Serve has not reported finished (`RoutingTable`), so
requests routed in the same instant already count against each other. Every studio process
routes its own requests; with one studio ingress (the default) that is all of them.
"""

from __future__ import annotations

import time
from typing import Optional

from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from serve.routing import RoutingTable, preference_order

DEFAULT_MAX_BATCH_REQUESTS = 8


class BatchKeyRouter(RequestRouter):
    def initialize_state(self, max_batch_requests: int = DEFAULT_MAX_BATCH_REQUESTS, **_) -> None:
        self.max_batch_requests = max_batch_requests
        self.table = RoutingTable()

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: Optional[PendingRequest] = None
    ) -> list[list[RunningReplica]]:
        if pending_request is None:
            return [candidate_replicas]
        # Every rank below is all we would ever offer: after it, back off instead of spinning.
        pending_request.routing_context.should_backoff = True
        kwargs = pending_request.kwargs or {}
        avoid = set(kwargs.get("avoid") or ())
        usable = [r for r in candidate_replicas if r.replica_id.unique_id not in avoid] or candidate_replicas
        batch_key = kwargs.get("batch_key")
        if batch_key is None:
            return [usable]
        by_id = {r.replica_id.unique_id: r for r in usable}
        now = time.monotonic()
        order = preference_order(self.table.loads(sorted(by_id), batch_key, now), self.max_batch_requests)
        self.table.reserve(pending_request.metadata.internal_request_id, order[0], batch_key, now)
        return [[by_id[replica]] for replica in order]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        batch_key = (pending_request.kwargs or {}).get("batch_key")
        if batch_key is not None:
            self.table.confirm(pending_request.metadata.internal_request_id, replica_id.unique_id, batch_key,
                               time.monotonic())

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self.table.release(internal_request_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.table.forget_replica(replica_id.unique_id)

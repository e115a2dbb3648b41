"""One request the facade relays: from its admission to its final event."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from engine import PreparedRequest, RequestCost, RequestHandle


@dataclass
class Flight:
    """One request from submit to its final event (fields written on the relay loop unless noted)."""

    handle: RequestHandle  # written at submit
    prepared: PreparedRequest  # its batch key is the repr the router groups by
    replica_id: str | None = None
    replica: str | None = None
    engine_request_id: str | None = None
    stream: object = None  # the DeploymentResponseGenerator
    stop: tuple[str, str] | None = None  # (reason, cause) once cancelled
    reruns: int = 0  # times it ran again because its replica died
    task: asyncio.Task | None = field(default=None, repr=False)

    @property
    def request_id(self) -> str:
        return self.handle.request_id

    @property
    def session_id(self) -> str:
        return self.handle.session_id

    @property
    def cost(self) -> RequestCost:
        return self.prepared.cost

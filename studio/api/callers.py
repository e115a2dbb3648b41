"""Who is calling the HTTP API: the caller's API key (checked when keys are configured, wrong
ones slowed down per host) and the engine session its requests belong to."""

from __future__ import annotations

import math
import secrets

from fastapi import Request

from studio.api import errors as http_errors
from studio.api.config import HttpApiConfig
from studio.server.throttle import FailedAttempts, LockedOut


async def caller_session(request: Request, config: HttpApiConfig, attempts: FailedAttempts) -> str:
    """The engine session of this caller; checks its key when keys are configured (401, or 429
    once its host has guessed too often)."""
    return _session_id(request, await _key_name(request, config, attempts))


def _bearer_token(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


async def _key_name(request: Request, config: HttpApiConfig, attempts: FailedAttempts) -> str | None:
    """The name of the caller's API key; None when the API needs no key. A wrong key costs
    the caller's host a delay (and, repeated, a lockout): see studio.server.throttle."""
    if not config.api_keys:
        return None
    token = _bearer_token(request)
    found: list[str] = []

    def check() -> bool:
        # Compare against every key in constant time: no early exit that leaks which prefix matched.
        given = (token or "").encode()
        matches = [name for name, key in config.api_keys.items() if secrets.compare_digest(given, key.encode())]
        found.extend(matches)
        return token is not None and bool(matches)

    try:
        if not await attempts.attempt(client_host(request), check):
            raise http_errors.invalid_api_key()
    except LockedOut as locked:
        raise http_errors.too_many_failed_attempts(str(locked), math.ceil(locked.retry_after_s)) from None
    return found[0]


def client_host(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def _session_id(request: Request, key_name: str | None) -> str:
    """Who the engine's per-session limits and fairness apply to: the API key's name when keys
    are configured, else the caller's host. Never a string the caller chooses freely, and never
    one of the studio page's sessions (those start with "ui:")."""
    if key_name is not None:
        return f"http:key:{key_name}"
    return f"http:host:{client_host(request)}"

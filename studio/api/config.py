"""What the HTTP API (studio.api.http_routes, studio.api.video_routes) is configured with:
request limits, file stores, API keys and the wrong-key slowdown."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from studio.pictures import MAX_UPLOAD_BYTES

_KEY_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


@dataclass(frozen=True)
class HttpApiConfig:
    max_images_per_request: int = 8  # the largest `n`
    max_body_bytes: int = 64 * 1024  # a request body is a few prompts and numbers
    # /v1/images/edits: the largest uploaded picture (image or mask; 400 naming it). Its body may
    # carry two of them and the text fields: 2 x this + max_body_bytes (413 beyond). Pictures
    # must also fit the model's size (studio.pictures).
    max_upload_bytes: int = MAX_UPLOAD_BYTES
    body_timeout_s: float = 10.0  # a body that has not fully arrived by then is refused (408)
    image_ttl_s: float = 3600.0  # how long a response_format="url" image stays fetchable
    image_store_max_files: int = 256
    image_store_max_bytes: int = 256 * 2**20
    image_store_files_per_caller: int = 32  # one caller can't push the others' images out
    # Base of the image URLs when the server sits behind a proxy (default: the request's own).
    public_base_url: str | None = None
    # API keys by caller name, e.g. {"alice": "sk-..."} (a set of keys works too; each is then
    # named by a short hash of itself). When given, /v1/ routes, /metrics and /v1/openapi.json
    # require "Authorization: Bearer <key>" (401 otherwise) and each key is its own session,
    # "http:key:<name>". Without keys the API is open and every caller from one host is one
    # session, "http:host:<address>" (a bearer token names nothing: anyone could make one up).
    api_keys: Mapping[str, str] | frozenset[str] = field(default_factory=dict)
    # The operator's key for /v1/admin/ (pause and resume the whole engine); None: those routes answer 404.
    admin_key: str | None = None
    # Wrong keys, per client host: each costs this long, and this many in a minute lock the
    # host out for a minute (429).
    failed_key_delay_s: float = 1.0
    max_failed_keys: int = 10
    # /v1/videos jobs (studio.api.video_jobs): a finished video stays downloadable this long; the
    # store holds at most this many jobs and bytes, one caller at most video_jobs_per_caller.
    video_ttl_s: float = 3600.0
    video_store_max_jobs: int = 128
    video_store_max_bytes: int = 256 * 2**20
    video_jobs_per_caller: int = 16
    video_poll_after_ms: int = 250  # what retrieve tells the openai client's poll loop to wait

    def __post_init__(self) -> None:
        for name in (
            "max_images_per_request", "max_body_bytes", "max_upload_bytes", "image_store_max_files",
            "image_store_max_bytes", "image_store_files_per_caller", "max_failed_keys", "video_store_max_jobs",
            "video_store_max_bytes", "video_jobs_per_caller", "video_poll_after_ms",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        for name in ("image_ttl_s", "body_timeout_s", "video_ttl_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}.")
        if not self.failed_key_delay_s >= 0:
            raise ValueError(f"failed_key_delay_s must be >= 0, got {self.failed_key_delay_s!r}.")
        object.__setattr__(self, "api_keys", MappingProxyType(_named_keys(self.api_keys)))

    @property
    def max_upload_body_bytes(self) -> int:
        """The edits route's body limit: two pictures (image, mask) and the text fields."""
        return 2 * self.max_upload_bytes + self.max_body_bytes


def _named_keys(api_keys: Mapping[str, str] | frozenset[str]) -> dict[str, str]:
    """{name: key}, checked: names are short words, keys non-empty and distinct."""
    if isinstance(api_keys, str):
        raise ValueError("api_keys must be a {name: key} mapping or a set of keys, not one string.")
    if not isinstance(api_keys, Mapping):
        if not all(isinstance(key, str) and key for key in api_keys):
            raise ValueError("api_keys must hold non-empty strings.")
        api_keys = {"key-" + hashlib.sha256(key.encode()).hexdigest()[:12]: key for key in api_keys}
    named = dict(api_keys)
    for name, key in named.items():
        if not isinstance(name, str) or not _KEY_NAME.fullmatch(name):
            raise ValueError(f"API key name {name!r} is not allowed: use 1-64 letters, digits, '.', '_' or '-'.")
        if not isinstance(key, str) or not key:
            raise ValueError(f"the API key of {name!r} must be a non-empty string.")
    if len(set(named.values())) != len(named):
        raise ValueError("two API key names share one key: give every caller its own key.")
    return named


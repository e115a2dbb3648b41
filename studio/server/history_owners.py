"""Who owns a saved result: the keys the History index files results under, and the browser tokens
that open them.

    owners = HistoryOwners.in_folder(Path("outputs"))
    token = owners.issue()                      # a browser's token, signed by this server
    owners.of_browser(token)                     # its owner key; None for a token this server did not sign
    owners.of_caller("http:key:alice")           # an API caller's owner key (its engine session)

The rule: a page lists a browser's results only when the browser shows a token this server signed,
and an API caller's results (gradio_client, the HTTP API) are filed under a key nobody can name from
outside: both keys are HMACs under the server's secret, each with its own label, so no string a
client sends as a token reaches another caller's results. The secret lives beside the history index
(`<outputs>/history/secret.key`, made on first start), so tokens and keys survive restarts; with
saving off it is made anew each start (nothing is listed then anyway).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
from pathlib import Path

SECRET_FILE = "secret.key"
_SECRET_BYTES = 32
_NONCE_BYTES = 24  # secrets.token_urlsafe(24): 32 characters
_MAX_TOKEN_CHARS = 128
# What browsers kept before tokens were signed: token_urlsafe(24), filed under LEGACY_KEY(token).
_LEGACY_TOKEN = re.compile(r"[A-Za-z0-9_-]{32}")
_OWNER_KEY = re.compile(r"[0-9a-f]{32}")


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def is_owner_key(text: object) -> bool:
    return isinstance(text, str) and _OWNER_KEY.fullmatch(text) is not None


def legacy_owner_key(token: str) -> str:
    """Where results of an unsigned browser token were filed before tokens were signed."""
    return hashlib.sha256(("stepstudio-history\0" + token).encode("utf-8", "surrogatepass")).hexdigest()[:32]


def is_legacy_token(token: object) -> bool:
    return isinstance(token, str) and _LEGACY_TOKEN.fullmatch(token) is not None


def _read_or_make_secret(folder: Path) -> bytes:
    """The secret in `folder`, made once (two studios starting together agree on one)."""
    path = folder / SECRET_FILE
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        draft = folder / f".{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
        descriptor = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as file:
            file.write(secrets.token_bytes(_SECRET_BYTES))
        try:
            os.link(draft, path)  # atomic, and refuses to replace one another studio made first
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    secret = path.read_bytes()
    if len(secret) < 16:
        raise ValueError(f"{path} holds {len(secret)} bytes, not a secret: remove it and start again "
                         "(browsers then get new History tokens).")
    return secret


class HistoryOwners:
    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    @classmethod
    def in_folder(cls, folder: Path | None) -> "HistoryOwners":
        """The owners of the results indexed in `folder` (None: saving is off, a secret for this run)."""
        return cls(secrets.token_bytes(_SECRET_BYTES) if folder is None else _read_or_make_secret(Path(folder)))

    def _mac(self, label: str, text: str) -> bytes:
        return hmac.new(self._secret, f"{label}\0{text}".encode("utf-8", "surrogatepass"), hashlib.sha256).digest()

    def issue(self) -> str:
        """A new browser token: a random part and this server's signature of it."""
        nonce = secrets.token_urlsafe(_NONCE_BYTES)
        return f"{nonce}.{_b64(self._mac('token', nonce))}"

    def verified(self, token: object) -> str | None:
        """The token, when this server signed it."""
        if not isinstance(token, str) or len(token) > _MAX_TOKEN_CHARS:
            return None
        nonce, dot, signature = token.partition(".")
        if not dot or not nonce or not hmac.compare_digest(signature, _b64(self._mac("token", nonce))):
            return None
        return token

    def of_browser(self, token: object) -> str | None:
        """The owner key of a browser's results; None unless this server signed the token."""
        if self.verified(token) is None:
            return None
        return self._mac("browser", token.partition(".")[0]).hex()[:32]

    def of_caller(self, session_id: str) -> str:
        """The owner key of an API caller's results (its engine session)."""
        return self._mac("caller", session_id).hex()[:32]

    @property
    def browser_state_secret(self) -> str:
        """The key gr.BrowserState obfuscates the token with in localStorage: fixed across restarts
        (a random one would make every browser's stored token unreadable after a restart); sent to
        pages, so it is derived from the secret, never the secret itself."""
        return self._mac("browser-state", "").hex()[:32]

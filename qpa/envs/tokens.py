"""Bearer tokens for qpa's servers: a file mapping each token's SHA-256 to the caller it names.

Both `qpa env serve` and `qpa harness serve` authenticate callers the same way. The file (YAML
or JSON, typically a Kubernetes Secret mounted read-only) maps `sha256:<64 hex digits>` of a
token to the identity it stands for (a client name for the environment server, a user id for the
Harness):

    sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08: alice
    sha256:60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752: collector-a

Only hashes are stored, so the Secret never holds a usable token. Make one with
`printf %s "$TOKEN" | sha256sum`. A caller sends `Authorization: Bearer <token>`; the token's
hash is looked up (a hash of a high-entropy secret leaks nothing through lookup timing). The
file is re-read when it changes (Kubernetes updates a mounted Secret in place), at most once a
second; a change that does not parse keeps the last good table and is logged.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import yaml

logger = logging.getLogger("qpa.tokens")

IDENTITY_PATTERN = r"^[A-Za-z0-9_.@:\-]{1,128}$"
_IDENTITY = re.compile(IDENTITY_PATTERN)
_HASH = re.compile(r"^(?:sha256:)?([0-9a-f]{64})$")
_MAX_TOKEN_CHARS = 4096
_RECHECK_S = 1.0


class TokenFileError(ValueError):
    """The tokens file cannot be read or an entry is malformed (the entry is named)."""


class AuthError(Exception):
    """A request whose credentials are missing or not known."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def token_hash(token: str) -> str:
    """`sha256:<hex>` of `token`: the key a tokens file stores for it."""
    return "sha256:" + hashlib.sha256(token.encode("utf-8")).hexdigest()


def parse_tokens(data: Any, source: str) -> dict[str, str]:
    """{hex digest: identity} from a loaded tokens document; TokenFileError names the entry."""
    if not isinstance(data, dict):
        raise TokenFileError(f"{source}: expected a mapping of sha256:<hex> to an identity")
    table: dict[str, str] = {}
    for key, identity in data.items():
        match = _HASH.match(str(key).strip().lower())
        if match is None:
            raise TokenFileError(
                f"{source}: key {str(key)[:20]!r}...: expected sha256:<64 hex digits> "
                "(the token's hash, never the token)"
            )
        if not isinstance(identity, str) or not _IDENTITY.fullmatch(identity):
            raise TokenFileError(
                f"{source}: entry {match.group(1)[:12]}...: identity must match {IDENTITY_PATTERN}"
            )
        table[match.group(1)] = identity
    return table


class TokenTable:
    """The identities of a tokens file, reloaded when the file changes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp = self._stat()
        self._table = self._read()
        self._checked = time.monotonic()

    @classmethod
    def of(cls, tokens: dict[str, str]) -> TokenTable:
        """A fixed table from {token: identity} (tests, embedded use); never reloaded."""
        table = cls.__new__(cls)
        table.path = Path()
        table._lock = threading.Lock()
        table._stamp = None
        table._table = {token_hash(t).split(":", 1)[1]: who for t, who in tokens.items()}
        table._checked = float("inf")
        return table

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise TokenFileError(f"{self.path}: cannot read the tokens file: {exc}") from None
        return (st.st_mtime_ns, st.st_ino, st.st_size)

    def _read(self) -> dict[str, str]:
        try:
            data = yaml.safe_load(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise TokenFileError(f"{self.path}: cannot read the tokens file: {exc}") from None
        return parse_tokens(data, str(self.path))

    def __len__(self) -> int:
        return len(self._table)

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._checked < _RECHECK_S:
            return
        with self._lock:
            self._checked = now
            try:
                stamp = self._stat()
                if stamp != self._stamp:
                    self._table = self._read()
                    self._stamp = stamp
                    logger.info("reloaded %d tokens from %s", len(self._table), self.path)
            except TokenFileError as exc:
                logger.error("keeping the previous tokens: %s", exc)

    def identity(self, authorization: str | None) -> str:
        """The identity of an `Authorization` header value; AuthError when there is none."""
        if not authorization:
            raise AuthError("missing 'Authorization: Bearer <token>' header")
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise AuthError("the Authorization header must be 'Bearer <token>'")
        if len(token) > _MAX_TOKEN_CHARS:
            raise AuthError("the bearer token is too long")
        self._refresh()
        who = self._table.get(hashlib.sha256(token.encode("utf-8", "replace")).hexdigest())
        if who is None:
            raise AuthError("unknown bearer token")
        return who

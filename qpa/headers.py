"""Which HTTP headers can carry an identity a trusted proxy vouches for: the one rule that
`qpa harness serve --identity-header` and the HarnessRelease CRD (`spec.harness.auth.
identityHeader`, in `qpa.api`) both apply.

A header qualifies only if no client sets it on its own: not one HTTP itself or every client
sets (`Host`, `Authorization`, `Content-Type`, `Content-Length`, ...), and not one that proxies
append to rather than overwrite, so a client's value survives them (`Forwarded`,
`X-Forwarded-*`, `X-Real-IP`, `X-Client-IP`, `True-Client-IP`). This module imports nothing
of qpa, so `qpa.api` (which may import no other part of qpa) can import it too.
"""

from __future__ import annotations

from typing import Final

#: Exact names (lower case) no identity can ride on.
CLIENT_CONTROLLED_HEADERS: Final = (
    "authorization",
    "host",
    "content-type",
    "content-length",
    "cookie",
    "forwarded",
    "x-real-ip",
    "x-client-ip",
    "true-client-ip",
    "user-agent",
    "origin",
    "referer",
)
#: Prefixes (lower case) of names no identity can ride on.
CLIENT_CONTROLLED_PREFIXES: Final = ("x-forwarded-",)
#: The header a trusted proxy proves itself with (`qpa harness serve --proxy-secret-file`).
PROXY_SECRET_HEADER: Final = "x-qpa-proxy-secret"


def client_controlled_header(name: str) -> bool:
    """Whether a client controls header `name` (any case), so it cannot carry an identity.

    The proxy's own secret header is refused too: it proves the proxy, it names no one.
    """
    lowered = name.strip().lower()
    return (
        lowered in CLIENT_CONTROLLED_HEADERS
        or lowered.startswith(CLIENT_CONTROLLED_PREFIXES)
        or lowered == PROXY_SECRET_HEADER
    )


def client_controlled_cel(field: str) -> str:
    """The same rule as a CEL expression, true when `field` (e.g. `self.identityHeader`) is
    *not* client controlled: for the CRD's `x-kubernetes-validations`."""
    exact = ", ".join(f"'{h}'" for h in (*CLIENT_CONTROLLED_HEADERS, PROXY_SECRET_HEADER))
    lowered = f"{field}.lowerAscii()"
    prefixes = " || ".join(f"{lowered}.startsWith('{p}')" for p in CLIENT_CONTROLLED_PREFIXES)
    return f"!({lowered} in [{exact}] || {prefixes})"


def client_controlled_message() -> str:
    """What a refusal says: the rule in words."""
    return (
        "a header clients set or proxies append to cannot carry an identity: not "
        + ", ".join(CLIENT_CONTROLLED_HEADERS)
        + ", "
        + PROXY_SECRET_HEADER
        + ", nor any "
        + ", ".join(f"{p}*" for p in CLIENT_CONTROLLED_PREFIXES)
    )

"""A host's addresses at reconcile time, for the egress rule's DNS half (`builders.netpol`).

The operator resolves each external endpoint's host before it opens egress to it, and refuses
one that resolves into a denied range (`egress.denied`, the metadata ranges): a name is no way
around a rule that its address would break. Answers are kept for `TTL_S` seconds so a
reconcile loop does not ask DNS on every pass; a name that does not resolve has no addresses
(the egress allowlist still decides, by CIDR, what its pods may reach).
"""

from __future__ import annotations

import socket
import time
from typing import Final

TTL_S: Final = 60.0
_cache: dict[str, tuple[float, tuple[str, ...]]] = {}


def no_addresses(host: str) -> tuple[str, ...]:
    """The resolver of `Defaults()` built in code: no lookups (the builders stay pure)."""
    return ()


def dns_addresses(host: str) -> tuple[str, ...]:
    """Every address `host` resolves to now (IPv4 and IPv6), () when it does not resolve."""
    now = time.monotonic()
    kept = _cache.get(host)
    if kept is not None and now - kept[0] < TTL_S:
        return kept[1]
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        addresses: tuple[str, ...] = ()
    else:
        addresses = tuple(dict.fromkeys(str(info[4][0]).split("%", 1)[0] for info in infos))
    _cache[host] = (now, addresses)
    return addresses

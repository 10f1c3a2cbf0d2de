"""Validation rules by class, each one function with one message, shared by the pydantic models,
the CRDs (a CEL rule or pattern built from the same constants) and the operator.

A rule is written for a class of input, not for the cases that found it:

- **egress** (`endpoint_host_problem`): an endpoint never names a link-local or cloud metadata
  address, or an unspecified one, however the address is written (dotted, as one number, in hex
  or octal). Loopback is left to the operator's reconcile-time check (the single-machine test
  path runs its store and models on 127.0.0.1); at reconcile time the operator resolves host names
  and refuses any address in the denied ranges (`address_denied`, the chart's
  `network.deniedEgressCidrs` added to `DENIED_EGRESS_CIDRS`);
- **URI text** (`uri_text_problem`): a URI is written in its normal form, so a prefix or
  credential check reads what a client will fetch: no percent-encoding, no backslash, no `.` or
  `..` path segment, nothing outside RFC 3986's characters;
- **query and fragment** (`endpoint_query_problem`): an endpoint URL carries no fragment and only
  query keys of `ENDPOINT_QUERY_KEYS` (a credential may hide under any other name);
- **environment names** (`env_name_problem`): matched case-insensitively against the variables
  that change how a process loads code or where it connects (loader, interpreter, proxy and
  cloud-SDK variables, and the operator's own `QPA_` ones);
- **identity headers** (`client_controlled_header`): a header a client sets itself, or that
  proxies append to rather than overwrite (`Host`, `Authorization`, `Forwarded`,
  `X-Forwarded-*`, `X-Real-IP`, ...), never carries an identity a proxy vouches for (the
  HarnessRelease CRD and `qpa harness serve --identity-header` apply this one rule);
- **text** (`text_problem`): a string that reaches an environment variable, a label, an event or
  a path holds no control, zero-width or bidirectional character.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from typing import Any, Final


def cel_string(text: str) -> str:
    """`text` as a CEL string literal (backslashes and quotes escaped: `\\.` is no CEL escape)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# --------------------------------------------------------------------------- egress

#: Ranges no workload's endpoint may reach: link-local (cloud metadata lives there),
#: "this network", and the metadata addresses clouds put elsewhere (AWS over IPv6, Alibaba).
DENIED_EGRESS_CIDRS: Final = (
    "169.254.0.0/16",
    "0.0.0.0/8",
    "100.100.100.200/32",
    "::/128",
    "fe80::/10",
    "fd00:ec2::254/128",
    "::ffff:169.254.0.0/112",
)
#: Host names of cloud metadata services.
DENIED_HOST_NAMES: Final = ("metadata", "metadata.google.internal", "instance-data")
EGRESS_MESSAGE: Final = (
    "must not point at a link-local or cloud metadata address, or an unspecified address "
    "(169.254.0.0/16, 0.0.0.0/8, fe80::/10, metadata.google.internal)"
)
NUMERIC_HOST_MESSAGE: Final = (
    "a host written as a number must be a dotted decimal IPv4 address (no single number, hex "
    "or octal form, no leading zeros)"
)
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_DOTTED_QUAD = rf"{_OCTET}(\.{_OCTET}){{3}}"
# a host whose labels are all numbers (decimal or 0x hex): an IPv4 address in some notation
_NUMERIC_HOST = r"(0[xX][0-9a-fA-F]*|[0-9]+)(\.(0[xX][0-9a-fA-F]*|[0-9]+))*\.?"
_AUTHORITY_END = r"(:[0-9]*)?([/?#]|$)"
# hosts of the denied ranges and names, written the only way `NUMERIC_HOST_MESSAGE` allows
_DENIED_HOST = (
    r"(169\.254\.[0-9.]*|0\.[0-9.]*|100\.100\.100\.200|"
    r"(" + "|".join(re.escape(n) for n in DENIED_HOST_NAMES) + r")\.?)"
)
#: What the CRD says about an endpoint's host (CEL, over the whole URL), as the models do.
ENDPOINT_HOST_RULES: Final[tuple[dict[str, Any], ...]] = (
    {
        "rule": "!self.matches("
        + cel_string(f"^[A-Za-z][-A-Za-z0-9+.]*://{_NUMERIC_HOST}{_AUTHORITY_END}")
        + ") || self.matches("
        + cel_string(f"^[A-Za-z][-A-Za-z0-9+.]*://{_DOTTED_QUAD}{_AUTHORITY_END}")
        + ")",
        "message": NUMERIC_HOST_MESSAGE,
    },
    {
        "rule": "!self.lowerAscii().matches("
        + cel_string(f"^[a-z][-a-z0-9+.]*://{_DENIED_HOST}{_AUTHORITY_END}")
        + ")",
        "message": EGRESS_MESSAGE,
    },
)


def _host_of(url: str) -> str | None:
    """The host of `url` as written (no port, no brackets), None when it has no authority."""
    match = re.match(r"^[A-Za-z][-A-Za-z0-9+.]*://([^/?#]*)", url)
    if match is None:
        return None
    authority = match.group(1).rsplit("@", 1)[-1]
    if authority.startswith("["):
        return authority[1:].split("]", 1)[0]
    return authority.split(":", 1)[0]


def endpoint_host_problem(url: str) -> str | None:
    """Why the host of endpoint `url` is one no workload may reach (None when it may)."""
    host = _host_of(url)
    if host is None:
        return None
    if re.fullmatch(_NUMERIC_HOST, host) and not re.fullmatch(_DOTTED_QUAD, host):
        return NUMERIC_HOST_MESSAGE
    name = host.lower().rstrip(".")
    if name in DENIED_HOST_NAMES:
        return EGRESS_MESSAGE
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return None
    return EGRESS_MESSAGE if address_denied(address) else None


def denied_networks(
    extra: Iterable[str] = (),
) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """The denied ranges: `DENIED_EGRESS_CIDRS` and the admin's (`extra`, CIDR strings)."""
    return tuple(ipaddress.ip_network(c, strict=False) for c in (*DENIED_EGRESS_CIDRS, *extra))


def address_denied(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address | str, extra: Iterable[str] = ()
) -> bool:
    """Whether `address` lies in a denied range (the unspecified and multicast ones too)."""
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_link_local or ip.is_unspecified or ip.is_multicast:
        return True
    return any(ip in net for net in denied_networks(extra) if net.version == ip.version)


# --------------------------------------------------------------------------- URI text

URI_TEXT_MESSAGE: Final = (
    "must be written in normal form: RFC 3986 characters only, no percent-encoding, no "
    "backslash and no '.' or '..' path segment (what a prefix check reads is what is fetched)"
)
# RFC 3986's unreserved, reserved and (here refused) percent characters, less `%` and `\`
_URI_CHARS = r"[-A-Za-z0-9._~:/?#\[\]@!$&'()*+,;=]"
_DOT_SEGMENT = r"^[A-Za-z][-A-Za-z0-9+.]*://[^/?#]*(/[^?#]*)?/\.\.?([/?#]|$)"
#: The CRD's rules for URI text (CEL), as the models check it.
URI_TEXT_RULES: Final[tuple[dict[str, Any], ...]] = (
    {
        "rule": f"self.matches({cel_string(f'^{_URI_CHARS}*$')}) && "
        f"!self.matches({cel_string(_DOT_SEGMENT)})",
        "message": URI_TEXT_MESSAGE,
    },
)


def uri_text_problem(uri: str) -> str | None:
    """Why `uri` is not in the normal form every check reads (None when it is)."""
    if not re.fullmatch(f"{_URI_CHARS}*", uri) or re.match(_DOT_SEGMENT, uri):
        return URI_TEXT_MESSAGE
    return None


# --------------------------------------------------------------------------- query, fragment

#: Query keys an endpoint URL may carry (Azure OpenAI's `api-version`); any other key may be a
#: credential under a name no list foresees.
ENDPOINT_QUERY_KEYS: Final = ("api-version",)
ENDPOINT_QUERY_MESSAGE: Final = (
    "an endpoint URL takes no fragment and no query key but "
    + ", ".join(ENDPOINT_QUERY_KEYS)
    + " (a credential goes in a Secret: apiKeySecretRef)"
)
_KEYS = "|".join(re.escape(k) for k in ENDPOINT_QUERY_KEYS)
_ALLOWED_QUERY = rf"^[^?#]*(\?({_KEYS})=[-A-Za-z0-9._~]*(&({_KEYS})=[-A-Za-z0-9._~]*)*)?$"
#: The CRD's rule for an endpoint's query and fragment (CEL).
ENDPOINT_QUERY_RULES: Final[tuple[dict[str, Any], ...]] = (
    {"rule": f"self.matches({cel_string(_ALLOWED_QUERY)})", "message": ENDPOINT_QUERY_MESSAGE},
)


def endpoint_query_problem(url: str) -> str | None:
    """Why the query or fragment of endpoint `url` is refused (None when it has none or only
    allowed keys)."""
    return None if re.match(_ALLOWED_QUERY, url) else ENDPOINT_QUERY_MESSAGE


# --------------------------------------------------------------------------- environment names

#: Prefixes of variables that change how a process loads code, which interpreter path or SDK
#: endpoint it uses, or that the operator sets (`QPA_`), in any case.
DENIED_ENV_PREFIXES: Final = (
    "QPA_",
    "LD_",
    "DYLD_",
    "PYTHON",
    "AWS_",
    "AMAZON_",
    "GOOGLE_",
    "GCE_",
    "CLOUDSDK_",
    "AZURE_",
    "KUBERNETES_",
    "HF_",
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "S3_",
    "MC_HOST",
    "NODE_",
    "JAVA_",
    "_JAVA",
    "SSL_",
    "OPENSSL_",
    "GIT_",
)
#: Whole names denied besides the prefixes (the operator's, loaders', trust stores).
DENIED_ENV_NAMES: Final = (
    "HOME",
    "PATH",
    "SHELL",
    "ENV",
    "BASH_ENV",
    "PERL5LIB",
    "PERL5OPT",
    "RUBYOPT",
    "RUBYLIB",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "TRITON_CACHE_DIR",
    "POD_NAME",
    "POD_NAMESPACE",
    "POD_IP",
    "JOB_COMPLETION_INDEX",
    "OPENAI_BASE_URL",
    "OPENAI_API_BASE",
)
#: Suffixes of proxy variables (`HTTPS_PROXY`, `no_proxy`, `ALL_PROXY`).
DENIED_ENV_SUFFIXES: Final = ("_PROXY",)
ENV_NAME_MESSAGE: Final = (
    "is a variable that changes how the pod's processes load code or where they connect, or "
    "one the operator sets (QPA_*, LD_*, PYTHON*, *_PROXY, cloud SDK variables such as AWS_* "
    "and GOOGLE_*, HOME, PATH; any case)"
)


def _alternation(values: Iterable[str]) -> str:
    return "|".join(re.escape(v) for v in values)


_DENIED_ENV = (
    f"^(({_alternation(DENIED_ENV_PREFIXES)}).*|({_alternation(DENIED_ENV_NAMES)})"
    f"|.*({_alternation(DENIED_ENV_SUFFIXES)}))$"
)
#: The CRD's rule for an environment variable's name (CEL).
ENV_NAME_RULES: Final[tuple[dict[str, Any], ...]] = (
    {"rule": f"!self.upperAscii().matches({cel_string(_DENIED_ENV)})", "message": ENV_NAME_MESSAGE},
)


def env_name_problem(name: str) -> str | None:
    """Why `name` may not be set on the operator's pods (None when it may)."""
    return ENV_NAME_MESSAGE if re.match(_DENIED_ENV, name.upper()) else None


# --------------------------------------------------------------------------- text

#: Control characters, and the zero-width and bidirectional ones that make text read other
#: than it is (in a label, an event, a log line or a path).
_INVISIBLE: Final = (
    "\u00ad\u061c\u180e\u200b\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e"
    "\u2060\u2061\u2062\u2063\u2064\u2066\u2067\u2068\u2069\ufeff"
)
#: A string with none of them (Python `re` and Go RE2 read this pattern alike).
PLAIN_TEXT: Final = "^[^\\x00-\\x1f\\x7f-\\x9f" + _INVISIBLE + "]*$"
TEXT_MESSAGE: Final = "must not contain control, zero-width or bidirectional characters"


def text_problem(value: str) -> str | None:
    """Why `value` may not reach an environment variable, a label, an event or a path."""
    return None if re.match(PLAIN_TEXT, value) else TEXT_MESSAGE


# --------------------------------------------------------------------------- identity headers

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

"""NetworkPolicies: the pods qpa runs reach only what they need, and are reached only by theirs.

Every pod the operator creates but the device bridge (whose ingress `builders.devicepool`
owns) is selected by an egress policy `<owner>[-<part>]-egress`, and every server by an ingress
policy `<server>-ingress`, each selecting exactly its pods. Egress is denied but

- **DNS**: UDP/TCP 53 to the cluster DNS pods (`networkPolicy.dns.namespace`/`podLabels`,
  `k8s-app: kube-dns` in `kube-system`) and to the NodeLocal DNSCache addresses
  (`networkPolicy.dns.nodeLocalCidrs`, `169.254.20.10/32`); nothing else on 53;
- each **endpoint URL** the pods are given (model, object store, ...), by its host, never
  into a denied range (the always-denied link-local and metadata ranges and the admin's
  `networkPolicy.egress.denied`, loopback by default), whether the host is an address or a
  name that resolves there at reconcile time: such an endpoint is not opened and is listed as
  blocked, like one no allowlist covers;
  - an IP address: that address (`/32`, `/128`) on the URL's port;
  - an in-cluster Service (`svc`, `svc.ns`, `svc.ns.svc[.<cluster domain>]`): only that
    Service's pods and their port: a Service the admin named in `networkPolicy.egress.services`
    (its pod labels and ports: the chart adds its bundled store), a KServe predictor
    (`<isvc>-predictor[-NNNNN]`: pods labelled `serving.kserve.io/inferenceservice=<isvc>`,
    ports `networkPolicy.kservePorts`), a RolloutPool's `<pool>-env` (its env servers, named
    port `http`), else the pods of that namespace on the URL's port only;
  - any other host name: only the CIDRs of `networkPolicy.egress.external` entries that cover
    the host and port. None covering it: the endpoint is **not opened** and is listed in the
    policy's `qpa.ai/egress-blocked` annotation (empty when nothing is blocked), which the
    handlers turn into an `EgressAllowed=False` condition and a Warning naming the endpoint
    and the setting;
    `svc.ns` hosts are tried as both;
- pods of other qpa objects they talk to, by those pods' labels and ports;
- for pods that hold Leases: the API server (`networkPolicy.egress.apiServer`, by default the
  `kubernetes` Service's address the operator itself sees).

No rule is ever empty, allows every address (`0.0.0.0/0`, `::/0`), or leaves its ports open,
with one exception: a training run's ranks reach each other on every port (NCCL opens
ephemeral ports), and only each other. Pure functions, like every builder.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Final
from urllib.parse import urlsplit

from qpa_operator.builders.common import (
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    Defaults,
    JsonDict,
    bounded_name,
    kind_label,
    metadata,
    owner_namespace,
    selector_labels,
    with_spec_hash,
)
from qpa_operator.builders.netsettings import NetworkSettings, PodPeer

from qpa.api.v1alpha1 import CustomResource
from qpa.api.v1alpha1.rules import address_denied

NAMESPACE_LABEL: Final = "kubernetes.io/metadata.name"
#: KServe's label on an InferenceService's predictor pods.
ISVC_LABEL: Final = "serving.kserve.io/inferenceservice"
#: On client pods of a RolloutPool (collectors, RL ranks, benchmarks): the pool they use, so
#: the pool's ingress policy admits exactly them.
ENV_CLIENT_LABEL: Final = "qpa.ai/env-client"
#: Endpoints a policy does not open (no allowlist covers them), one per line.
BLOCKED_ANNOTATION: Final = "qpa.ai/egress-blocked"
#: The chart's setting that opens external endpoints (named in conditions and Events).
EXTERNAL_SETTING: Final = "networkPolicy.egress.external"
API_SERVER_SETTING: Final = "networkPolicy.egress.apiServer"
DENIED_SETTING: Final = "networkPolicy.egress.denied"
DNS_PORT: Final = 53
DEFAULT_PORTS: Final = {"http": 80, "https": 443, "s3": 443}
ENV_PORT: Final = "http"
PREDICTOR: Final = re.compile(r"(?P<isvc>[a-z0-9]([-a-z0-9]*[a-z0-9])?)-predictor(-\d{5})?")

Port = int | str


def _name(owner: CustomResource, suffix: str) -> str:
    return bounded_name(owner, suffix, 63)


def policy_name(owner: CustomResource, part: str | None = None) -> str:
    """`<owner>-egress`, or `<owner>-<part>-egress` for a second kind of pod of the owner."""
    return _name(owner, f"{part}-egress" if part else "egress")


def ingress_name(server: str) -> str:
    return f"{server}-ingress"


def tcp(ports: Iterable[Port]) -> list[JsonDict]:
    seen: list[JsonDict] = []
    for port in ports:
        entry = {"protocol": "TCP", "port": port}
        if entry not in seen:
            seen.append(entry)
    return seen


def dns_rules(settings: NetworkSettings) -> list[JsonDict]:
    """UDP/TCP 53 to the cluster DNS pods and, when set, the node-local cache addresses."""
    ports = [{"protocol": "UDP", "port": DNS_PORT}, {"protocol": "TCP", "port": DNS_PORT}]
    dns = settings.dns
    cluster = {
        "namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: dns.namespace}},
        "podSelector": {"matchLabels": dict(dns.pod_labels)},
    }
    rules = [{"to": [cluster], "ports": [dict(p) for p in ports]}]
    if dns.node_local_cidrs:
        rules.append(
            {
                "to": [{"ipBlock": {"cidr": cidr}} for cidr in dns.node_local_cidrs],
                "ports": [dict(p) for p in ports],
            }
        )
    return rules


def pods_peer(match_labels: Mapping[str, str], namespace: str | None = None) -> JsonDict:
    """Pods with these labels, in `namespace` (None: the policy's own namespace)."""
    peer: JsonDict = {"podSelector": {"matchLabels": dict(sorted(match_labels.items()))}}
    if namespace is not None:
        peer["namespaceSelector"] = {"matchLabels": {NAMESPACE_LABEL: namespace}}
    return peer


def pods_rule(
    match_labels: Mapping[str, str], ports: Iterable[Port], namespace: str | None = None
) -> JsonDict:
    """Egress to pods with these labels on these TCP ports."""
    return {"to": [pods_peer(match_labels, namespace)], "ports": tcp(ports)}


def component_pods(kind: str, name: str, component: str) -> dict[str, str]:
    """The selector labels of the pods of another qpa object (`common.selector_labels`)."""
    return {LABEL_INSTANCE: name, LABEL_COMPONENT: component, kind_label(kind): name}


def env_pool_rule(pool: str, namespace: str | None = None) -> JsonDict:
    """To a RolloutPool's env servers, on their container port (named `http`)."""
    return pods_rule(component_pods("RolloutPool", pool, "env-server"), [ENV_PORT], namespace)


def predictor_pods(isvc: str) -> dict[str, str]:
    return {ISVC_LABEL: isvc}


def predictor_rule(isvc: str, defaults: Defaults, namespace: str | None = None) -> JsonDict:
    """To an InferenceService's predictor pods on the KServe ports."""
    return pods_rule(predictor_pods(isvc), defaults.network.kserve_ports, namespace)


#: Where an `hf://` model comes from (opened only through `networkPolicy.egress.external`).
HUGGING_FACE: Final = "https://huggingface.co"


def model_source(uri: str | None) -> str | None:
    """The endpoint a pod downloads a model URI from: `hf://` is Hugging Face, http(s) itself;
    None for the object store (its own rule) and volumes (`pvc://`)."""
    if not uri or "://" not in uri:
        return None
    scheme = uri.split("://", 1)[0].lower()
    if scheme in ("http", "https"):
        return uri
    return HUGGING_FACE if scheme == "hf" else None


def api_server_rules(defaults: Defaults) -> tuple[list[JsonDict], list[str]]:
    """(rules to the API server, blocked) from `networkPolicy.egress.apiServer`."""
    entries = defaults.network.egress.api_server
    if not entries:
        return [], [f"the API server (set {API_SERVER_SETTING})"]
    rules = [
        {"to": [{"ipBlock": {"cidr": entry.cidr}}], "ports": tcp(entry.ports)} for entry in entries
    ]
    return rules, []


def _service_rules(
    name: str, namespace: str, port: int, own_namespace: str, defaults: Defaults
) -> list[JsonDict]:
    """Egress to the pods behind the in-cluster Service `name.namespace`."""
    where = None if namespace == own_namespace else namespace
    for mapped in defaults.network.egress.services:
        if mapped.name == name and mapped.namespace == namespace:
            return [pods_rule(dict(mapped.pod_labels), mapped.ports, where)]
    predictor = PREDICTOR.fullmatch(name)
    if predictor is not None:
        return [predictor_rule(predictor.group("isvc"), defaults, where)]
    if name.endswith("-env") and len(name) > len("-env"):
        return [env_pool_rule(name[: -len("-env")], where)]
    peer = {"namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: namespace}}}
    if where is None:
        peer = {"podSelector": {}}
    return [{"to": [peer], "ports": tcp([port])}]


def _external_rules(host: str, port: int, defaults: Defaults) -> list[JsonDict]:
    cidrs = [e.cidr for e in defaults.network.egress.external if e.covers(host, port)]
    if not cidrs:
        return []
    return [{"to": [{"ipBlock": {"cidr": c}} for c in dict.fromkeys(cidrs)], "ports": tcp([port])}]


def endpoint_rules(
    url: str, namespace: str, defaults: Defaults
) -> tuple[list[JsonDict], list[str]]:
    """(egress rules that let a pod in `namespace` reach `url`, what stays blocked and why)."""
    parts = urlsplit(url)
    host = (parts.hostname or "").rstrip(".").lower()
    if not host:
        raise ValueError(f"endpoint {url!r} has no host")
    port = parts.port or DEFAULT_PORTS.get(parts.scheme.lower(), 80)
    address: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # RFC 6761: localhost names are loopback whatever DNS says
        is_local = host == "localhost" or host.endswith(".localhost")
        address = ipaddress.ip_address("127.0.0.1") if is_local else None
    denied = defaults.network.egress.denied
    if address is not None:
        if address_denied(address, denied):
            return [], [f"{url} ({host}: a denied address; see {DENIED_SETTING})"]
        cidr = f"{address}/{address.max_prefixlen}"
        return [{"to": [{"ipBlock": {"cidr": cidr}}], "ports": tcp([port])}], []
    labels = host.split(".")
    cluster = ["svc", *defaults.cluster_domain.lower().split(".")]
    if len(labels) == 1:
        return _service_rules(labels[0], namespace, port, namespace, defaults), []
    if len(labels) >= 3 and labels[2:] in (cluster[:1], cluster):
        return _service_rules(labels[0], labels[1], port, namespace, defaults), []
    resolved = [a for a in defaults.resolve(host) if address_denied(a, denied)]
    if resolved:
        why = f"{host} resolves to {resolved[0]}, a denied address; see {DENIED_SETTING}"
        return [], [f"{url} ({why})"]
    external = _external_rules(host, port, defaults)
    if len(labels) == 2:  # `svc.ns` as the resolver's search path tries it, or a domain
        return _service_rules(labels[0], labels[1], port, namespace, defaults) + external, []
    if external:
        return external, []
    return [], [f"{url} ({host}:{port}: add a CIDR for it to {EXTERNAL_SETTING})"]


def egress_policy(
    owner: CustomResource,
    component: str,
    defaults: Defaults,
    *,
    endpoints: Iterable[str | None] = (),
    rules: Iterable[JsonDict] = (),
    blocked: Iterable[str] = (),
    part: str | None = None,
    pod_selector: Mapping[str, str] | None = None,
) -> JsonDict:
    """The egress NetworkPolicy of the pods `pod_selector` (default:
    `selector_labels(owner, component)`) selects; `blocked` adds to what the endpoints leave
    closed (the `qpa.ai/egress-blocked` annotation)."""
    namespace = owner_namespace(owner)
    egress = dns_rules(defaults.network)
    closed = list(blocked)
    for url in endpoints:
        if url:
            found, missing = endpoint_rules(url, namespace, defaults)
            egress += [rule for rule in found if rule not in egress]
            closed += [m for m in missing if m not in closed]
    egress += [rule for rule in rules if rule not in egress]
    # always written (empty when nothing is blocked): a merge patch never removes a key
    annotations = {BLOCKED_ANNOTATION: "\n".join(closed)}
    selector = dict(pod_selector) if pod_selector else selector_labels(owner, component)
    manifest = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(
            owner, policy_name(owner, part), component, defaults, annotations=annotations
        ),
        "spec": {
            "podSelector": {"matchLabels": selector},
            "policyTypes": ["Egress"],
            "egress": egress,
        },
    }
    return with_spec_hash(manifest)


def gateway_peers(peers: Sequence[PodPeer]) -> list[JsonDict]:
    """Admin-set ingress sources (`networkPolicy.ingress.servingGateway`)."""
    return [pods_peer(dict(p.pod_labels), p.namespace) for p in peers]


def ingress_policy(
    owner: CustomResource,
    server: str,
    component: str,
    defaults: Defaults,
    *,
    pod_selector: Mapping[str, str],
    sources: Iterable[tuple[Sequence[JsonDict], Sequence[Port] | None]],
) -> JsonDict:
    """`<server>-ingress`: into the pods `pod_selector` selects, only from `sources`
    ((peers, ports); ports None: every port, for a training run's own ranks only)."""
    ingress: list[JsonDict] = []
    for peers, ports in sources:
        if not peers:
            continue
        rule: JsonDict = {"from": [dict(p) for p in peers]}
        if ports is not None:
            rule["ports"] = tcp(ports)
        if rule not in ingress:
            ingress.append(rule)
    manifest = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(owner, ingress_name(server), component, defaults),
        "spec": {
            "podSelector": {"matchLabels": dict(sorted(pod_selector.items()))},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }
    return with_spec_hash(manifest)


def blocked_endpoints(children: Iterable[Mapping[str, object]]) -> list[str]:
    """What the NetworkPolicies among `children` leave closed (their blocked annotations)."""
    found: list[str] = []
    for child in children:
        if child.get("kind") != "NetworkPolicy":
            continue
        meta = child.get("metadata")
        notes = meta.get("annotations") if isinstance(meta, Mapping) else None
        text = notes.get(BLOCKED_ANNOTATION) if isinstance(notes, Mapping) else None
        for line in str(text or "").splitlines():
            if line and line not in found:
                found.append(line)
    return found

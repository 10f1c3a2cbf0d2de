"""Egress NetworkPolicies: the pods that run episodes reach only what they need.

Collector pods (TaskBatch) and environment servers (RolloutPool) run model-written actions
against sandboxed apps, so each gets a `networking.k8s.io/v1` NetworkPolicy `<owner>-egress`
selecting exactly its pods, with `policyTypes: [Egress]`: everything is denied but

- DNS: the cluster DNS pods (`k8s-app: kube-dns` in `kube-system`), UDP and TCP 53;
- each endpoint URL the pods are given (model, object store), by the shape of its host:
  - an in-cluster Service name (`svc`, `svc.ns.svc[.<cluster domain>]`): the pods of that
    namespace, any port (a NetworkPolicy sees the pod's port after the Service translated
    it, which the URL does not tell);
  - `svc.ns` (two labels): that namespace, and also the URL's port anywhere, since it may just
    as well be an external domain (`minio.example`);
  - an IP address: that address (`/32` or `/128`) on the URL's port;
  - any other host name: the URL's port on any address (NetworkPolicy has no host names;
    a CNI with FQDN rules, e.g. Cilium's `toFQDNs`, narrows this further);
- pods of other qpa objects they talk to (a RolloutPool's env servers, a DevicePool's
  bridges), by those pods' selector labels, in the same namespace;
- for pods that hold Leases (device-backed env servers): the API server's ports 443 and 6443.

Ingress is left to the cluster's own policies. Pure functions, like every builder.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Final
from urllib.parse import urlsplit

from qpa_operator.builders.common import (
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    Defaults,
    JsonDict,
    child_name,
    kind_label,
    metadata,
    owner_namespace,
    selector_labels,
    with_spec_hash,
)

from qpa.api.v1alpha1 import CustomResource

NAMESPACE_LABEL: Final = "kubernetes.io/metadata.name"
DNS_PEER: Final[JsonDict] = {
    "namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: "kube-system"}},
    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
}
DNS_PORTS: Final = ({"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53})
ANYWHERE: Final = ({"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}})
API_SERVER_PORTS: Final = (443, 6443)
DEFAULT_PORTS: Final = {"http": 80, "https": 443}


def policy_name(owner: CustomResource) -> str:
    return child_name(owner, "egress")


def dns_rule() -> JsonDict:
    return {"to": [dict(DNS_PEER)], "ports": [dict(p) for p in DNS_PORTS]}


def _tcp(port: int) -> list[JsonDict]:
    return [{"protocol": "TCP", "port": port}]


def endpoint_rules(url: str, namespace: str, defaults: Defaults) -> list[JsonDict]:
    """Egress rules that let a pod in `namespace` reach `url` (see the module's docstring)."""
    parts = urlsplit(url)
    host = (parts.hostname or "").rstrip(".").lower()
    if not host:
        raise ValueError(f"endpoint {url!r} has no host")
    port = parts.port or DEFAULT_PORTS.get(parts.scheme.lower(), 80)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None:
        cidr = f"{address}/{address.max_prefixlen}"
        return [{"to": [{"ipBlock": {"cidr": cidr}}], "ports": _tcp(port)}]
    labels = host.split(".")
    cluster = ["svc", *defaults.cluster_domain.lower().split(".")]
    if len(labels) == 1:
        return [_namespace_rule(namespace)]
    if len(labels) >= 3 and labels[2:] in (cluster[:1], cluster):
        return [_namespace_rule(labels[1])]
    anywhere = {"to": [dict(peer) for peer in ANYWHERE], "ports": _tcp(port)}
    if len(labels) == 2:
        return [_namespace_rule(labels[1]), anywhere]
    return [anywhere]


def _namespace_rule(namespace: str) -> JsonDict:
    return {"to": [{"namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: namespace}}}]}


def pods_rule(match_labels: Mapping[str, str]) -> JsonDict:
    """To pods of the policy's own namespace with these labels (any port)."""
    return {"to": [{"podSelector": {"matchLabels": dict(sorted(match_labels.items()))}}]}


def component_pods(kind: str, name: str, component: str) -> dict[str, str]:
    """The selector labels of the pods of another qpa object (`common.selector_labels`)."""
    return {LABEL_INSTANCE: name, LABEL_COMPONENT: component, kind_label(kind): name}


def api_server_rule() -> JsonDict:
    return {
        "to": [dict(peer) for peer in ANYWHERE],
        "ports": [p for port in API_SERVER_PORTS for p in _tcp(port)],
    }


def egress_policy(
    owner: CustomResource,
    component: str,
    defaults: Defaults,
    *,
    endpoints: Iterable[str | None] = (),
    rules: Iterable[JsonDict] = (),
) -> JsonDict:
    """The NetworkPolicy of the pods `selector_labels(owner, component)` selects."""
    namespace = owner_namespace(owner)
    egress = [dns_rule()]
    for url in endpoints:
        if url:
            egress += [
                rule for rule in endpoint_rules(url, namespace, defaults) if rule not in egress
            ]
    egress += [rule for rule in rules if rule not in egress]
    manifest = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(owner, policy_name(owner), component, defaults),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(owner, component)},
            "policyTypes": ["Egress"],
            "egress": egress,
        },
    }
    return with_spec_hash(manifest)

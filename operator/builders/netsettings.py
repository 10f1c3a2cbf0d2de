"""The cluster admin's network-policy settings (the chart's `networkPolicy` values).

The operator reads them once at start-up from `QPA_OPERATOR_NETWORK_POLICY` (the chart passes
`networkPolicy` as JSON) into a frozen `NetworkSettings` that `Defaults.network` carries to the
builders (`builders.netpol`). Every address here is the admin's: nothing a resource says can
widen a policy beyond them.

- `dns`: the cluster DNS pods (`namespace` + `podLabels`) and the node-local cache addresses
  (`nodeLocalCidrs`, NodeLocal DNSCache's default link-local `169.254.20.10/32`); UDP/TCP 53 to
  those and nothing else;
- `egress.external`: CIDR allowlist for endpoints outside the cluster (`cidr`, `ports`, and
  optionally the `hosts` an entry is for, `*.example.com` for a domain's hosts); an external
  host no entry covers is not opened (the resource gets `EgressAllowed=False`);
- `egress.services`: in-cluster Services named by `host` (`name.namespace`) whose pods
  (`podLabels`) and target `ports` the operator would not know otherwise (the chart adds its
  bundled store);
- `egress.apiServer`: the API server's addresses and ports, for pods that hold Leases;
- `egress.denied`: ranges no endpoint may lie in, literal or after DNS at reconcile time, on
  top of the link-local and metadata ranges that are always denied
  (`qpa.api.v1alpha1.rules.DENIED_EGRESS_CIDRS`); loopback by default, the admin adds the
  node and private ranges of their cluster (`builders.netpol.endpoint_rules` applies them);
- `ingress.servingGateway`: peers allowed into the InferenceServices' predictors besides the
  qpa pods that use them (the KServe/Knative activator or ingress gateway);
- `ingress.metricsScrapers`: peers allowed into the env servers' port for `/metrics` (the
  Prometheus whose series a metrics adapter turns into the RolloutPool autoscaler's metric);
- `kservePorts`: the predictor pods' ports (KServe's container port 8080, Knative's
  queue-proxy 8012).

A prefix of length 0 (`0.0.0.0/0`, `::/0`) is refused: it would allow everything.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from typing import Annotated, Final

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)
from pydantic.alias_generators import to_camel

ENV_VAR: Final = "QPA_OPERATOR_NETWORK_POLICY"
NODE_LOCAL_DNS: Final = "169.254.20.10/32"
#: A pod's loopback is its own: an endpoint there is a mistake or an attack on a sidecar.
DEFAULT_DENIED: Final = ("127.0.0.0/8", "::1/128")


def _cidr(value: str) -> str:
    try:
        network = ipaddress.ip_network(value, strict=False)
    except ValueError as exc:
        raise ValueError(f"{value!r} is not an IP address or CIDR") from exc
    if network.prefixlen == 0:
        raise ValueError(f"{value!r} allows every address; name the networks to allow")
    return str(network)


def _labels(value: object) -> object:
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), str(v)) for k, v in value.items()))
    return value


Port = Annotated[int, Field(ge=1, le=65535)]
Cidr = Annotated[str, AfterValidator(_cidr)]
LabelMap = Annotated[tuple[tuple[str, str], ...], BeforeValidator(_labels)]


class _Frozen(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class CidrPorts(_Frozen):
    """An address block and the TCP ports allowed on it; `hosts` limits which endpoints use it."""

    cidr: Cidr
    ports: tuple[Port, ...] = Field(min_length=1)
    hosts: tuple[str, ...] = ()

    @field_validator("hosts")
    @classmethod
    def _lower(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(h.strip().rstrip(".").lower() for h in value if h.strip())

    def covers(self, host: str, port: int) -> bool:
        if port not in self.ports:
            return False
        if not self.hosts:
            return True
        return any(
            host == pattern or (pattern.startswith("*.") and host.endswith(pattern[1:]))
            for pattern in self.hosts
        )


class ServicePods(_Frozen):
    """An in-cluster Service (`name.namespace`) by the labels and target ports of its pods."""

    host: str
    pod_labels: LabelMap = Field(min_length=1)
    ports: tuple[Port | str, ...] = Field(min_length=1)

    @field_validator("host")
    @classmethod
    def _two_labels(cls, value: str) -> str:
        host = value.strip().rstrip(".").lower()
        if len(host.split(".")) != 2:
            raise ValueError(f"{value!r}: write the Service as name.namespace")
        return host

    @property
    def name(self) -> str:
        return self.host.split(".")[0]

    @property
    def namespace(self) -> str:
        return self.host.split(".")[1]


class PodPeer(_Frozen):
    """Pods of a namespace (all of them when `podLabels` is empty)."""

    namespace: str = Field(min_length=1)
    pod_labels: LabelMap = ()


class DnsSettings(_Frozen):
    namespace: str = "kube-system"
    pod_labels: LabelMap = (("k8s-app", "kube-dns"),)
    node_local_cidrs: tuple[Cidr, ...] = (NODE_LOCAL_DNS,)


class EgressSettings(_Frozen):
    external: tuple[CidrPorts, ...] = ()
    services: tuple[ServicePods, ...] = ()
    api_server: tuple[CidrPorts, ...] = ()
    denied: tuple[Cidr, ...] = DEFAULT_DENIED


class IngressSettings(_Frozen):
    serving_gateway: tuple[PodPeer, ...] = ()
    metrics_scrapers: tuple[PodPeer, ...] = ()


class NetworkSettings(_Frozen):
    dns: DnsSettings = DnsSettings()
    egress: EgressSettings = EgressSettings()
    ingress: IngressSettings = IngressSettings()
    kserve_ports: tuple[Port, ...] = Field(default=(8080, 8012), min_length=1)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> NetworkSettings:
        """`QPA_OPERATOR_NETWORK_POLICY` (JSON); a bad value raises ValueError naming the field.

        Without an `egress.apiServer` setting the in-cluster address of the `kubernetes`
        Service (`KUBERNETES_SERVICE_HOST`/`_PORT`, set in every pod) is used.
        """
        raw = env.get(ENV_VAR)
        try:
            data = json.loads(raw) if raw else {}
        except ValueError as exc:
            raise ValueError(f"{ENV_VAR}: not JSON ({exc})") from exc
        if not isinstance(data, dict):
            raise ValueError(f"{ENV_VAR}: expected a JSON object")
        try:
            settings = cls.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                "networkPolicy." + ".".join(str(p) for p in e["loc"]) + ": " + e["msg"]
                for e in exc.errors()
            )
            raise ValueError(f"{ENV_VAR}: {problems}") from exc
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
        if not settings.egress.api_server and host and port and port.isdigit():
            api = CidrPorts(cidr=_cidr(host), ports=(int(port),))
            egress = settings.egress.model_copy(update={"api_server": (api,)})
            settings = settings.model_copy(update={"egress": egress})
        return settings

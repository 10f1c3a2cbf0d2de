"""The Kubernetes `restricted` Pod Security Standard as a check of a pod spec (install tests)."""

from __future__ import annotations

from typing import Any

#: Volume types the restricted profile allows (everything else, hostPath first, is refused).
ALLOWED_VOLUMES = frozenset(
    {
        "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
        "projected", "secret",
    }
)  # fmt: skip


def violations(pod: dict[str, Any]) -> list[str]:
    """What keeps a pod spec from the `restricted` Pod Security Standard (empty: none)."""
    found = []
    security = pod.get("securityContext") or {}
    if security.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        found.append("pod seccompProfile")
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            found.append(flag)
    for volume in pod.get("volumes") or []:
        if "hostPath" in volume:
            found.append(f"hostPath volume {volume['name']}")
        elif not set(volume) - {"name"} <= ALLOWED_VOLUMES:
            found.append(f"volume {volume['name']} of a type restricted refuses")
    containers = [*(pod.get("initContainers") or []), *pod["containers"]]
    for container in containers:
        name = container["name"]
        ctx = container.get("securityContext") or {}
        if ctx.get("privileged"):
            found.append(f"{name}: privileged")
        if ctx.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation")
        if ctx.get("readOnlyRootFilesystem") is not True:
            found.append(f"{name}: readOnlyRootFilesystem")
        caps = ctx.get("capabilities") or {}
        if caps.get("drop") != ["ALL"] or set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            found.append(f"{name}: capabilities")
        non_root = ctx.get("runAsNonRoot", security.get("runAsNonRoot"))
        user = ctx.get("runAsUser", security.get("runAsUser"))
        if non_root is not True or user == 0:
            found.append(f"{name}: runs as root")
        if ctx.get("seccompProfile", security.get("seccompProfile", {})).get("type") not in (
            "RuntimeDefault",
            "Localhost",
        ):
            found.append(f"{name}: seccompProfile")
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                found.append(f"{name}: hostPort {port['hostPort']}")
    return found

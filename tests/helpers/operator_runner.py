"""Running the real qpa operator in tests, and waiting on what it does.

The operator (`kopf run -A --standalone -m qpa_operator.main`) runs in a
`kopf.testing.KopfRunner` thread against the test API server (`fakes.kube_api`); tests wait
with `await asyncio.sleep` (inside `kube.eventually`), never `time.sleep`, since the server
and the operator live in other threads.

    from helpers.operator_runner import operator, exists, phase, operator_env  # noqa: F401

    async def test_it(kube_api, operator_env):
        with operator():
            kube_api.create(example("harnessrelease.yaml"))
            await phase(kube_api, "qhr", "planner", "Deploying")

`operator_env` is a fixture: import it into the test module so pytest finds it.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakes.kube_api import KubeAPIServer
from kopf.testing import KopfRunner

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
NS = "default"
OPERATOR = ["run", "-A", "--standalone", "-m", "qpa_operator.main"]
T0 = "2026-01-01T00:00:00Z"
T1 = "2026-01-01T01:00:00Z"


def example(file: str, index: int = 0) -> dict[str, Any]:
    """A document of a file in examples/, as a fresh dict."""
    docs = [d for d in yaml.safe_load_all((EXAMPLES / file).read_text()) if d]
    return copy.deepcopy(docs[index])


@pytest.fixture
def operator_env(kube_config: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Short backoffs, no metrics port; the kubeconfig of the test API server."""
    monkeypatch.setenv("QPA_OPERATOR_RETRY_SCALE", "0.1")
    monkeypatch.delenv("QPA_OPERATOR_METRICS_PORT", raising=False)
    # the single-machine path: store, models and env servers all listen on 127.0.0.1
    monkeypatch.setenv("QPA_OPERATOR_NETWORK_POLICY", '{"egress": {"denied": []}}')
    return kube_config


@contextlib.contextmanager
def operator(timeout: float = 60) -> Iterator[KopfRunner]:
    """The real operator for the block; it must stop cleanly."""
    with KopfRunner(OPERATOR, timeout=timeout) as runner:
        yield runner
    assert runner.exception is None, runner.output
    assert runner.exit_code == 0, runner.output


def status(kube: KubeAPIServer, plural: str, name: str, namespace: str = NS) -> dict[str, Any]:
    obj = kube.get(plural, namespace, name) or {}
    return dict(obj.get("status") or {})


async def phase(
    kube: KubeAPIServer,
    plural: str,
    name: str,
    wanted: str,
    timeout: float = 15,
    namespace: str = NS,
) -> dict[str, Any]:
    """Wait until `status.phase == wanted`; returns the status (the failure shows the last)."""

    def check() -> dict[str, Any] | None:
        current = status(kube, plural, name, namespace)
        return current if current.get("phase") == wanted else None

    try:
        found: dict[str, Any] = await kube.eventually(check, timeout=timeout)
    except AssertionError:
        last = status(kube, plural, name, namespace)
        brief = {
            "phase": last.get("phase"),
            "reasons": last.get("reasons"),
            "conditions": [
                f"{c.get('type')}={c.get('status')} {c.get('reason')}: {c.get('message')}"
                for c in last.get("conditions") or []
            ],
        }
        raise AssertionError(
            f"{plural}/{name} never reached {wanted}: {json.dumps(brief, indent=1)[:6000]}"
        ) from None
    return found


async def exists(
    kube: KubeAPIServer, plural: str, name: str, timeout: float = 15, namespace: str = NS
) -> dict[str, Any]:
    """Wait until the object exists; returns it."""
    found: dict[str, Any] = await kube.eventually(
        lambda: kube.get(plural, namespace, name), timeout=timeout
    )
    return found


async def gone(
    kube: KubeAPIServer, plural: str, name: str, timeout: float = 15, namespace: str = NS
) -> None:
    await kube.eventually(lambda: kube.get(plural, namespace, name) is None, timeout=timeout)


def owned(
    kube: KubeAPIServer, plural: str, kind: str, name: str, namespace: str = NS
) -> list[dict[str, Any]]:
    """Objects labelled `qpa.ai/<kind>=<name>` (the children of one resource)."""
    return kube.list_objects(plural, namespace, f"qpa.ai/{kind.lower()}={name}")


def event_reasons(kube: KubeAPIServer, name: str, namespace: str = NS) -> list[str]:
    """The reasons of the Events about an object, oldest first."""
    return [e["reason"] for e in events_for(kube, name, namespace)]


def events_for(kube: KubeAPIServer, name: str, namespace: str = NS) -> list[dict[str, Any]]:
    """Events about an object, oldest first."""
    return [
        e
        for e in kube.list_objects("events", namespace)
        if (e.get("involvedObject") or {}).get("name") == name
    ]


def mark_job(kube: KubeAPIServer, name: str, namespace: str = NS, **fields: Any) -> None:
    kube.patch_status("jobs", namespace, name, fields)


def job_complete(kube: KubeAPIServer, name: str, namespace: str = NS, **extra: Any) -> None:
    """A Job as the Job controller leaves it on success."""
    conditions = [
        {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": T1},
        {"type": "Complete", "status": "True", "lastTransitionTime": T1},
    ]
    fields = {"startTime": T0, "completionTime": T1, "active": 0, "succeeded": 1}
    mark_job(kube, name, namespace, **(fields | {"conditions": conditions} | extra))


def job_failed(
    kube: KubeAPIServer, name: str, reason: str = "BackoffLimitExceeded", namespace: str = NS
) -> None:
    """A Job as the Job controller leaves it when it gives up."""
    conditions = [
        {"type": "Failed", "status": "True", "reason": reason, "message": "pods failed",
         "lastTransitionTime": T1},
    ]  # fmt: skip
    mark_job(kube, name, namespace, startTime=T0, active=0, failed=1, conditions=conditions)


def isvc_ready(kube: KubeAPIServer, name: str, namespace: str = NS) -> None:
    """An InferenceService as KServe reports it once its current generation serves."""
    obj = kube.get("inferenceservices", namespace, name)
    assert obj is not None, f"InferenceService {name} is missing"
    kube.patch_status(
        "inferenceservices",
        namespace,
        name,
        {
            "observedGeneration": obj["metadata"].get("generation", 1),
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": T0}],
        },
    )


def container(obj: dict[str, Any]) -> dict[str, Any]:
    """The first container of a Job's pod template or an InferenceService's predictor."""
    spec = obj["spec"]
    pod = spec["template"]["spec"] if "template" in spec else spec["predictor"]
    return dict(pod["containers"][0])


def command(obj: dict[str, Any]) -> list[str]:
    c = container(obj)
    return [*c.get("command", []), *c.get("args", [])]


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]

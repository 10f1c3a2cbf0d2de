"""The chart's ClusterRole grants exactly what the operator's code calls: no more, no less.

The permissions are derived from operator/ itself, not from a list kept next to the chart:

- **kopf's registry** (after importing `qpa_operator.main`): every resource with an index,
  an event or a change handler is listed and watched; resources with change handlers are
  patched by kopf (handler progress lives in `qpa.ai/*` annotations);
- **the operator's client calls** (an AST scan of operator/): `client.<verb>(apiVersion,
  plural, ...)` with literal or module-level arguments resolve directly; calls inside the
  generic helpers (`ensure`, `delete_child`, `write_status`, `child_event`) resolve to the
  kinds those helpers are given: every child kind (`CHILD_INDEXES`), the kinds callers pass
  to `delete_child` (traced to `views.child(s)("<Kind>", ...)`), the five custom resources
  (and `/status` for `subresource="status"`). Any other call the scan cannot resolve fails
  the test, so a new API call cannot slip past the chart;
- **what the operator grants**: the Roles its builders create (a subject may grant only
  permissions it holds);
- **kopf's own needs**: Events, CRD discovery, and the cluster-wide peering object.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest
from helpers.chart import ROOT, Render, find
from qpa_operator import main as operator_main  # registers every handler
from qpa_operator.builders import Defaults, devicepool, rolloutpool
from qpa_operator.handlers.views import CHILD_INDEXES
from qpa_operator.kube import plural_of

from qpa.api import GROUP, RESOURCES, parse_resource

Permission = tuple[str, str, str]  # (API group, resource[/subresource], verb)

OPERATOR = ROOT / "operator"
CLIENT_VERBS = {
    "get": "get",
    "list": "list",
    "create": "create",
    "patch": "patch",
    "delete": "delete",
    "delete_collection": "deletecollection",
}
#: kopf itself: Events for handler outcomes, CRD discovery, the cluster-wide peering (`-A`).
KOPF_OWN: set[Permission] = {
    ("", "events", "create"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    *{("kopf.dev", "clusterkopfpeerings", verb) for verb in ("get", "list", "watch", "patch")},
}
PARENTS = [(GROUP, cls.info.plural) for cls in RESOURCES]


def group_of(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def child_kinds() -> dict[str, tuple[str, str]]:
    """kind -> (group, plural) of every child kind the operator indexes (and so ensures)."""
    return {
        kind: (group_of(api_version), plural_of(api_version, kind))
        for api_version, kind in CHILD_INDEXES.values()
    }


# --------------------------------------------------------------------------- kopf registry


def kopf_needs() -> set[Permission]:
    registry: Any = kopf.get_default_registry()
    needs: set[Permission] = set()
    for part in (registry._indexing, registry._watching, registry._changing):
        for handler in part.get_all_handlers():
            selector = handler.selector
            needs |= {(selector.group, selector.any_name, v) for v in ("list", "watch")}
    for handler in registry._changing.get_all_handlers():
        needs.add((handler.selector.group, handler.selector.any_name, "patch"))
    handled = {plural for group, plural, verb in needs if group == GROUP and verb == "patch"}
    assert handled == {p for _, p in PARENTS}, "qpa_operator's handlers are not in kopf's registry"
    return needs


# --------------------------------------------------------------------------- client calls


def _module_name(path: Path) -> str:
    parts = path.relative_to(OPERATOR).with_suffix("").parts
    return ".".join(["qpa_operator", *[p for p in parts if p != "__init__"]])


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _is_client(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "client") or (
        isinstance(node, ast.Attribute) and node.attr == "client"
    )


def _resolve(node: ast.expr, namespace: dict[str, Any]) -> str | None:
    """The value of an argument made of literals and module-level names, else None."""
    try:
        value = eval(compile(ast.Expression(node), "<arg>", "eval"), dict(namespace))
    except NameError:
        return None
    return value if isinstance(value, str) else None


def _kinds_of(node: ast.expr, loops: dict[str, set[str]], namespace: dict[str, Any]) -> set[str]:
    """Kinds an argument names: a literal or module constant, or a loop over a constant."""
    if isinstance(node, ast.Name) and node.id in loops:
        return loops[node.id]
    value = _resolve(node, namespace)
    return {value} if value else set()


def _deleted_kinds() -> set[str]:
    """Kinds handlers pass to `delete_child`: traced to `views.child[ren](<kind>, ...)`, where
    <kind> is a literal, a module constant, or a loop variable over a module constant."""
    kinds: set[str] = set()
    for path in OPERATOR.rglob("*.py"):
        namespace = vars(importlib.import_module(_module_name(path)))
        tree = ast.parse(path.read_text())
        for function in _functions(tree):
            loops: dict[str, set[str]] = {}
            for node in ast.walk(function):
                if isinstance(node, ast.For) and isinstance(node.target, ast.Name):
                    try:
                        values = eval(
                            compile(ast.Expression(node.iter), "<it>", "eval"), dict(namespace)
                        )
                    except (NameError, AttributeError, TypeError):
                        continue
                    if isinstance(values, tuple | list | set | frozenset):
                        loops[node.target.id] = {str(v) for v in values}
            sources: dict[str, set[str]] = {}
            for node in ast.walk(function):
                if isinstance(node, ast.Assign | ast.For):
                    value = node.value if isinstance(node, ast.Assign) else node.iter
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    if (
                        isinstance(value, ast.Call)
                        and isinstance(value.func, ast.Attribute)
                        and value.func.attr in ("child", "children")
                        and value.args
                    ):
                        named = _kinds_of(value.args[0], loops, namespace)
                        for target in targets:
                            if isinstance(target, ast.Name) and named:
                                sources[target.id] = named
            for node in ast.walk(function):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id == "delete_child"
                ):
                    arg = node.args[1]
                    assert isinstance(arg, ast.Name) and arg.id in sources, (
                        f"{path.name}:{node.lineno}: delete_child of an object not read with "
                        "views.child/children; extend this test"
                    )
                    kinds |= sources[arg.id]
    return kinds


def client_needs() -> set[Permission]:
    children = child_kinds()
    deleted = _deleted_kinds()
    assert deleted, "no delete_child call found: the scan is broken"
    needs: set[Permission] = set()
    for path in sorted(OPERATOR.rglob("*.py")):
        if path.name == "kube.py":
            continue  # the client itself
        module = importlib.import_module(_module_name(path))
        tree = ast.parse(path.read_text())
        for function in _functions(tree):
            for node in ast.walk(function):
                if not (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and _is_client(node.func.value)
                    and node.func.attr != "close"
                ):
                    continue
                assert node.func.attr in CLIENT_VERBS, f"{path.name}:{node.lineno}: client call"
                verb = CLIENT_VERBS[node.func.attr]
                status = any(
                    k.arg == "subresource" and isinstance(k.value, ast.Constant)
                    for k in node.keywords
                )
                args = [_resolve(a, vars(module)) for a in node.args[:2]]
                if len(node.args) >= 2 and None not in args:
                    api_version, plural = args
                    assert api_version is not None and plural is not None
                    needs.add((group_of(api_version), plural, verb))
                elif function.name == "ensure":
                    needs |= {(g, p, verb) for g, p in children.values()}
                elif function.name == "delete_child":
                    needs |= {(*children[kind], verb) for kind in deleted}
                elif function.name in ("write_status", "child_event"):
                    suffix = "/status" if status else ""
                    needs |= {(g, p + suffix, verb) for g, p in PARENTS}
                else:
                    pytest.fail(
                        f"{path.name}:{node.lineno}: `{ast.unparse(node)[:80]}` in "
                        f"{function.name}() cannot be resolved; extend this test"
                    )
    return needs


# --------------------------------------------------------------------------- granted Roles


def granted_needs() -> set[Permission]:
    examples = ROOT / "examples"
    import yaml

    needs: set[Permission] = set()
    built: list[dict[str, Any]] = []
    for doc in yaml.safe_load_all((examples / "rolloutpool.yaml").read_text()):
        doc["metadata"].update(namespace="team-a", uid="uid-1")
        built += rolloutpool.children(parse_resource(doc), Defaults())
    for doc in yaml.safe_load_all((examples / "devicepool.yaml").read_text()):
        doc["metadata"].update(namespace="team-a", uid="uid-2")
        built += devicepool.children(parse_resource(doc), Defaults())
    roles = [obj for obj in built if obj["kind"] == "Role"]
    assert len(roles) >= 2, "the device examples no longer build lease Roles"
    for role in roles:
        needs |= set(expand(role["rules"]))
    return needs


def expand(rules: list[dict[str, Any]]) -> Iterator[Permission]:
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    yield (group, resource, verb)


def required() -> set[Permission]:
    return KOPF_OWN | kopf_needs() | client_needs() | granted_needs()


# --------------------------------------------------------------------------- tests


def test_cluster_role_is_exactly_what_the_operator_calls(render: Render) -> None:
    assert operator_main.PEERING_NAME == "qpa-operator"
    role = find(render(), "ClusterRole")
    granted = set(expand(role["rules"]))
    needed = required()
    assert not needed - granted, f"missing from the chart: {sorted(needed - granted)}"
    assert not granted - needed, f"granted but never used: {sorted(granted - needed)}"


def test_no_wildcards_and_no_secrets(render: Render) -> None:
    for doc in render({"objectStore.bundled.enabled": True, "objectStore.secretName": "s"}):
        if doc["kind"] in ("ClusterRole", "Role"):
            for group, resource, verb in expand(doc["rules"]):
                assert "*" not in (group, resource, verb), doc["metadata"]["name"]
                assert resource != "secrets", "the operator never reads Secrets"


def test_binding_names_the_operators_service_account(render: Render) -> None:
    docs = render()
    binding = find(docs, "ClusterRoleBinding")
    account = find(docs, "ServiceAccount")
    deployment = find(docs, "Deployment")
    assert binding["roleRef"]["name"] == find(docs, "ClusterRole")["metadata"]["name"]
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        }
    ]
    assert (
        deployment["spec"]["template"]["spec"]["serviceAccountName"]
        == (account["metadata"]["name"])
    )
    assert not [d for d in render({"rbac.create": False}) if "Role" in d["kind"]]


def test_the_derivation_sees_what_it_must() -> None:
    """Spot checks that the scan finds calls of each kind (it would miss them if broken)."""
    needed = required()
    assert ("coordination.k8s.io", "leases", "deletecollection") in needed  # literal call
    assert ("batch", "jobs", "delete") in needed  # delete_child traced to views.children
    assert ("autoscaling", "horizontalpodautoscalers", "delete") in needed
    assert ("qpa.ai", "trainingruns/status", "patch") in needed  # write_status
    assert ("networking.k8s.io", "networkpolicies", "create") in needed  # ensure
    assert ("", "pods", "watch") in needed and ("", "pods", "get") not in needed  # indexes
    assert ("qpa.ai", "taskbatches", "patch") in needed  # kopf's annotations

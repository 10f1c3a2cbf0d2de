"""The operator's RBAC is exactly what its code calls, in both install modes, and documented.

The permissions, each with the code that needs it (`module:function`), are derived from
operator/ itself, not from a list kept next to the chart:

- **kopf's registry** (after importing `qpa_operator.main`): every resource with an index,
  an event, a daemon or a change handler is listed and watched; resources with change handlers
  are patched by kopf (handler progress lives in `qpa.ai/*` annotations);
- **the operator's client calls** (an AST scan of operator/): `client.<verb>(apiVersion,
  plural, ...)` with literal or module-level arguments resolve directly; calls inside the
  generic helpers (`ensure`, `delete_child`, `write_status`, `child_event`) resolve to the
  kinds those helpers are given: every child kind (`CHILD_INDEXES`), the kinds callers pass
  to `delete_child` (traced to `views.child(s)("<Kind>", ...)`), the five custom resources
  (and `/status` for `subresource="status"`). Any other call the scan cannot resolve fails
  the test, so a new API call cannot slip past the chart;
- **what the operator grants**: the Roles its builders create (a subject may grant only
  permissions it holds);
- **owner references**: every child's ownerReference sets `blockOwnerDeletion`, which on
  clusters enforcing OwnerReferencesPermissionEnforcement needs `update` on the owner's
  `<kind>/finalizers`;
- **kopf's own needs**: Events; cluster-wide only, CRD discovery and the ClusterKopfPeering;
  namespaced only, the KopfPeering of each namespace (kopf's scanning is off there).

The chart is rendered in both modes (ClusterRole; a Role per watched namespace and no
ClusterRole) and compared with that set, and so is the table in docs/operator.md ("RBAC the
operator needs"): a permission the chart grants that no code needs fails, and so does a stale
table row.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml
from helpers.chart import CHART, NAMESPACE, RELEASE, ROOT, Render, find, set_args
from qpa_operator import main as operator_main  # registers every handler
from qpa_operator import release
from qpa_operator.builders import Defaults, devicepool, rolloutpool, taskbatch, trainingrun
from qpa_operator.builders.common import owner_references
from qpa_operator.handlers.views import CHILD_INDEXES
from qpa_operator.kube import plural_of

from qpa.api import GROUP, RESOURCES, parse_resource
from qpa.api.v1alpha1 import HarnessReleaseStatus

Permission = tuple[str, str, str]  # (API group, resource[/subresource], verb)
Sources = dict[Permission, set[str]]  # permission -> the code that needs it

OPERATOR = ROOT / "operator"
DOCS = ROOT / "docs" / "operator.md"
CLIENT_VERBS = {
    "get": "get",
    "list": "list",
    "create": "create",
    "patch": "patch",
    "delete": "delete",
    "delete_collection": "deletecollection",
}
PEERING_VERBS = ("get", "list", "watch", "patch")
#: kopf itself, in both modes: Events of handler outcomes (kopf.info/warn, the poster).
KOPF_OWN: Sources = {("", "events", "create"): {"kopf:events"}}
#: kopf, cluster-wide only (`--all-namespaces`): CRD discovery and the cluster-wide peering.
KOPF_CLUSTER: Sources = {
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"): {"kopf:scanning"},
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"): {"kopf:scanning"},
    **{("kopf.dev", "clusterkopfpeerings", verb): {"kopf:peering"} for verb in PEERING_VERBS},
}
#: kopf, namespaced only (`--namespace`, scanning off): the peering object of each namespace.
KOPF_NAMESPACED: Sources = {
    ("kopf.dev", "kopfpeerings", verb): {"kopf:peering"} for verb in PEERING_VERBS
}
PARENTS = [(GROUP, cls.info.plural) for cls in RESOURCES]
#: Cluster-scoped resources the operator reads: a namespace-scoped operator's client refuses
#: cluster-scoped paths (`qpa_operator.kube`), so the code reading them (the TrainingRun gang
#: admission's Nodes) needs them in the cluster-wide mode only.
CLUSTER_SCOPED = {("", "nodes")}
#: a store, so that the chart grants `get` on its Secret (the release gate reads with it)
STORE = {"objectStore.endpoint": "http://minio.minio:9000", "objectStore.secretName": "qpa-store"}
WATCHED = ["team-a", "team-b"]
NAMESPACED = {**STORE, "operator.watchNamespaces": WATCHED}


def group_of(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def short(module: str, function: str) -> str:
    return f"{module.removeprefix('qpa_operator.')}:{function}"


def merge(*parts: Sources) -> Sources:
    merged: Sources = defaultdict(set)
    for part in parts:
        for permission, sources in part.items():
            merged[permission] |= sources
    return dict(merged)


def child_kinds() -> dict[str, tuple[str, str]]:
    """kind -> (group, plural) of every child kind the operator indexes (and so ensures)."""
    return {
        kind: (group_of(api_version), plural_of(api_version, kind))
        for api_version, kind in CHILD_INDEXES.values()
    }


# --------------------------------------------------------------------------- kopf registry


def kopf_needs() -> Sources:
    registry: Any = kopf.get_default_registry()
    needs: Sources = defaultdict(set)
    for part in (registry._indexing, registry._watching, registry._spawning, registry._changing):
        for handler in part.get_all_handlers():
            selector = handler.selector
            for verb in ("list", "watch"):
                needs[selector.group, selector.any_name, verb].add(
                    short(handler.fn.__module__, handler.fn.__name__)
                )
    for handler in registry._changing.get_all_handlers():
        needs[handler.selector.group, handler.selector.any_name, "patch"].add("kopf:annotations")
    handled = {plural for group, plural, verb in needs if group == GROUP and verb == "patch"}
    assert handled == {p for _, p in PARENTS}, "qpa_operator's handlers are not in kopf's registry"
    return dict(needs)


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


def client_needs() -> Sources:
    children = child_kinds()
    deleted = _deleted_kinds()
    assert deleted, "no delete_child call found: the scan is broken"
    needs: Sources = defaultdict(set)

    def add(permissions: Iterator[Permission] | set[Permission], source: str) -> None:
        for permission in permissions:
            needs[permission].add(source)

    for path in sorted(OPERATOR.rglob("*.py")):
        if path.name == "kube.py":
            continue  # the client itself
        module = importlib.import_module(_module_name(path))
        tree = ast.parse(path.read_text())
        for function in _functions(tree):
            source = short(module.__name__, function.name)
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
                    add({(group_of(api_version), plural, verb)}, source)
                elif function.name == "ensure":
                    add({(g, p, verb) for g, p in children.values()}, source)
                elif function.name == "delete_child":
                    add({(*children[kind], verb) for kind in deleted}, source)
                elif function.name in ("write_status", "child_event", "report_invalid"):
                    suffix = "/status" if status else ""
                    add({(g, p + suffix, verb) for g, p in PARENTS}, source)
                elif verb == "create" and function.name in getattr(module, "CREATES", {}):
                    # `client.create(body)` of a body a builder made: the module names what
                    # each such function creates (`CREATES[function] = (apiVersion, plural)`)
                    api_version, plural = module.CREATES[function.name]
                    add({(group_of(api_version), plural, verb)}, source)
                else:
                    pytest.fail(
                        f"{path.name}:{node.lineno}: `{ast.unparse(node)[:80]}` in "
                        f"{function.name}() cannot be resolved; extend this test"
                    )
    return dict(needs)


# --------------------------------------------------------------------------- built children


def _examples(name: str) -> Iterator[Any]:
    for index, doc in enumerate(yaml.safe_load_all((ROOT / "examples" / name).read_text())):
        doc["metadata"].update(namespace="team-a", uid=f"uid-{name}-{index}")
        yield parse_resource(doc)


def _phone_lease(pool: Any) -> list[dict[str, Any]]:
    name = pool.metadata.name
    return [{"metadata": {"name": devicepool.lease_name(name, "R5CT1"),
                          "labels": {devicepool.POOL_LABEL: name},
                          "annotations": {devicepool.SERIAL_ANNOTATION: "R5CT1"}}}]  # fmt: skip


def built_children() -> list[tuple[str, dict[str, Any]]]:
    """(builder, child) for every example: all children each kind's builders make."""
    built: list[tuple[str, dict[str, Any]]] = []
    for module, example in ((rolloutpool, "rolloutpool.yaml"), (devicepool, "devicepool.yaml"),
                            (taskbatch, "taskbatch.yaml")):  # fmt: skip
        for resource in _examples(example):
            source = short(module.__name__, "children")
            # a DevicePool with a phone: its Roles name the phone's Lease (get/update)
            extra = [_phone_lease(resource)] if module is devicepool else []
            built += [(source, child) for child in module.children(resource, Defaults(), *extra)]
    for tr in _examples("trainingrun.yaml"):
        done = {r.task_batch_ref.name: "s3://qpa/tb/" for r in tr.spec.datasets if r.task_batch_ref}
        plan = trainingrun.data_plan(tr, done)
        children = trainingrun.children(tr, Defaults(), attempt=0, plan=plan, data_ready=True)
        built += [("builders.trainingrun:children", child) for child in children]
    for hr in _examples("harnessrelease.yaml"):
        desired = release.children(hr, HarnessReleaseStatus(phase="Benchmarking"), Defaults())
        built += [("release:children", child) for child in desired.apply]
    return built


def granted_needs() -> Sources:
    """What the Roles the builders create grant (the operator must hold it to grant it)."""
    needs: Sources = defaultdict(set)
    roles = [(source, obj) for source, obj in built_children() if obj["kind"] == "Role"]
    assert len(roles) >= 2, "the device examples no longer build lease Roles"
    for source, role in roles:
        for permission in expand(role["rules"]):
            needs[permission].add(source)
    return dict(needs)


def owner_needs() -> Sources:
    """`update` on `<kind>/finalizers` of every kind whose children block its deletion."""
    needs: Sources = {}
    children = built_children()
    assert children
    owners = set()
    for _, child in children:
        (ref,) = child["metadata"]["ownerReferences"]
        assert ref["blockOwnerDeletion"] is True and ref["controller"] is True, child["kind"]
        owners.add(ref["kind"])
    assert owners == {cls.info.kind for cls in RESOURCES}, "a kind's children were not built"
    kinds = set()
    for example in ("rolloutpool", "devicepool", "taskbatch", "trainingrun", "harnessrelease"):
        for owner in _examples(f"{example}.yaml"):
            (ref,) = owner_references(owner)
            assert ref["blockOwnerDeletion"] is True, owner.kind
            kinds.add(owner.kind)
            needs[GROUP, f"{owner.info.plural}/finalizers", "update"] = {
                "builders.common:owner_references"
            }
    assert kinds == {cls.info.kind for cls in RESOURCES}
    return needs


def expand(rules: list[dict[str, Any]]) -> Iterator[Permission]:
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    yield (group, resource, verb)


def required(mode: str) -> Sources:
    """Every permission the operator needs in `mode` (cluster-wide | namespaced)."""
    own = KOPF_CLUSTER if mode == "cluster-wide" else KOPF_NAMESPACED
    needs = merge(KOPF_OWN, own, kopf_needs(), client_needs(), granted_needs(), owner_needs())
    if mode == "namespaced":
        needs = {p: s for p, s in needs.items() if (p[0], p[1]) not in CLUSTER_SCOPED}
    return needs


# --------------------------------------------------------------------------- the docs' table


def table_rows() -> set[tuple[str, str, str, str, str]]:
    """(scope, group, resource, verbs, code) rows the table in docs/operator.md must have:
    one per (resource, set of verbs the same code needs), scope both | cluster-wide |
    namespaced."""
    cluster, namespaced = required("cluster-wide"), required("namespaced")
    rows = set()
    for permission in sorted(set(cluster) | set(namespaced)):
        scope = (
            "both" if permission in cluster and permission in namespaced
            else "cluster-wide" if permission in cluster else "namespaced"
        )  # fmt: skip
        sources = cluster.get(permission) or namespaced[permission]
        rows.add((scope, permission[0], permission[1], permission[2], ", ".join(sorted(sources))))
    grouped: dict[tuple[str, str, str, str], list[str]] = defaultdict(list)
    for scope, group, resource, verb, code in rows:
        grouped[scope, group, resource, code].append(verb)
    return {
        (scope, f"`{group}`" if group else '`""`', resource, ", ".join(sorted(verbs)),
         ", ".join(f"`{c}`" for c in code.split(", ")))
        for (scope, group, resource, code), verbs in grouped.items()
    }  # fmt: skip


def documented_rows() -> set[tuple[str, ...]]:
    text = DOCS.read_text()
    section = text.split("## RBAC the operator needs", 1)[1].split("\n## ", 1)[0]
    rows = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0] in ("both", "cluster-wide", "namespaced"):
            rows.add(tuple(cells))
    return rows


def render_table() -> str:
    order = {"both": 0, "cluster-wide": 1, "namespaced": 2}
    lines = ["| scope | API group | resource | verbs | code that needs it |"]
    lines.append("|---|---|---|---|---|")
    for row in sorted(table_rows(), key=lambda r: (order[r[0]], r[1], r[2], r[3])):
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- tests


def granted_by(docs: list[dict[str, Any]], kind: str) -> dict[str, set[Permission]]:
    return {
        d["metadata"].get("namespace", ""): set(expand(d["rules"]))
        for d in docs
        if d["kind"] == kind
    }


def test_cluster_role_is_exactly_what_the_operator_calls(render: Render) -> None:
    assert operator_main.PEERING_NAME == "qpa-operator"
    docs = render(STORE)
    granted = set(expand(find(docs, "ClusterRole")["rules"]))
    needed = set(required("cluster-wide"))
    assert not needed - granted, f"missing from the chart: {sorted(needed - granted)}"
    assert not granted - needed, f"granted but never used: {sorted(granted - needed)}"
    assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding", "KopfPeering")]


def test_namespaced_install_has_a_role_per_namespace_and_nothing_cluster_scoped(
    render: Render,
) -> None:
    docs = render(NAMESPACED)
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    assert not [d for d in docs if d["kind"] == "ClusterKopfPeering"]
    roles = granted_by(docs, "Role")
    assert set(roles) == set(WATCHED)
    needed = set(required("namespaced"))
    for namespace, granted in roles.items():
        assert not needed - granted, f"{namespace}: missing {sorted(needed - granted)}"
        assert not granted - needed, f"{namespace}: never used {sorted(granted - needed)}"
    account = find(docs, "ServiceAccount")["metadata"]
    bindings = [d for d in docs if d["kind"] == "RoleBinding"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == WATCHED
    for binding in bindings:
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
            "name": "qpa-operator",
        }  # fmt: skip
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["name"], "namespace": NAMESPACE}
        ]
    peerings = [d for d in docs if d["kind"] == "KopfPeering"]
    assert sorted(p["metadata"]["namespace"] for p in peerings) == WATCHED
    assert {p["metadata"]["name"] for p in peerings} == {operator_main.PEERING_NAME}
    deployment = find(docs, "Deployment", "qpa-operator")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    assert [a for a in command if a.startswith("--namespace=")] == [
        f"--namespace={n}" for n in WATCHED
    ]
    assert "--all-namespaces" not in command
    env = {v["name"]: v.get("value") for v in container["env"]}
    assert env["QPA_OPERATOR_NAMESPACES"] == ",".join(WATCHED)
    assert Defaults.from_env({k: v for k, v in env.items() if v is not None}).namespaces == (
        tuple(WATCHED)
    )


def test_secrets_only_by_name_and_no_wildcards(render: Render) -> None:
    for values in ({}, STORE, NAMESPACED, {**STORE, "objectStore.readableSecrets": ["team-s3"]}):
        docs = render(values)
        names = [n for n in (values.get("objectStore.secretName"),) if n]
        names += values.get("objectStore.readableSecrets", [])
        for doc in docs:
            if doc["kind"] not in ("ClusterRole", "Role"):
                continue
            for rule in doc["rules"]:
                for group, resource, verb in expand([rule]):
                    assert "*" not in (group, resource, verb), doc["metadata"]["name"]
                    if resource == "secrets" and verb == "create":
                        # a release's storage initializer Secret (create takes no names)
                        assert rule["verbs"] == ["create"] and names, rule
                    elif resource == "secrets":
                        assert verb == "get" and rule["resourceNames"] == names, rule
            secret_rules = [
                r for r in doc["rules"] if "secrets" in r["resources"] and "get" in r["verbs"]
            ]
            assert len(secret_rules) == (1 if names else 0), values
            assert all("resourceNames" not in r for r in doc["rules"] if r not in secret_rules)


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
    for values in ({"rbac.create": False}, {**NAMESPACED, "rbac.create": False}):
        assert not [d for d in render(values) if "Role" in d["kind"]]


def test_docs_table_is_every_permission_with_its_code() -> None:
    documented, expected = documented_rows(), table_rows()
    missing, stale = expected - documented, documented - expected
    assert not missing and not stale, (
        f"docs/operator.md's RBAC table is out of date (missing {sorted(missing)}, stale "
        f"{sorted(stale)}); the table as the code needs it:\n{render_table()}"
    )


def test_the_derivation_sees_what_it_must() -> None:
    """Spot checks that the scan finds calls of each kind (it would miss them if broken)."""
    needed = required("cluster-wide")
    assert ("coordination.k8s.io", "leases", "deletecollection") in needed  # literal call
    assert ("batch", "jobs", "delete") in needed  # delete_child traced to views.children
    assert ("autoscaling", "horizontalpodautoscalers", "delete") in needed
    assert ("qpa.ai", "trainingruns/status", "patch") in needed  # write_status
    assert ("networking.k8s.io", "networkpolicies", "create") in needed  # ensure
    assert ("", "pods", "watch") in needed and ("", "pods", "get") not in needed  # indexes
    assert ("qpa.ai", "taskbatches", "patch") in needed  # kopf's annotations
    assert needed["", "secrets", "get"] == {"storecreds:namespace_store_keys"}
    assert needed["", "secrets", "create"] == {"handlers.harnessrelease:storage_secret"}
    assert ("qpa.ai", "harnessreleases/finalizers", "update") in needed  # blockOwnerDeletion
    assert any(re.match(r"^handlers\.\w+:\w+$", s) for s in needed["", "pods", "list"])


def test_values_schema_refuses_bad_namespaces_and_prefixes(helm_run: Any) -> None:
    for values, field in (
        ({"operator.watchNamespaces": ["Team_A"]}, "watchNamespaces"),
        ({"operator.watchNamespaces": ["a", "a"]}, "watchNamespaces"),
        ({"objectStore.namespacePrefix": "s3://key:secret@qpa/{namespace}/"}, "namespacePrefix"),
        ({"objectStore.namespacePrefixes": {"team-a": "s3://qpa/team-a"}}, "namespacePrefixes"),
    ):
        result = helm_run("template", RELEASE, str(CHART), *set_args(values))
        assert result.returncode != 0 and field in result.stderr, (values, result.stderr)

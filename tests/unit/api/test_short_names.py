"""qpa's short names collide with no short name of the projects a qpa cluster commonly runs.

`kubectl get hr` on a cluster with Flux listed Flux's HelmReleases, not qpa's (and `tr`
Tekton's TaskRuns): kubectl resolves a short name to one resource only. The table below is
every `shortNames` entry of the CRDs those projects ship, read from their repositories'
manifests (checked 2026-12-01, at the snapshot dates noted), plus the built-in kinds'. A qpa
name must not be any of them, nor any plural, singular or kind of theirs.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from qpa.api.v1alpha1 import RESOURCES

#: project (repository, snapshot date) -> {kind: short names}
KNOWN: Mapping[str, Mapping[str, tuple[str, ...]]] = {
    "Kubernetes built-ins": {
        "ConfigMap": ("cm",), "Endpoints": ("ep",), "Event": ("ev",), "LimitRange": ("limits",),
        "Namespace": ("ns",), "Node": ("no",), "PersistentVolumeClaim": ("pvc",),
        "PersistentVolume": ("pv",), "Pod": ("po",), "ReplicationController": ("rc",),
        "ResourceQuota": ("quota",), "ServiceAccount": ("sa",), "Service": ("svc",),
        "CustomResourceDefinition": ("crd", "crds"), "DaemonSet": ("ds",),
        "Deployment": ("deploy",), "ReplicaSet": ("rs",), "StatefulSet": ("sts",),
        "HorizontalPodAutoscaler": ("hpa",), "CronJob": ("cj",),
        "CertificateSigningRequest": ("csr",), "Ingress": ("ing",),
        "NetworkPolicy": ("netpol",), "PodDisruptionBudget": ("pdb",),
        "PriorityClass": ("pc",), "StorageClass": ("sc",),
    },
    "Flux (fluxcd/*-controller, 2026-06..08)": {
        "HelmRelease": ("hr",), "Kustomization": ("ks",), "GitRepository": ("gitrepo",),
        "HelmRepository": ("helmrepo",), "HelmChart": ("hc",), "OCIRepository": ("ocirepo",),
        "ExternalArtifact": ("ea",), "ImageRepository": ("imagerepo", "imgrepo"),
        "ImagePolicy": ("imagepol", "imgpol"),
        "ImageUpdateAutomation": ("imgauto", "imgupd", "iua"),
    },
    "Tekton (tektoncd/pipeline, tektoncd/triggers, 2026-08)": {
        "TaskRun": ("tr", "trs"), "PipelineRun": ("pr", "prs"), "TriggerBinding": ("tb",),
        "ClusterTriggerBinding": ("ctb",), "TriggerTemplate": ("tt",),
        "EventListener": ("el",), "Trigger": ("tri",), "Interceptor": ("ni",),
        "ClusterInterceptor": ("ci",),
    },
    "Argo CD (argoproj/argo-cd, 2026-08)": {
        "Application": ("app", "apps"), "ApplicationSet": ("appset", "appsets"),
        "AppProject": ("appproj", "appprojs"),
    },
    "Argo Workflows (argoproj/argo-workflows, 2026-08)": {
        "Workflow": ("wf",), "WorkflowTemplate": ("wftmpl",),
        "ClusterWorkflowTemplate": ("clusterwftmpl", "cwft"), "CronWorkflow": ("cronwf", "cwf"),
        "WorkflowEventBinding": ("wfeb",), "WorkflowTaskSet": ("wfts",),
        "WorkflowArtifactGCTask": ("wfat",),
    },
    "Argo Rollouts (argoproj/argo-rollouts, 2026-08)": {
        "Rollout": ("ro",), "AnalysisRun": ("ar",), "AnalysisTemplate": ("at",),
        "ClusterAnalysisTemplate": ("cat",), "Experiment": ("exp",),
    },
    "Argo Events (argoproj/argo-events, 2026-07)": {
        "EventBus": ("eb",), "EventSource": ("es",), "Sensor": ("sn",),
    },
    "KServe (kserve/kserve, 2026-08)": {
        "InferenceService": ("isvc",), "InferenceGraph": ("ig",), "TrainedModel": ("tm",),
        "LLMInferenceService": ("llmisvc",), "InferencePool": ("infpool", "xinfpool"),
    },
    "Kubeflow Pipelines (kubeflow/pipelines, 2026-08)": {
        "ScheduledWorkflow": ("swf",), "Viewer": ("vi",),
        "CompositeController": ("cc", "cctl"), "DecoratorController": ("dec", "decorators"),
    },
    # Kubeflow Trainer / Training Operator (TrainJob, PyTorchJob, ...) and Katib (Experiment,
    # Suggestion, Trial) declare no short names (kubeflow/trainer, training-operator, katib).
    "Kueue (kubernetes-sigs/kueue, 2026-08)": {
        "ClusterQueue": ("cq",), "LocalQueue": ("lq", "queue", "queues"),
        "Workload": ("kueueworkload", "kueueworkloads", "kwl"),
        "ResourceFlavor": ("flavor", "flavors", "rf"), "AdmissionCheck": ("ac",), "Cohort": ("co",),
        "MultiKueueCluster": ("mkc",), "MultiKueueConfig": ("mkconf",),
        "ProvisioningRequestConfig": ("prc",), "Topology": ("topo",),
        "WorkloadPriorityClass": ("wpc",),
    },
    "cert-manager (cert-manager/cert-manager, 2026-08)": {
        "Certificate": ("cert", "certs"), "CertificateRequest": ("cr", "crs"),
        "Issuer": ("iss",), "ClusterIssuer": ("ciss",),
    },
    "Istio (istio/istio, 2026-08)": {
        "VirtualService": ("vs",), "DestinationRule": ("dr",), "Gateway": ("gw",),
        "ServiceEntry": ("se",), "WorkloadEntry": ("we",), "WorkloadGroup": ("wg",),
        "AuthorizationPolicy": ("ap",), "PeerAuthentication": ("pa",),
        "RequestAuthentication": ("ra",), "Telemetry": ("telemetry",),
    },
    "Knative (knative/serving, eventing, networking, 2026-06..08)": {
        "Service": ("kservice", "ksvc"), "Configuration": ("cfg", "config"),
        "Revision": ("rev",), "Route": ("rt",), "DomainMapping": ("dm",),
        "PodAutoscaler": ("kpa", "pa"), "Channel": ("ch",), "InMemoryChannel": ("imc",),
        "Subscription": ("sub",), "RequestReply": ("rr",), "Certificate": ("kcert",),
        "Ingress": ("king", "kingress"), "ServerlessService": ("sks",),
        "ClusterDomainClaim": ("cdc",),
    },
    "Prometheus Operator (prometheus-operator/prometheus-operator, 2026-08)": {
        "Prometheus": ("prom",), "PrometheusAgent": ("promagent",), "Alertmanager": ("am",),
        "AlertmanagerConfig": ("amcfg",), "ServiceMonitor": ("smon",), "PodMonitor": ("pmon",),
        "Probe": ("prb",), "PrometheusRule": ("promrule",), "ScrapeConfig": ("scfg",),
        "ThanosRuler": ("ruler",),
    },
}  # fmt: skip

TAKEN = {
    name: f"{project}: {kind}"
    for project, kinds in KNOWN.items()
    for kind, names in kinds.items()
    for name in (*names, kind.lower(), f"{kind.lower()}s")
}


def test_the_names_qpa_gave_up_are_taken_elsewhere() -> None:
    assert TAKEN["hr"].startswith("Flux") and TAKEN["tr"].startswith("Tekton")
    assert TAKEN["tb"].startswith("Tekton")  # TriggerBinding


@pytest.mark.parametrize("resource", RESOURCES, ids=lambda r: r.info.kind)
def test_no_qpa_name_collides(resource: type) -> None:
    info = resource.info  # type: ignore[attr-defined]
    for name in (*info.short_names, info.plural, info.singular):
        assert name not in TAKEN, f"{info.kind}: {name!r} is {TAKEN[name]}'s"
    assert all(name.startswith("q") for name in info.short_names)


def test_short_names_are_unique_within_qpa() -> None:
    names = [name for resource in RESOURCES for name in resource.info.short_names]
    assert len(names) == len(set(names)) == len(RESOURCES)

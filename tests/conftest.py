"""Shared pytest configuration: make sure the stdlib `operator` is never shadowed by ./operator."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The repo root holds the folder `operator/` (packaged as qpa_operator); with the root on
# sys.path it would shadow the standard library module of the same name.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT]

# Reusable fixtures: a deterministic OpenAI-compatible server on 127.0.0.1 (tests/fakes).
pytest_plugins = [
    "fakes.openai_server",
    "fakes.seaweed",
    "fakes.kube_api",
    "fakes.kubectl",
    "fakes.adbd",
    "fakes.kubelet",  # kubelet: runs the Pods of Jobs, Deployments, DaemonSets
    "fakes.kserve",  # kserve: InferenceServices as revisions, Services and status
    "helpers.operator_runner",  # operator_env: the real operator's test settings
]

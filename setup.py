"""Packaging shim: the folder `operator/` ships as the import package `qpa_operator`.

pyproject.toml holds all metadata; setuptools cannot express a renamed package tree there.
"""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["qpa", "qpa.*"]),
        "qpa_operator",
        *(f"qpa_operator.{name}" for name in find_packages("operator")),
    ],
    package_dir={"qpa_operator": "operator"},
    package_data={
        "qpa": [
            "py.typed",
            "envs/llmsim/apps/*.yaml",
            "envs/agentdojo/effects.yaml",
            "envs/agentdojo/roles.yaml",
            "envs/agentdojo/collections.yaml",
            "envs/bfcl/roles.yaml",
            "envs/bfcl/effects.yaml",
            "api/v1alpha1/schemas/*.json",
        ]
    },
)

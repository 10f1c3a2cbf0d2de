"""Count the malformed custom resources of tests/unit/api/test_malformed_resources.py that
`qpa.api` refuses, that the test API server refuses, and that both refuse naming the field.

    python tools/malformed_resources.py            # this checkout
    python tools/malformed_resources.py /tmp/old   # another tree (a `git archive` of an older
                                                   # commit with today's test file copied in)

The tree given is imported (its qpa, crds/, examples/ and test fakes), so the same cases measure
any version of the models and CRDs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main(root: Path) -> int:
    os.chdir(root)
    sys.path[:0] = [
        str(root),
        str(root / "tests"),
        str(root / "tests/unit/api"),
        str(root / "tools"),
    ]
    import test_malformed_resources as cases
    from fakes.kube_api import KubeAPIServer

    refused = {"qpa.api": 0, "API server": 0, "both, naming the field": 0}
    missed: list[str] = []
    with KubeAPIServer(crds=root / "crds") as server:
        for kind, index, changes, field in cases.MALFORMED:
            body = cases.patched(kind, index, changes)
            by_model = cases.pydantic_fields(kind, body)
            by_server = cases.server_causes(server, kind, body)
            refused["qpa.api"] += by_model is not None
            refused["API server"] += by_server is not None
            named = (
                by_model is not None
                and any(cases.names(path, field) for path in by_model)
                and by_server is not None
                and cases.server_names(by_server, field)
            )
            refused["both, naming the field"] += named
            if not named:
                missed.append(f"{kind} {field}: {', '.join(changes)}")
    print(f"{root}: {len(cases.MALFORMED)} malformed cases")
    for who, count in refused.items():
        print(f"  refused by {who}: {count}")
    for line in missed:
        print(f"  not refused by both: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parents[1]).resolve()))

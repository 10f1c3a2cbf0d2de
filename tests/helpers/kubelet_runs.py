"""What the end-to-end tests that run pods on the test kubelet share: DeepSpeed's CPU comm op
built once where the pods load it, and the pods' report attached to a failure."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from fakes.kubelet import TORCH_EXTENSIONS, VENV_BIN, TestKubelet


def build_native_ops() -> None:
    """DeepSpeed's CPU comm op (which a rank's `init_distributed` loads) built in the test
    kubelet's extensions folder, as an image ships it (minutes of two cores on a fresh machine,
    once; pods rebuild a stale one themselves)."""
    if (Path(TORCH_EXTENSIONS) / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").is_file():
        return
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}",  # the venv's ninja, as in the pods
        "TORCH_EXTENSIONS_DIR": TORCH_EXTENSIONS,
    }
    build = "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder as B; B().load()"
    done = subprocess.run(
        [sys.executable, "-c", build], env=env, capture_output=True, text=True, timeout=480
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@contextlib.contextmanager
def reported(kubelet: TestKubelet) -> Iterator[None]:
    """On a failure, what every pod did (states and log tails) goes with it."""
    try:
        yield
    except BaseException:
        print(kubelet.report(tail=40))
        raise

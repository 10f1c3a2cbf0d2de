"""Helpers shared by CLI commands: consoles, JSON output, clean errors."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console

from qpa.api.v1alpha1 import PodSummary

# Messages never wrap: a terminal folds long lines itself, and a log, a pipe or CI keeps each
# message (and every path in it) on one line that grep finds. Rich still fits tables and
# progress bars to the width.
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


STATUS_FILE_ENV = "QPA_STATUS_FILE"
STATUS_FILE_LIMIT = 4096  # bytes: what Kubernetes keeps of a container's termination message


def write_summary(summary: PodSummary) -> None:
    """Write a pod's typed summary where `$QPA_STATUS_FILE` points (its termination message,
    which the operator parses with the same model); nothing when the variable is unset."""
    path = os.environ.get(STATUS_FILE_ENV)
    if path:
        with open(path, "w", encoding="utf-8") as stream:
            stream.write(summary.to_message(STATUS_FILE_LIMIT))


def write_refusal(message: str) -> None:
    """Leave `error: <message>` as the pod's termination message (where `$QPA_STATUS_FILE`
    points), so the operator can put why a pod refused its work into the resource's status.
    A typed summary already written there wins (it is only written on success)."""
    path = os.environ.get(STATUS_FILE_ENV)
    if not path:
        return
    try:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            return
        data = f"error: {message}".encode()[:STATUS_FILE_LIMIT]
        with open(path, "w", encoding="utf-8") as stream:
            stream.write(data.decode("utf-8", errors="ignore"))
    except OSError:
        pass  # the message still goes to stderr, the pod's log


def die(message: str, code: int = 2) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {message}")
    write_refusal(message)
    raise typer.Exit(code)

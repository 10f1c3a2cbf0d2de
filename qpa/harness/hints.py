"""Execution feedback for the model: the error kind plus a hint on how to recover."""

from __future__ import annotations

from qpa.contract import ErrorKind, Feedback

HINTS: dict[ErrorKind, str] = {
    "unknown_tool": "Call only the tools listed for this scenario; check the exact name.",
    "invalid_arguments": "Fix the named argument to match the tool's schema, then call again.",
    "precondition_failed": "Read the message: look up the missing record or choose another "
    "option before retrying; do not repeat the same call unchanged.",
    "permission_denied": "Do not retry. Ask the user for confirmation or skip this action.",
    "transient": "A temporary failure: retry the same call once.",
    "environment_failure": "The app failed; retry once, then report the problem to the user.",
    "malformed_action": "Answer with exactly one tool call in the required format.",
}


def hint_for(feedback: Feedback) -> str | None:
    if feedback.status == "ok" or feedback.error is None:
        return None
    return HINTS.get(feedback.error)

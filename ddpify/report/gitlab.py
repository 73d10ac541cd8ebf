"""--output-format gitlab: a GitLab code quality report (the part of the Code Climate format that
GitLab reads: description, check_name, fingerprint, severity, location.path, location.lines.begin).

The fingerprint identifies a finding across commits: the file, the code, the message and how many
identical ones came before it in the file, not the line (a line moved by an edit above it is the
same finding).
"""

from __future__ import annotations

import hashlib
import json

from ddpify.report.common import TOOL_NAME, FileResult, level

SEVERITY = {"error": "critical", "warning": "minor", "note": "info"}


def _fingerprint(*parts: object) -> str:
    return hashlib.sha256("\0".join(map(str, parts)).encode()).hexdigest()[:32]


def document(results: list[FileResult], tool: str) -> list[dict]:
    out = []
    for r in results:
        seen: dict[tuple[str, str], int] = {}
        path = r.path.replace("\\", "/")
        for f in r.findings:
            k = seen[(f.code, f.message)] = seen.get((f.code, f.message), -1) + 1
            out.append(
                {
                    "type": "issue",
                    "description": f"{f.code} {f.message}",
                    "check_name": f.code,
                    "fingerprint": _fingerprint(tool, path, f.code, f.message, k),
                    "severity": SEVERITY[level(f)],
                    "location": {"path": path, "lines": {"begin": max(1, f.line)}},
                }
            )
        for e in r.errors:
            out.append(
                {
                    "type": "issue",
                    "description": f"{TOOL_NAME}: {e.message}",
                    "check_name": f"{TOOL_NAME}-error",
                    "fingerprint": _fingerprint(tool, path, "error", e.message),
                    "severity": "blocker",
                    "location": {"path": path, "lines": {"begin": max(1, e.line)}},
                }
            )
    return out


def render(results: list[FileResult], tool: str) -> str:
    return json.dumps(document(results, tool), indent=2) + "\n"

"""--output-format sarif: one SARIF 2.1.0 log (what GitHub code scanning's upload-sarif reads).

Rules come from the registry (ddpify/rules.py): id, name, descriptions, the `--explain` text as
help, and the default level. Results point at the file relative to the working directory
(uriBaseId %SRCROOT%, whose absolute URI the run records) with 1-based line and column regions;
columns count Unicode code points, as ddpify's do (run.columnKind). Files that could not be read
or converted are tool execution notifications.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import quote

from ddpify import __version__, rules
from ddpify.report.common import TOOL_NAME, FileResult, level, rule_level

SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
SRCROOT = "%SRCROOT%"


def uri(path: str) -> str:
    """A path as a URI reference: relative to the working directory where it lies beneath it."""
    rel = os.path.relpath(path) if os.path.isabs(path) else os.path.normpath(path)
    if rel.startswith(".."):
        return Path(os.path.abspath(path)).as_uri()
    return quote(rel.replace(os.sep, "/"), safe="/")


def rule_descriptor(code: str) -> dict:
    rule = rules.get(code)
    if rule is None:  # a code raised without a declaration: still a valid rule
        return {"id": code, "shortDescription": {"text": code}}
    return {
        "id": rule.code,
        "name": rule.title,
        "shortDescription": {"text": rule.message},
        "fullDescription": {
            "text": f"{rule.message} (severity: {rule.severity}{', ddpify fixes it' if rule.fix else ''})"
        },
        "help": {"text": rules.explain(rule.code)},
        "defaultConfiguration": {"level": rule_level(rule)},
        "properties": {
            "tool": rule.tool,
            **({"verifyCheck": rule.check} if rule.check else {}),
        },
    }


def _region(line: int, col: int) -> dict:
    region = {"startLine": max(1, line)}
    if col > 0:
        region["startColumn"] = col
    return region


def _location(path: str, line: int = 0, col: int = 0) -> dict:
    physical: dict = {"artifactLocation": {"uri": uri(path)}}
    if not physical["artifactLocation"]["uri"].startswith("file:"):
        physical["artifactLocation"]["uriBaseId"] = SRCROOT
    if line > 0:
        physical["region"] = _region(line, col)
    return {"physicalLocation": physical}


def document(results: list[FileResult], tool: str) -> dict:
    codes = sorted({f.code for r in results for f in r.findings})
    index = {code: i for i, code in enumerate(codes)}
    out = []
    notifications = []
    for r in results:
        for f in r.findings:
            out.append(
                {
                    "ruleId": f.code,
                    "ruleIndex": index[f.code],
                    "level": level(f),
                    "message": {"text": f.message},
                    "locations": [_location(r.path, f.line, f.col)],
                    "properties": {"severity": f.severity, "fixed": f.fixed},
                }
            )
        for e in r.errors:
            notifications.append(
                {
                    "level": "error",
                    "message": {"text": e.message},
                    "locations": [_location(r.path, e.line, e.col)],
                }
            )
    name = TOOL_NAME if tool == "convert" else f"{TOOL_NAME} lint"
    run = {
        "tool": {
            "driver": {
                "name": name,
                "version": __version__,
                "semanticVersion": __version__,
                "rules": [rule_descriptor(c) for c in codes],
            }
        },
        "invocations": [
            {
                "executionSuccessful": not notifications,
                "toolExecutionNotifications": notifications,
            }
        ],
        "originalUriBaseIds": {
            SRCROOT: {"uri": Path(os.getcwd()).as_uri().rstrip("/") + "/"}
        },
        "columnKind": "unicodeCodePoints",
        "results": out,
    }
    return {"$schema": SCHEMA_URI, "version": "2.1.0", "runs": [run]}


def render(results: list[FileResult], tool: str) -> str:
    return json.dumps(document(results, tool), indent=2) + "\n"

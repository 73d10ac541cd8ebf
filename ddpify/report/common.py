"""What every review format reads: one file's findings and errors (FileResult), and the level
of a finding (error, warning, note)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ddpify.findings import Finding

TOOL_NAME = "ddpify"


@dataclass(frozen=True)
class FileError:
    """A file that could not be read, parsed or converted (no code: not a finding)."""

    message: str
    line: int = 0
    col: int = 0


@dataclass
class FileResult:
    path: str  # as the text output shows it: relative to the working directory where possible
    findings: list[Finding] = field(default_factory=list)
    errors: list[FileError] = field(default_factory=list)
    # The file's text before and after the conversion, when the conversion changes it (rdjson).
    original: str | None = None
    converted: str | None = None


def level(f: Finding) -> str:
    """error | warning | note (SARIF's words; GitHub says notice, reviewdog INFO).

    A blocking finding (lint: an error) is an error; a change the conversion makes is a warning
    (`ddpify --check` fails until the script has it); any other note stays a note."""
    if f.blocking:
        return "error"
    if f.fixed:
        return "warning"
    return "note"


def rule_level(rule) -> str:
    """The level of a rule's findings by default (SARIF's defaultConfiguration)."""
    if rule.blocking:
        return "error"
    return "warning" if rule.fix else "note"


_WHERE = re.compile(r"^:(?P<line>\d+)(?::(?P<col>\d+))?")


def parse_error(path: str, text: str) -> FileError:
    """A formatted error line ("path:line:col: error: message") as a FileError."""
    rest = text[len(path) :] if text.startswith(path) else text
    line = col = 0
    mo = _WHERE.match(rest)
    if mo:
        line, col = int(mo["line"]), int(mo["col"] or 0)
        rest = rest[mo.end() :]
    for head in (": error: ", ": "):
        if rest.startswith(head):
            rest = rest[len(head) :]
            break
    return FileError(rest.strip() or text, line, col)

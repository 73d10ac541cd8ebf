"""--output-format rdjson: reviewdog's Diagnostic format (a DiagnosticResult, `reviewdog -f=rdjson`).

Every change the conversion makes is a diagnostic whose suggestion replaces its range with the
converted text, so `reviewdog -reporter=github-pr-review` posts the conversion as suggested
changes; the findings the change carries out are its message. Other findings are diagnostics of
their own.

Positions follow reviewdog.proto: lines from 1, columns from 1 counted in UTF-8 bytes, the end
exclusive; a line ends after its "\\n". Each change is one hunk of a line diff of the original and
the converted text, whose range reviewdog's GitHub reporter turns into a suggested change of whole
lines: a replacement runs from the start of its first line to the end of its last (the newline
stays); an insertion or a deletion takes in one unchanged line beside it, the one after it (from
the start of its first line to the start of that line) or, at the end of the file, the one before
it (from the end of that line). No two changes share a line.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass

from ddpify.report.common import TOOL_NAME, FileResult, level

SEVERITY = {"error": "ERROR", "warning": "WARNING", "note": "INFO"}


@dataclass(frozen=True)
class Hunk:
    start: tuple[
        int, int
    ]  # (line, column) of the original, 1-based, column in UTF-8 bytes
    end: tuple[int, int]  # exclusive
    text: str  # what replaces [start, end)
    first: int  # the original lines the hunk replaces: first..last (last < first: an insertion)
    last: int


def _lines(text: str) -> list[str]:
    """Lines with their "\\n" (a "\\r" before it stays in the line)."""
    parts = re.split(r"(?<=\n)", text)
    return parts[:-1] if parts and parts[-1] == "" else parts


def _eol(line: str) -> str:
    return "\r\n" if line.endswith("\r\n") else "\n" if line.endswith("\n") else ""


def _nbytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def hunks(original: str, converted: str) -> list[Hunk]:
    """The changes from original to converted, one per hunk of a line diff."""
    a, b = _lines(original), _lines(converted)
    starts = [0]
    for line in a:
        starts.append(starts[-1] + len(line))

    def eol(i: int) -> str:  # the newline of line i (1-based)
        return _eol(a[i - 1])

    ops = [
        op
        for op in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
        if op[0] != "equal"
    ]
    spans: list[list] = []  # [start offset, end offset, text, first line, last line]
    claimed: set[int] = (
        set()
    )  # unchanged lines an insertion's or deletion's comment covers
    for _, i1, i2, j1, j2 in reversed(ops):
        new = "".join(b[j1:j2])
        if i2 > i1 and new and new.endswith(eol(i2)):
            # a replacement: from the start of its first line to the end of its last, newline left
            lo, hi, text = (
                starts[i1],
                starts[i2] - len(eol(i2)),
                new[: len(new) - len(eol(i2))],
            )
        elif i2 < len(a) and i2 + 1 not in claimed:
            # from the start of its first line to the start of the unchanged line after it
            lo, hi, text = starts[i1], starts[i2], new
            claimed.add(i2 + 1)
        elif (
            i1 > 0 and i1 not in claimed and (eol(i1) + new).endswith(eol(max(i1, i2)))
        ):
            # from the end of the unchanged line before it to the end of its last line
            last = eol(max(i1, i2))
            lo, hi = starts[i1] - len(eol(i1)), starts[max(i1, i2)] - len(last)
            text = (eol(i1) + new)[: len(eol(i1) + new) - len(last)]
            claimed.add(i1)
        else:
            lo, hi, text = starts[i1], starts[i2], new
        spans.append([lo, hi, text, i1 + 1, i2])
    spans.reverse()
    # Changes whose comments would still share a line become one (GitHub applies one per line).
    merged: list[list] = []
    for h in spans:
        if merged and _line_of(original, h[0]) <= _line_of(original, merged[-1][1]):
            m = merged[-1]
            m[2] += original[m[1] : h[0]] + h[2]
            m[1], m[4] = h[1], h[4]
        else:
            merged.append(h)
    return [
        Hunk(_at(original, lo), _at(original, hi), text, first, last)
        for lo, hi, text, first, last in merged
    ]


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _at(text: str, offset: int) -> tuple[int, int]:
    """(line, column in UTF-8 bytes) of a character offset."""
    start = text.rfind("\n", 0, offset) + 1
    return _line_of(text, offset), _nbytes(text[start:offset]) + 1


def _position(line: int, col: int) -> dict:
    return {"line": line, "column": col}


def _range(start: tuple[int, int], end: tuple[int, int]) -> dict:
    return {"start": _position(*start), "end": _position(*end)}


def byte_column(text: str | None, line: int, col: int) -> int:
    """ddpify's column (code points, 1-based) as reviewdog's (UTF-8 bytes, 1-based)."""
    if text is None or col <= 1:
        return col
    lines = text.split("\n")
    if not 0 < line <= len(lines):
        return col
    return _nbytes(lines[line - 1][: col - 1]) + 1


def diagnostics(result: FileResult) -> list[dict]:
    source = {"name": TOOL_NAME}
    out = []
    pending = list(result.findings)
    if (
        result.original is not None
        and result.converted is not None
        and result.original != result.converted
    ):
        for h in hunks(result.original, result.converted):
            # the findings a hunk carries out: on its lines, or for an insertion on the lines around it
            span = (
                range(h.first, h.last + 1)
                if h.last >= h.first
                else range(h.first - 1, h.first + 1)
            )
            carried = [f for f in pending if f.fixed and f.line in span]
            pending = [f for f in pending if f not in carried]
            if carried:
                message = "\n".join(f"{f.code}: {f.message}" for f in carried)
            else:
                message = f"ddpify converts these lines for DistributedDataParallel (`ddpify {result.path}` makes the change)"
            where = _range(h.start, h.end)
            diag = {
                "message": message,
                "location": {"path": result.path, "range": where},
                "severity": SEVERITY["warning"],
                "source": source,
                "suggestions": [{"range": where, "text": h.text}],
            }
            if carried:
                diag["code"] = {"value": carried[0].code}
            out.append(diag)
    text = result.original
    if text is None and pending:
        text = _read(result.path)
    for f in pending:
        out.append(
            {
                "message": f.message,
                "location": {
                    "path": result.path,
                    "range": {
                        "start": _position(f.line, byte_column(text, f.line, f.col))
                    },
                },
                "severity": SEVERITY[level(f)],
                "source": source,
                "code": {"value": f.code},
            }
        )
    for e in result.errors:
        loc: dict = {"path": result.path}
        if e.line:
            loc["range"] = {
                "start": {"line": e.line, **({"column": e.col} if e.col else {})}
            }
        out.append(
            {
                "message": e.message,
                "location": loc,
                "severity": "ERROR",
                "source": source,
            }
        )
    return out


def _read(path: str) -> str | None:
    from ddpify import fileio

    try:
        return fileio.decode_source(fileio.read_bytes(path)).text
    except Exception:  # a column then stays in code points: off only on non-ASCII lines
        return None


def document(results: list[FileResult], tool: str) -> dict:
    return {
        "source": {"name": TOOL_NAME if tool == "convert" else f"{TOOL_NAME} lint"},
        "diagnostics": [d for r in results for d in diagnostics(r)],
    }


def render(results: list[FileResult], tool: str) -> str:
    return json.dumps(document(results, tool), indent=2, ensure_ascii=False) + "\n"

"""--output-format github: one GitHub Actions workflow command per finding, which the runner turns
into an annotation on the file and line (`::error file=train.py,line=12,col=5,title=DDP020::...`).

Escaping as the Actions toolkit does it: in the message, % CR LF become %25 %0D %0A; in a
property value, also : and , (%3A %2C), which would otherwise end the value.
"""

from __future__ import annotations

from ddpify.report.common import TOOL_NAME, FileResult, level

# SARIF's level -> the command's name
COMMANDS = {"error": "error", "warning": "warning", "note": "notice"}


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def command(name: str, message: str, **props: object) -> str:
    """`::name k=v,k=v::message`; properties whose value is None or 0 are left out."""
    shown = ",".join(
        f"{k}={escape_property(str(v))}"
        for k, v in props.items()
        if v not in (None, 0, "")
    )
    return f"::{name}{' ' + shown if shown else ''}::{escape_data(message)}"


def render(results: list[FileResult], tool: str) -> str:
    lines = []
    for r in results:
        for e in r.errors:
            lines.append(
                command(
                    "error",
                    e.message,
                    file=r.path,
                    line=e.line,
                    col=e.col,
                    title=f"{TOOL_NAME} error",
                )
            )
        for f in r.findings:
            lines.append(
                command(
                    COMMANDS[level(f)],
                    f.message,
                    file=r.path,
                    line=f.line,
                    col=f.col,
                    title=f.code,
                )
            )
    return "".join(line + "\n" for line in lines)

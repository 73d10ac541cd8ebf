"""What the command prints: diffs (coloured on a terminal), findings, the commands that run a
converted script, the summary line, and the --output-format json document."""

from __future__ import annotations

import difflib
import os
import re
import sys
from dataclasses import dataclass, field

import click

from ddpify import __version__


@dataclass(frozen=True)
class Settings:
    check: bool
    diff: bool

    @property
    def write(self) -> bool:
        return not (self.check or self.diff)


@dataclass
class Report:
    path: str
    outcome: str = "unchanged"  # changed | unchanged | refused | error
    status: str = ""  # the converter's status, or empty / generated
    # (kind, text): kind is error | blocking | note | fixed | finding; --quiet shows error and blocking
    messages: list[tuple[str, str]] = field(default_factory=list)
    diff: str = ""
    stdout: bytes | None = None
    stdin: bool = False
    findings: list = field(
        default_factory=list
    )  # Finding objects, for --output-format json
    blocked: bool = (
        False  # a blocking finding remains (refused, or written anyway with --partial)
    )
    member: bool = (
        False  # a module of a project (project mode): run through its entry script
    )
    # The file's text before and after, when the conversion changes it (review formats: rdjson).
    original: str | None = None
    converted: str | None = None

    def fail(self, text: str) -> None:
        self.outcome = "error"
        self.messages.append(("error", text))


def unified_diff(before: str, after: str, path: str) -> str:
    # Split after "\n" only: splitlines() would also split on form feeds and other separators.
    a = re.split(r"(?<=\n)", before)
    b = re.split(r"(?<=\n)", after)
    a = a[:-1] if a and a[-1] == "" else a
    b = b[:-1] if b and b[-1] == "" else b
    out = []
    for line in difflib.unified_diff(a, b, fromfile=path, tofile=path):
        if not line.endswith("\n"):
            line += "\n\\ No newline at end of file\n"
        out.append(line)
    return "".join(out)


def color_diff(diff: str) -> str:
    out = []
    for line in diff.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        end = line[len(body) :]
        if line.startswith(("+++", "---")):
            body = f"\033[1m{body}\033[0m"
        elif line.startswith("@@"):
            body = f"\033[36m{body}\033[0m"
        elif line.startswith("+"):
            body = f"\033[32m{body}\033[0m"
        elif line.startswith("-"):
            body = f"\033[31m{body}\033[0m"
        out.append(body + end)
    return "".join(out)


def _plural(n: int, word: str = "file") -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def summary(reports: list[Report], settings: Settings) -> str:
    changed = sum(r.outcome == "changed" for r in reports)
    unchanged = sum(r.outcome == "unchanged" for r in reports)
    refused = sum(r.outcome == "refused" for r in reports)
    partial = sum(r.outcome == "changed" and r.blocked for r in reports)
    failed = sum(r.outcome == "error" for r in reports)
    parts = []
    if settings.write:
        if changed:
            parts.append(
                f"{_plural(changed)} converted"
                + (f" ({partial} partially, with --partial)" if partial else "")
            )
        if unchanged:
            parts.append(f"{_plural(unchanged)} left unchanged")
        if refused:
            parts.append(f"{_plural(refused)} refused (blocking findings)")
        if failed:
            parts.append(f"{_plural(failed)} failed to convert")
    else:
        if changed:
            parts.append(
                f"{_plural(changed)} would be converted"
                + (f" ({partial} partially, with --partial)" if partial else "")
            )
        if unchanged:
            parts.append(f"{_plural(unchanged)} would be left unchanged")
        if refused:
            parts.append(f"{_plural(refused)} would be refused (blocking findings)")
        if failed:
            parts.append(f"{_plural(failed)} would fail to convert")
    return ", ".join(parts) + "."


def run_commands(path: str) -> list[str]:
    """The lines that run a converted script on this machine: one process per GPU, or on CPUs."""
    from ddpify.launcher import single_node_command

    # torchrun's "gpu" fails where there is no GPU: the CPU line (gloo) says how many instead.
    return [
        f"{single_node_command(path, [])}  (one process per GPU)",
        f"{single_node_command(path, [], nproc='2')}  (no GPU: 2 processes, gloo)",
    ]


def use_color(flag: bool | None, stream) -> bool:
    """--color/--no-color, else NO_COLOR (no-color.org), else FORCE_COLOR (force-color.org),
    else whether the stream is a terminal. An empty variable counts as unset."""
    if flag is not None:
        return flag
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


# path:line:col: CODE [mark] message -- a finding as Finding.format writes it
_FINDING = re.compile(
    r"^(?P<where>.+?:\d+:\d+:) (?P<code>DDP\d{3})(?P<mark> \[\*\]| \[blocking\])? "
)
_ERROR = re.compile(r"^(?P<where>.+?): (?P<word>error|refused|note|warning):")


def color_message(kind: str, text: str) -> str:
    """A finding or message coloured as ruff colours its output: the place bold, the code red
    where it blocks, green where ddpify fixed it, yellow for a note."""
    mo = _FINDING.match(text)
    if mo:
        mark = mo.group("mark") or ""
        tint = "31" if mark == " [blocking]" else "32" if mark == " [*]" else "33"
        head = (
            f"\033[1m{mo.group('where')}\033[0m \033[1;{tint}m{mo.group('code')}\033[0m"
        )
        head += f"\033[{tint}m{mark}\033[0m " if mark else " "
        return head + text[mo.end() :]
    mo = _ERROR.match(text)
    if mo:
        tint = "33" if mo.group("word") in ("note", "warning") else "31"
        return (
            f"\033[1m{mo.group('where')}\033[0m: \033[1;{tint}m{mo.group('word')}\033[0m"
            + text[mo.end() - 1 :]
        )
    return text


def print_report(
    report: Report,
    settings: Settings,
    quiet: bool,
    color: bool,
    color_err: bool = False,
) -> None:
    """color: the diff on stdout; color_err: findings and messages on stderr."""
    if report.diff:
        sys.stdout.write(color_diff(report.diff) if color else report.diff)
        sys.stdout.flush()
    if report.stdout is not None:
        sys.stdout.buffer.write(report.stdout)
        sys.stdout.buffer.flush()
    for kind, text in report.messages:
        if quiet and kind not in ("error", "blocking"):
            continue
        click.echo(
            color_message(kind, text) if color_err else text, err=True, color=color_err
        )
    if report.outcome == "changed" and not quiet:
        click.echo(
            f"{'converted' if settings.write else 'would convert'} {report.path}",
            err=True,
        )
        if settings.write and not report.stdin and not report.member:
            first, *rest = run_commands(report.path)
            click.echo(f"  run it with: {first}", err=True)
            for line in rest:
                click.echo(f"           or: {line}", err=True)


def review_results(reports: list[Report]) -> list:
    """The reports as the review formats (ddpify/report/) read them."""
    from ddpify.report import FileResult, parse_error

    return [
        FileResult(
            r.path,
            list(r.findings),
            [parse_error(r.path, t) for k, t in r.messages if k == "error"],
            r.original,
            r.converted,
        )
        for r in reports
    ]


def json_document(reports: list[Report], settings: Settings) -> dict:
    """--output-format json: every file's outcome, findings and errors, for editors and CI."""
    files = []
    for r in reports:
        files.append(
            {
                "path": r.path,
                "outcome": r.outcome,  # changed | unchanged | refused | error
                "status": r.status,
                "blocking": r.blocked,
                "findings": [f.to_dict() for f in r.findings],
                "errors": [text for kind, text in r.messages if kind == "error"],
                **({"diff": r.diff} if r.diff else {}),
            }
        )
    return {
        "version": __version__,
        "mode": "write" if settings.write else "check" if settings.check else "diff",
        "files": files,
        "summary": summary(reports, settings),
    }

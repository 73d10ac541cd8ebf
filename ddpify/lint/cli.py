"""`ddpify lint PATHS`: report DDP bugs in scripts that are already distributed; changes nothing.

Files, directories (recursed into for *.py, skipping what the converter skips) and `-` (stdin,
named by --stdin-filename). Text output `path:line:col: CODE [error|note] message`, or one JSON
document (--output-format json). Exit status: 0 no error-level finding, 1 an error-level finding
remains, 2 a file could not be read or parsed (the other files are still linted). An entry script
that imports local modules is linted with them as one program (project mode), so a training loop
in a trainer module is seen with the wrap and the launch of the entry.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field

import click

from ddpify import __version__, fileio
from ddpify.fileio import FileError
from ddpify.findings import Finding
from ddpify.options import Options
from ddpify.report import FORMATS, REVIEW_FORMATS, FileResult, parse_error, render

SEVERITY = {"blocking": "error", "note": "note"}


def severity(f: Finding) -> str:
    """How lint names a finding's severity: an error-level rule is "error", a note "note"."""
    return SEVERITY.get(f.severity, f.severity)


def format_finding(f: Finding, path: str) -> str:
    return f"{path}:{f.line}:{f.col}: {f.code} [{severity(f)}] {f.message}"


@dataclass
class FileReport:
    path: str
    status: str = ""  # checked | not-distributed | empty | error
    findings: list[Finding] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "status": self.status,
            "findings": [
                {**f.to_dict(), "severity": severity(f)} for f in self.findings
            ],
            "errors": self.errors,
        }


def _read(job, stdin_data: bytes | None) -> str:
    data = stdin_data if job.stdin else fileio.read_bytes(job.path)
    return fileio.decode_source(data).text


def _check_syntax(text: str, path: str) -> None:
    from ddpify.process import check_syntax

    check_syntax(
        text, path
    )  # the converter's message for a syntax error: path:line:col


def lint_file(job, stdin_data: bytes | None = None) -> FileReport:
    """Lint one file (or stdin); never raises for a bad file: errors go in the report."""
    from ddpify.lint.engine import lint_source
    from ddpify.result import ConversionError

    report = FileReport(job.path)
    if job.error is not None:
        report.status, report.errors = "error", [job.error]
        return report
    try:
        text = _read(job, stdin_data)
        _check_syntax(text, job.path)
        result = lint_source(text, job.options or Options(), path=job.path)
        report.status, report.findings = result.status, result.findings
    except FileError as exc:
        report.status, report.errors = "error", [exc.format(job.path)]
    except ConversionError as exc:
        report.status = "error"
        where = f"{job.path}:{exc.line}:{exc.col}" if exc.line else job.path
        report.errors = [f"{where}: error: {exc.message}"]
    except (RecursionError, MemoryError):
        report.status, report.errors = (
            "error",
            [f"{job.path}: error: the code is too deeply nested to lint"],
        )
    except Exception as exc:  # a lint bug must not stop the other files
        report.status = "error"
        report.errors = [
            f"{job.path}: error: internal error ({type(exc).__name__}: {exc}); please report this bug"
        ]
    return report


def lint_projects(entries: list) -> list[FileReport]:
    """Each entry script with the local modules it imports, as one program; a module shared by
    several entries is reported once."""
    from ddpify.lint.engine import lint_project
    from ddpify.result import ConversionError

    reports: list[FileReport] = []
    seen: set[str] = set()
    for job in entries:

        def read(p: str) -> str:
            text = fileio.decode_source(fileio.read_bytes(p)).text
            _check_syntax(
                text,
                p if os.path.realpath(p) != os.path.realpath(job.path) else job.path,
            )
            return text

        try:
            results = lint_project(job.path, job.options or Options(), read=read)
        except FileError as exc:
            reports.append(FileReport(job.path, "error", errors=[exc.format(job.path)]))
            continue
        except (ConversionError, SyntaxError, OSError, UnicodeDecodeError) as exc:
            reports.append(
                FileReport(
                    job.path,
                    "error",
                    errors=[
                        f"{job.path}: error: project mode: {getattr(exc, 'message', None) or exc}"
                    ],
                )
            )
            continue
        for k, r in enumerate(results):
            real = os.path.realpath(r.path)
            if real in seen:
                continue
            seen.add(real)
            shown = job.path if k == 0 else _display(r.path)
            reports.append(FileReport(shown, r.status, r.findings))
    return reports


def _display(path: str) -> str:
    rel = os.path.relpath(path)
    return rel if not rel.startswith("..") else path


def summary(reports: list[FileReport]) -> str:
    errors = sum(1 for r in reports for f in r.findings if f.blocking)
    notes = sum(1 for r in reports for f in r.findings if not f.blocking)
    failed = sum(1 for r in reports if r.status == "error")
    checked = sum(1 for r in reports if r.status == "checked")
    parts = [
        f"{errors} error{'' if errors == 1 else 's'}",
        f"{notes} note{'' if notes == 1 else 's'}",
    ]
    tail = f" in {len(reports)} file{'' if len(reports) == 1 else 's'} ({checked} distributed)"
    if failed:
        tail += f"; {failed} file{'' if failed == 1 else 's'} could not be linted"
    return ", ".join(parts) + tail


@click.command(name="lint", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", nargs=-1, type=click.Path(allow_dash=True))
@click.option(
    "--output-format",
    type=click.Choice(FORMATS),
    default="text",
    show_default=True,
    help="json: one JSON document on stdout with every file's findings (code, severity, line, col); "
    "github: annotations (workflow commands); sarif: SARIF 2.1.0 (code scanning); rdjson: reviewdog "
    "diagnostics; gitlab: a code quality report.",
)
@click.option("--json", "json_flag", is_flag=True, help="Same as --output-format json.")
@click.option(
    "-q", "--quiet", is_flag=True, help="Print only errors (no notes, no summary)."
)
@click.option(
    "--ignore",
    "ignore",
    multiple=True,
    metavar="CODES",
    help="Never report these codes (comma-separated; adds to [tool.ddpify] ignore).",
)
@click.option(
    "--exclude",
    multiple=True,
    metavar="GLOB",
    help="Skip matching paths when recursing (adds to [tool.ddpify] exclude).",
)
@click.option(
    "--force-exclude",
    is_flag=True,
    help="Apply excludes to files named on the command line too.",
)
@click.option(
    "--stdin-filename",
    default=None,
    metavar="PATH",
    help="Name of the file read from stdin (messages, config lookup).",
)
@click.option(
    "--no-project",
    is_flag=True,
    help="Lint each file on its own (no project mode for entry scripts that import local modules).",
)
@click.option(
    "--explain",
    metavar="CODE",
    default=None,
    help="Explain a code (DDP210, or `all` for lint's table) and exit.",
)
@click.version_option(
    __version__, prog_name="ddpify lint", message="%(prog)s %(version)s"
)
def lint_command(
    paths: tuple[str, ...],
    output_format: str,
    json_flag: bool,
    quiet: bool,
    ignore: tuple[str, ...],
    exclude: tuple[str, ...],
    force_exclude: bool,
    stdin_filename: str | None,
    no_project: bool,
    explain: str | None,
) -> None:
    """Find DDP bugs in distributed PyTorch scripts (hangs, ranks that train different models,
    checkpoints that do not load) without running them. Changes nothing.

    PATHS are files or directories (recursed into for *.py); `-` reads stdin. Exit status: 0 no
    error-level finding, 1 an error-level finding remains, 2 a file could not be read or parsed.
    """
    from ddpify.collect import collect
    from ddpify.process_projects import split_projects
    from ddpify.config import find_config

    if explain is not None:
        _explain(explain)
    if json_flag:
        output_format = "json"
    if not paths:
        if (
            output_format in REVIEW_FORMATS
        ):  # an empty report: a CI step with no changed file still has one
            click.echo(render(output_format, [], "lint"), nl=False)
        sys.exit(0)
    as_json = (
        output_format != "text"
    )  # machine output on stdout: no warnings or summary
    find_config.cache_clear()
    codes = tuple(
        c.strip().upper() for raw in ignore for c in raw.split(",") if c.strip()
    )
    jobs, warns = collect(
        paths, exclude, force_exclude, stdin_filename, {"ignore": codes or None}
    )
    for w in warns:
        if not quiet and not as_json:
            click.echo(w, err=True)
    entries: list = []
    if not no_project:
        groups, jobs = split_projects(jobs, explicit=paths)
        entries = [g[0] for g in groups]
    stdin_data = (
        sys.stdin.buffer.read()
        if any(j.stdin and not j.passthrough for j in jobs)
        else None
    )
    reports = [lint_file(j, stdin_data) for j in jobs if not j.passthrough] + (
        lint_projects(entries) if entries else []
    )
    reports.sort(key=lambda r: (r.path != "-" and r.path != stdin_filename, r.path))
    if output_format in REVIEW_FORMATS:
        results = [
            FileResult(
                r.path, list(r.findings), [parse_error(r.path, t) for t in r.errors]
            )
            for r in reports
        ]
        click.echo(render(output_format, results, "lint"), nl=False)
    elif as_json:
        doc = {
            "version": __version__,
            "files": [r.to_dict() for r in reports],
            "summary": summary(reports),
        }
        click.echo(json.dumps(doc, indent=2))
    else:
        for r in reports:
            for text in r.errors:
                click.echo(text, err=True)
            for f in r.findings:
                if quiet and not f.blocking:
                    continue
                click.echo(format_finding(f, r.path))
        if reports and not quiet:
            click.echo(summary(reports), err=True)
    if any(r.status == "error" for r in reports):
        sys.exit(2)
    if any(f.blocking for r in reports for f in r.findings):
        sys.exit(1)
    sys.exit(0)


def _explain(code: str) -> None:
    from ddpify import rules

    if code.lower() == "all":
        click.echo(rules.table("lint"))
        sys.exit(0)
    try:
        click.echo(rules.explain(code.strip()), nl=False)
    except KeyError:
        raise click.BadParameter(
            f"no such code {code!r} (`ddpify lint --explain all` lists lint's)",
            param_hint="--explain",
        ) from None
    sys.exit(0)

"""ddpify's command line: `ddpify PATH...` rewrites files in place, like black and ruff.

Exit codes: 0 success or nothing to do; 1 a file would change (--check); 2 a file could not be read,
parsed or converted, or was refused because a blocking finding remains (the other files are
still processed). `ddpify verify ...` and
`ddpify launch ...` are dispatched to their own commands.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import json
import os
import re
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from itertools import repeat

import click

from ddpify import __version__, fileio
from ddpify.config import Config, ConfigError, config_for, find_config, matches_any
from ddpify.fileio import FileError, SourceFile
from ddpify.options import AMP_CHOICES, OPT_LEVELS, OPTIMIZATIONS, Options, parse_optimize

SUBCOMMANDS = {
    "verify": ("ddpify.verify.cli", "verify_command"),
    "launch": ("ddpify.launcher", "launch_command"),
    "lint": ("ddpify.lint.cli", "lint_command"),
}

# Directories never entered when recursing (hidden ones, starting with ".", are skipped too).
SKIP_DIRS = frozenset(
    {"__pycache__", "__pypackages__", "venv", "env", "site-packages", "node_modules", "build", "dist", "_build", "buck-out"}
)
NOTEBOOK_ERROR = "notebooks are not converted: export it to a script first (jupyter nbconvert --to script)"
PY2_HINTS = ("Missing parentheses in call to", "leading zeros in decimal integer", "multiple exception types must be parenthesized")


@dataclass(frozen=True)
class Settings:
    check: bool
    diff: bool

    @property
    def write(self) -> bool:
        return not (self.check or self.diff)


@dataclass(frozen=True)
class Job:
    path: str  # as shown to the user; "-" (or --stdin-filename) for stdin
    options: Options | None = None
    error: str | None = None  # found while collecting paths: reported as is
    stdin: bool = False
    passthrough: bool = False  # stdin excluded by --force-exclude: echoed unchanged, like black


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
    findings: list = field(default_factory=list)  # Finding objects, for --output-format json
    blocked: bool = False  # a blocking finding remains (refused, or written anyway with --partial)
    member: bool = False  # a module of a project (project mode): run through its entry script

    def fail(self, text: str) -> None:
        self.outcome = "error"
        self.messages.append(("error", text))


# --------------------------------------------------------------------------- converting one file


def _syntax_error(exc: SyntaxError) -> FileError:
    msg = exc.msg or "invalid syntax"
    if any(h in msg for h in PY2_HINTS):
        msg += " (Python 2 code? ddpify converts Python 3 only)"
    return FileError(f"SyntaxError: {msg}", exc.lineno or 0, exc.offset or 0)


def check_syntax(text: str, path: str) -> ast.Module:
    """Parse and compile (never run) the code; warnings such as invalid escapes are not ours to print."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            tree = compile(text, path, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
            compile(tree, path, "exec", dont_inherit=True)
        except SyntaxError as exc:
            raise _syntax_error(exc) from None
        except (RecursionError, MemoryError):
            raise FileError("the code is too deeply nested to parse") from None
        except ValueError as exc:
            raise FileError(str(exc)) from None
    return tree


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


def _convert(src: SourceFile, options: Options, path: str, report: Report) -> bytes:
    """Converted bytes (== src.data when nothing changes); fills the report's status and findings."""
    tree = check_syntax(src.text, path)
    if not tree.body:
        report.status = "empty"  # empty or only comments: nothing to convert, like black and ruff
        return src.data
    if fileio.is_generated(src.text):
        report.status = "generated"
        report.messages.append(("note", f"{path}: note: marked {fileio.GENERATED_MARKER}: left unchanged"))
        return src.data
    from ddpify.pipeline import ConversionError, convert_source

    try:
        result = convert_source(src.text, options, path=path)
    except ConversionError as exc:
        where = f"{path}:{exc.line}:{exc.col}" if exc.line else path
        raise _Failed(f"{where}: error: {exc.message}") from None
    report.status = result.status
    report.findings = sorted(result.findings)
    for finding in report.findings:
        kind = "fixed" if finding.fixed else "blocking" if finding.blocking else "finding"
        report.messages.append((kind, finding.format(path)))
    if result.blocking:
        report.blocked = True
        n = len(result.blocking)
        what = f"{n} blocking finding{'' if n == 1 else 's'}"
        if result.status == "refused":
            kept = "the input was echoed unchanged" if report.stdin else "the file was left unchanged"
            report.messages.append(("blocking", (
                f"{path}: refused: {what} above would make the output a wrong DDP program, so {kept}. "
                "Fix them by hand, suppress one with `# ddpify: ignore[CODE]` on its line, "
                "or write the partial conversion with --partial."
            )))
        else:
            report.messages.append(("blocking", f"{path}: converted with --partial: {what} above still need(s) a hand fix"))
    if result.status == "generated":
        report.messages.append(("note", f"{path}: note: marked {fileio.GENERATED_MARKER}: left unchanged"))
    out = fileio.encode_source(src, result.source)
    if out != src.data:
        try:
            check_syntax(result.source, path)
        except FileError as exc:
            where = f" (line {exc.line}: {exc.message})" if exc.line else f" ({exc.message})"
            raise _Failed(
                f"{path}: error: internal error: the converted code does not compile{where}; "
                "the file was left unchanged. Please report this bug."
            ) from None
    return out


class _Failed(Exception):
    """A fully formatted one-line error."""


def process(job: Job, settings: Settings, stdin_data: bytes | None = None) -> Report:
    """Convert one file (or stdin); never raises for a bad file: errors go in the report."""
    report = Report(job.path, stdin=job.stdin)
    if job.error is not None:
        report.fail(job.error)
        return report
    if job.passthrough:
        data = stdin_data if stdin_data is not None else sys.stdin.buffer.read()
        report.status = "excluded"
        if settings.write:
            report.stdout = data
        return report
    data = b""
    try:
        if job.stdin:
            data = stdin_data if stdin_data is not None else sys.stdin.buffer.read()
            signature = None
        else:
            signature = fileio.file_signature(job.path) if os.path.exists(job.path) else None
            data = fileio.read_bytes(job.path)
        src = fileio.decode_source(data)
        out = _convert(src, job.options or Options(), job.path, report)
        changed = out != src.data
        report.outcome = "changed" if changed else "refused" if report.status == "refused" else "unchanged"
        if settings.diff and changed:
            encoding = src.encoding
            report.diff = unified_diff(src.data.decode(encoding), out.decode(encoding), job.path)
        if job.stdin:
            if settings.write:
                report.stdout = out
        elif settings.write and changed:
            fileio.check_writable(job.path)
            fileio.write_atomic(job.path, out, expected=signature)
    except FileError as exc:
        report.fail(exc.format(job.path))
    except _Failed as exc:
        report.fail(str(exc))
    except OSError as exc:
        report.fail(f"{job.path}: error: cannot write: {(exc.strerror or str(exc)).lower()}; the file was left unchanged")
    except (RecursionError, MemoryError):
        report.fail(f"{job.path}: error: the code is too deeply nested to convert")
    except Exception as exc:  # a converter bug must not stop the other files
        report.fail(
            f"{job.path}: error: internal error ({type(exc).__name__}: {exc}); "
            "the file was left unchanged. Please report this bug."
        )
    if report.outcome in ("error", "refused") and job.stdin and settings.write:
        report.stdout = data  # echo the input so `ddpify - < a > b` never loses code
    return report


def _process_star(job: Job, settings: Settings) -> Report:
    return process(job, settings)


# --------------------------------------------------------------------------- collecting files


def _dedupe_key(path: str) -> str:
    return os.path.realpath(path)


def _is_venv(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "pyvenv.cfg"))


def collect(
    paths: tuple[str, ...], cli_exclude: tuple[str, ...], force_exclude: bool, stdin_filename: str | None, overrides: dict
) -> tuple[list[Job], list[str]]:
    """Jobs sorted by path, and warnings. Config errors become error jobs (exit 2)."""
    jobs: dict[str, Job] = {}
    warnings_: list[str] = []
    cwd = os.getcwd()

    def add(path: str, explicit: bool) -> None:
        key = _dedupe_key(path)
        if key in jobs:
            return  # a file given twice (or reached twice) is processed once
        if explicit and path.endswith(".ipynb"):
            jobs[key] = Job(path, error=f"{path}: error: {NOTEBOOK_ERROR}")
            return
        try:
            cfg = config_for(path)
        except ConfigError as exc:
            jobs[key] = Job(path, error=f"{exc}")
            return
        excluded = matches_any(path, cli_exclude, cwd) or cfg.excludes(path)
        if excluded and (not explicit or force_exclude or cfg.force_exclude):
            return
        jobs[key] = Job(path, options=cfg.options(**overrides))

    for raw in paths:
        if raw == "-":
            if "-" not in jobs:
                try:
                    cfg = config_for(stdin_filename) if stdin_filename else config_for(None)
                    excluded = bool(stdin_filename) and (force_exclude or cfg.force_exclude) and (
                        matches_any(stdin_filename, cli_exclude, cwd) or cfg.excludes(stdin_filename))
                    jobs["-"] = Job(stdin_filename or "-", options=cfg.options(**overrides), stdin=True, passthrough=excluded)
                except ConfigError as exc:
                    jobs["-"] = Job(stdin_filename or "-", error=f"{exc}", stdin=True)
            continue
        if os.path.isdir(raw):
            found = _walk(raw, cli_exclude, cwd, add, jobs)
            if not found:
                warnings_.append(f"{raw}: warning: no Python files found")
            continue
        add(raw, explicit=True)
    ordered = sorted(jobs.values(), key=lambda j: (not j.stdin, j.path))
    return ordered, warnings_


def _walk(top: str, cli_exclude: tuple[str, ...], cwd: str, add, jobs: dict) -> int:
    before = len(jobs)
    for dirpath, dirnames, filenames in os.walk(top):  # does not follow directory symlinks
        try:
            cfg: Config = find_config(os.path.abspath(dirpath))
        except ConfigError as exc:
            jobs.setdefault(exc.path, Job(exc.path, error=str(exc)))
            dirnames[:] = []
            continue
        keep = []
        for d in sorted(dirnames):
            full = os.path.join(dirpath, d)
            if d.startswith(".") or d in SKIP_DIRS or _is_venv(full):
                continue
            if matches_any(full, cli_exclude, cwd) or cfg.excludes(full):
                continue
            keep.append(d)
        dirnames[:] = keep
        for name in sorted(filenames):
            if not name.endswith(".py") or name.startswith("."):
                continue
            full = os.path.normpath(os.path.join(dirpath, name))  # "./a.py" -> "a.py", like black
            if not os.path.exists(full):
                continue  # broken symlink met while recursing: not a file to convert
            add(full, explicit=False)
    return len(jobs) - before


# --------------------------------------------------------------------------- the command


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
            parts.append(f"{_plural(changed)} converted" + (f" ({partial} partially, with --partial)" if partial else ""))
        if unchanged:
            parts.append(f"{_plural(unchanged)} left unchanged")
        if refused:
            parts.append(f"{_plural(refused)} refused (blocking findings)")
        if failed:
            parts.append(f"{_plural(failed)} failed to convert")
    else:
        if changed:
            parts.append(f"{_plural(changed)} would be converted" + (f" ({partial} partially, with --partial)" if partial else ""))
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
    return [f"{single_node_command(path, [])}  (one process per GPU)",
            f"{single_node_command(path, [], nproc='2')}  (no GPU: 2 processes, gloo)"]


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.command(context_settings=CONTEXT, epilog="Also: `ddpify verify --help`, `ddpify launch --help`.")
@click.argument("paths", nargs=-1, type=click.Path(dir_okay=True, allow_dash=True))
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if a file would change.")
@click.option("--diff", is_flag=True, help="Print a unified diff of the changes; write nothing.")
@click.option("--color/--no-color", default=None, help="Color the diff [default: when stdout is a terminal].")
@click.option("-j", "--jobs", type=click.IntRange(min=0), default=1, show_default=True, help="Files converted in parallel (0: one per CPU).")
@click.option("-q", "--quiet", is_flag=True, help="Print only errors and blocking findings (what needs a hand fix).")
@click.option("--partial", is_flag=True, help="Write the conversion even when a blocking finding remains (still exits 2).")
@click.option("--ignore", "ignore", multiple=True, metavar="CODES", help="Never report these codes (comma-separated; adds to [tool.ddpify] ignore).")
@click.option("--output-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: one JSON document on stdout with every file's outcome and findings (severity, code, line, col).")
@click.option("--json", "json_flag", is_flag=True, help="Same as --output-format json.")
@click.option("--amp", type=click.Choice(AMP_CHOICES), default=None, help="Mixed precision to add [default: auto].")
@click.option("--opt-level", type=click.Choice(OPT_LEVELS), default=None, help="apex opt_level (with --amp apex) [default: O1].")
@click.option("--sync-bn/--no-sync-bn", default=None, help="Convert BatchNorm to SyncBatchNorm [default: no].")
@click.option("--shard-eval/--no-shard-eval", default=None, help="Shard evaluation loaders too [default: no].")
@click.option("--optimize", is_flag=True, default=None,
              help="Add verified-safe speed-ups, each only where a static check shows it safe, each with a finding (DDP130-DDP135).")
@click.option("--optimize-only", metavar="NAMES", default=None,
              help=f"Only these speed-ups (comma-separated; implies --optimize): {', '.join(OPTIMIZATIONS)}.")
@click.option("--writers", multiple=True, metavar="FUNC", help="A function that writes files (mylib.dump_results): rank 0 alone calls it; repeatable (overrides [tool.ddpify] writers).")
@click.option("--exclude", multiple=True, metavar="GLOB", help="Skip matching paths when recursing (adds to [tool.ddpify] exclude).")
@click.option("--force-exclude", is_flag=True, help="Apply excludes to files named on the command line too.")
@click.option("--stdin-filename", default=None, metavar="PATH", help="Name of the file read from stdin (messages, config lookup).")
@click.option("--explain", metavar="CODE", default=None, help="Explain a finding code (DDP020, or `all` for the table) and exit.")
@click.version_option(__version__, prog_name="ddpify", message="%(prog)s %(version)s")
def convert_command(
    paths: tuple[str, ...],
    check: bool,
    diff: bool,
    color: bool | None,
    jobs: int,
    quiet: bool,
    amp: str | None,
    opt_level: str | None,
    sync_bn: bool | None,
    shard_eval: bool | None,
    optimize: bool | None,
    optimize_only: str | None,
    writers: tuple[str, ...],
    exclude: tuple[str, ...],
    force_exclude: bool,
    stdin_filename: str | None,
    partial: bool,
    ignore: tuple[str, ...],
    output_format: str,
    json_flag: bool,
    explain: str | None,
) -> None:
    """Convert single-GPU PyTorch training scripts to DistributedDataParallel, in place.

    PATHS are files or directories (recursed into for *.py); `-` reads stdin and writes to stdout.
    Exit status: 0 success, 1 a file would change (--check), 2 a file could not be converted or
    was refused (a blocking finding remains: the output would not be a correct DDP program).
    """
    if explain is not None:
        _explain(explain)
    if not paths:
        sys.exit(0)
    as_json = json_flag or output_format == "json"
    find_config.cache_clear()
    settings = Settings(check=check, diff=diff)
    if as_json and settings.write and "-" in paths:
        raise click.UsageError("--output-format json writes JSON to stdout: with `-`, add --check or --diff")
    if color is None:
        color = sys.stdout.isatty() and "NO_COLOR" not in os.environ
    codes = tuple(c.strip().upper() for raw in ignore for c in raw.split(",") if c.strip())
    if optimize_only is not None:
        try:
            optimize = parse_optimize(optimize_only) or None
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--optimize-only") from None
    overrides = {"amp": amp, "opt_level": opt_level, "sync_bn": sync_bn, "shard_eval": shard_eval,
                 "partial": partial or None, "ignore": codes or None, "writers": writers or None,
                 "optimize": optimize}
    job_list, warns = collect(paths, exclude, force_exclude, stdin_filename, overrides)
    for w in warns:
        if not quiet:
            click.echo(w, err=True)
    if settings.write:
        # Temporaries left by a killed earlier run are removed before anything is written.
        for d in sorted({os.path.dirname(os.path.realpath(j.path)) for j in job_list if not j.stdin and not j.error}):
            fileio.clean_stale_temps(d)

    every_job = job_list
    projects, job_list = _split_projects(job_list, explicit=paths)
    project_reports = _process_projects(projects, settings) if projects else []
    # the modules of an entry that trains nothing (an inference script importing the model class
    # from the training script) are files of their own again, converted one at a time
    loose = _loose_members(every_job, project_reports)
    reports = _run(job_list + loose, settings, jobs) + [r for r in project_reports if not any(r.path == _display(j.path, j) for j in loose)]
    reports.sort(key=lambda r: (not r.stdin, r.path))
    if as_json:
        click.echo(json.dumps(json_document(reports, settings), indent=2))
    else:
        for report in reports:
            _print_report(report, settings, quiet, color)
        if reports and not quiet:
            click.echo(summary(reports, settings), err=True)
    if any(r.outcome == "error" or r.blocked for r in reports):
        sys.exit(2)
    if check and any(r.outcome == "changed" for r in reports):
        sys.exit(1)
    sys.exit(0)


# --------------------------------------------------------------------------- project mode


def _split_projects(job_list: list[Job], explicit: tuple[str, ...]) -> tuple[list[list[Job]], list[Job]]:
    """Entry scripts that import local modules (project mode) and their modules, apart from the
    files converted one at a time. A file named on the command line that imports a local module is
    an entry; in a directory, an entry also has `if __name__ == "__main__":`. Modules of an entry
    are not converted on their own."""
    from ddpify.analysis.project import local_modules

    named = {os.path.realpath(p) for p in explicit if p != "-" and not os.path.isdir(p)}
    entries: list[tuple[Job, list[str]]] = []
    for job in job_list:
        if job.stdin or job.error or job.passthrough:
            continue
        try:
            _, files = local_modules(job.path)
        except (SyntaxError, OSError, UnicodeDecodeError, ValueError):
            continue
        if len(files) < 2:
            continue
        if os.path.realpath(job.path) in named or files[0].main_guard is not None:
            entries.append((job, [f.path for f in files]))
    if not entries:
        return [], job_list
    members = {p for _, files in entries for p in files[1:]}
    entry_paths = {os.path.realpath(j.path) for j, _ in entries}
    rest = [j for j in job_list if j.stdin or os.path.realpath(j.path) not in members | entry_paths]
    return [[j] for j, _ in entries], rest


def _loose_members(every_job: list[Job], reports: list["Report"]) -> list[Job]:
    """The jobs of the modules of projects whose entry trains nothing, that no training project
    holds (a file named on the command line or found in a directory)."""
    idle = {os.path.realpath(r.path) for r in reports if r.member and r.status == "not-training" and r.outcome == "unchanged"}
    busy = {os.path.realpath(r.path) for r in reports if r.status != "not-training"}
    return [j for j in every_job if not j.stdin and os.path.realpath(j.path) in idle - busy]


def _display(path: str, entry: Job) -> str:
    rel = os.path.relpath(path)
    return rel if not rel.startswith("..") else path


def _convert_projects(groups: list[list[Job]]):
    """Every project converted in memory from the files as they are on disk (ddpify/project.py)."""
    from ddpify.project import convert_projects

    sources: dict[str, fileio.SourceFile] = {}
    signatures: dict[str, tuple[int, int, int]] = {}

    def read(path: str) -> str:
        if path not in sources:
            signatures[path] = fileio.file_signature(path)
            sources[path] = fileio.decode_source(fileio.read_bytes(path))
        return sources[path].text

    results = convert_projects([(g[0].path, g[0].options or Options()) for g in groups], read=read, errors=(FileError,))
    return [(g[0], r) for g, r in zip(groups, results)], sources, signatures


def _process_projects(groups: list[list[Job]], settings: Settings) -> list[Report]:
    """Convert each entry and its local modules as one program: all files are written, or none;
    a module shared by several projects is reported and written once."""
    done, sources, signatures = _convert_projects(groups)
    reports: list[Report] = []
    seen: set[str] = set()
    writes: dict[str, bytes] = {}
    for entry, result in done:
        if isinstance(result, str):
            report = Report(entry.path)
            report.fail(result)
            reports.append(report)
            continue
        group_reports = []
        blocked = result.status == "refused" or (bool(result.blocking) and not (entry.options or Options()).partial)
        for fr in result.files:
            path = entry.path if fr.path == result.entry else _display(fr.path, entry)
            report = Report(path, status=result.status, member=fr.path != result.entry)
            report.findings = fr.findings
            report.blocked = any(f.blocking for f in fr.findings)
            for finding in fr.findings:
                kind = "fixed" if finding.fixed else "blocking" if finding.blocking else "finding"
                report.messages.append((kind, finding.format(path)))
            src = sources[fr.path]
            out = fileio.encode_source(src, fr.output) if fr.changed and not blocked else src.data
            if out != src.data:
                try:
                    check_syntax(fr.output, path)
                except FileError:
                    report.fail(f"{path}: error: internal error: the converted code does not compile; the project was left unchanged. Please report this bug.")
                    blocked = True
            report.outcome = "changed" if out != src.data else "unchanged"
            if settings.diff and out != src.data:
                report.diff = unified_diff(src.text, fr.output, path)
            group_reports.append((fr.path, out, report))
        if blocked:
            n = len(result.blocking)
            for _, _, report in group_reports:
                report.outcome = "refused" if report.outcome != "error" else "error"
                report.diff = ""
                report.blocked = True
            group_reports[0][2].messages.append(("blocking", (
                f"{entry.path}: refused: {n} blocking finding{'' if n == 1 else 's'} in the project "
                f"({len(group_reports)} files) would make it a wrong DDP program, so every file was left unchanged."
            )))
        for path, out, report in group_reports:
            if path in seen:
                continue  # a module of several projects: reported (and written) once
            seen.add(path)
            reports.append(report)
            if not blocked and out != sources[path].data:
                writes[path] = out
    if settings.write and writes:
        try:
            for path in writes:
                fileio.check_writable(path)
            for path, data in writes.items():
                fileio.write_atomic(path, data, expected=signatures[path])
        except (OSError, FileError) as exc:
            reports[0].fail(f"{reports[0].path}: error: cannot write the project: {exc}")
    return reports


def _run(job_list: list[Job], settings: Settings, jobs: int) -> list[Report]:
    workers = (os.cpu_count() or 1) if jobs == 0 else jobs
    file_jobs = [j for j in job_list if not j.stdin]
    if workers <= 1 or len(file_jobs) < 2:
        return [process(j, settings) for j in job_list]
    done: dict[int, Report] = {}
    with ProcessPoolExecutor(max_workers=min(workers, len(file_jobs))) as pool:
        pooled = [i for i, j in enumerate(job_list) if not j.stdin]
        for i, rep in zip(pooled, pool.map(_process_star, [job_list[i] for i in pooled], repeat(settings))):
            done[i] = rep
    for i, j in enumerate(job_list):
        if j.stdin:
            done[i] = process(j, settings)  # stdin belongs to this process
    return [done[i] for i in range(len(job_list))]


def _print_report(report: Report, settings: Settings, quiet: bool, color: bool) -> None:
    if report.diff:
        sys.stdout.write(color_diff(report.diff) if color else report.diff)
        sys.stdout.flush()
    if report.stdout is not None:
        sys.stdout.buffer.write(report.stdout)
        sys.stdout.buffer.flush()
    for kind, text in report.messages:
        if quiet and kind not in ("error", "blocking"):
            continue
        click.echo(text, err=True)
    if report.outcome == "changed" and not quiet:
        click.echo(f"{'converted' if settings.write else 'would convert'} {report.path}", err=True)
        if settings.write and not report.stdin and not report.member:
            first, *rest = run_commands(report.path)
            click.echo(f"  run it with: {first}", err=True)
            for line in rest:
                click.echo(f"           or: {line}", err=True)


def json_document(reports: list[Report], settings: Settings) -> dict:
    """--output-format json: every file's outcome, findings and errors, for editors and CI."""
    files = []
    for r in reports:
        files.append({
            "path": r.path,
            "outcome": r.outcome,  # changed | unchanged | refused | error
            "status": r.status,
            "blocking": r.blocked,
            "findings": [f.to_dict() for f in r.findings],
            "errors": [text for kind, text in r.messages if kind == "error"],
            **({"diff": r.diff} if r.diff else {}),
        })
    return {"version": __version__, "mode": "write" if settings.write else "check" if settings.check else "diff",
            "files": files, "summary": summary(reports, settings)}


def _explain(code: str) -> None:
    """`ddpify --explain CODE`, like `ruff rule`: what the code means, with its example."""
    from ddpify import rules

    if code.lower() == "all":
        click.echo(rules.table())
        sys.exit(0)
    try:
        click.echo(rules.explain(code.strip()), nl=False)
    except KeyError:
        raise click.BadParameter(f"no such code {code!r} (`ddpify --explain all` lists them)", param_hint="--explain") from None
    sys.exit(0)


def main(argv: list[str] | None = None) -> None:
    """Entry point: `ddpify verify ...` and `ddpify launch ...` go to their commands, the rest converts."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in SUBCOMMANDS:
        module_name, attr = SUBCOMMANDS[args[0]]
        try:
            command = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            click.echo(f"error: `ddpify {args[0]}` is not available: {exc}", err=True)
            sys.exit(2)
        command.main(args[1:], prog_name=f"ddpify {args[0]}")
        return
    convert_command.main(args, prog_name="ddpify")


if __name__ == "__main__":
    main()

"""One file through the converter: read, convert, check that the output compiles, write it
atomically (or show a diff, or check), into a Report; the files of a run in parallel processes."""

from __future__ import annotations

import ast
import os
import sys
import warnings
from itertools import repeat

from ddpify import fileio
from ddpify.collect import Job
from ddpify.fileio import FileError, SourceFile
from ddpify.options import Options
from ddpify.output import Report, Settings, unified_diff

PY2_HINTS = (
    "Missing parentheses in call to",
    "leading zeros in decimal integer",
    "multiple exception types must be parenthesized",
)


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


def _convert(src: SourceFile, options: Options, path: str, report: Report) -> bytes:
    """Converted bytes (== src.data when nothing changes); fills the report's status and findings."""
    tree = check_syntax(src.text, path)
    if not tree.body:
        report.status = (
            "empty"  # empty or only comments: nothing to convert, like black and ruff
        )
        return src.data
    if fileio.is_generated(src.text):
        report.status = "generated"
        report.messages.append(
            ("note", f"{path}: note: marked {fileio.GENERATED_MARKER}: left unchanged")
        )
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
        kind = (
            "fixed" if finding.fixed else "blocking" if finding.blocking else "finding"
        )
        report.messages.append((kind, finding.format(path)))
    if result.blocking:
        report.blocked = True
        n = len(result.blocking)
        what = f"{n} blocking finding{'' if n == 1 else 's'}"
        if result.status == "refused":
            kept = (
                "the input was echoed unchanged"
                if report.stdin
                else "the file was left unchanged"
            )
            report.messages.append(
                (
                    "blocking",
                    (
                        f"{path}: refused: {what} above would make the output a wrong DDP program, so {kept}. "
                        "Fix them by hand, suppress one with `# ddpify: ignore[CODE]` on its line, "
                        "or write the partial conversion with --partial."
                    ),
                )
            )
        else:
            report.messages.append(
                (
                    "blocking",
                    f"{path}: converted with --partial: {what} above still need(s) a hand fix",
                )
            )
    if result.status == "generated":
        report.messages.append(
            ("note", f"{path}: note: marked {fileio.GENERATED_MARKER}: left unchanged")
        )
    out = fileio.encode_source(src, result.source)
    if out != src.data:
        try:
            check_syntax(result.source, path)
        except FileError as exc:
            where = (
                f" (line {exc.line}: {exc.message})"
                if exc.line
                else f" ({exc.message})"
            )
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
            signature = (
                fileio.file_signature(job.path) if os.path.exists(job.path) else None
            )
            data = fileio.read_bytes(job.path)
        src = fileio.decode_source(data)
        out = _convert(src, job.options or Options(), job.path, report)
        changed = out != src.data
        report.outcome = (
            "changed"
            if changed
            else "refused"
            if report.status == "refused"
            else "unchanged"
        )
        if changed:
            report.original, report.converted = (
                src.data.decode(src.encoding),
                out.decode(src.encoding),
            )
            if settings.diff:
                report.diff = unified_diff(report.original, report.converted, job.path)
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
        report.fail(
            f"{job.path}: error: cannot write: {(exc.strerror or str(exc)).lower()}; the file was left unchanged"
        )
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


def run_jobs(job_list: list[Job], settings: Settings, jobs: int) -> list[Report]:
    workers = (os.cpu_count() or 1) if jobs == 0 else jobs
    file_jobs = [j for j in job_list if not j.stdin]
    if workers <= 1 or len(file_jobs) < 2:
        return [process(j, settings) for j in job_list]
    done: dict[int, Report] = {}
    # imported here: a plain `ddpify --check FILE` (a pre-commit hook) runs no pool
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=min(workers, len(file_jobs))) as pool:
        pooled = [i for i, j in enumerate(job_list) if not j.stdin]
        for i, rep in zip(
            pooled,
            pool.map(_process_star, [job_list[i] for i in pooled], repeat(settings)),
        ):
            done[i] = rep
    for i, j in enumerate(job_list):
        if j.stdin:
            done[i] = process(j, settings)  # stdin belongs to this process
    return [done[i] for i in range(len(job_list))]

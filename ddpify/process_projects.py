"""Project mode on the command line: entry scripts that import local modules are converted with
those modules as one program (ddpify/project.py); every file of a project is written, or none."""

from __future__ import annotations

import os

from ddpify import fileio
from ddpify.collect import Job
from ddpify.fileio import FileError
from ddpify.options import Options
from ddpify.output import Report, Settings, unified_diff
from ddpify.process import check_syntax


def split_projects(
    job_list: list[Job], explicit: tuple[str, ...]
) -> tuple[list[list[Job]], list[Job]]:
    """Entry scripts that import local modules (project mode) and their modules, apart from the
    files converted one at a time. A file named on the command line that imports a local module is
    an entry; in a directory, an entry also has `if __name__ == "__main__":`, or is started
    otherwise (a package's __main__.py, a console script's module, sacred's automain). Modules of
    an entry are not converted on their own."""
    from ddpify.analysis.project import local_modules
    from ddpify.project import _trains

    named = {os.path.realpath(p) for p in explicit if p != "-" and not os.path.isdir(p)}
    entries: list[tuple[Job, list[str]]] = []
    for job in job_list:
        if job.stdin or job.error or job.passthrough:
            continue
        try:
            _, files = local_modules(job.path)
        except (SyntaxError, OSError, UnicodeDecodeError, ValueError):
            continue
        # a module whose training lives in a module it imports inside a function: project
        # mode refuses it (DDP100) rather than calling the file "not a training script"
        lazy = any(_trains(p) for _, p in files[0].lazy)
        if len(files) < 2 and not lazy:
            continue
        if (
            os.path.realpath(job.path) in named
            or files[0].main_guard is not None
            or _started(files[0])
        ):
            entries.append((job, [f.path for f in files]))
    # `python -m pkg` whose __main__.py calls a console script's function: that function is
    # the entry (the group lives inside it), and __main__.py stays as it is
    from ddpify.analysis.entries import console_functions

    entries = [
        (j, files)
        for j, files in entries
        if os.path.basename(j.path) != "__main__.py"
        or os.path.realpath(j.path) in named
        or not any(console_functions(f) for f in files[1:])
    ]
    if not entries:
        return [], job_list
    members = {p for _, files in entries for p in files[1:]}
    entry_paths = {os.path.realpath(j.path) for j, _ in entries}
    rest = [
        j
        for j in job_list
        if j.stdin or os.path.realpath(j.path) not in members | entry_paths
    ]
    return [[j] for j, _ in entries], rest


def _started(mod) -> bool:
    """The file runs as an entry without a `__main__` block: a package's `__main__.py`
    (`python -m pkg`), a module whose function a console script of the project starts, or one
    whose function a decorator runs (sacred's `@ex.automain`)."""
    from ddpify.analysis.entries import console_functions, run_by_decorator

    return (
        os.path.basename(mod.path) == "__main__.py"
        or bool(console_functions(mod.path))
        or bool(run_by_decorator(mod.tree.body))
    )


def loose_members(every_job: list[Job], reports: list[Report]) -> list[Job]:
    """The jobs of the modules of projects whose entry trains nothing, that no training project
    holds (a file named on the command line or found in a directory)."""
    idle = {
        os.path.realpath(r.path)
        for r in reports
        if r.member and r.status == "not-training" and r.outcome == "unchanged"
    }
    busy = {os.path.realpath(r.path) for r in reports if r.status != "not-training"}
    return [
        j for j in every_job if not j.stdin and os.path.realpath(j.path) in idle - busy
    ]


def display(path: str) -> str:
    """A path as reports show it: relative to the working directory unless outside it."""
    return _display(path, None)


def _display(path: str, entry: Job | None) -> str:
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

    results = convert_projects(
        [(g[0].path, g[0].options or Options()) for g in groups],
        read=read,
        errors=(FileError,),
    )
    return [(g[0], r) for g, r in zip(groups, results)], sources, signatures


def process_projects(groups: list[list[Job]], settings: Settings) -> list[Report]:
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
        blocked = result.status == "refused" or (
            bool(result.blocking) and not (entry.options or Options()).partial
        )
        for fr in result.files:
            path = entry.path if fr.path == result.entry else _display(fr.path, entry)
            report = Report(path, status=result.status, member=fr.path != result.entry)
            report.findings = fr.findings
            report.blocked = any(f.blocking for f in fr.findings)
            for finding in fr.findings:
                kind = (
                    "fixed"
                    if finding.fixed
                    else "blocking"
                    if finding.blocking
                    else "finding"
                )
                report.messages.append((kind, finding.format(path)))
            src = sources[fr.path]
            out = (
                fileio.encode_source(src, fr.output)
                if fr.changed and not blocked
                else src.data
            )
            if out != src.data:
                try:
                    check_syntax(fr.output, path)
                except FileError:
                    report.fail(
                        f"{path}: error: internal error: the converted code does not compile; the project was left unchanged. Please report this bug."
                    )
                    blocked = True
            report.outcome = "changed" if out != src.data else "unchanged"
            if out != src.data:
                report.original, report.converted = (
                    src.data.decode(src.encoding),
                    out.decode(src.encoding),
                )
                if settings.diff:
                    report.diff = unified_diff(src.text, fr.output, path)
            group_reports.append((fr.path, out, report))
        if blocked:
            n = len(result.blocking)
            for _, _, report in group_reports:
                report.outcome = "refused" if report.outcome != "error" else "error"
                report.diff = ""
                report.original = report.converted = None
                report.blocked = True
            group_reports[0][2].messages.append(
                (
                    "blocking",
                    (
                        f"{entry.path}: refused: {n} blocking finding{'' if n == 1 else 's'} in the project "
                        f"({len(group_reports)} files) would make it a wrong DDP program, so every file was left unchanged."
                    ),
                )
            )
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
            reports[0].fail(
                f"{reports[0].path}: error: cannot write the project: {exc}"
            )
    return reports
